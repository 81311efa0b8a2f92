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

from pipeline.schema.config import flatten, redact

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
    return f"sqlite:///{path}/mlflow.db"  # the folder is made when the run takes the root's lock


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

        flat = flatten(redact(params))
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

    def mark_killed_runs(self, root: str) -> list[str]:
        """Runs of ``root`` still RUNNING when a new run holds the root's lock: their process died
        (SIGKILL, a lost machine). Mark them KILLED; return their ids."""
        if self.experiment_id is None:
            return []
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`bertflow.root` = '{root}' and attributes.status = 'RUNNING'"
        )
        for run in runs:
            self.client.set_terminated(run.info.run_id, "KILLED")
        return [r.info.run_id for r in runs]

    def log_datasets(
        self, run_id: str, inputs: dict[str, str], fingerprints: dict[str, str], context: str = "input"
    ) -> None:
        """Record each input URL as an MLflow dataset (its source URL and fingerprint): lineage."""
        import warnings

        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.entities import DatasetInput, InputTag

        datasets = []
        for name, url in sorted(inputs.items()):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # "can be interpreted in multiple ways"
                    source = resolve_dataset_source(url)
            except Exception:  # an URL scheme MLflow has no source for
                continue
            entity = MetaDataset(source, name=name, digest=fingerprints.get(name, "")[:36])._to_mlflow_entity()
            datasets.append(DatasetInput(entity, tags=[InputTag("mlflow.data.context", context)]))
        if datasets:
            self.client.log_inputs(run_id, datasets=datasets)

    def set_alias_by_score(self, name: str, version: str, score: float | None) -> str:
        """``champion`` moves to ``version`` if its score beats the champion's (or there is none);
        otherwise ``version`` becomes the ``challenger``. Returns the alias given."""
        from mlflow.exceptions import MlflowException

        if score is not None:
            self.client.set_model_version_tag(name, version, "bertflow.score", f"{score:.6f}")
        try:
            champion = self.client.get_model_version_by_alias(name, "champion")
        except MlflowException:
            champion = None
        best = None
        if champion is not None and str(champion.version) != str(version):
            try:
                best = float(champion.tags.get("bertflow.score", "nan"))
            except ValueError:
                best = None
        if champion is None or (score is not None and (best is None or best != best or score > best)):
            self.client.set_registered_model_alias(name, "champion", version)
            return "champion"
        self.client.set_registered_model_alias(name, "challenger", version)
        return "challenger"


def check_tracking_uri(uri: str, timeout: float = 5.0) -> None:
    """Fail in seconds, with the reason, when the tracking store cannot be reached."""
    if uri.startswith(("http://", "https://")):
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as r:
                r.read(64)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ConnectionError(
                f"MLflow tracking server {uri} does not answer ({exc}); start it, or pass another "
                "--mlflow-uri (default: sqlite:///<root>/mlflow.db)"
            ) from None
    elif uri.startswith("sqlite:///"):
        folder = os.path.dirname(uri.removeprefix("sqlite:///"))
        if folder and os.path.exists(folder) and not os.path.isdir(folder):
            raise NotADirectoryError(f"MLflow database folder {folder} is a file")


def git_commit() -> str:
    """The commit of the code that runs (``unknown`` outside a git checkout)."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if out.returncode != 0:
        return "unknown"
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


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
