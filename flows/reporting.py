"""What the flows show and record of a stage: key figures, Markdown tables, MLflow artifacts.

Generic over the stage table: a row says which counts are its key figures and what extra
artifacts show its output (``Stage.figures``, ``Stage.artifacts``); nothing here names a stage.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from flows.figures import format_figure

if TYPE_CHECKING:
    from flows.calls import StageResult
    from flows.table import Stage
    from flows.tracking import Tracker

log = logging.getLogger("bertflow.flow")


def run_summary(preset: str, root: str, cfg: Any, results: list[StageResult], ids: tuple[str, str, str],
                registered: tuple[str | None, str | None], start: float) -> dict[str, Any]:  # fmt: skip
    """What a run returns (and the CLI prints): every stage's status, time, figures, URL.
    ``ids``: (tracking URI, experiment id, parent run id); ``registered``: (version, alias).
    The flow's (``flows.prefect_tasks.summary``) and a finished root's (``flows.finished``)."""
    import time

    from flows.figures import key_figures
    from flows.table import get_stage

    (uri, experiment_id, run_id), (version, alias) = ids, registered
    return {
        "preset": preset,
        "root": root,
        "tracking_uri": uri,
        "experiment_id": experiment_id,
        "parent_run_id": run_id,
        "model_name": cfg.model_name,
        "model_version": version,
        "model_alias": alias,
        "seconds": time.time() - start,
        "stages": [
            {
                "stage": r.stage,
                "status": r.status,
                "seconds": round(r.seconds, 1),
                "figures": key_figures(get_stage(r.stage).figures, r.counts),
                "url": r.url,
            }
            for r in results
        ],
    }


def stage_markdown(result: StageResult) -> str:
    lines = [f"### {result.stage}: {result.status} in {result.seconds:.1f} s", "", f"`{result.url}`", ""]
    lines += ["| figure | value |", "|---|---|"]
    lines += [f"| {k} | {format_figure(v)} |" for k, v in sorted(result.counts.items())]
    if result.manifest is not None:
        lines += ["", "| file | bytes | rows |", "|---|---|---|"]
        lines += [f"| {f.path} | {f.size} | {f.rows if f.rows is not None else ''} |" for f in result.manifest.files]
    return "\n".join(lines)


def summary_markdown(summary: dict[str, Any]) -> str:
    lines = ["| stage | status | seconds | key figures | output |", "|---|---|---|---|---|"]
    for s in summary["stages"]:
        figs = ", ".join(f"{k}={format_figure(v)}" for k, v in s["figures"].items())
        lines.append(f"| {s['stage']} | {s['status']} | {s['seconds']} | {figs} | {s['url']} |")
    return "\n".join(lines)


def log_stage_artifacts(tracker: Tracker, run_id: str, row: Stage, result: StageResult) -> None:
    """Per stage: its manifest, and what its row says shows its output best (the vocab, decoded
    documents or examples, the loss curve, the results table)."""
    if result.manifest is None:
        return
    tracker.log_text(run_id, result.manifest.to_json(), "manifest.json")
    if row.artifacts is None:
        return
    try:
        row.artifacts(tracker, run_id, result)
    except Exception as exc:  # a missing extra artifact must not fail the stage
        log.warning("stage %s: extra artifacts not logged (%s)", row.name, exc)
