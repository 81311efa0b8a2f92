"""MLflow tracking for the flow: a parent run per pipeline run, a child run per stage.

Everything goes through an explicit ``MlflowClient`` and run ids rather than the fluent API's
thread-local "active run", so stages running in threads (downstream fan-out) or in a training
subprocess (which gets the run id through the environment) log to the right run.
The default store is ``sqlite:///<root>/mlflow.db`` (the registry needs a database) with
artifacts under ``<root>/mlartifacts``.

Design choices:
1. **A busy store is waited for, not a failure**: every client call retries while the database
   says it is locked or busy (another process writing a SQLite file; a server restarting), for
   up to :data:`BUSY_SECONDS`, so a run is never left ``RUNNING`` because one call met a lock.
2. **Ending a run never hides why it ended**: :meth:`Tracker.end_run` with ``quiet=True`` (the
   stage tasks' ``finally``) logs a failure to record the end instead of raising over the error
   that is on its way out (a full disk is reported as the disk, not as MLflow's database error).
3. **Filters quote what they match**: a root with ``'``, ``"`` or ``\\`` in its path is matched
   exactly (:func:`tag_filter`; client-side when a value holds both quote characters).
4. **A root copied or moved elsewhere keeps working**: its own SQLite store recorded absolute
   artifact URIs; :func:`relocate_store` rewrites them (and the ``bertflow.root`` tags) to the
   root's new place, which the flow does at the start of a run (``flows.prefect_tasks.session``).
5. **A tracking server that goes away is waited for, then named**: a call whose connection is
   refused (the server killed or restarting) is sent again for up to
   :data:`UNREACHABLE_SECONDS`; a server back within that time costs nothing, one that is not
   fails the run with :class:`TrackingServerGone` naming it (checkpoints kept, nothing
   registered: registration is the chain's last step, once per export). Later calls of the
   same process then try once, so the run's ending bookkeeping fails in seconds. A connection
   cut mid-request is not resent (the server may have applied it). After a restart the rerun
   resumes from the checkpoints and registers; its start marks the runs the failure left
   ``RUNNING`` as ``KILLED``. MLflow's own retries are cut to 2 (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``,
   an operator's setting wins). The wait is ``BERTFLOW_TRACKING_WAIT_S`` seconds when that is set
   (:func:`unreachable_seconds`; 0: fail at the first refusal). A stage or unit that failed so
   is not retried (the retry would wait for the same server again): its process exits
   :data:`flows.proc.protocol.EXIT_TRACKING_GONE`, and the flow's own process then tries the
   server once per call too (:func:`give_up`), so the whole run ends about one wait after the
   server went.
6. **A new SQLite store is created under a lock**: MLflow creates and migrates a database's tables
   the first time a client opens it, and two runs opening one new file at once both failed
   mid-migration and left it broken (``_alembic_tmp_tags already exists``). ``flows.mlflow_store.prepare_store``
   does that first open under ``flock`` on ``<database>.lock``; the others wait, then find the
   tables made.
7. **Artifacts live with the store, not with whichever root came first**: the experiment's
   artifact location is fixed when it is created, so a store shared by several roots kept every
   root's models under the first root's folder (moving that root broke the others' models).
   :func:`store_artifact_root` puts them beside the SQLite file (for a root's own store, under
   the root as before) or leaves them to the tracking server, as ``mlflow server`` does. A team
   shares one ``mlflow server`` (README, "Tracking").
8. **Looking is cheaper than writing**: ``bertflow status`` reads a SQLite store's latest run per
   stage with ``sqlite3`` (:func:`latest_stage_runs`, the same runs MLflow's search returns),
   because importing MLflow's client and its SQLAlchemy store costs seconds of CPU and hundreds
   of MB for one query. A server or another database is still asked through MLflow. The cost:
   the query knows MLflow's table layout (``experiments``, ``runs``, ``tags``), which
   ``tests/flows/test_cli.py`` checks against runs MLflow itself wrote. A finished root's ``run``
   reads its registry and writes its one run the same way (``flows.store_sqlite``), and a flow
   writes its runs on a SQLite store of MLflow's layout with ``sqlite3`` too
   (``flows.tracker_sqlite.open_tracker``; this module's :class:`Tracker` is MLflow's client).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from typing import Any

from flows.mlflow_store import BUSY_SECONDS, prepare_store, sqlite_path
from pipeline.schema.config import flatten, redact

log = logging.getLogger("bertflow.flow")

EXPERIMENT = "bertflow"
"""The experiment every bertflow run is recorded in."""
ENV_RUN_ID = "BERTFLOW_MLFLOW_RUN_ID"
ENV_TRACKING_URI = "MLFLOW_TRACKING_URI"
EXPERIMENT_KIND = "custom_model_development"
"""``mlflow.experimentKind``: the experiment is model training, not a GenAI app (what MLflow's
tools read; MLflow 3.17's UI takes its view from the URL instead: :func:`ui_url`)."""
UI_DEFAULT = "http://127.0.0.1:5000"
"""Where ``mlflow ui`` serves by default."""
_BUSY = ("database is locked", "database is busy", "database table is locked")
_MAX_PARAM_LEN = 6000


def default_tracking_uri(root: str) -> str:
    if "://" in root and not root.startswith("file://"):
        raise ValueError(
            f"--root {root} is remote: give --mlflow-uri (an MLflow server or a database URL); "
            "sqlite needs a local file"
        )
    path = os.path.abspath(root.removeprefix("file://"))
    return f"sqlite:///{path}/mlflow.db"  # the folder is made when the run takes the root's lock


def is_busy(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(b in text for b in _BUSY)


UNREACHABLE_SECONDS = 120.0
"""How long a call waits for a tracking server that refuses connections (killed, restarting)
before the run fails naming it (design choice 5), unless ``BERTFLOW_TRACKING_WAIT_S`` says."""
ENV_WAIT = "BERTFLOW_TRACKING_WAIT_S"
_UNREACHABLE = ("connection refused", "failed to establish a new connection", "name or service not known")
"""Errors of a request that never reached the server: safe to send again. A connection cut
mid-request (aborted, reset, timed out) may have been applied, so it is not resent."""
_GAVE_UP: set[str] = set()
"""Servers this process already waited the whole window for: later calls try once (an ending
run's bookkeeping then fails in seconds, not another window each)."""


def is_unreachable(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(u in text for u in _UNREACHABLE)


def unreachable_seconds() -> float:
    """How long a call waits for a server that refuses connections: ``BERTFLOW_TRACKING_WAIT_S``
    when it holds a number of seconds >= 0 (read at each call: a stage's process inherits it),
    else :data:`UNREACHABLE_SECONDS`."""
    raw = os.environ.get(ENV_WAIT, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if 0.0 <= value < float("inf"):
            return value
        log.warning("%s=%r is not a number of seconds >= 0: waiting %.0f s", ENV_WAIT, raw, UNREACHABLE_SECONDS)
    return UNREACHABLE_SECONDS


def give_up(uri: str | None) -> None:
    """Treat ``uri`` as a server this process already waited for (a stage's process did, and
    failed): its later calls here try once, so the run's ending bookkeeping fails in seconds."""
    if uri:
        _GAVE_UP.add(uri)


class TrackingServerGone(ConnectionError):
    """The MLflow tracking server refused connections for the whole wait: the message names it.
    Not retried (``deterministic``): a retry would wait for the same server again."""

    deterministic = True


class _Retrying:
    """An ``MlflowClient`` whose calls retry while the store is busy (design choice 1) or its
    server refuses connections (design choice 5)."""

    def __init__(self, client, seconds: float = BUSY_SECONDS, uri: str = ""):
        self._client, self._seconds, self._uri = client, seconds, uri

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            start = time.monotonic()
            deadline, wait = start + self._seconds, 0.1
            gone_by = start + (0.0 if self._uri in _GAVE_UP else unreachable_seconds())
            while True:
                try:
                    result = attr(*args, **kwargs)
                    _GAVE_UP.discard(self._uri)
                    return result
                except Exception as exc:  # MLflow wraps the driver's error in its own
                    if is_unreachable(exc) and self._uri:
                        if time.monotonic() + wait > gone_by:
                            waited = (
                                f"for {time.monotonic() - start:.0f} s"
                                if self._uri not in _GAVE_UP
                                else "again (this run already waited for it)"
                            )
                            _GAVE_UP.add(self._uri)
                            raise TrackingServerGone(
                                f"MLflow tracking server {self._uri} refused connections {waited} ({name}): the "
                                "run fails here, its checkpoints kept; restart the server and run again to resume"
                            ) from None
                        log.warning("MLflow server %s unreachable: %s retried in %.1f s", self._uri, name, wait)
                    elif not is_busy(exc) or time.monotonic() + wait > deadline:
                        raise
                    else:
                        log.warning("MLflow store busy (%s): %s retried in %.1f s", str(exc)[:80], name, wait)
                    time.sleep(wait)
                    wait = min(wait * 2, 5.0)

        return call


SQLITE_BUSY_SECONDS = 20.0
"""How long SQLite itself waits on a locked file before a call sees "database is locked" (MLflow's
``PRAGMA busy_timeout`` on every session); the retries of design choice 1 come after it."""


def _sqlite_busy_timeout(client, seconds: float) -> None:
    """Make SQLite's own wait of ``client``'s stores ``seconds`` instead of MLflow's 20 s: the
    ``busy_timeout`` pragma MLflow runs at the start of each session is rewritten on the way to
    the driver (tests meet a held lock in a second instead of 20)."""
    from sqlalchemy import event

    pragma = f"PRAGMA busy_timeout = {max(0, round(seconds * 1000))};"

    def rewrite(conn, cursor, statement, parameters, context, executemany):
        if statement.strip().lower().startswith("pragma busy_timeout"):
            statement = pragma
        return statement, parameters

    stores = [client._tracking_client.store, client._get_registry_client().store]
    for engine in {id(s.engine): s.engine for s in stores if hasattr(s, "engine")}.values():
        event.listen(engine, "before_cursor_execute", rewrite, retval=True)


def import_client(uri: str) -> None:
    """Import what :func:`_client` will use for ``uri`` (MLflow's client; its SQLAlchemy store for
    a database URI), ahead of time: ``flows.worker`` does it while Prefect's server starts."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow.tracking  # noqa: F401

    if not uri.startswith(("http://", "https://", "databricks")):
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401


def _client(uri: str, sqlite_busy_seconds: float | None = None):
    import_client(uri)
    from mlflow.tracking import MlflowClient

    if uri.startswith(("http://", "https://")):
        # MLflow's own retries of a refused connection (7, backing off to 2 min: ~4 min a call)
        # are shortened so that the wait is this module's, bounded by UNREACHABLE_SECONDS
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    prepare_store(uri)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    if sqlite_busy_seconds is not None and sqlite_busy_seconds != SQLITE_BUSY_SECONDS and sqlite_path(uri):
        _sqlite_busy_timeout(client, sqlite_busy_seconds)
    return _Retrying(client, uri=uri)


def store_artifact_root(uri: str, root: str) -> str | None:
    """Where a new experiment of store ``uri`` keeps its artifacts (design choice 7): beside a
    SQLite store's file (a root's own store: ``<root>/mlartifacts``); a tracking server's own
    artifact root (None: the server decides, ``--artifacts-destination`` or
    ``--default-artifact-root``); under the root for any other database URL."""
    path = sqlite_path(uri)
    if path is not None:
        return os.path.join(os.path.dirname(path), "mlartifacts")
    if uri.startswith(("http://", "https://", "databricks")):
        return None
    return root.rstrip("/") + "/mlartifacts"


def quoted(value: str) -> str | None:
    """``value`` as a filter-string literal, in the quote character it does not hold; None when
    it holds both (MLflow's filter grammar has no escape: match client-side)."""
    for quote in ("'", '"'):
        if quote not in value:
            return f"{quote}{value}{quote}"
    return None


def tag_filter(key: str, value: str) -> str | None:
    """A filter clause matching tag ``key`` equal to ``value`` exactly (None: see :func:`quoted`)."""
    literal = quoted(value)
    return f"tags.`{key}` = {literal}" if literal else None


class Tracker:
    """Thin wrapper over MlflowClient with the run layout of this project."""

    def __init__(self, uri: str, sqlite_busy_seconds: float | None = None):
        """``sqlite_busy_seconds``: SQLite's own wait on a locked store file before a call retries
        (None: MLflow's :data:`SQLITE_BUSY_SECONDS`)."""
        self.uri = uri
        self.client = _client(uri, sqlite_busy_seconds)
        self.experiment_id: str | None = None

    def use_experiment(self, name: str, artifact_root: str | None = None) -> str:
        """Select (creating if needed) the experiment new runs go to."""
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            location = artifact_root
            if location and "://" not in location:
                location = "file://" + os.path.abspath(location)
            try:
                self.experiment_id = self.client.create_experiment(
                    name, artifact_location=location, tags={"mlflow.experimentKind": EXPERIMENT_KIND}
                )
                return self.experiment_id
            except MlflowException:
                # Another run on the same store created it since the lookup (two runs started
                # together on a new store or server: RESOURCE_ALREADY_EXISTS); use theirs.
                exp = self.client.get_experiment_by_name(name)
                if exp is None:
                    raise
                log.info("MLflow experiment %r was created by another run meanwhile: using it", name)
        self.experiment_id = exp.experiment_id
        if exp.tags.get("mlflow.experimentKind") != EXPERIMENT_KIND:
            self.client.set_experiment_tag(self.experiment_id, "mlflow.experimentKind", EXPERIMENT_KIND)
        return self.experiment_id

    def start_run(self, name: str, parent_id: str | None = None, tags: dict[str, str] | None = None) -> str:
        all_tags = dict(tags or {})
        if parent_id:
            all_tags["mlflow.parentRunId"] = parent_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        return run.info.run_id

    def end_run(self, run_id: str, ok: bool = True, quiet: bool = False, status: str | None = None) -> None:
        """Mark the run FINISHED (or FAILED; ``status`` when given: KILLED). ``quiet``: log a
        failure to do so instead of raising (in a ``finally`` whose error must stay the one reported)."""
        status = status or ("FINISHED" if ok else "FAILED")
        try:
            self._terminate(run_id, status)
        except Exception as exc:
            if not quiet:
                raise
            log.warning("MLflow run %s could not be marked %s: %s", run_id, status, exc)

    def _terminate(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status)

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in param_items(params)]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in metric_items(metrics)]
        if items:
            self.client.log_batch(run_id, metrics=items)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(run_id, k, str(v))

    def log_text(self, run_id: str, text: str, path: str) -> None:
        self.client.log_text(run_id, text, path)

    def runs_with_tag(self, key: str, value: str, extra: str = "", **search) -> list:
        """Runs of the experiment whose tag ``key`` is exactly ``value`` (and the ``extra`` filter)."""
        clause = tag_filter(key, value)
        filter_string = " and ".join(c for c in (clause, extra) if c)
        runs = self.client.search_runs([self.experiment_id], filter_string=filter_string, **search)
        return [r for r in runs if r.data.tags.get(key) == value]

    def mark_killed_runs(self, root: str) -> list[str]:
        """Runs of ``root`` still RUNNING when a new run holds the root's lock: their process died
        (SIGKILL, a lost machine). Mark them KILLED; return their ids."""
        if self.experiment_id is None:
            return []
        runs = self.runs_with_tag("bertflow.root", root, "attributes.status = 'RUNNING'")
        for run in runs:
            self._terminate(run.info.run_id, "KILLED")
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


# -- a root's own store, copied or moved ---------------------------------------------------------------
_LOCATIONS = (  # (table, column) holding artifact URIs, file:///<root>/mlartifacts/...
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "storage_location"),
    ("model_versions", "source"),
)
_TAG_VALUES = ("tags", "model_version_tags")  # bertflow.root, bertflow.url, lineage.*.url ...


def recorded_root(db_path: str, experiment: str) -> str | None:
    """The root a root-local store was written at: its experiment's artifact location without
    ``/mlartifacts`` (None: no such experiment, or not a root's own store)."""
    if not os.path.exists(db_path):
        return None
    with sqlite3.connect(db_path) as db:
        row = db.execute("select artifact_location from experiments where name = ?", (experiment,)).fetchone()
    if not row or not row[0] or not row[0].startswith("file://") or not row[0].endswith("/mlartifacts"):
        return None
    return row[0].removeprefix("file://").removesuffix("/mlartifacts")


def latest_stage_runs(db_path: str, experiment: str, root: str | None = None, limit: int = 500) -> dict[str, str]:
    """stage -> "run_id (status)" of each stage's latest run in a SQLite store, read with
    ``sqlite3`` (design choice 8): the runs MLflow's ``search_runs`` returns (active runs of the
    experiment, newest first, ties by run id, the first ``limit``), those tagged ``bertflow.root``
    = ``root`` when ``root`` is given. Read-only: a missing file is an empty store, never created."""
    if not os.path.exists(db_path):
        return {}
    import pathlib

    with contextlib.closing(
        sqlite3.connect(pathlib.Path(db_path).absolute().as_uri() + "?mode=ro", uri=True, timeout=BUSY_SECONDS)
    ) as db:
        columns = {r[1] for r in db.execute("pragma table_info(experiments)")}
        order = " order by workspace = 'default' desc" if "workspace" in columns else ""
        exp = db.execute(f"select experiment_id from experiments where name = ?{order} limit 1", (experiment,))
        row = exp.fetchone()
        if row is None:
            return {}
        where, args = "r.experiment_id = ? and r.lifecycle_stage = 'active'", [row[0]]
        if root is not None:
            where += " and exists (select 1 from tags t where t.run_uuid = r.run_uuid and t.key = ? and t.value = ?)"
            args += ["bertflow.root", root]
        runs = db.execute(
            "select r.run_uuid, r.status, s.value from"
            f" (select run_uuid, status, start_time from runs r where {where}"
            "  order by start_time desc, run_uuid limit ?) r"
            " left join tags s on s.run_uuid = r.run_uuid and s.key = 'bertflow.stage'"
            " order by r.start_time desc, r.run_uuid",
            [*args, limit],
        ).fetchall()
    latest: dict[str, str] = {}
    for run_id, status, stage in runs:
        if stage and stage not in latest:
            latest[stage] = f"{run_id} ({(status or '').lower()})"
    return latest


def follow_moved_root(root: str, tracking_uri: str) -> None:
    """A root copied or moved since its own store was written: point the store's artifact URIs
    and root tags at where the root is now (:func:`relocate_store`), so models load and
    ``status`` finds the runs, and new artifacts land under this root (design choice 4). What a
    run does first, in the flow or answered from the manifests (``flows.finished``)."""
    if "://" in root and not root.startswith("file://"):
        return  # a remote root always has a shared store: its locations are its own
    if tracking_uri != default_tracking_uri(root):
        return  # a shared store (a server, another database): its locations are its own
    db = tracking_uri.removeprefix("sqlite:///")
    old = recorded_root(db, EXPERIMENT)
    here = os.path.abspath(root.removeprefix("file://"))
    if old is not None and old != here:
        n = relocate_store(db, old, here)
        log.warning(
            "root %s was recorded at %s (copied or moved): %d artifact locations and tags rewritten", here, old, n
        )


def relocate_store(db_path: str, old_root: str, new_root: str) -> int:
    """Rewrite a root-local SQLite store recorded at ``old_root`` for ``new_root``: artifact URIs
    (experiments, runs, logged models, model versions) and tag values naming paths under the old
    root. Returns the number of values rewritten. One transaction; values elsewhere untouched."""
    old, new = old_root.rstrip("/"), new_root.rstrip("/")
    changed = 0
    with sqlite3.connect(db_path, timeout=BUSY_SECONDS) as db:
        tables = {r[0] for r in db.execute("select name from sqlite_master where type = 'table'")}
        for table, column in _LOCATIONS:
            if table in tables:
                for prefix, to in ((f"file://{old}/", f"file://{new}/"), (f"{old}/", f"{new}/")):
                    changed += _replace_prefix(db, table, column, prefix, to)
        for table in _TAG_VALUES:
            if table in tables:
                changed += _replace_prefix(db, table, "value", f"{old}/", f"{new}/")
                changed += db.execute(f"update {table} set value = ? where value = ?", (new, old)).rowcount
    return changed


def _replace_prefix(db, table: str, column: str, prefix: str, to: str) -> int:
    return db.execute(
        f"update {table} set {column} = ? || substr({column}, ?) where substr({column}, 1, ?) = ?",
        (to, len(prefix) + 1, len(prefix), prefix),
    ).rowcount


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


def ui_url(tracking_uri: str, experiment_id: str) -> str:
    """The MLflow UI's page of the experiment's training runs. MLflow 3.17's UI opens every
    experiment on its GenAI view (traces, latency) unless the URL (or the sidebar's switch, turned
    in that browser) says ``workflowType=machine_learning``: its ``mlflow.experimentKind`` tag no
    longer decides (tests/flows/test_mlflow_ui_browser.py, headless Chromium). A tracking server's
    own address, else ``mlflow ui``'s."""
    base = tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else UI_DEFAULT
    return f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


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


def param_items(params: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, value) of each param a run records for ``params``: flattened, secrets redacted,
    long values cut, in key order."""
    return [(k, _param_value(v)) for k, v in sorted(flatten(redact(params)).items())]


def metric_items(metrics: dict[str, Any]) -> list[tuple[str, float]]:
    """(key, value) of each metric a run records for ``metrics``: the numbers (not booleans)."""
    return [(k, float(v)) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _param_value(v: Any) -> str:
    text = json.dumps(v) if isinstance(v, (list, tuple, dict)) else str(v)
    return text if len(text) <= _MAX_PARAM_LEN else text[: _MAX_PARAM_LEN - 3] + "..."
