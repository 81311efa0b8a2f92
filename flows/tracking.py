"""MLflow tracking for the flow: a parent run per pipeline run, a child run per stage.

Everything goes through an explicit ``MlflowClient`` and run ids rather than the fluent API's
thread-local "active run", so stages running in threads (downstream fan-out) or in a training
subprocess (which gets the run id through the environment) log to the right run.
The default store is ``sqlite:///<root>/mlflow.db`` (the registry needs a database) with
artifacts under ``<root>/mlartifacts``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from flows.presets import flatten

ENV_RUN_ID = "BERTFLOW_MLFLOW_RUN_ID"
ENV_TRACKING_URI = "MLFLOW_TRACKING_URI"
_MAX_PARAM_LEN = 6000


def default_tracking_uri(root: str) -> str:
    if "://" in root and not root.startswith("file://"):
        raise ValueError(
            f"--root {root} is remote: give --mlflow-uri (an MLflow server or a database URL); "
            "sqlite needs a local file"
        )
    path = os.path.abspath(root.removeprefix("file://"))
    os.makedirs(path, exist_ok=True)
    return f"sqlite:///{path}/mlflow.db"


def _client(uri: str):
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


class Tracker:
    """Thin wrapper over MlflowClient with the run layout of this project."""

    def __init__(self, uri: str):
        self.uri = uri
        self.client = _client(uri)
        self.experiment_id: str | None = None

    def use_experiment(self, name: str, artifact_root: str | None = None) -> str:
        """Select (creating if needed) the experiment new runs go to."""
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            location = artifact_root
            if location and "://" not in location:
                location = "file://" + os.path.abspath(location)
            self.experiment_id = self.client.create_experiment(name, artifact_location=location)
        else:
            self.experiment_id = exp.experiment_id
        return self.experiment_id

    def start_run(self, name: str, parent_id: str | None = None, tags: dict[str, str] | None = None) -> str:
        all_tags = dict(tags or {})
        if parent_id:
            all_tags["mlflow.parentRunId"] = parent_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        return run.info.run_id

    def end_run(self, run_id: str, ok: bool = True) -> None:
        self.client.set_terminated(run_id, "FINISHED" if ok else "FAILED")

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        flat = flatten(params)
        items = [Param(k, _param_value(v)) for k, v in sorted(flat.items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [
            Metric(k, float(v), now, step)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        if items:
            self.client.log_batch(run_id, metrics=items)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(run_id, k, str(v))

    def log_text(self, run_id: str, text: str, path: str) -> None:
        self.client.log_text(run_id, text, path)

    def log_artifacts(self, run_id: str, local_dir: str, path: str | None = None) -> None:
        self.client.log_artifacts(run_id, local_dir, path)

    def register_model(
        self,
        run_id: str,
        name: str,
        artifact_path: str | None = None,
        source: str | None = None,
        tags: dict[str, Any] | None = None,
    ) -> str:
        """Register a new version of ``name`` from the run's ``artifact_path`` or a ``source`` URL."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(
                name, description="BERT pretrained by bertflow (MLM + NSP), Hugging Face layout."
            )
        if source is None:
            source = f"{self.client.get_run(run_id).info.artifact_uri}/{artifact_path}"
        version = self.client.create_model_version(
            name, source, run_id=run_id, tags={k: str(v) for k, v in (tags or {}).items()}
        )
        return str(version.version)


def log_fn_from_env():
    """In a stage's own process: a ``log_fn`` writing to the MLflow run the flow passed through
    the environment, or None (no run given, or a rank other than 0)."""
    run_id = os.environ.get(ENV_RUN_ID)
    if not run_id or int(os.environ.get("RANK", "0")) != 0:
        return None
    tracker = Tracker(os.environ[ENV_TRACKING_URI])

    def log_to_mlflow(metrics: dict[str, float], step: int) -> None:
        tracker.log_metrics(run_id, metrics, step)

    return log_to_mlflow


def _param_value(v: Any) -> str:
    text = json.dumps(v) if isinstance(v, (list, tuple, dict)) else str(v)
    return text if len(text) <= _MAX_PARAM_LEN else text[: _MAX_PARAM_LEN - 3] + "..."
