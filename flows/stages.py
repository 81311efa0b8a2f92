"""The stages of the chain, as one table: where each writes, what it reads, how it runs, when
it is skipped.

Everything that knows about stages reads :data:`STAGES` (and :func:`stage_names`, which adds a
``finetune/<task>`` row per downstream task of ``flows.downstream.TASKS``): the CLI's choices,
the Prefect flows, skipping, ``bertflow status`` and the process launchers. Adding a stage or a
downstream task is one row.

A stage is skipped when its folder holds a manifest made from the same config, the same input
fingerprints and the same code (a digest of the source of every module of ours the stage's run
function reaches), and every file it lists is there with its size. ``force`` reruns a stage
whatever its manifest says. Nothing here imports Prefect or MLflow: the Prefect tasks in
``flows.pretrain_flow`` wrap these calls, and tests call them directly.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from flows.presets import ConfigError, RunConfig, resolve_data
from pipeline.config import output_config
from pipeline.schema.manifest import (
    Manifest,
    ManifestError,
    fingerprint_input,
    has_manifest,
    read_manifest,
    save_manifest,
)
from pipeline.schema.storage import join_url

log = logging.getLogger("bertflow.flow")

LogFn = Callable[[dict[str, float], int], None]
CHAIN = ("corpus", "vocab", "examples", "pretrain", "export", "finetune")
"""The chain's order; ``finetune`` stands for every ``finetune/<task>`` row."""


@dataclass
class StageCall:
    """What a stage's run function gets: the resolved config, its input and output URLs."""

    stage: str
    cfg: RunConfig
    root: str
    url: str
    inputs: dict[str, str]
    log_fn: LogFn | None = None
    restart: bool = False
    """Start over instead of resuming (pretraining under ``--force``)."""
    unit: dict[str, Any] | None = None
    """Run only this unit of a fanned-out stage (a downstream grid point x seed)."""
    aggregate_only: bool = False
    """A fanned-out stage whose units ran elsewhere: only gather them into the stage's output."""


@dataclass(frozen=True)
class Stage:
    """One row of the stage table."""

    name: str
    folder: str
    """Where it writes, under the run's root."""
    inputs: Callable[[RunConfig, str], dict[str, str]]
    """(config, root) -> input name -> URL; the flows may replace any URL."""
    config: Callable[[RunConfig, dict[str, str]], dict[str, Any]]
    """(config, inputs) -> what its manifest records (what decides a rerun)."""
    run: Callable[[StageCall], Manifest]
    """Does the work, in the process ``where`` names."""
    where: str = "inline"
    """inline (the flow's process) | training (a training process: torchrun/XLA at scale) |
    process (a process of its own, e.g. a fine-tuning run)."""
    figures: tuple[str, ...] = ()
    """Manifest counts shown in summaries (fnmatch patterns)."""
    retries: int = 0
    timeout_s: float | None = None
    doc: str = ""
    unit_done: Callable[[StageCall], bool] | None = None
    """(call with ``unit``) -> whether that unit's output is already the output of exactly this run."""
    units: Callable[[RunConfig], list[dict[str, Any]]] | None = None
    """A stage made of independent units (the downstream grid): (config) -> the units, each a
    JSON dict with a ``unit_id``. The flows fan them out one task (and process) each; the row's
    ``run`` with ``StageCall.unit`` runs one, with ``aggregate_only`` gathers them."""

    @property
    def group(self) -> str:
        return self.name.split("/", 1)[0]


# -- model config: the vocabulary decides the embedding rows ------------------------------------
def model_config(cfg: RunConfig, vocab_url: str):
    """The network's config for the trained vocabulary at ``vocab_url``.

    ``model.vocab_size`` equal to ``vocab.vocab_size`` (every preset) means "the size the
    vocabulary came out at" (a small corpus gives fewer pieces than asked). Any other value is
    kept as set (e.g. rounded up to a multiple of 64 for speed) and must hold the vocabulary.
    """
    trained = int(read_manifest(vocab_url).counts["vocab_size"])
    if cfg.model.vocab_size == cfg.vocab.vocab_size:
        return dataclasses.replace(cfg.model, vocab_size=trained)
    if cfg.model.vocab_size < trained:
        raise ConfigError(
            f"model.vocab_size: {cfg.model.vocab_size} is smaller than the trained vocabulary at "
            f"{vocab_url} ({trained} entries); leave it equal to vocab.vocab_size to follow the vocabulary"
        )
    return cfg.model


# -- the run functions (imports inside: a row costs nothing until it runs) ----------------------
def _run_corpus(c: StageCall) -> Manifest:
    from pipeline.corpus import run_corpus

    return run_corpus(c.cfg.corpus, c.inputs, c.url)


def _run_vocab(c: StageCall) -> Manifest:
    from pipeline.wordpiece import run_vocab

    return run_vocab(c.cfg.vocab, c.inputs["corpus"], c.url)


def _run_examples(c: StageCall) -> Manifest:
    from pipeline.examples import run_examples

    return run_examples(c.cfg.examples, c.inputs["corpus"], c.inputs["vocab"], c.url)


def _run_pretrain(c: StageCall) -> Manifest:
    from flows.processes import launch_training
    from model.train import run_pretrain  # noqa: F401 - what the launched process runs (code version)

    return launch_training(c, {})


def _run_export(c: StageCall) -> Manifest:
    from model.export import run_export

    return run_export(c.inputs["pretrain"], c.inputs["vocab"], c.url)


def _run_downstream(c: StageCall) -> Manifest | None:
    from flows.downstream import aggregate_task, run_downstream, run_unit_safely, unit_url

    task = c.stage.split("/", 1)[1]
    if c.unit is not None:
        ok = run_unit_safely(
            task,
            c.cfg.finetune,
            c.unit,
            c.inputs["data"],
            c.inputs["model"],
            unit_url(c.url, c.unit),
            c.log_fn,
            force=c.restart,
        )
        if not ok:
            raise RuntimeError(f"{c.stage} unit {c.unit['unit_id']} failed (its error.txt has the traceback)")
        return None
    if c.aggregate_only:
        return aggregate_task(task, c.cfg.finetune, c.inputs["data"], c.inputs["model"], c.url)
    return run_downstream(task, c.cfg.finetune, c.inputs["data"], c.inputs["model"], c.url, log_fn=c.log_fn)


def _downstream_unit_done(c: StageCall) -> bool:
    from flows.downstream import unit_is_current, unit_url

    task = c.stage.split("/", 1)[1]
    return unit_is_current(task, c.cfg.finetune, c.unit, c.inputs["data"], c.inputs["model"], unit_url(c.url, c.unit))


def _downstream_units(task: str) -> Callable[[RunConfig], list[dict[str, Any]]]:
    def units(cfg: RunConfig) -> list[dict[str, Any]]:
        from flows.downstream import plan_units

        return plan_units(task, cfg.finetune)

    return units


def _pretrain_config(cfg: RunConfig, inputs: dict[str, str]) -> dict[str, Any]:
    from model.train import manifest_config

    return manifest_config(cfg.pretrain, model_config(cfg, inputs["vocab"]))


def _export_config(cfg: RunConfig, inputs: dict[str, str]) -> dict[str, Any]:
    from model.export import manifest_config

    return manifest_config(model_config(cfg, inputs["vocab"]))


def _downstream_config(name: str) -> Callable[[RunConfig, dict[str, str]], dict[str, Any]]:
    def config(cfg: RunConfig, inputs: dict[str, str]) -> dict[str, Any]:
        from flows.downstream import manifest_config

        return manifest_config(name, cfg.finetune)

    return config


def _at(root: str, folder: str) -> str:
    return join_url(root, folder)


STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage(
            "corpus",
            "corpus",
            inputs=lambda cfg, root: {"wiki": resolve_data(cfg.data).wiki, "books": resolve_data(cfg.data).books},
            config=lambda cfg, inputs: output_config(cfg.corpus),  # how it runs (beam.*) is not recorded
            run=_run_corpus,
            figures=("documents", "sentences", "read", "records_rejected"),
            retries=1,
            timeout_s=48 * 3600,
            doc="Beam: clean the Wikipedia dump and the books into sentence-split documents (Parquet)",
        ),
        Stage(
            "vocab",
            "vocab",
            inputs=lambda cfg, root: {"corpus": _at(root, "corpus")},
            config=lambda cfg, inputs: dataclasses.asdict(cfg.vocab),
            run=_run_vocab,
            figures=("vocab_size",),
            retries=1,
            timeout_s=12 * 3600,
            doc="train a WordPiece vocabulary (Google's vocab.txt layout)",
        ),
        Stage(
            "examples",
            "examples",
            inputs=lambda cfg, root: {"corpus": _at(root, "corpus"), "vocab": _at(root, "vocab")},
            config=lambda cfg, inputs: output_config(cfg.examples),
            run=_run_examples,
            retries=1,
            timeout_s=48 * 3600,
            figures=("*.examples", "*.masked_share_of_eligible", "*.random_next_share_multi_sentence"),
            doc="Beam: masked A/B pretraining examples, Parquet shards per sequence length",
        ),
        Stage(
            "pretrain",
            "checkpoints",
            inputs=lambda cfg, root: {"examples": _at(root, "examples"), "vocab": _at(root, "vocab")},
            config=_pretrain_config,
            run=_run_pretrain,
            where="training",
            figures=("steps", "first_mlm_loss", "last_mlm_loss"),
            retries=3,
            timeout_s=30 * 24 * 3600,
            doc="MLM + NSP pretraining in phases; resumes from its last checkpoint (also on retry)",
        ),
        Stage(
            "export",
            "model",
            inputs=lambda cfg, root: {"pretrain": _at(root, "checkpoints"), "vocab": _at(root, "vocab")},
            config=_export_config,
            run=_run_export,
            figures=("parameters",),
            retries=1,
            timeout_s=3600,
            doc="the final weights in Hugging Face layout (config.json, model.safetensors, vocab)",
        ),
    )
}


@cache
def downstream_stage(task: str) -> Stage:
    """The row of one downstream task (``finetune/<task>``)."""
    from flows.downstream import TASKS

    if task not in TASKS:
        raise KeyError(f"unknown downstream task {task!r}; known: {', '.join(sorted(TASKS))}")
    t = TASKS[task]

    def inputs(cfg: RunConfig, root: str) -> dict[str, str]:
        from flows.downstream import task_data_url

        data = task_data_url(task, resolve_data(cfg.data).downstream, cfg.data.downstream_urls)
        return {"model": cfg.data.finetune_model or _at(root, "model"), "data": data}

    return Stage(
        f"finetune/{task}",
        f"finetune/{task}",
        inputs=inputs,
        config=_downstream_config(task),
        run=_run_downstream,
        where="process",
        figures=(t.metric, "eval_exact_match", "eval_exact"),
        retries=2,
        timeout_s=24 * 3600,
        units=_downstream_units(task),
        unit_done=_downstream_unit_done,
        doc=f"fine-tune and evaluate on {task} ({t.kind})",
    )


def get_stage(name: str) -> Stage:
    if name.startswith("finetune/"):
        return downstream_stage(name.split("/", 1)[1])
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}; stages: {', '.join(CHAIN)}")
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
            raise KeyError(f"stage {stage} has no input {name!r}; inputs: {', '.join(inputs)}")
        if url:
            inputs[name] = url
    return inputs


def stage_config(stage: str, cfg: RunConfig, inputs: dict[str, str]) -> dict[str, Any]:
    return get_stage(stage).config(cfg, inputs)


# -- code versions --------------------------------------------------------------------------------
_OUR_PACKAGES = ("pipeline", "model", "tasks")


@cache
def code_modules(stage: str) -> dict[str, bytes]:
    """Module name -> source of every module of ours the stage's run function reaches (imports
    followed through ``pipeline``, ``model`` and ``tasks``, lazy ones included)."""
    seen: dict[str, bytes] = {}
    todo = _run_modules(get_stage(stage))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            continue
        with open(path, "rb") as f:
            source = f.read()
        seen[name] = source
        todo += _imported(source, name, _OUR_PACKAGES)
    return seen


def digest_sources(sources: dict[str, bytes]) -> str:
    h = hashlib.blake2b(digest_size=12)
    for name in sorted(sources):
        h.update(name.encode() + b"\0" + sources[name] + b"\0")
    return h.hexdigest()


@cache
def code_version(stage: str) -> str:
    """The version of a stage's code: a digest of :func:`code_modules`. Editing any of them
    makes the stage (and, if its output changes, everything after it) rerun."""
    return digest_sources(code_modules(stage))


def _run_modules(row: Stage) -> list[str]:
    """The modules of ours a row's run function imports (read off its source)."""
    import inspect

    source = inspect.getsource(row.run).encode()
    out = []
    for m in _imported(source, "flows.stages", _OUR_PACKAGES + ("flows",)):
        if m.startswith("flows."):  # e.g. flows.downstream: follow what it imports of ours
            with open(_module_file(m), "rb") as f:
                out += _imported(f.read(), m, _OUR_PACKAGES)
        else:
            out.append(m)
    return out


def _imported(source: bytes, module: str, packages: tuple[str, ...]) -> list[str]:
    """The modules of ``packages`` that ``source`` imports (``from a import b``: ``a`` and, if it
    is a module, ``a.b``)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]  # `from pkg import module`
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = module.rsplit(".", node.level)[0]
            names.append(f"{base}.{node.module}" if node.module else base)
    return [n for n in names if n.split(".")[0] in packages and _is_module(n)]


def _module_file(name: str) -> str | None:
    """The source file of module ``name`` of ours, found without importing it (importing
    ``pipeline.corpus`` would import Beam)."""
    import os

    top = importlib.util.find_spec(name.split(".")[0])
    if top is None or not top.submodule_search_locations:
        return None
    path = os.path.join(list(top.submodule_search_locations)[0], *name.split(".")[1:])
    for candidate in (path + ".py", os.path.join(path, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _is_module(name: str) -> bool:
    return _module_file(name) is not None


# -- state: done, stale, missing -----------------------------------------------------------------
@dataclass
class StageState:
    stage: str
    url: str
    state: str  # "done" | "stale" | "missing" | "running" | "blocked"
    reasons: list[str] = field(default_factory=list)
    manifest: Manifest | None = None


def stage_state(
    stage: str, cfg: RunConfig, root: str, given: dict[str, str] | None = None, checksums: bool = False
) -> StageState:
    """Whether a stage's output is up to date, and if not, why."""
    url = stage_url(root, stage)
    if not has_manifest(url):
        return StageState(stage, url, "missing", ["no manifest: never run or unfinished"])
    try:
        manifest = read_manifest(url)
    except ManifestError as exc:
        return StageState(stage, url, "stale", [str(exc)])
    try:
        inputs = stage_inputs(stage, cfg, root, given)
        # the inputs that determine the output are the ones its run recorded (pretraining reads
        # the vocab only for its size, which its config holds); an input it lacks marks it stale
        fingerprints = {k: fingerprint_input(u) for k, u in inputs.items() if k in manifest.inputs}
        expected = stage_config(stage, cfg, inputs)
    except (ManifestError, FileNotFoundError, KeyError) as exc:
        return StageState(stage, url, "stale", [f"inputs not ready: {exc}"], manifest)
    reasons = manifest.stale_reasons(expected, fingerprints, code_version(stage))
    reasons += manifest.missing_files(checksums)
    if manifest.counts.get("units_failed"):  # a partial grid: the next run retries its failed units
        reasons.append(f"{int(manifest.counts['units_failed'])} of {int(manifest.counts.get('units', 0))} units failed")
    return StageState(stage, url, "stale" if reasons else "done", reasons, manifest)


UPSTREAM_INPUTS = {"corpus", "vocab", "examples", "pretrain", "model"}


def written_by_this_run(name: str, url: str, root: str) -> bool:
    """An input that an earlier stage under ``root`` writes (not a raw file, a released model
    or another run's output)."""
    return name in UPSTREAM_INPUTS and url.startswith(root.rstrip("/") + "/")


def check_inputs_ready(stage: str, cfg: RunConfig, root: str, given: dict[str, str] | None = None) -> None:
    """Fail before any work when an input is missing: an upstream stage unfinished, a raw file absent."""
    for name, url in stage_inputs(stage, cfg, root, given).items():
        if written_by_this_run(name, url, root):
            if not has_manifest(url):
                upstream = "export" if name == "model" else name
                raise ManifestError(
                    f"stage {stage} needs {name} at {url}, which has no finished manifest: run "
                    f"`bertflow stage {upstream}` (or `bertflow run`) first"
                )
        else:
            fingerprint_input(url)  # raises FileNotFoundError naming the URL


# -- running ---------------------------------------------------------------------------------------
@dataclass
class StageResult:
    stage: str
    status: str  # "done" | "skipped"
    seconds: float
    url: str
    counts: dict[str, float] = field(default_factory=dict)
    manifest: Manifest | None = None
    inputs: dict[str, str] = field(default_factory=dict)


def run_stage(
    stage: str,
    cfg: RunConfig,
    root: str,
    force: bool = False,
    log_fn: LogFn | None = None,
    env: dict[str, str] | None = None,
    given: dict[str, str] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    aggregate_only: bool = False,
) -> StageResult:
    """Run one stage unless it is up to date (or ``force``); return what it did.

    ``aggregate_only``: the stage's units ran already (``run_stage_unit``, fanned out by the
    flow); gather them here, in this process, whatever the stage's state."""
    row = get_stage(stage)
    url = stage_url(root, stage)
    start = time.time()
    if aggregate_only and row.units is None:
        raise ValueError(f"stage {stage} has no units to aggregate")
    if not force and not aggregate_only:
        current = stage_state(stage, cfg, root, given)
        if current.state == "done":
            log.info("stage %s: up to date, skipped (%s)", stage, url)
            m = current.manifest
            return StageResult(
                stage, "skipped", time.time() - start, url, m.counts, m, stage_inputs(stage, cfg, root, given)
            )
        if current.manifest is not None:
            log.info("stage %s: stale (%s)", stage, "; ".join(current.reasons))
    check_inputs_ready(stage, cfg, root, given)
    inputs = stage_inputs(stage, cfg, root, given)
    call = StageCall(
        stage, cfg, root, url, inputs, log_fn, restart=force and row.group == "pretrain", aggregate_only=aggregate_only
    )
    log.info("stage %s: %s -> %s", stage, "gathering its units" if aggregate_only else "running", url)
    if row.where == "inline" or aggregate_only:
        manifest = row.run(call)
    else:
        from flows.processes import run_in_process

        manifest = run_in_process(call, row.where, env or {}, on_progress)
    manifest.code_version = code_version(stage)
    save_manifest(manifest)
    # a gathered stage's own time is the gathering; its manifest has the units' total
    seconds = manifest.seconds if aggregate_only and manifest.seconds else time.time() - start
    log.info("stage %s: done in %.1f s", stage, seconds)
    return StageResult(stage, "done", seconds, url, manifest.counts, manifest, inputs)


def run_stage_unit(
    stage: str,
    cfg: RunConfig,
    root: str,
    unit_id: str,
    force: bool = False,
    log_fn: LogFn | None = None,
    env: dict[str, str] | None = None,
    given: dict[str, str] | None = None,
    in_process: bool = False,
) -> float:
    """Run one unit of a fanned-out stage (its own process unless ``in_process``); a unit that
    is up to date is skipped by the row itself. Raises when the unit failed (its ``error.txt``
    keeps the traceback for the stage's aggregation). Returns the seconds it took."""
    row = get_stage(stage)
    if row.units is None:
        raise ValueError(f"stage {stage} is not made of units")
    unit = next((u for u in row.units(cfg) if u["unit_id"] == unit_id), None)
    if unit is None:
        raise KeyError(f"stage {stage}: no unit {unit_id!r}; planned: {[u['unit_id'] for u in row.units(cfg)]}")
    check_inputs_ready(stage, cfg, root, given)
    call = StageCall(
        stage,
        cfg,
        root,
        stage_url(root, stage),
        stage_inputs(stage, cfg, root, given),
        log_fn,
        restart=force,
        unit=unit,
    )
    start = time.time()
    if not force and row.unit_done is not None and row.unit_done(call):
        log.info("%s unit %s: up to date, skipped", stage, unit_id)
        return 0.0
    if in_process:
        row.run(call)
    else:
        from flows.processes import run_unit_in_process

        try:
            run_unit_in_process(call, env or {})
        except RuntimeError as exc:  # e.g. killed: leave the reason where the aggregation reads it
            from flows.downstream import record_unit_error, unit_url

            record_unit_error(unit_url(call.url, unit), str(exc))
            raise
    return time.time() - start
