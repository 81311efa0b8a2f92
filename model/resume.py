"""Resume or restart: what a checkpoint of an earlier run may continue under the current config.

A checkpoint records the config it was written under. Against the current config the fields
fall into three kinds:

- **free** (logging, checkpointing, evaluation, backend, loader workers, precision): they change
  neither the weights' meaning nor the data order; resuming is silent and bit-exact.
- **tunable** (learning rate, warm-up, steps and micro-batch size per phase, weight decay,
  betas, eps, clipping):
  the run continues from the checkpoint under the new values, with a warning naming them;
  the schedule is rebuilt for the new step counts.
- **binding** (the model's shape, the examples, seed, masking, data parts, phases' names,
  lengths and batch sizes, the optimiser kind, ddp/fsdp (their optimizer states differ),
  ``init_from``): the checkpoint cannot continue
  this run. ``restart=True`` (``--force pretrain``) clears the run and starts over; without it
  the error says exactly that.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from model.config import BertConfig, PretrainConfig
from model.contract import config_digest

FREE = (
    "log_every",
    "checkpoint_every",
    "backend",
    "eval_every",
    "eval_batches",
    "loader_workers",
    "precision",
    "peak_tflops",
    "keep_checkpoints",
    "nproc",
)  # nproc: data_parts holds what binds
TUNABLE = ("learning_rate", "warmup_steps", "weight_decay", "beta1", "beta2", "eps", "max_grad_norm")


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
