"""A finished root's ``bertflow run``, answered from the manifests and the tracking store, without
Prefect: the command's own process decides that the flow would do nothing, then does what the flow
does for such a run, in about a second instead of Prefect's temporary server and the flow (~24
CPU-s).

What the flow (``flows.pretrain_flow``) does on a root where nothing is left to do: its session
follows a moved root's store and opens a parent MLflow run (the session tags, the config as
params); every stage task finds its stage up to date and opens no run; ``flows.chain.finish``
rewrites the downstream results table and logs it (``results.md``, ``glue_average``) to the
parent, the registry step rewrites the model card, finds the export registered and writes its
scores, description and alias again (the same values), and the parent is tagged ``nothing to do``
with every stage's key figures. This module does the same, with one parent run and no child run,
when all of these hold (otherwise the flow runs, as before, and decides for itself):

1. ``run`` with no ``--force`` (the CLI asks only then; a stage flow, ``--input``: the flow);
2. a local root, and a tracking store that is a SQLite file with MLflow 3.17's layout
   (``flows.store_sqlite``): a tracking server, another database or a ``gs://`` root goes
   through the flow and MLflow's client, which this module does not replace;
3. every stage of the run's list is done, by the same judgement as ``status`` and the runner
   (``flows.runner.stage_state``: config, input fingerprints, code version, files);
4. the ``bertflow`` experiment exists with its kind tag, its artifacts are in a local folder, and
   no run of this root was left ``RUNNING`` (the flow marks those KILLED);
5. a stage of the run publishes the model, a registered version holds its export (by
   fingerprint), scoring it again would write nothing new (``flows.model_registry.rescoring``:
   score tags, description, aliases), and no other version's lineage needs renaming
   (``flows.lineage.moved_lineage``).

Cost: this restates, for one case, the bookkeeping of ``flows.chain.finish`` and
``flows.prefect_tasks.session`` / ``register_model_task``; a change there must be made here too.
``tests/flows/test_finished_run.py`` compares the parent run written here with the flow's.
Deployments run the flow itself, which is unchanged.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

from flows.calls import StageResult
from flows.figures import key_figures
from flows.presets import RunConfig, as_dict
from flows.table import CHAIN, get_stage, stage_names
from flows.tracking import EXPERIMENT, EXPERIMENT_KIND, sqlite_path

log = logging.getLogger("bertflow.flow")

NOTHING_TO_DO = "nothing to do"
"""The ``bertflow.outcome`` tag of a run that did nothing (``flows.chain.finish``)."""


@dataclass(frozen=True)
class Finished:
    """What a finished root's run records: every stage's result (skipped), the model and the
    registered version that holds it, the store."""

    results: list[StageResult]
    model: StageResult
    version: str
    alias: str | None
    db: str
    experiment: Any  # flows.store_sqlite.Experiment


def answer_finished_run(cfg: RunConfig, preset: str, root: str, tracking_uri: str) -> dict[str, Any] | None:
    """The flow's summary of a run on ``root`` that had nothing to do, recorded without Prefect;
    None when the flow must run (why: at debug level). Call holding the root's lock."""
    start = time.time()
    try:
        try:
            finished = _finished(cfg, root, tracking_uri)
        except Exception as exc:  # what decides could not be read: the flow reads it again, and says why
            finished = f"{type(exc).__name__}: {exc}"
        if isinstance(finished, str):
            log.debug("run: through the flow: %s", finished)
            return None
        try:
            return _record(finished, cfg, preset, root, tracking_uri, start)
        except Exception as exc:  # the run is recorded last, in one transaction: nothing is, the flow runs
            log.warning("run: answering from the manifests failed (%s: %s): the flow runs", type(exc).__name__, exc)
            return None
    except KeyboardInterrupt:  # the run's one transaction is rolled back: nothing was recorded
        print("bertflow: run stopped; nothing was recorded", file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None


def _finished(cfg: RunConfig, root: str, tracking_uri: str) -> Finished | str:
    """The run's results when it has nothing to do (conditions 2-5 of the module), else why not."""
    from flows.checks import is_local
    from flows.runner import stage_state

    if not is_local(root):
        return f"root {root} is remote"
    db = sqlite_path(tracking_uri)
    if db is None or not os.path.exists(db):
        return f"tracking store {tracking_uri} is not an existing SQLite file (the flow asks MLflow's client)"
    results = []
    for name in stage_names(cfg, CHAIN):
        state = stage_state(name, cfg, root)
        if state.state != "done":
            return f"stage {name} is {state.state}"
        m = state.manifest
        results.append(StageResult(name, "skipped", 0.0, state.url, m.counts, m))
    # the flow's order: one stage after another, then the fanned-out ones
    results.sort(key=lambda r: get_stage(r.stage).units is not None)
    model = next((r for r in results if get_stage(r.stage).publishes_model), None)
    if model is None:
        return "no stage of this run publishes a model"
    from flows import store_sqlite as store

    changed = store.layout_differences(db)
    if changed:
        return f"MLflow store {db} is not in the layout this path writes ({'; '.join(changed)})"
    from flows.tracking import follow_moved_root

    follow_moved_root(root, tracking_uri)  # what the flow's session does first
    exp = store.experiment(db, EXPERIMENT)
    if exp is None or exp.tags.get("mlflow.experimentKind") != EXPERIMENT_KIND:
        return f"experiment {EXPERIMENT} is missing or has no kind tag"
    if store.local_artifacts(exp.artifact_location) is None:
        return f"artifacts at {exp.artifact_location} are not a local folder"
    if store.running_runs(db, exp.experiment_id, root):
        return "a run of this root was left RUNNING (the flow marks it KILLED)"
    found = _registered(cfg, root, db, model, [r for r in results if get_stage(r.stage).task])
    if isinstance(found, str):
        return found
    version, alias = found
    return Finished(results, model, version, alias, db, exp)


def _registered(cfg: RunConfig, root: str, db: str, model: StageResult,
                downstream: list[StageResult]) -> tuple[str, str | None] | str:  # fmt: skip
    """(version, alias) of the registered version holding ``model`` when the registry step
    (``flows.prefect_tasks.register_model_task``) would change nothing, else why it would."""
    from flows import model_registry as registry
    from flows import store_sqlite as store
    from flows.lineage import moved_lineage

    name, fingerprint = cfg.model_name, model.manifest.fingerprint
    versions = store.model_versions(db, name)
    holding = [  # this root's version: another root's identical export has its own (flows.model_registry)
        v
        for v in versions
        if v.tags.get(registry.TAG_FINGERPRINT) == fingerprint and v.tags.get(registry.TAG_MODEL_URL) == model.url
    ]
    if not holding:
        return f"no version of {name} holds the export {fingerprint[:12]} of {model.url} (the flow registers it)"
    version = max(holding, key=lambda v: int(v.version))
    moved = moved_lineage(versions, name, model.url.rsplit("/", 1)[0], version.version, cfg.keep_outputs)
    if moved:
        return f"the lineage of {name} version(s) {', '.join(moved)} moved (the flow renames it)"
    aliases = store.model_aliases(db, name)
    champion = next((v.tags for v in versions if v.version == aliases.get("champion")), {})
    scores = registry.task_scores([(get_stage(r.stage).task.name, r) for r in downstream])
    changes, alias = registry.rescoring(version.version, version.description, version.tags, aliases, champion, scores)
    if changes:
        return f"{name} version {version.version} is not scored as its results say ({', '.join(changes)})"
    return version.version, alias


def _record(f: Finished, cfg: RunConfig, preset: str, root: str, tracking_uri: str, start: float) -> dict[str, Any]:
    """What the flow records and rewrites for a run with nothing to do (the module's docstring)."""
    from flows import store_sqlite as store
    from flows.tracking import git_commit, metric_items, param_items
    from pipeline.schema.config import config_digest

    start_ms = int(start * 1000)
    for r in f.results:
        log.info("stage %s: up to date, skipped (%s)", r.stage, r.url)
    metrics: list[tuple[str, float, int]] = []
    texts: dict[str, str] = {}
    downstream = [r for r in f.results if get_stage(r.stage).task]
    if downstream:  # flows.prefect_tasks.results_table_task
        texts["results.md"], glue = _results_table(cfg, root)
        if glue is not None:
            metrics.append(("glue_average", float(glue), _now_ms()))
    if not cfg.data.finetune_model:  # flows.prefect_tasks.register_model_task: the card with the scores
        from flows.card import write_model_card
        from flows.table import card_sources

        model_root = f.model.url.rsplit("/", 1)[0]
        write_model_card(cfg, f.model.url, card_sources(cfg, model_root),
                         [(get_stage(r.stage).task.name, r) for r in downstream])  # fmt: skip
    now = _now_ms()
    for r in f.results:  # flows.chain.finish
        figures = key_figures(get_stage(r.stage).figures, r.counts)
        prefix = r.stage.replace("/", ".")
        metrics += [(f"{prefix}.{k}", v, now) for k, v in metric_items(figures)]
    tags = {  # flows.prefect_tasks.session, and the outcome flows.chain.finish sets
        "bertflow.preset": preset,
        "bertflow.root": root,
        "bertflow.git_commit": git_commit(),
        "bertflow.config_fingerprint": config_digest(as_dict(cfg)),
        "prefect.flow_run_id": "",  # no flow ran
        "bertflow.outcome": NOTHING_TO_DO,
        "mlflow.note.content": f"Nothing to do: all {len(f.results)} stages were up to date (no stage run was opened).",
    }
    params = param_items({"preset": preset, "root": root, **as_dict(cfg)})
    run_id = store.write_run(f.db, f.experiment, f"pretrain-{preset}", tags, params, metrics, texts, start_ms)
    log.info(
        "run: nothing to do, answered from the manifests and the MLflow store (every stage up to date, "
        "%s version %s registered): Prefect's server not started",
        cfg.model_name,
        f.version,
    )
    from flows.reporting import run_summary

    ids = (tracking_uri, f.experiment.experiment_id, run_id)
    return run_summary(preset, root, cfg, f.results, ids, (f.version, f.alias), start)


def _results_table(cfg: RunConfig, root: str) -> tuple[str, float | None]:
    """The per-model results table rewritten as ``results_table_task`` writes it: (its
    markdown, the GLUE average)."""
    import fsspec

    from flows.table import stage_url
    from pipeline.schema.storage import join_url
    from tasks.results import summarize

    out = join_url(root, "finetune")
    summary = summarize({t: stage_url(root, f"finetune/{t}") for t in cfg.finetune_tasks}, out, model=cfg.model_name)
    with fsspec.open(join_url(out, "results.md"), "r") as f:
        return f.read(), summary.get("glue_average")


def _now_ms() -> int:
    return int(time.time() * 1000)
