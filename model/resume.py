"""Resume or restart: what a checkpoint of an earlier run may continue under the current config.

A checkpoint records the config it was written under. Against the current config the fields
fall into three kinds:

- **free** (logging, checkpointing, evaluation, backend, loader workers, precision, unpadding,
  compilation): they change neither the weights' meaning nor the data order; resuming is
  silent, and bit-exact where the kernels stay the same (same backend, precision, unpadding and
  compilation).
- **tunable** (learning rate, warm-up, steps and micro-batch size per phase, weight decay,
  betas, eps, clipping):
  the run continues from the checkpoint under the new values, with a warning naming them;
  the schedule is rebuilt for the new step counts.
- **binding** (the model's shape, seed, masking, data parts, phases' names, lengths and batch
  sizes, the optimiser kind, ddp/fsdp (their optimizer states differ), ``init_from``): the
  checkpoint cannot continue this run. ``restart=True`` (``--force pretrain``; a deployment
  run: ``--param force='["pretrain"]'``) clears the run and starts over; without it the error
  says exactly that: a changed setting may be a slip, and days of training are not thrown away
  on a typo.
- **the input** (the examples' fingerprint): checkpoints made from other examples (a new dump
  went through the earlier stages) are neither resumed nor an error: :func:`inputs_changed` says
  so and ``model.train.setup`` moves them aside, under ``_previous-<their examples' fingerprint>/``
  in the stage folder (:func:`set_aside`), and starts over. The stage's ``finish`` removes the
  set-aside folders once the new run has written its manifest, so a failed refresh keeps the old
  run's checkpoints and final weights until a new one has replaced them. Cost: the disk of one
  more run while the refresh trains. ``_attempt.json`` (``pipeline.schema.manifest.write_attempt``) records which
  examples the checkpoints in the folder come from, so that ``bertflow status`` can tell
  "restarts" from "resumes" when no manifest is there (a failed attempt).

:class:`TrainState` (where training stands, saved in every checkpoint), :func:`check_resume`
(the saved state, or the error) and :func:`restore` (optimizer, schedule and RNG state under the
current hyper-parameters) apply those rules in ``model.train.setup``.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import Any

import fsspec
import torch

from model.backend import Backend
from model.checkpoint import load_latest_good
from model.config import BertConfig, PretrainConfig
from model.contract import config_digest, join_url, write_attempt
from model.data import stable_seed
from model.stage_configs import FREE

log = logging.getLogger("bertflow.pretrain")

TUNABLE = ("learning_rate", "warmup_steps", "weight_decay", "beta1", "beta2", "eps", "max_grad_norm")


FORCE_REMEDY = "bertflow run --force pretrain, or a deployment run with --param force='[\"pretrain\"]'"
"""How to start pretraining over, in every words a user may run it with."""
PREVIOUS_PREFIX = "_previous-"


class ResumeError(RuntimeError):
    """A checkpoint exists that cannot continue under this config; the message says what to do."""


def run_record(
    config: PretrainConfig, model_config: BertConfig, examples_fp: str, data_parts: int, init_from: str = ""
) -> dict[str, Any]:
    """What a checkpoint stores about the run that wrote it."""
    pretrain = dataclasses.asdict(config)
    pretrain["data_parts"] = data_parts  # resolved (0 means "processes x workers")
    return {
        "pretrain": pretrain,
        "model": dataclasses.asdict(model_config),
        "examples": examples_fp,
        "init_from": init_from,
    }


def exact_digest(record: dict[str, Any]) -> str:
    """Digest of everything but the free fields: equal digests resume bit-exact."""
    pretrain = {k: v for k, v in record["pretrain"].items() if k not in FREE}
    return config_digest({**record, "pretrain": pretrain})


def compare(saved: dict[str, Any], current: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(binding differences, tunable differences) between two run records, as field names."""
    binding, tunable = [], []
    if saved.get("model") != current["model"]:
        changed = sorted(k for k in current["model"] if saved.get("model", {}).get(k) != current["model"][k])
        binding += [f"model.{k}" for k in changed] or ["model"]
    if saved.get("examples") != current["examples"]:
        binding.append("examples (the example stage's output changed)")
    if saved.get("init_from", "") != current.get("init_from", ""):
        binding.append("init_from")
    sp, cp = saved.get("pretrain", {}), current["pretrain"]
    for k, v in cp.items():
        if k in FREE or k == "phases" or sp.get(k) == v:
            continue
        (tunable if k in TUNABLE else binding).append(f"pretrain.{k}")
    old, new = sp.get("phases", []), cp["phases"]
    shape = lambda ps: [(p["name"], p["max_seq_length"], p["batch_size"]) for p in ps]
    if shape(old) != shape(new):
        binding.append("pretrain.phases (names, lengths or batch sizes)")
    else:
        for field in ("steps", "micro_batch_size"):
            if [p.get(field, 0) for p in old] != [p.get(field, 0) for p in new]:
                tunable.append(f"pretrain.phases[*].{field}")
    return binding, tunable


@dataclasses.dataclass
class TrainState:
    """Where training stands; saved in every checkpoint."""

    global_step: int = 0
    phase_index: int = 0
    phase_step: int = 0  # steps done in the current phase
    loader_position: int = 0  # local batches the phase's loader has served
    examples_seen: int = 0
    seconds: float = 0.0  # training time over all sessions
    first_window: dict[str, float] | None = None
    last_window: dict[str, float] | None = None
    last_eval: dict[str, float] | None = None
    run_digest: str = ""
    record: dict[str, Any] | None = None  # the config that wrote it (model/resume.py)


def inputs_changed(saved: dict, current: dict[str, Any]) -> str:
    """The examples' fingerprint a checkpoint was made from when it differs from the current run's
    (``current``: :func:`run_record`), else "": such a checkpoint is set aside, not resumed."""
    old = (saved["train"].get("record") or {}).get("examples") or ""
    return old if old and old != current["examples"] else ""


def set_aside(run_url: str, examples_fp: str) -> str:
    """Move everything of a run folder but its bookkeeping (``_*``) to ``_previous-<fp>/`` inside
    it, where checkpoints are no longer found; return that URL."""
    fs, root = fsspec.core.url_to_fs(run_url)
    aside = join_url(root, PREVIOUS_PREFIX + examples_fp[:16])
    if fs.exists(aside):  # an earlier set-aside of the same examples: the newer checkpoints win
        fs.rm(aside, recursive=True)
    fs.makedirs(aside, exist_ok=True)
    for path in fs.ls(root, detail=False):
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if not name.startswith("_"):
            fs.mv(path, join_url(aside, name), recursive=True)
    return join_url(run_url, PREVIOUS_PREFIX + examples_fp[:16])


def remove_set_aside(run_url: str) -> list[str]:
    """Remove the ``_previous-*`` folders (the new run has finished); return what was removed."""
    fs, root = fsspec.core.url_to_fs(run_url)
    gone = [p for p in fs.glob(join_url(root, PREVIOUS_PREFIX + "*")) if fs.isdir(p)]
    for p in gone:
        fs.rm(p, recursive=True)
    return gone


def resume_point(output_url: str, record: dict[str, Any], examples_fp: str, backend: Backend):
    """The latest good checkpoint under ``output_url`` to continue from (``load_latest_good``'s
    tuple), or ``None`` to start: none there, or one made from other examples (new data upstream),
    which is set aside (:func:`set_aside`) until this run finishes. Every host must find the same
    step; the attempt's examples fingerprint is written either way."""
    found = load_latest_good(output_url)
    if not backend.same_everywhere(-1 if found is None else int(found[2]["train"]["global_step"])):
        raise RuntimeError(
            f"the hosts of the pod slice found different checkpoints to resume under {output_url} "
            f"(this host: {found[0] if found else 'none'}); rerun: they must continue the same step"
        )
    old_examples = inputs_changed(found[2], record) if found is not None else ""
    if old_examples:  # made from other examples (new data upstream): start over, the old run kept aside
        if backend.is_main:
            aside = set_aside(output_url, old_examples)
            log.warning(
                "the checkpoints under %s were made from other examples (%s, now %s): starting over; "
                "the old run is kept at %s until this one finishes",
                output_url, old_examples[:16], examples_fp[:16], aside,
            )  # fmt: skip
        backend.barrier()
        found = None
    if backend.is_main:
        write_attempt(output_url, {"examples": examples_fp})
    return found


def check_resume(url: str, saved: dict, fresh: TrainState) -> TrainState:
    """The saved state, if its config may continue under the current one (:func:`compare`)."""
    state = TrainState(**saved["train"])
    if state.run_digest != fresh.run_digest:
        binding, tunable = compare(state.record or {}, fresh.record)
        if binding:
            raise ResumeError(
                f"checkpoint {url} was written by a run with a different {', '.join(binding)}: it cannot "
                f"continue under this config. To start this stage over: {FORCE_REMEDY} (restart=true in "
                "the training spec); or set the old value back to resume"
            )
        log.warning("resuming %s under changed settings: %s", url, ", ".join(tunable))
    state.run_digest, state.record = fresh.run_digest, fresh.record
    return state


def restore(found, model, optimizer, scheduler, backend: Backend, state: TrainState, config: PretrainConfig) -> None:
    """Optimizer, schedule and RNG state of the checkpoint ``found`` = (url, weights, state), under
    the current config's hyper-parameters."""
    url, _, saved = found
    backend.load_optimizer_state(model, optimizer, saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    # the current config's hyper-parameters and schedule (identical values on an exact resume)
    lam = scheduler.lr_lambdas[0]
    lam.warmup_steps, lam.total_steps = config.warmup_steps, config.total_steps
    scheduler.base_lrs = [config.learning_rate] * len(optimizer.param_groups)
    for i, group in enumerate(optimizer.param_groups):
        group["initial_lr"] = config.learning_rate
        group["lr"] = config.learning_rate * lam(scheduler.last_epoch)
        group["betas"], group["eps"] = (config.beta1, config.beta2), config.eps
        group["weight_decay"] = config.weight_decay if i == 0 else 0.0
    if backend.rank == 0:  # the saved RNG states are rank 0's (on XLA: every host's, one SPMD program)
        rng = saved["rng"]
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
        backend.set_rng_state(rng["device"])
    else:  # other ranks: a fresh dropout stream per (rank, step); exact resume is for rank 0's
        torch.manual_seed(stable_seed(config.seed, "rank", backend.rank, state.global_step))
    log.info("resuming from %s (step %d)", url, state.global_step)
