"""What the flows show and record of a stage: key figures, Markdown tables, MLflow artifacts."""

from __future__ import annotations

import fnmatch
import logging
from typing import TYPE_CHECKING, Any

from pipeline.schema.storage import join_url

if TYPE_CHECKING:
    from flows.stages import StageResult
    from flows.tracking import Tracker

log = logging.getLogger("bertflow.flow")


def key_figures(stage: str, counts: dict[str, float]) -> dict[str, float]:
    """The counts a stage's row of the table names (its first three if none match)."""
    from flows.stages import get_stage

    wanted = get_stage(stage).figures
    picked = {k: v for k, v in counts.items() if any(fnmatch.fnmatchcase(k, w) for w in wanted)}
    return picked or dict(list(counts.items())[:3])


def format_figure(v: Any) -> str:
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.4g}"
    return str(int(v)) if isinstance(v, float) else str(v)


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


def log_stage_artifacts(tracker: Tracker, run_id: str, stage: str, result: StageResult) -> None:
    """Per stage: its manifest, and what shows its output best (vocab, decoded examples, the loss
    curve, the results table)."""
    if result.manifest is None:
        return
    tracker.log_text(run_id, result.manifest.to_json(), "manifest.json")
    group = stage.split("/", 1)[0]
    try:
        if group == "vocab":
            tracker.log_text(run_id, _read_text(join_url(result.url, "vocab.txt")), "vocab.txt")
        elif group in ("corpus", "examples"):
            from flows.inspect import inspect_url

            tracker.log_text(run_id, inspect_url(result.url, 5), f"{group}_sample.txt")
        elif group == "pretrain":
            _log_loss_plot(tracker, run_id, result)
        elif group == "finetune":
            rows = ["| metric | value |", "|---|---|"]
            rows += [f"| {k} | {format_figure(v)} |" for k, v in sorted(result.counts.items())]
            tracker.log_text(run_id, "\n".join(rows) + "\n", "results.md")
    except Exception as exc:  # a missing extra artifact must not fail the stage
        log.warning("stage %s: extra artifacts not logged (%s)", stage, exc)


def _read_text(url: str) -> str:
    import fsspec

    with fsspec.open(url, "r") as f:
        return f.read()


def _log_loss_plot(tracker: Tracker, run_id: str, result: StageResult) -> None:
    """The loss curves the training process logged to this run, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    plotted = False
    for name in ("mlm_loss", "nsp_loss", "eval_mlm_loss"):
        history = sorted(tracker.client.get_metric_history(run_id, name), key=lambda m: m.step)
        if history:
            ax.plot([m.step for m in history], [m.value for m in history], label=name)
            plotted = True
    if not plotted:
        plt.close(fig)
        return
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    ax.set_title(f"pretraining: {result.url}")
    tracker.client.log_figure(run_id, fig, "loss_curve.png")
    plt.close(fig)
