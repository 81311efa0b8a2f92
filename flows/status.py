"""``bertflow status``: every stage of a root, its state (done, stale and why, missing, running),
its counts, its time and its MLflow run. Reads manifests and the tracking store; runs nothing,
starts no server."""

from __future__ import annotations

import os
from typing import Any

from flows.checks import LOCK_NAME, is_local, local_path
from flows.figures import format_figure, key_figures
from flows.presets import RunConfig
from flows.runner import stage_state
from flows.table import get_stage, stage_names


def _running(root: str) -> str | None:
    """Who holds the root's lock, if anyone (a run in progress)."""
    if not is_local(root):
        return None
    path = os.path.join(local_path(root), LOCK_NAME)
    if not os.path.exists(path):
        return None
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except BlockingIOError:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
    finally:
        os.close(fd)


def _mlflow_runs(root: str, uri: str | None) -> dict[str, str]:
    """stage -> id of its latest MLflow run (when the tracking store exists). In the root's own
    store every run is the root's (also when the root was copied or moved since); in a shared one,
    the runs tagged with this root. A SQLite store is read without MLflow
    (``flows.tracking.latest_stage_runs``); only a server or another database imports it."""
    from flows.tracking import latest_stage_runs, sqlite_path

    own = uri is None
    if own:
        db = os.path.join(local_path(root), "mlflow.db") if is_local(root) else None
        if not db or not os.path.exists(db):
            return {}
        uri = f"sqlite:///{db}"
    try:
        db = sqlite_path(uri)
        if db is not None:
            return latest_stage_runs(db, "bertflow", None if own else root)
        return _server_runs(root, uri)
    except Exception:  # status must answer even when the store does not
        return {}


def _server_runs(root: str, uri: str) -> dict[str, str]:
    """:func:`_mlflow_runs` for a store MLflow must be asked (a server, a database URL)."""
    from flows.tracking import Tracker

    tracker = Tracker(uri)
    exp = tracker.client.get_experiment_by_name("bertflow")
    if exp is None:
        return {}
    tracker.experiment_id = exp.experiment_id
    runs = tracker.runs_with_tag("bertflow.root", root, order_by=["attributes.start_time DESC"], max_results=500)
    latest: dict[str, str] = {}
    for r in runs:
        stage = r.data.tags.get("bertflow.stage")
        if stage and stage not in latest:
            latest[stage] = f"{r.info.run_id} ({r.info.status.lower()})"
    return latest


def root_missing(root: str) -> str:
    """Why ``root`` is no run root (nothing there, or a file), or "" when it is a folder (an empty
    one included: then every stage is simply missing)."""
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(root)
        if not fs.exists(path):
            return f"no run root at {root}: the folder does not exist (nothing has run there, or --root is mistyped)"
        if not fs.isdir(path):
            return f"{root} is a file, not a run root folder"
    except OSError as exc:
        return f"cannot read the run root {root}: {exc}"
    return ""


def collect_status(
    cfg: RunConfig, root: str, mlflow_uri: str | None = None, verify: bool = False
) -> list[dict[str, Any]]:
    holder = _running(root)
    runs = _mlflow_runs(root, mlflow_uri)
    rows = []
    behind: str | None = None  # the first stage not done: everything after it will rerun
    for name in stage_names(cfg):
        s = stage_state(name, cfg, root, checksums=verify)
        state = s.state
        if state == "done" and behind is not None:
            what = "restarts" if get_stage(name).resumable else "reruns"
            state, s.reasons = "stale", [f"after {behind}: {what} if that changes its input"]
        if state != "done" and behind is None:
            behind = name
        if holder and state != "done":
            state = "running"
        m = s.manifest
        rows.append(
            {
                "stage": name,
                "state": state,
                "why": s.reasons,
                "url": s.url,
                "figures": key_figures(get_stage(name).figures, m.counts) if m else {},
                "seconds": round(m.seconds, 1) if m else None,
                "mlflow_run": runs.get(name, ""),
            }
        )
    return rows


def print_status(rows: list[dict[str, Any]], root: str) -> None:
    from rich.console import Console
    from rich.table import Table

    colours = {"done": "green", "stale": "yellow", "missing": "red", "running": "cyan"}
    table = Table(title=f"bertflow status: {root}")
    for col in ("stage", "state", "why", "key figures", "time (s)", "MLflow run"):
        table.add_column(col, overflow="fold")
    for r in rows:
        figs = "\n".join(f"{k}={format_figure(v)}" for k, v in r["figures"].items())
        table.add_row(
            r["stage"],
            f"[{colours.get(r['state'], 'white')}]{r['state']}",
            "\n".join(r["why"]),
            figs,
            "" if r["seconds"] is None else f"{r['seconds']:.1f}",
            r["mlflow_run"],
        )
    Console(width=max(140, Console().width)).print(table)
