"""A flow's MLflow runs written with ``sqlite3`` when its store is a SQLite file of the layout
MLflow 3.17 makes: a stage command's tracking without importing MLflow.

Importing MLflow's client and its SQLAlchemy store costs 1.0-1.2 CPU-s in every ``bertflow
stage`` command (a third of its fixed cost, profiled: docs/speed.md) and in every process a run
starts for a downstream unit or pretraining (:func:`log_fn_from_env`), for a handful of rows a run:
the experiment, a parent and a child run, their tags, params, metrics, dataset inputs and a few
text artifacts. :class:`SqliteTracker` writes those rows itself; everything else (the model
registry, figures, metric histories, searches) still goes through MLflow's client, made on first
use (:attr:`SqliteTracker.client`), on the same file.

Choices, and what they cost:

1. **Only a store it knows**: :func:`open_tracker` gives a :class:`SqliteTracker` for a
   ``sqlite:///`` store at the revision of this MLflow's cached empty database
   (``flows.mlflow_store.schema_template``, made by MLflow's own migrations once per MLflow
   version) whose tables have the columns of ``flows.store_sqlite.LAYOUT``; a new store is a copy
   of that database with MLflow's default experiment, as MLflow's client makes it. Any other store
   (a server, another database, an older or newer layout, no template yet) gets MLflow's own
   client (``flows.tracking.Tracker``), which migrates it.
2. **What MLflow's client writes, row for row**: ``tests/flows/test_tracker_sqlite.py`` runs the
   same calls through both on two stores and compares every row but ids and times, and reads the
   runs written here back through MLflow.
3. **A busy store is waited for, and said so**: every write is one ``BEGIN IMMEDIATE``
   transaction. Where another process holds the file, SQLite waits
   ``flows.tracking.SQLITE_BUSY_SECONDS``, then the call is tried again after a warning (``MLflow
   store busy ...: log_params retried in 0.4 s``), as MLflow's client's calls are
   (``flows.tracking``'s design choice 1), for up to ``BUSY_SECONDS`` in all.
4. **Refusals as MLflow's**: a param logged again with another value, a run or an experiment that
   is deleted or missing raise :class:`TrackingRefused` with MLflow's wording.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import time
import urllib.parse
import uuid
from typing import Any

from flows.mlflow_store import BUSY_SECONDS, publish_copy, revision, schema_template, sqlite_path
from flows.store_sqlite import WORKSPACE, layout_differences, local_artifacts, running_runs, sanitized
from flows.tracking import (
    ENV_RUN_ID,
    ENV_TRACKING_URI,
    EXPERIMENT_KIND,
    SQLITE_BUSY_SECONDS,
    Tracker,
    _client,
    is_busy,
    metric_items,
    param_items,
)

log = logging.getLogger("bertflow.flow")

ENV_MLFLOW_CLIENT = "BERTFLOW_MLFLOW_CLIENT"
"""``1``: every run through MLflow's own client, as before this module (a benchmark's baseline)."""
MAX_TAG_VALUE = 8000  # MLflow's MAX_TAG_VAL_LENGTH: longer tag values are cut
_SERVER_ROOT = "_MLFLOW_SERVER_ARTIFACT_ROOT"  # MLflow's default artifact root inside its server
_USABLE: dict[str, bool] = {}


class TrackingRefused(ValueError):
    """A write MLflow's store refuses too (its message)."""


def open_tracker(uri: str) -> Tracker:
    """A tracker for ``uri``: :class:`SqliteTracker` where choice 1 allows, else MLflow's client."""
    path = sqlite_path(uri)
    if path is not None and os.environ.get(ENV_MLFLOW_CLIENT) != "1" and usable(uri, path):
        return SqliteTracker(uri, path)
    return Tracker(uri)


def log_fn_from_env():
    """In a stage's own process (a downstream unit, pretraining): a ``log_fn`` writing to the
    MLflow run the flow passed through the environment, or None (no run given, or a rank other
    than 0). Through :func:`open_tracker`: such a process imports MLflow only where it must."""
    run_id = os.environ.get(ENV_RUN_ID)
    if not run_id or int(os.environ.get("RANK", "0")) != 0:
        return None
    tracker = open_tracker(os.environ[ENV_TRACKING_URI])

    def log_to_mlflow(metrics: dict[str, float], step: int) -> None:
        tracker.log_metrics(run_id, metrics, step)

    return log_to_mlflow


def without_mlflow(uri: str) -> bool:
    """Whether :func:`open_tracker` can do without MLflow's client for ``uri``, judged without
    touching the store: what ``flows.worker`` asks before importing MLflow ahead of time."""
    path = sqlite_path(uri)
    if path is None or os.environ.get(ENV_MLFLOW_CLIENT) == "1" or not _plain_mlflow():
        return False
    return _USABLE.get(uri, True) and os.path.exists(schema_template())


def _plain_mlflow() -> bool:
    """MLflow's single-tenant store writing under ``./mlruns`` by default (what the copy assumes)."""
    return not os.environ.get(_SERVER_ROOT) and os.environ.get("MLFLOW_ENABLE_WORKSPACES", "").lower() not in (
        "1", "true")  # fmt: skip


def usable(uri: str, path: str) -> bool:
    """Prepare ``path`` as choice 1 says, under the store's lock (``flows.mlflow_store``), once a
    process: True when :class:`SqliteTracker` may write it."""
    if uri not in _USABLE:
        from flows.filelock import exclusive

        template = schema_template()
        ok = False
        if _plain_mlflow() and os.path.exists(template):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            busy = f"MLflow store {path}: another process has held {path}.lock for {BUSY_SECONDS:.0f} s"
            with exclusive(path + ".lock", BUSY_SECONDS, busy):
                if not os.path.exists(path):  # the template's copy with MLflow's default experiment
                    publish_copy(template, path, _default_experiment)
                head = revision(template)
                ok = head is not None and revision(path) == head and not layout_differences(path)
        _USABLE[uri] = ok
    return _USABLE[uri]


def _default_experiment(path: str) -> None:
    """MLflow's experiment 0, ``Default``, as its store adds it to a database without one: its
    artifacts under ``./mlruns/0`` of the process that opens the store."""
    location = os.path.join(os.path.abspath(os.getcwd()), "mlruns", "0")
    now = _now()
    with _writing(path, "the default experiment") as db:
        db.execute(
            "insert or ignore into experiments (experiment_id, name, artifact_location, lifecycle_stage,"
            " creation_time, last_update_time, workspace) values (0, 'Default', ?, 'active', ?, ?, ?)",
            (location, now, now, WORKSPACE),
        )


def _now() -> int:
    return int(time.time() * 1000)


def _connect(path: str) -> sqlite3.Connection:
    return sqlite3.connect(path, timeout=SQLITE_BUSY_SECONDS, isolation_level=None)


def _retry(what: str, call):
    """``call()``, again while the store is busy (choice 3): SQLite waits
    ``flows.tracking.SQLITE_BUSY_SECONDS`` each time, then a warning says what waits, as the
    retries of MLflow's client say it, up to ``BUSY_SECONDS`` in all."""
    start, wait = time.monotonic(), 0.1
    while True:
        try:
            return call()
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() + wait - start > BUSY_SECONDS:
                raise
            log.warning("MLflow store busy (%s): %s retried in %.1f s", str(exc)[:80], what, wait)
            time.sleep(wait)
            wait = min(wait * 2, 5.0)


def _read(path: str, what: str, sql: str, args: tuple = ()) -> list[tuple]:
    with contextlib.closing(_connect(path)) as db:
        return _retry(what, lambda: db.execute(sql, args).fetchall())


@contextlib.contextmanager
def _writing(path: str, what: str):
    """One write transaction (choice 3): committed whole, or rolled back on any error; its start
    and its commit wait for a busy store."""
    with contextlib.closing(_connect(path)) as db:
        _retry(what, lambda: db.execute("begin immediate"))
        try:
            yield db
            _retry(what, lambda: db.execute("commit"))
        except BaseException:
            if db.in_transaction:
                db.execute("rollback")
            raise


def _tag(key: str, value: Any) -> tuple[str, str]:
    return key, str(value)[:MAX_TAG_VALUE]


def _active_run(db: sqlite3.Connection, run_id: str) -> tuple[int, str]:
    """(experiment id, artifact URI) of an active run; refused as MLflow refuses it otherwise."""
    row = db.execute("select experiment_id, artifact_uri, lifecycle_stage from runs where run_uuid = ?",
                     (run_id,)).fetchone()  # fmt: skip
    if row is None:
        raise TrackingRefused(f"Run with id={run_id} not found")
    if row[2] != "active":
        raise TrackingRefused(f"The run {run_id} must be in the 'active' state. Current state is {row[2]}.")
    return row[0], row[1]


_SOURCES = {"": "local", "file": "local", "gs": "gs", "s3": "s3", "hdfs": "hdfs", "http": "http", "https": "http"}


def dataset_source(url: str) -> tuple[str, str] | None:
    """(source type, source JSON) MLflow's dataset source registry gives ``url``, for the kinds of
    URL a stage reads (a local path, ``file:///``, ``gs://``, ``s3://``, ``hdfs://``, HTTP); None
    for any other (the caller asks MLflow)."""
    scheme = urllib.parse.urlparse(url).scheme
    if scheme not in _SOURCES or (scheme == "file" and not url.startswith("file:///")):
        return None
    kind = _SOURCES[scheme]
    return kind, json.dumps({"url" if kind == "http" else "uri": url})


class SqliteTracker(Tracker):
    """``flows.tracking.Tracker``'s runs written with ``sqlite3`` (see the module's choices)."""

    def __init__(self, uri: str, path: str):
        self.uri, self.path = uri, path
        self.experiment_id: str | None = None
        self._mlflow = None

    @property
    def client(self):
        """MLflow's client on the same store, made on first use (registry, figures, histories)."""
        if self._mlflow is None:
            self._mlflow = _client(self.uri)
        return self._mlflow

    def use_experiment(self, name: str, artifact_root: str | None = None) -> str:
        found = self._experiment(name)
        if found is None and artifact_root:
            location = artifact_root if "://" in artifact_root else "file://" + os.path.abspath(artifact_root)
            now = _now()
            try:
                with _writing(self.path, "create_experiment") as db:
                    cursor = db.execute(
                        "insert into experiments (name, artifact_location, lifecycle_stage, creation_time,"
                        " last_update_time, workspace) values (?, ?, 'active', ?, ?, ?)",
                        (name, location, now, now, WORKSPACE),
                    )
                    db.execute("insert into experiment_tags (key, value, experiment_id) values (?, ?, ?)",
                               ("mlflow.experimentKind", EXPERIMENT_KIND, cursor.lastrowid))  # fmt: skip
                self.experiment_id = str(cursor.lastrowid)
                return self.experiment_id
            except sqlite3.IntegrityError:  # another run made it since the lookup: use theirs
                log.info("MLflow experiment %r was created by another run meanwhile: using it", name)
                found = self._experiment(name)
        if found is None or found[1] != "active":  # none without a location, or deleted: MLflow decides
            return super().use_experiment(name, artifact_root)
        self.experiment_id = found[0]
        kind = _read(
            self.path,
            "get_experiment",
            "select value from experiment_tags where experiment_id = ? and key = ?",
            (int(found[0]), "mlflow.experimentKind"),
        )
        if not kind or kind[0][0] != EXPERIMENT_KIND:
            with _writing(self.path, "set_experiment_tag") as db:
                db.execute("insert or replace into experiment_tags (key, value, experiment_id) values (?, ?, ?)",
                           ("mlflow.experimentKind", EXPERIMENT_KIND, int(found[0])))  # fmt: skip
        return self.experiment_id

    def _experiment(self, name: str) -> tuple[str, str] | None:
        rows = _read(self.path, "get_experiment_by_name",
                     "select experiment_id, lifecycle_stage from experiments where name = ? and workspace = ?",
                     (name, WORKSPACE))  # fmt: skip
        return (str(rows[0][0]), rows[0][1]) if rows else None

    def start_run(self, name: str, parent_id: str | None = None, tags: dict[str, str] | None = None) -> str:
        all_tags = dict(tags or {})
        if parent_id:
            all_tags["mlflow.parentRunId"] = parent_id
        all_tags.setdefault("mlflow.runName", name)
        run_id = uuid.uuid4().hex
        with _writing(self.path, "create_run") as db:
            row = db.execute("select artifact_location, lifecycle_stage from experiments where experiment_id = ?",
                             (int(self.experiment_id),)).fetchone()  # fmt: skip
            if row is None or row[1] != "active":
                raise TrackingRefused(f"The experiment {self.experiment_id} must be in the 'active' state.")
            artifact_uri = f"{(row[0] or '').rstrip('/')}/{run_id}/artifacts"
            db.execute(
                "insert into runs (run_uuid, name, source_type, source_name, entry_point_name, user_id, status,"
                " start_time, end_time, source_version, lifecycle_stage, artifact_uri, experiment_id, deleted_time)"
                " values (?, ?, 'UNKNOWN', '', '', ?, 'RUNNING', ?, null, '', 'active', ?, ?, null)",
                (run_id, all_tags["mlflow.runName"], all_tags.get("mlflow.user", "unknown"), _now(), artifact_uri,
                 int(self.experiment_id)),
            )  # fmt: skip
            db.executemany("insert into tags (key, value, run_uuid) values (?, ?, ?)",
                           [(k, str(v), run_id) for k, v in all_tags.items()])  # fmt: skip
        return run_id

    def _terminate(self, run_id: str, status: str) -> None:
        with _writing(self.path, "set_terminated") as db:
            _active_run(db, run_id)
            db.execute("update runs set status = ?, end_time = ? where run_uuid = ?", (status, _now(), run_id))

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        items = param_items(params)
        with _writing(self.path, "log_params") as db:
            _active_run(db, run_id)
            have = dict(db.execute("select key, value from params where run_uuid = ?", (run_id,)))
            changed = [{"key": k, "old_value": have[k], "new_value": v} for k, v in items if k in have and have[k] != v]
            if changed:
                raise TrackingRefused(f"Changing param values is not allowed. Params were already logged='{changed}' "
                                      f"for run ID='{run_id}'.")  # fmt: skip
            db.executemany("insert into params (key, value, run_uuid) values (?, ?, ?)",
                           [(k, v, run_id) for k, v in dict(items).items() if k not in have])  # fmt: skip

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        now = _now()
        rows = [(k, *sanitized(v), now, step) for k, v in metric_items(metrics)]
        if not rows:
            return
        with _writing(self.path, "log_metrics") as db:
            _active_run(db, run_id)
            latest = {
                key: (s, t, v)
                for key, v, t, s in db.execute(
                    "select key, value, timestamp, step from latest_metrics where run_uuid = ?", (run_id,)
                )
            }
            changed = {}
            for key, value, is_nan, at, at_step in rows:
                db.execute(
                    "insert or ignore into metrics (key, value, timestamp, run_uuid, step, is_nan)"
                    " values (?, ?, ?, ?, ?, ?)",
                    (key, value, at, run_id, at_step, is_nan),
                )
                if key not in latest or (at_step, at, value) > latest[key]:  # MLflow's: by step, time, value
                    latest[key] = (at_step, at, value)
                    changed[key] = (value, at, at_step, is_nan)
            db.executemany(
                "insert or replace into latest_metrics (key, value, timestamp, step, is_nan, run_uuid)"
                " values (?, ?, ?, ?, ?, ?)",
                [(k, *v, run_id) for k, v in changed.items()],
            )

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        with _writing(self.path, "set_tags") as db:
            _active_run(db, run_id)
            for key, value in (_tag(k, v) for k, v in tags.items()):
                db.execute("insert or replace into tags (key, value, run_uuid) values (?, ?, ?)", (key, value, run_id))
                if key == "mlflow.runName":
                    db.execute("update runs set name = ? where run_uuid = ?", (value, run_id))

    def log_text(self, run_id: str, text: str, path: str) -> None:
        with contextlib.closing(_connect(self.path)) as db:
            _, artifact_uri = _retry("log_text", lambda: _active_run(db, run_id))
        folder = local_artifacts(artifact_uri or "")
        if folder is None:  # artifacts in a bucket: MLflow's artifact repository writes them
            return super().log_text(run_id, text, path)
        target = os.path.join(folder, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)

    def mark_killed_runs(self, root: str) -> list[str]:
        if self.experiment_id is None:
            return []
        runs = running_runs(self.path, self.experiment_id, root)
        for run_id in runs:
            self._terminate(run_id, "KILLED")
        return runs

    def log_datasets(
        self, run_id: str, inputs: dict[str, str], fingerprints: dict[str, str], context: str = "input"
    ) -> None:
        sources = {name: dataset_source(url) for name, url in inputs.items()}
        if any(s is None for s in sources.values()):  # a kind of URL not known here: MLflow resolves it
            return super().log_datasets(run_id, inputs, fingerprints, context)
        datasets: dict[tuple[str, str], tuple[str, str]] = {}
        for name, (kind, source) in sorted(sources.items()):
            config = {"name": name, "source": source, "source_type": kind, "schema": ""}
            digest = fingerprints.get(name, "")[:36] or hashlib.sha256(json.dumps(config).encode()).hexdigest()[:8]
            datasets.setdefault((name, digest), (kind, source))  # MLflow keeps the first of a name and digest
        if not datasets:
            return
        with _writing(self.path, "log_inputs") as db:
            experiment_id, _ = _active_run(db, run_id)
            for (name, digest), (kind, source) in datasets.items():
                row = db.execute(
                    "select dataset_uuid from datasets where experiment_id = ? and name = ? and digest = ?",
                    (experiment_id, name, digest),
                ).fetchone()
                dataset = row[0] if row else uuid.uuid4().hex
                if row is None:
                    db.execute(
                        "insert into datasets (dataset_uuid, experiment_id, name, digest, dataset_source_type,"
                        " dataset_source, dataset_schema, dataset_profile) values (?, ?, ?, ?, ?, ?, null, null)",
                        (dataset, experiment_id, name, digest, kind, source),
                    )
                if db.execute(
                    "select 1 from inputs where source_type = 'DATASET' and source_id = ?"
                    " and destination_type = 'RUN' and destination_id = ?",
                    (dataset, run_id),
                ).fetchone():
                    continue
                edge = uuid.uuid4().hex
                db.execute("insert into inputs (input_uuid, source_type, source_id, destination_type, destination_id)"
                           " values (?, 'DATASET', ?, 'RUN', ?)", (edge, dataset, run_id))  # fmt: skip
                db.execute("insert into input_tags (input_uuid, name, value) values (?, 'mlflow.data.context', ?)",
                           (edge, context))  # fmt: skip
