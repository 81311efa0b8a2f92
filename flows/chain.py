"""Running some of the chain's stages in a flow, and what follows them: the results table and
the registered model. Both flows (``pretrain`` and the per-stage ones) call :func:`run_stages`
then :func:`finish`, so what a stage row says (units to fan out, a model to publish) decides
what happens, never a stage's name.
"""

from __future__ import annotations

from typing import Any

from flows.calls import StageResult
from flows.fanout import fan_out
from flows.figures import key_figures
from flows.prefect_tasks import (
    Tracking,
    register_model_task,
    results_table_task,
    stage_options,
    stage_task,
    summary,
    unwrap,
)
from flows.presets import RunConfig
from flows.table import get_stage
from pipeline.schema.manifest import ManifestError, read_manifest


def run_stages(names: list[str], cfg: RunConfig, root: str, forced: set[str] | bool, tracking: Tracking,
               given: dict[str, str] | None = None) -> list[StageResult]:  # fmt: skip
    """Run (or skip) the stages ``names`` in order: each one task, a stage made of units fanned
    out unit by unit (all such stages at once, after the others). ``forced``: the stages to rerun
    (True: all of them)."""

    def is_forced(name: str) -> bool:
        return forced if isinstance(forced, bool) else name in forced

    plain = [n for n in names if get_stage(n).units is None]
    fanned = [n for n in names if get_stage(n).units is not None]
    results, previous = [], None
    for n in plain:
        # each stage waits for the one before (wait_for): Prefect's run graph draws the chain
        state = stage_task.with_options(**stage_options(n))(
            n, cfg, root, is_forced(n), tracking, given, wait_for=[previous] if previous else None, return_state=True
        )
        results.append(unwrap(state))  # a failed stage raises its error here
        previous = state
    if fanned:
        forced_fanned = forced if isinstance(forced, bool) else set(forced)
        results += fan_out(fanned, cfg, root, forced_fanned, tracking, given, after=previous)
    return results


def evaluated_export(downstream: list[StageResult]) -> StageResult | None:
    """The export the downstream tasks of a run without an export stage (``stage-finetune``, the
    weekly re-evaluation) fine-tuned, when every task read the same one and it is a bertflow
    export (a folder with its manifest): the registry step then rescores the version made from it
    (its champion alias moves only by score). None for a released model, or for tasks that read
    different models."""
    models = {r.inputs.get("model") for r in downstream}
    if len(models) != 1 or None in models:
        return None
    (url,) = models
    try:
        manifest = read_manifest(url)
    except (ManifestError, FileNotFoundError):
        return None
    if manifest.stage != "export":
        return None
    return StageResult("export", "skipped", 0.0, manifest.url, manifest.counts, manifest)


def finish(preset: str, root: str, cfg: RunConfig, tracking: Tracking, results: list[StageResult],
           start: float) -> dict[str, Any]:  # fmt: skip
    """After the stages: the downstream results table (when a downstream task ran), the model of
    the stage that publishes one (or, with no such stage, the export the tasks evaluated)
    registered (idempotent: once per export, ``flows.model_registry``) and scored, the parent
    run's key figures; the flow's summary."""
    downstream = [r for r in results if get_stage(r.stage).task]
    if downstream:
        results_table_task(cfg, root, tracking, wait_for=downstream)
    registered = None
    model = next((r for r in results if get_stage(r.stage).publishes_model), None) or evaluated_export(downstream)
    if model is not None:
        registered = register_model_task(cfg, model, downstream, tracking)
    tracker = tracking.tracker()
    if results and all(r.status == "skipped" for r in results):  # the one MLflow run of a run that did nothing
        note = f"Nothing to do: all {len(results)} stages were up to date (no stage run was opened)."
        tracker.set_tags(tracking.parent_run_id, {"bertflow.outcome": "nothing to do", "mlflow.note.content": note})
    for r in results:
        figures = key_figures(get_stage(r.stage).figures, r.counts)
        tracker.log_metrics(tracking.parent_run_id, {f"{r.stage.replace('/', '.')}.{k}": v for k, v in figures.items()})
    return summary(preset, root, tracking, cfg, results, registered, start)
