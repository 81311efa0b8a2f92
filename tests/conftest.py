"""Test-wide settings: hermetic Prefect/MLflow homes, no telemetry, no network."""

import os
import tempfile

_HOME = tempfile.mkdtemp(prefix="bertflow-test-home-")
os.environ.setdefault("PREFECT_HOME", os.path.join(_HOME, "prefect"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
