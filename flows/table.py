"""The stages of the chain, as one table: a row per stage, and everything the rest needs to know of it.

A row (:class:`Stage`) says where the stage writes, what it reads (and which of its inputs are
earlier stages' outputs, for lineage), what of the config its manifest records, the
``run_<stage>`` it calls and where that runs, which modules its code version digests, what it
shows (key figures, ``bertflow inspect``, extra MLflow artifacts) and what is checked before any
work (``preflight``). The CLI, both Prefect flows, ``status``, ``inspect``, reporting, the checks,
the per-stage flows and deployments read the rows; adding a stage is one row here plus its
package. Downstream tasks are rows too: one ``finetune/<task>`` row per task of
``tasks.registry.TASKS``, made from the task's row.

Nothing here imports Prefect or MLflow, and a row costs nothing until it runs: its functions
import their package when called.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from flows import hooks
from flows.calls import StageCall, StageResult
from flows.presets import RunConfig, resolve_data
from pipeline.beam.config import output_config
from pipeline.schema.config import ConfigError, suggest
from pipeline.schema.manifest import Manifest, read_manifest
from pipeline.schema.storage import join_url
from tasks.registry import Task

WHERE = ("inline", "process", "training")


@dataclass(frozen=True)
class Units:
    """How a stage made of independent units (the downstream grid) is fanned out."""

    plan: Callable[[RunConfig], list[dict[str, Any]]]
    """(config) -> the units, each a JSON dict with a ``unit_id``."""
    prepare: Callable[[RunConfig, str], list[dict[str, Any]]]
    """(config, stage URL) -> the units, their folders made ready (those of units no longer planned
    removed)."""
    done: Callable[[StageCall], bool]
    """(call with ``unit``) -> whether that unit's output is already the output of exactly this run."""
    failed: Callable[[StageCall, str], None]
    """(call with ``unit``, why) -> record why a unit's process died, where the gathering reads it."""
    slots: Callable[[RunConfig], int]
    """(config) -> how many of the stage's units run at once on this machine."""
    dispatch: Callable[[RunConfig], str]
    """(config) -> "process" (a child process per unit), or the name of the deployment whose runs
    take the units (each on that deployment's work pool)."""


@dataclass(frozen=True)
class Stage:
    """One row of the stage table."""

    name: str
    folder: str
    """Where it writes, under the run's root."""
    inputs: Callable[[RunConfig, str], dict[str, str]]
    """(config, root) -> input name -> URL; the flows may replace any URL. An empty URL is an
    optional input not given (the corpus's ``text``): :func:`stage_inputs` leaves it out."""
    config: Callable[[RunConfig, dict[str, str]], dict[str, Any]]
    """(config, inputs) -> what its manifest records (what decides a rerun)."""
    run: Callable[[StageCall], Manifest | None]
    """Does the work. ``where="inline"``: in the flow's process; ``"process"``: in a stage process
    of its own (``flows.proc.stage_entry``); ``"training"``: in the flow's process, starting the
    training process tree (``flows.proc.train_entry``: torchrun / the XLA launcher at scale)."""
    code: tuple[str, ...]
    """The modules and packages of ours whose source is the stage's code version (a changed one
    reruns the stage); ``tests/flows/test_table.py`` checks it covers what ``run`` imports."""
    where: str = "inline"
    provides: str = ""
    """The input name later stages read this output by (``vocab``, ``model``); empty: none."""
    figures: tuple[str, ...] = ()
    """Manifest counts shown in summaries and status (fnmatch patterns)."""
    retries: int = 0
    timeout_s: float | None = None
    doc: str = ""
    resumable: bool = False
    """Continues from its checkpoints on a rerun or a retry; ``--force`` starts it over."""
    publishes_model: bool = False
    """Its output is the model the registry holds (a version is registered for it)."""
    preflight: Callable[[RunConfig, dict[str, str]], set[str]] | None = None
    """(config, inputs) -> raise a one-line error before any work (a missing corpus, no GPU);
    returns the inputs it checked itself (the others: exist and are not empty)."""
    preview: Callable[[str, str, int], str] | None = None
    """(stage folder, URL asked for, n) -> a few rows decoded for a person (``bertflow inspect``)."""
    artifacts: Callable[[Any, str, StageResult], None] | None = None
    """(tracker, run id, result) -> extra MLflow artifacts that show the output best."""
    task: Task | None = None
    """A downstream row: its task's row in ``tasks.registry.TASKS`` (passed on, never its name)."""
    agree: tuple[tuple[str, str], ...] = ()
    """Pairs ``(a, b)`` of its inputs that must belong together: input ``a``'s manifest records the
    fingerprint of the ``b`` it was made from, which must be the ``b`` this stage reads (checked
    before any work: ``pipeline.schema.manifest.check_inputs_agree``)."""
    units: Units | None = None
    """A stage made of independent units (the downstream grid): the flows fan them out one task
    (and process) each; ``run`` with ``StageCall.unit`` runs one, with ``aggregate_only`` gathers
    them."""

    @property
    def group(self) -> str:
        """The stage's place in the chain (``finetune/sst2`` -> ``finetune``)."""
        return self.name.split("/", 1)[0]

    def __post_init__(self):
        if self.where not in WHERE:
            raise ValueError(f"stage {self.name}: where={self.where!r}, expected one of {WHERE}")


# -- the network's config: the vocabulary decides the embedding rows ---------------------------------
def model_config(cfg: RunConfig, vocab_url: str):
    """The network's config for the trained vocabulary at ``vocab_url`` (its typed output).

    ``model.vocab_size`` unset (``None``, every preset) is "the size the vocabulary came out at"
    (a small corpus gives fewer pieces than asked). A number is kept as set (e.g. rounded up to a
    multiple of 64 for speed) and must hold the vocabulary.
    """
    from pipeline.schema.outputs import VOCAB_KEY, vocab_output

    manifest = read_manifest(vocab_url)
    if VOCAB_KEY in (manifest.outputs or {}):
        trained = vocab_output(manifest).vocab_size
    else:  # a vocab manifest from before typed outputs counted its entries
        trained = int(manifest.counts["vocab_size"])
    if cfg.model.vocab_size is None:
        return dataclasses.replace(cfg.model, vocab_size=trained)
    if cfg.model.vocab_size < trained:
        raise ConfigError(
            f"model.vocab_size: {cfg.model.vocab_size} is smaller than the trained vocabulary at "
            f"{vocab_url} ({trained} entries); leave it unset (--set model.vocab_size=null) to follow the vocabulary"
        )
    return cfg.model


PREVIOUS = "previous"
"""``pretrain.init_from=previous``: continue from the root's last export (the model the last run
registered), on whatever data the run has now; the first run starts from scratch."""


def init_from_url(cfg: RunConfig, root: str) -> str:
    """The folder pretraining starts from: ``pretrain.init_from``, ``previous`` resolved."""
    if cfg.pretrain.init_from != PREVIOUS:
        return cfg.pretrain.init_from
    from pipeline.schema.manifest import has_manifest

    url = _at(root, STAGES["export"].folder)
    return url if has_manifest(url) else ""


# -- the run functions ------------------------------------------------------------------------------
def _run_corpus(c: StageCall) -> Manifest:
    from pipeline.corpus.job import run_corpus

    return run_corpus(c.cfg.corpus, c.inputs, c.url)


def _run_vocab(c: StageCall) -> Manifest:
    from pipeline.vocab.job import run_vocab

    return run_vocab(c.cfg.vocab, c.inputs["corpus"], c.url)


def _run_examples(c: StageCall) -> Manifest:
    from pipeline.examples.job import run_examples

    return run_examples(c.cfg.examples, c.inputs["corpus"], c.inputs["vocab"], c.url)


def _run_pretrain(c: StageCall) -> Manifest:
    from flows.proc.launch import launch_training
    from flows.proc.protocol import (
        EXIT_RESUME_REFUSED,
        EXIT_TRACKING_GONE,
        STOPPED_BY_SIGNAL,
        StageProcessError,
    )

    errors: list[str] = []
    code = launch_training(c.spec(), c.cfg.pretrain.total_steps, c.env, c.on_progress, errors)
    if code == 0:
        return read_manifest(c.url)
    from flows.tracking import ENV_TRACKING_URI, give_up

    uri = c.env.get(ENV_TRACKING_URI)
    if code == EXIT_TRACKING_GONE or any(f"MLflow tracking server {uri} refused connections" in e for e in errors):
        give_up(uri)  # the trainer waited for the server (torchrun exits 1 for it): here it is tried once from now on
    hints = {
        EXIT_RESUME_REFUSED: f"the checkpoints under {c.url} cannot continue under this config (a changed "
        "setting; changed examples start over by themselves): set it back to resume, or start over with "
        "`bertflow run --force pretrain` (a deployment run: --param force='[\"pretrain\"]')",
    }
    hint = hints.get(code, "its checkpoint is kept and a rerun resumes" if code in STOPPED_BY_SIGNAL else "")
    if code == EXIT_TRACKING_GONE and not errors:  # the trainer's own line names the server
        hint = "the MLflow tracking server went away: restart it and rerun to resume from the checkpoints"
    if code == -9:
        hint = "a rerun resumes from its last checkpoint; if memory ran out, lower the batch or the model size"
    if errors and code not in STOPPED_BY_SIGNAL:  # what the trainer said last: the file, the step, the checkpoint
        hint = errors[-1] + (f"; {hint}" if hint else "")
    raise StageProcessError("pretrain: the training process", code, hint)


def _run_export(c: StageCall) -> Manifest:
    from flows.card import write_model_card
    from model.export import run_export

    manifest = run_export(c.inputs["pretrain"], c.inputs["vocab"], c.url)
    write_model_card(c.cfg, c.url, card_sources(c.cfg, c.root))  # after the manifest: not one of its files
    return manifest


def _run_downstream(c: StageCall) -> Manifest | None:
    from tasks.units import aggregate_task, run_downstream, try_unit, unit_url

    task = get_stage(c.stage).task
    if c.unit is not None:
        url = unit_url(c.url, c.unit)
        error = try_unit(
            task, c.cfg.finetune, c.unit, c.inputs["data"], c.inputs["model"], url, c.log_fn, force=c.restart
        )
        if error is not None:  # its error.txt has the traceback; the exception's kind decides a retry
            raise RuntimeError(f"{c.stage} unit {c.unit['unit_id']} failed: {type(error).__name__}: {error}") from error
        return None
    if c.aggregate_only:
        return aggregate_task(task, c.cfg.finetune, c.inputs["data"], c.inputs["model"], c.url)
    return run_downstream(task, c.cfg.finetune, c.inputs["data"], c.inputs["model"], c.url, log_fn=c.log_fn)


def _downstream_unit_done(c: StageCall) -> bool:
    from tasks.units import unit_is_current, unit_url

    task = get_stage(c.stage).task
    return unit_is_current(task, c.cfg.finetune, c.unit, c.inputs["data"], c.inputs["model"], unit_url(c.url, c.unit))


def _downstream_unit_failed(c: StageCall, why: str) -> None:
    from tasks.units import record_unit_error, unit_url

    record_unit_error(unit_url(c.url, c.unit), why)


def _downstream_units(task: Task) -> Units:
    from tasks.units import plan_units, prepare_units

    return Units(
        plan=lambda cfg: plan_units(task, cfg.finetune),
        prepare=lambda cfg, url: prepare_units(task, cfg.finetune, url)[0],
        done=_downstream_unit_done,
        failed=_downstream_unit_failed,
        slots=lambda cfg: cfg.finetune.grid.workers,
        dispatch=lambda cfg: cfg.finetune.grid.deployment if cfg.finetune.grid.dispatch == "deployment" else "process",
    )


def _pretrain_config(cfg: RunConfig, inputs: dict[str, str]) -> dict[str, Any]:
    from model.stage_configs import pretrain_manifest_config

    return pretrain_manifest_config(cfg.pretrain, model_config(cfg, inputs["vocab"]))


def _export_config(cfg: RunConfig, inputs: dict[str, str]) -> dict[str, Any]:
    from model.stage_configs import export_manifest_config

    return export_manifest_config(model_config(cfg, inputs["vocab"]))


def _at(root: str, folder: str) -> str:
    return join_url(root, folder)


def corpus_inputs(data) -> dict[str, str]:
    """The corpus stage's raw inputs: one per source of ``pipeline.corpus.sources.SOURCES``, its
    URL in ``data`` (:meth:`flows.presets.DataConfig.source_urls`; empty: not given)."""
    return data.source_urls()


# -- the rows ---------------------------------------------------------------------------------------
STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage(
            "corpus", "corpus",
            inputs=lambda cfg, root: corpus_inputs(resolve_data(cfg.data)),
            config=lambda cfg, inputs: output_config(cfg.corpus),  # how it runs (beam.*) is not recorded
            run=_run_corpus, code=("pipeline.corpus", "pipeline.beam", "pipeline.schema"), provides="corpus",
            figures=("documents", "sentences", "read", "records_rejected"), retries=1, timeout_s=48 * 3600,
            preflight=hooks.corpus_preflight, preview=hooks.corpus_preview, artifacts=hooks.corpus_sample_artifact,
            doc="Beam: clean the Wikipedia dump and the books into sentence-split documents (Parquet)",
        ),
        Stage(
            "vocab", "vocab",
            inputs=lambda cfg, root: {"corpus": _at(root, "corpus")},
            config=lambda cfg, inputs: dataclasses.asdict(cfg.vocab),
            run=_run_vocab, code=("pipeline.vocab", "pipeline.beam.config", "pipeline.schema"), provides="vocab",
            figures=("vocab_size",), retries=1, timeout_s=12 * 3600, preflight=hooks.segmenter_preflight,
            preview=hooks.vocab_preview, artifacts=hooks.vocab_artifact,
            doc="train a WordPiece vocabulary (Google's vocab.txt layout)",
        ),
        Stage(
            "examples", "examples",
            inputs=lambda cfg, root: {"corpus": _at(root, "corpus"), "vocab": _at(root, "vocab")},
            config=lambda cfg, inputs: output_config(cfg.examples),
            run=_run_examples, provides="examples",
            code=("pipeline.examples", "pipeline.vocab.tokenizer", "pipeline.beam", "pipeline.schema"),
            figures=("*.examples", "*.masked_share_of_eligible", "*_share_multi_sentence"),
            retries=1, timeout_s=48 * 3600, preview=hooks.examples_preview, artifacts=hooks.examples_sample_artifact,
            preflight=hooks.examples_preflight,
            doc="Beam: masked pretraining examples of examples.objective, Parquet shards per sequence length",
        ),
        Stage(
            "pretrain", "checkpoints",
            inputs=lambda cfg, root: {"examples": _at(root, "examples"), "vocab": _at(root, "vocab")},
            config=_pretrain_config, run=_run_pretrain, where="training", provides="pretrain",
            agree=(("examples", "vocab"),),
            code=("model", "pipeline.examples.masking", "pipeline.schema"), resumable=True,
            figures=("steps", "first_mlm_loss", "last_mlm_loss"), retries=3, timeout_s=30 * 24 * 3600,
            preflight=hooks.backend_preflight, preview=hooks.counts_preview, artifacts=hooks.loss_curve_artifact,
            doc="pretraining in phases with the examples' objective; resumes from its last checkpoint (also on retry)",
        ),
        Stage(
            "export", "model",
            inputs=lambda cfg, root: {"pretrain": _at(root, "checkpoints"), "vocab": _at(root, "vocab")},
            config=_export_config, run=_run_export, provides="model", publishes_model=True,
            agree=(("pretrain", "vocab"),),
            code=("model.export", "model.bert", "model.packing", "model.config", "model.contract", "model.kernels",
                  "model.card", "model.stage_configs", "flows.card", "pipeline.schema"),
            figures=("parameters",), retries=1, timeout_s=3600, preview=hooks.model_preview,
            doc="the final weights in Hugging Face layout (config.json, model.safetensors, vocab)",
        ),
    )
}  # fmt: skip
_FINETUNE_CODE = ("tasks", "model.bert", "model.packing", "model.config", "model.contract", "model.export",
                  "model.kernels", "model.optim", "model.stage_configs", "pipeline.schema")  # fmt: skip


@cache
def downstream_stage(task: str) -> Stage:
    """The row of one downstream task (``finetune/<task>``), made from its registry row."""
    from tasks.registry import get_task
    from tasks.units import manifest_config, task_data_url

    t = get_task(task)

    def inputs(cfg: RunConfig, root: str) -> dict[str, str]:
        data = task_data_url(t, resolve_data(cfg.data).downstream, cfg.data.downstream_urls)
        return {"model": cfg.data.finetune_model or _at(root, "model"), "data": data}

    return Stage(
        f"finetune/{t.name}",
        f"finetune/{t.name}",
        inputs=inputs,
        config=lambda cfg, inputs: manifest_config(t, cfg.finetune),
        run=_run_downstream,
        code=_FINETUNE_CODE,
        where="process",
        figures=(t.metric, "eval_exact_match", "eval_exact"),
        retries=2,
        timeout_s=24 * 3600,
        preview=hooks.counts_preview,
        artifacts=hooks.results_artifact,
        task=t,
        units=_downstream_units(t),
        doc=f"fine-tune and evaluate on {t.name} ({t.family})",
    )


# -- looking rows up ----------------------------------------------------------------------------------
CHAIN: tuple[str, ...] = (*STAGES, "finetune")
"""The chain's groups in order; ``finetune`` stands for every ``finetune/<task>`` row."""


def get_stage(name: str) -> Stage:
    if name.startswith("finetune/"):
        return downstream_stage(name.split("/", 1)[1])
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}{suggest(name, CHAIN)}; stages: {', '.join(CHAIN)}")
    return STAGES[name]


def stage_names(cfg: RunConfig, groups: tuple[str, ...] = CHAIN) -> list[str]:
    """Every stage this config runs, in chain order (``finetune`` expands to its tasks)."""
    names: list[str] = []
    for g in groups:
        names += [f"finetune/{t}" for t in cfg.finetune_tasks] if g == "finetune" else [g]
    return names


def stages_after(stage: str) -> list[str]:
    """``stage``'s group and every group that follows it in the chain."""
    group = stage.split("/", 1)[0]
    if group not in CHAIN:
        raise KeyError(f"unknown stage {stage!r}; stages: {', '.join(CHAIN)}")
    return list(CHAIN[CHAIN.index(group) :])


def stage_url(root: str, stage: str) -> str:
    return _at(root, get_stage(stage).folder)


def stage_inputs(stage: str, cfg: RunConfig, root: str, given: dict[str, str] | None = None) -> dict[str, str]:
    """Input name -> URL of what a stage reads (``given`` URLs replace the defaults)."""
    inputs = get_stage(stage).inputs(cfg, root)
    for name, url in (given or {}).items():
        if name not in inputs:
            raise KeyError(f"stage {stage} has no input {name!r}{suggest(name, inputs)}; inputs: {', '.join(inputs)}")
        if url:
            inputs[name] = url
    return {name: url for name, url in inputs.items() if url}  # an empty URL: an input not given


def stage_config(stage: str, cfg: RunConfig, inputs: dict[str, str]) -> dict[str, Any]:
    return get_stage(stage).config(cfg, inputs)


def producer(input_name: str) -> Stage | None:
    """The row whose output later stages read as ``input_name`` (None: a raw input)."""
    return next((s for s in STAGES.values() if s.provides == input_name), None)


def written_by_this_run(name: str, url: str, root: str) -> bool:
    """An input that an earlier stage under ``root`` writes (not a raw file, a released model
    or another run's output)."""
    return producer(name) is not None and url.startswith(root.rstrip("/") + "/")


def card_sources(cfg: RunConfig, root: str):
    """What the model card of the run under ``root`` reads (``flows.card.CardSources``)."""
    from flows.card import CardSources

    urls = [stage_url(root, name) for name in ("corpus", "vocab", "examples", "pretrain")]
    return CardSources(*urls, raw=stage_inputs("corpus", cfg, root))


def group_input_names(group: str, cfg: RunConfig | None = None) -> list[str]:
    """The inputs a group's flow takes as URL parameters: those every stage of it reads from the
    same default URL (a downstream task's data differs per task, its model does not); ``cfg``:
    the tiny preset, when the caller has it already."""
    from flows.presets import load_config

    cfg = cfg or load_config("tiny")
    names = stage_names(cfg, (group,))
    first = get_stage(names[0]).inputs(cfg, "/root")
    others = [get_stage(n).inputs(cfg, "/root") for n in names[1:]]
    return [k for k, url in first.items() if all(o.get(k) == url for o in others)]
