"""The ``pretrain`` Prefect flow: raw text to a registered, evaluated BERT.

The flow body reads top to bottom like the chain it runs. Each stage is one Prefect task around
a plain call (``flows.stages.run_stage``), with its own MLflow child run under the pipeline's
parent run and a Prefect markdown artifact listing what it wrote. Our own manifests decide
skipping (so Prefect's result cache is off): a second run skips every finished stage.
Downstream tasks fan out on a thread pool; at scale each becomes a deployment run.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import time
from typing import Any

from prefect import flow, task, unmapped
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from flows.presets import RunConfig, as_dict, load_config
from flows.stages import STAGES, StageResult, run_stage, stage_config, stages_after
from flows.tracking import ENV_RUN_ID, ENV_TRACKING_URI, Tracker, default_tracking_uri
from pipeline.schema import ManifestError, join_url

log = logging.getLogger("bertflow.flow")

EXPERIMENT = "bertflow"

# The figures the summary table shows per stage (when the stage's manifest has them).
KEY_FIGURES = {
    "corpus": ("documents", "sentences", "duplicate_document"),
    "vocab": ("vocab_size",),
    "examples": ("*.examples",),
    "pretrain": ("steps", "first_mlm_loss", "last_mlm_loss"),
    "export": ("parameters",),
    "finetune": ("eval_accuracy", "eval_f1", "eval_exact_match", "eval_mcc", "eval_pearson"),
}


def default_root(preset: str) -> str:
    return os.path.abspath(os.path.join("runs", preset))


def key_figures(stage: str, counts: dict[str, float]) -> dict[str, float]:
    wanted = KEY_FIGURES.get(stage.split("/", 1)[0], ())
    picked = {k: v for k, v in counts.items() if any(fnmatch.fnmatchcase(k, w) for w in wanted)}
    if not picked:
        picked = dict(list(counts.items())[:3])
    return picked


def _markdown(result: StageResult) -> str:
    lines = [f"### {result.stage}: {result.status} in {result.seconds:.1f} s", "", f"`{result.url}`", ""]
    lines += ["| figure | value |", "|---|---|"]
    lines += [f"| {k} | {format_figure(v)} |" for k, v in sorted(result.counts.items())]
    if result.manifest is not None:
        lines += ["", "| file | bytes | rows |", "|---|---|---|"]
        lines += [f"| {f.path} | {f.size} | {f.rows if f.rows is not None else ''} |" for f in result.manifest.files]
    return "\n".join(lines)


def format_figure(v: Any) -> str:
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.4g}"
    return str(int(v)) if isinstance(v, float) else str(v)


@task(name="stage", task_run_name="{stage}", cache_policy=NO_CACHE)
def stage_task(
    stage: str, cfg: RunConfig, root: str, force: bool, tracking_uri: str, parent_run_id: str
) -> StageResult:
    """Run one stage inside an MLflow child run and publish what it wrote."""
    tracker = Tracker(tracking_uri)
    tracker.experiment_id = tracker.client.get_run(parent_run_id).info.experiment_id
    run_id = tracker.start_run(stage, parent_id=parent_run_id, tags={"bertflow.stage": stage})
    ok = False
    try:
        try:
            tracker.log_params(run_id, stage_config(stage, cfg, root))
        except (ManifestError, FileNotFoundError, KeyError) as exc:  # upstream unfinished: the stage says why
            log.warning("stage %s: params not logged (%s)", stage, exc)

        def log_fn(metrics: dict[str, float], step: int) -> None:
            tracker.log_metrics(run_id, metrics, step)

        env = {ENV_RUN_ID: run_id, ENV_TRACKING_URI: tracking_uri}
        result = run_stage(stage, cfg, root, force=force, log_fn=log_fn, env=env)
        tracker.set_tags(run_id, {"bertflow.status": result.status, "bertflow.url": result.url})
        tracker.log_metrics(run_id, {f"stage.{k}": v for k, v in result.counts.items()})
        tracker.log_metrics(run_id, {"stage_seconds": result.seconds})
        if result.manifest is not None:
            tracker.log_text(run_id, result.manifest.to_json(), "manifest.json")
        create_markdown_artifact(
            key=stage.replace("/", "-").replace("_", "-").lower() + "-output",
            markdown=_markdown(result),
            description=f"{stage}: what the stage wrote",
        )
        ok = True
        return result
    finally:
        tracker.end_run(run_id, ok)


@task(name="register-model", cache_policy=NO_CACHE)
def register_model_task(
    cfg: RunConfig, export: StageResult, downstream: list[StageResult], tracking_uri: str, parent_run_id: str
) -> str:
    """Log the exported Hugging Face folder to MLflow and register it as a model version."""
    tracker = Tracker(tracking_uri)
    tracker.experiment_id = tracker.client.get_run(parent_run_id).info.experiment_id
    tags = {"preset": cfg.preset, "bertflow.model_url": export.url}
    for r in downstream:
        for k, v in key_figures(r.stage, r.counts).items():
            tags[f"{r.stage.split('/', 1)[1]}.{k}"] = format_figure(v)
    if "://" in export.url and not export.url.startswith("file://"):
        # a remote root (gs://): register the folder where it is rather than copying it
        return tracker.register_model(parent_run_id, cfg.model_name, source=export.url, tags=tags)
    tracker.log_artifacts(parent_run_id, export.url, "model")
    return tracker.register_model(parent_run_id, cfg.model_name, artifact_path="model", tags=tags)


@flow(name="pretrain", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=True)
def pretrain(
    preset: str = "tiny",
    root: str | None = None,
    force: list[str] | None = None,
    stages: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
    mlflow_uri: str | None = None,
) -> dict[str, Any]:
    """Run (or skip, when finished) every stage of the chain for one preset under ``root``.

    ``force``: stages to rerun together with every stage after them. ``stages``: run only these
    (each forced), e.g. ``["pretrain"]``; the stages before must have finished.
    """
    cfg = load_config(preset, overrides)
    root = root or default_root(preset)
    tracking_uri = mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(root)
    tracker = Tracker(tracking_uri)
    tracker.use_experiment(EXPERIMENT, artifact_root=join_url(root, "mlartifacts"))
    parent = tracker.start_run(f"pretrain-{preset}", tags={"bertflow.preset": preset, "bertflow.root": root})
    tracker.log_params(parent, {"preset": preset, "root": root, **as_dict(cfg)})

    forced: set[str] = set()
    for s in force or []:
        forced.update(stages_after(s))
    selected = set(stages or STAGES)
    if stages:
        forced.update(s.split("/", 1)[0] for s in stages)

    start = time.time()
    results: list[StageResult] = []
    ok = False
    try:
        for stage in ("corpus", "vocab", "examples", "pretrain", "export"):
            if stage in selected:
                results.append(stage_task(stage, cfg, root, stage in forced, tracking_uri, parent))
        downstream: list[StageResult] = []
        if "finetune" in selected:
            names = [f"finetune/{t}" for t in cfg.finetune_tasks]
            futures = stage_task.map(
                names, unmapped(cfg), unmapped(root), unmapped("finetune" in forced), unmapped(tracking_uri), unmapped(parent)
            )
            downstream = [f.result() for f in futures]
            results += downstream
        model_version = None
        export = next((r for r in results if r.stage == "export"), None)
        if export is not None and (export.status == "done" or not _registered(tracker, cfg.model_name)):
            model_version = register_model_task(cfg, export, downstream, tracking_uri, parent)
        for r in results:
            tracker.log_metrics(parent, {f"{r.stage.replace('/', '.')}.{k}": v for k, v in key_figures(r.stage, r.counts).items()})
        ok = True
    finally:
        tracker.end_run(parent, ok)
    summary = {
        "preset": preset,
        "root": root,
        "tracking_uri": tracking_uri,
        "parent_run_id": parent,
        "model_name": cfg.model_name,
        "model_version": model_version,
        "seconds": time.time() - start,
        "stages": [
            {
                "stage": r.stage,
                "status": r.status,
                "seconds": round(r.seconds, 1),
                "figures": key_figures(r.stage, r.counts),
                "url": r.url,
            }
            for r in results
        ],
    }
    create_markdown_artifact(key="pretrain-summary", markdown=summary_markdown(summary), description="pipeline summary")
    return summary


def _registered(tracker: Tracker, name: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        return bool(tracker.client.search_model_versions(f"name='{name}'"))
    except MlflowException:
        return False


def summary_markdown(summary: dict[str, Any]) -> str:
    lines = ["| stage | status | seconds | key figures | output |", "|---|---|---|---|---|"]
    for s in summary["stages"]:
        figs = ", ".join(f"{k}={format_figure(v)}" for k, v in s["figures"].items())
        lines.append(f"| {s['stage']} | {s['status']} | {s['seconds']} | {figs} | {s['url']} |")
    return "\n".join(lines)

