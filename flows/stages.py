"""The stages of the chain as plain calls: where each writes, what it reads, when it is skipped.

A stage is skipped when its folder holds a manifest made from the same config and the same
input fingerprints; a changed upstream stage changes its fingerprint, so everything after it
reruns. ``force`` reruns a stage whatever its manifest says. Nothing here imports Prefect or
MLflow: the Prefect tasks in ``flows.pretrain_flow`` wrap these calls, and tests call them
directly.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from flows.presets import RunConfig, resolve_data
from pipeline.schema import (
    Manifest,
    ManifestError,
    fingerprint_input,
    has_manifest,
    join_url,
    read_manifest,
)

log = logging.getLogger("bertflow.flow")

STAGES = ("corpus", "vocab", "examples", "pretrain", "export", "finetune")
LogFn = Callable[[dict[str, float], int], None]


@dataclass
class StageResult:
    stage: str
    status: str  # "done" | "skipped"
    seconds: float
    url: str
    counts: dict[str, float] = field(default_factory=dict)
    manifest: Manifest | None = None


def stage_url(root: str, stage: str) -> str:
    """The folder a stage writes; ``finetune/<task>`` for a downstream task."""
    folders = {
        "corpus": "corpus",
        "vocab": "vocab",
        "examples": "examples",
        "pretrain": "checkpoints",
        "export": "model",
    }
    if stage.startswith("finetune/"):
        return join_url(root, stage)
    return join_url(root, folders[stage])


def stage_inputs(stage: str, cfg: RunConfig, root: str) -> dict[str, str]:
    """Input name -> URL of what a stage reads."""
    data = resolve_data(cfg.data)
    if stage == "corpus":
        return {"wiki": data.wiki, "books": data.books}
    if stage == "vocab":
        return {"corpus": stage_url(root, "corpus")}
    if stage == "examples":
        return {"corpus": stage_url(root, "corpus"), "vocab": stage_url(root, "vocab")}
    if stage == "pretrain":
        return {"examples": stage_url(root, "examples")}
    if stage == "export":
        return {"pretrain": stage_url(root, "pretrain"), "vocab": stage_url(root, "vocab")}
    if stage.startswith("finetune/"):
        from flows.downstream import TASKS

        task = TASKS[stage.split("/", 1)[1]]
        return {"model": stage_url(root, "export"), "data": join_url(data.downstream, task.data_subdir)}
    raise KeyError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")


def model_config(cfg: RunConfig, root: str):
    """The network's config with vocab_size taken from the trained vocabulary."""
    vocab = read_manifest(stage_url(root, "vocab"))
    return dataclasses.replace(cfg.model, vocab_size=int(vocab.counts["vocab_size"]))


def stage_config(stage: str, cfg: RunConfig, root: str) -> dict[str, Any]:
    """The config a stage records in its manifest (what decides whether it must rerun)."""
    asdict = dataclasses.asdict
    if stage == "corpus":
        return asdict(cfg.corpus)
    if stage == "vocab":
        return asdict(cfg.vocab)
    if stage == "examples":
        return asdict(cfg.examples)
    if stage == "pretrain":
        from model.train import manifest_config

        return manifest_config(cfg.pretrain, model_config(cfg, root))
    if stage == "export":
        from model.export import manifest_config

        return manifest_config(model_config(cfg, root))
    if stage.startswith("finetune/"):
        from flows.downstream import TASKS

        task = TASKS[stage.split("/", 1)[1]]
        if task.kind == "glue":
            from tasks.glue import manifest_config as glue_config

            return glue_config(cfg.finetune, task.glue_task)
        from tasks.squad import manifest_config as squad_config

        return squad_config(cfg.finetune, task.squad_version)
    raise KeyError(stage)


def current_manifest(stage: str, cfg: RunConfig, root: str) -> Manifest | None:
    """The stage's manifest if it is up to date with this config and these inputs, else None."""
    url = stage_url(root, stage)
    if not has_manifest(url):
        return None
    try:
        manifest = read_manifest(url)
        inputs = {k: fingerprint_input(u) for k, u in stage_inputs(stage, cfg, root).items()}
        expected = stage_config(stage, cfg, root)
    except (ManifestError, FileNotFoundError, KeyError):
        return None
    return manifest if manifest.matches(expected, inputs) else None


UPSTREAM = {"corpus": "corpus", "vocab": "vocab", "examples": "examples", "pretrain": "pretrain", "model": "export"}


def check_inputs_ready(stage: str, cfg: RunConfig, root: str) -> None:
    """Fail before any work when an input is missing: an upstream stage unfinished, a raw file absent."""
    for name, url in stage_inputs(stage, cfg, root).items():
        upstream = UPSTREAM.get(name)
        if upstream is not None and stage != "corpus":
            if not has_manifest(url):
                raise ManifestError(
                    f"stage {stage} needs {name} at {url}, which has no finished manifest: run "
                    f"`bertflow stage {upstream}` (or `bertflow run`) first"
                )
        else:
            fingerprint_input(url)  # raises FileNotFoundError naming the URL


def run_stage(
    stage: str,
    cfg: RunConfig,
    root: str,
    force: bool = False,
    log_fn: LogFn | None = None,
    env: dict[str, str] | None = None,
) -> StageResult:
    """Run one stage unless its manifest is current (or ``force``); return what it did."""
    url = stage_url(root, stage)
    start = time.time()
    if not force:
        manifest = current_manifest(stage, cfg, root)
        if manifest is not None:
            log.info("stage %s: up to date, skipped (%s)", stage, url)
            return StageResult(stage, "skipped", time.time() - start, url, manifest.counts, manifest)
    check_inputs_ready(stage, cfg, root)
    log.info("stage %s: running -> %s", stage, url)
    manifest = _execute(stage, cfg, root, url, log_fn, env)
    seconds = time.time() - start
    log.info("stage %s: done in %.1f s", stage, seconds)
    return StageResult(stage, "done", seconds, url, manifest.counts, manifest)


def _execute(stage, cfg: RunConfig, root: str, url: str, log_fn, env) -> Manifest:
    inputs = stage_inputs(stage, cfg, root)
    if stage == "corpus":
        from pipeline.corpus import run_corpus

        return run_corpus(cfg.corpus, inputs, url)
    if stage == "vocab":
        from pipeline.wordpiece import run_vocab

        return run_vocab(cfg.vocab, inputs["corpus"], url)
    if stage == "examples":
        from pipeline.examples import run_examples

        return run_examples(cfg.examples, inputs["corpus"], inputs["vocab"], url)
    if stage == "pretrain":
        return run_pretrain_subprocess(cfg, root, url, env)
    if stage == "export":
        from model.export import run_export

        return run_export(inputs["pretrain"], inputs["vocab"], url)
    if stage.startswith("finetune/"):
        return run_downstream_subprocess(stage, cfg, root, url, env)
    raise KeyError(stage)


def execute_downstream(stage: str, cfg: RunConfig, root: str, url: str, log_fn: LogFn | None) -> Manifest:
    """Fine-tune and evaluate one downstream task in this process."""
    from flows.downstream import run_downstream

    name = stage.split("/", 1)[1]
    data_root = resolve_data(cfg.data).downstream
    model_url = stage_inputs(stage, cfg, root)["model"]
    return run_downstream(name, cfg.finetune, data_root, model_url, url, log_fn=log_fn)


def run_downstream_subprocess(
    stage: str, cfg: RunConfig, root: str, url: str, env: dict[str, str] | None
) -> Manifest:
    """Each downstream task runs in a process of its own: the tasks fan out in parallel, and
    torch's global RNG (dropout) is not shared between them, so each result is reproducible.
    The cores are split between the tasks unless OMP_NUM_THREADS is set."""
    proc_env = {**os.environ, **(env or {})}
    if "OMP_NUM_THREADS" not in os.environ:
        proc_env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, len(cfg.finetune_tasks))))
    payload = pickle.dumps((stage, cfg, root, url))
    cmd = [sys.executable, "-m", "flows.finetune_entry"]
    result = subprocess.run(cmd, input=payload, env=proc_env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{stage}: fine-tuning subprocess failed with exit code {result.returncode}")
    return read_manifest(url)


def run_pretrain_subprocess(cfg: RunConfig, root: str, url: str, env: dict[str, str] | None) -> Manifest:
    """Pretraining runs in a process of its own (a torchrun/XLA launcher at scale)."""
    payload = json.dumps(
        {
            "pretrain": dataclasses.asdict(cfg.pretrain),
            "model": dataclasses.asdict(model_config(cfg, root)),
            "examples_url": stage_url(root, "examples"),
            "output_url": url,
        }
    )
    cmd = [sys.executable, "-m", "flows.train_entry", "--spec", payload]
    proc_env = {**os.environ, **(env or {})}
    result = subprocess.run(cmd, env=proc_env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"pretraining subprocess failed with exit code {result.returncode}: {' '.join(cmd[:3])}")
    return read_manifest(url)


def stages_after(stage: str) -> list[str]:
    """``stage`` and every stage that follows it in the chain."""
    base = stage.split("/", 1)[0]
    if base not in STAGES:
        raise KeyError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    return list(STAGES[STAGES.index(base) :])
