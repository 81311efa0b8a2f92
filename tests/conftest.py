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


import logging  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _bertflow_logger_restored():
    """The CLI configures the ``bertflow`` logger (its own handler, no propagation) when a test
    calls ``main`` in-process; put it back so later tests' ``caplog`` sees its records."""
    logger = logging.getLogger("bertflow")
    handlers, propagate, level = logger.handlers[:], logger.propagate, logger.level
    yield
    logger.handlers[:] = handlers
    logger.propagate = propagate
    logger.setLevel(level)
