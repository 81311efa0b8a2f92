"""An MLflow SQLite store read and written with ``sqlite3``: what a finished root's ``bertflow run``
(``flows.finished``) needs of it, without MLflow's client.

Importing MLflow's client and opening its SQLAlchemy store costs about 4 CPU-s and 220 MB, more
than everything else such a run does; it reads a few rows of the registry and writes one run (its
tags, params, metrics and one text artifact). ``flows.tracking.latest_stage_runs`` reads the same
tables for ``status`` (design choice 8 there).

Choices, and what they cost:

1. **Only the layout it was written for**: :func:`layout_differences` compares the columns of
   every table read or written here with MLflow 3.17's (:data:`LAYOUT`); on any difference (a store
   of another MLflow version) the caller goes through the flow and MLflow's own client, which
   migrates it. ``tests/flows/test_store_sqlite.py`` checks that a store MLflow creates has this
   layout and that a run written here reads back through MLflow as the one its client writes: an
   MLflow upgrade that changes the layout fails there, not silently slower.
2. **One transaction per run**: the run is written whole (ended FINISHED) or not at all, so a
   failure or a stop leaves no run ``RUNNING`` and nothing half recorded. Its text artifacts are
   written first; a failure after them leaves a folder that no run names.
3. **MLflow's default workspace only** (a server feature): rows of another workspace are not ours.
4. **What MLflow's client writes, nothing more**: the run row as ``SqlAlchemyStore.create_run``
   makes it (source ``UNKNOWN``, user ``unknown``, the ``mlflow.runName`` tag), metrics as
   ``log_batch`` stores them (NaN as 0 with ``is_nan``, infinities as the largest float) with
   their ``latest_metrics`` rows, artifacts under ``<experiment location>/<run id>/artifacts``.
"""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
import sqlite3
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass

from flows.tracking import BUSY_SECONDS

LAYOUT: dict[str, frozenset[str]] = {
    table: frozenset(columns.split())
    for table, columns in {
        "experiments": "experiment_id name artifact_location lifecycle_stage creation_time last_update_time workspace",
        "experiment_tags": "key value experiment_id",
        "runs": "run_uuid name source_type source_name entry_point_name user_id status start_time end_time "
        "source_version lifecycle_stage artifact_uri experiment_id deleted_time",
        "tags": "key value run_uuid",
        "params": "key value run_uuid",
        "metrics": "key value timestamp run_uuid step is_nan",
        "latest_metrics": "key value timestamp step is_nan run_uuid",
        "model_versions": "name version creation_time last_updated_time description user_id current_stage source "
        "run_id status status_message run_link storage_location workspace",
        "model_version_tags": "key value name version workspace",
        "registered_model_aliases": "alias version name workspace",
        "datasets": "dataset_uuid experiment_id name digest dataset_source_type dataset_source dataset_schema "
        "dataset_profile",
        "inputs": "input_uuid source_type source_id destination_type destination_id step",
        "input_tags": "input_uuid name value",
    }.items()
}
"""The columns of each table this module or ``flows.tracker_sqlite`` reads or writes, as MLflow
3.17 makes them."""
WORKSPACE = "default"
_DELETED = "Deleted_Internal"  # the current_stage of a deleted model version


@dataclass(frozen=True)
class Experiment:
    experiment_id: str
    artifact_location: str
    tags: dict[str, str]


@dataclass(frozen=True)
class Version:
    """A registered model version as ``flows.lineage`` and ``flows.model_registry`` read one."""

    name: str
    version: str
    description: str | None
    tags: dict[str, str]


def _reading(db_path: str):
    """A read-only connection: a store is never created or changed by looking."""
    uri = pathlib.Path(db_path).absolute().as_uri() + "?mode=ro"
    return contextlib.closing(sqlite3.connect(uri, uri=True, timeout=BUSY_SECONDS))


def layout_differences(db_path: str) -> list[str]:
    """The tables whose columns are not :data:`LAYOUT`'s, each as ``table: +added -missing``."""
    out = []
    with _reading(db_path) as db:
        for table, columns in LAYOUT.items():
            have = {r[1] for r in db.execute(f"pragma table_info({table})")}
            if have != columns:
                diff = [f"+{c}" for c in sorted(have - columns)] + [f"-{c}" for c in sorted(columns - have)]
                out.append(f"{table}: {' '.join(diff)}")
    return out


def experiment(db_path: str, name: str) -> Experiment | None:
    """The active experiment ``name`` with its tags, or None."""
    with _reading(db_path) as db:
        row = db.execute(
            "select experiment_id, artifact_location from experiments"
            " where name = ? and lifecycle_stage = 'active' and workspace = ?",
            (name, WORKSPACE),
        ).fetchone()
        if row is None:
            return None
        tags = dict(db.execute("select key, value from experiment_tags where experiment_id = ?", (row[0],)))
    return Experiment(str(row[0]), row[1] or "", tags)


def running_runs(db_path: str, experiment_id: str, root: str) -> list[str]:
    """The active runs of the experiment tagged ``bertflow.root`` = ``root`` still ``RUNNING``
    (their process died: the flow marks them KILLED when it starts)."""
    with _reading(db_path) as db:
        rows = db.execute(
            "select r.run_uuid from runs r join tags t on t.run_uuid = r.run_uuid"
            " where r.experiment_id = ? and r.lifecycle_stage = 'active' and r.status = 'RUNNING'"
            " and t.key = 'bertflow.root' and t.value = ?",
            (int(experiment_id), root),
        ).fetchall()
    return [r[0] for r in rows]


def model_versions(db_path: str, name: str) -> list[Version]:
    """Every version of the registered model ``name`` that is not deleted, oldest first."""
    with _reading(db_path) as db:
        rows = db.execute(
            "select version, description from model_versions where name = ? and workspace = ?"
            " and (current_stage is null or current_stage != ?) order by version",
            (name, WORKSPACE, _DELETED),
        ).fetchall()
        tags: dict[str, dict[str, str]] = {str(v): {} for v, _ in rows}
        for version, key, value in db.execute(
            "select version, key, value from model_version_tags where name = ? and workspace = ?", (name, WORKSPACE)
        ):
            tags.setdefault(str(version), {})[key] = value
    return [Version(name, str(v), description, tags[str(v)]) for v, description in rows]


def model_aliases(db_path: str, name: str) -> dict[str, str]:
    """alias -> version of the registered model ``name``."""
    with _reading(db_path) as db:
        rows = db.execute(
            "select alias, version from registered_model_aliases where name = ? and workspace = ?", (name, WORKSPACE)
        ).fetchall()
    return {alias: str(version) for alias, version in rows}


def local_artifacts(location: str) -> str | None:
    """The local folder of a ``file://`` artifact location, as MLflow resolves it (None: not local)."""
    if not location.startswith("file:"):
        return None
    return urllib.request.url2pathname(urllib.parse.urlparse(location).path)


def sanitized(value: float) -> tuple[float, bool]:
    """(value, is_nan) as MLflow stores a metric: NaN as 0, infinities as the largest float."""
    if math.isnan(value):
        return 0.0, True
    if math.isinf(value):
        return (1.7976931348623157e308 if value > 0 else -1.7976931348623157e308), False
    return value, False


def write_run(
    db_path: str,
    exp: Experiment,
    name: str,
    tags: dict[str, str],
    params: list[tuple[str, str]],
    metrics: list[tuple[str, float, int]],
    texts: dict[str, str],
    start_ms: int,
) -> str:
    """Record one finished run in ``exp``: its tags, params, metrics ``(key, value, time in ms)``
    at step 0 and text artifacts (path -> text) (choices 2 and 4). Returns its id."""
    run_id = uuid.uuid4().hex
    artifact_uri = f"{exp.artifact_location.rstrip('/')}/{run_id}/artifacts"
    folder = local_artifacts(artifact_uri)
    if folder is None:
        raise ValueError(f"artifact location {exp.artifact_location} is not a local folder")
    for path, text in texts.items():
        target = os.path.join(folder, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
    latest: dict[str, tuple[int, float, bool]] = {}
    rows = []
    for key, value, at in metrics:
        stored, is_nan = sanitized(float(value))
        rows.append((key, stored, at, run_id, 0, is_nan))
        if key not in latest or (at, stored) > latest[key][:2]:  # MLflow's latest: by step, time, value
            latest[key] = (at, stored, is_nan)
    all_tags = {**tags, "mlflow.runName": name}
    with contextlib.closing(sqlite3.connect(db_path, timeout=BUSY_SECONDS)) as db, db:
        db.execute(
            "insert into runs (run_uuid, name, source_type, source_name, entry_point_name, user_id, status,"
            " start_time, end_time, source_version, lifecycle_stage, artifact_uri, experiment_id, deleted_time)"
            " values (?, ?, 'UNKNOWN', '', '', 'unknown', 'FINISHED', ?, ?, '', 'active', ?, ?, null)",
            (run_id, name, start_ms, int(time.time() * 1000), artifact_uri, int(exp.experiment_id)),
        )
        db.executemany("insert into tags (key, value, run_uuid) values (?, ?, ?)",
                       [(k, v, run_id) for k, v in all_tags.items()])  # fmt: skip
        db.executemany("insert into params (key, value, run_uuid) values (?, ?, ?)",
                       [(k, v, run_id) for k, v in params])  # fmt: skip
        db.executemany(
            "insert or ignore into metrics (key, value, timestamp, run_uuid, step, is_nan) values (?, ?, ?, ?, ?, ?)",
            rows,
        )
        db.executemany(
            "insert into latest_metrics (key, value, timestamp, step, is_nan, run_uuid) values (?, ?, ?, 0, ?, ?)",
            [(k, value, at, is_nan, run_id) for k, (at, value, is_nan) in latest.items()],
        )
    return run_id
