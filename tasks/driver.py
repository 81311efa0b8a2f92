"""One driver for every fine-tuning unit: a family gives the steps, :func:`run_unit` runs them.

A unit is one fine-tuning run of one task (a point of its grid, a seed). Every family (GLUE,
SQuAD, NER, SWAG, the JSON-lines benchmarks) used to repeat the same loop; here it is written
once, and a family is a :class:`Family` subclass that gives only what differs:

    read -> encode -> head -> predict -> score -> write

:func:`run_unit` does the rest, in this order: begin the run (seed, tokenizer, input
fingerprints, an output folder that is not an input), ``read`` (which checks the eval splits),
``encode``, load the encoder, ``head``, train with ``score(predict(model))`` as the evaluation,
``predict`` with the best epoch's weights, ``write`` (prediction files, the counts), save the
model (``saved``), ``metrics.json``, the manifest. The task's registry row
(:class:`tasks.registry.Task`) is passed, never its name; the row names its family class
(``Task.unit``).

Design choices:
1. A family object holds its unit's data between the steps (the splits, their features), so
   each step's signature stays short; the cost is a class per family instead of one function.
2. The manifest's config is the same for every family: the unit's ``FinetuneConfig``, the task's
   name and the unit's ``feature_mix`` when it has one (``tasks.units.run_manifest_config``, what
   ``tasks.units.unit_is_current`` compares to skip a finished unit).
3. The order of the steps is the order every family had (the head is built after the encoding,
   so torch's RNG, seeded once in ``begin_run``, draws the same head weights and dropout masks):
   the scores of every task are unchanged by the move.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from model.contract import Manifest, join_url, write_manifest
from tasks.config import FinetuneConfig
from tasks.finetune import (
    Feature,
    LogFn,
    TrainResult,
    begin_run,
    load_encoder,
    pick_device,
    save_finetuned,
    train,
    write_json,
)
from tasks.registry import Task, resolve
from tasks.units import run_manifest_config

logger = logging.getLogger("bertflow.finetune")


class Family:
    """The steps of one family's unit. Subclasses set :attr:`select` and implement the steps."""

    select: str = "eval_f1"
    """The dev metric the best epoch maximises."""
    eval_batch_floor: int = 64
    """Evaluation batches are ``max(batch_size, eval_batch_floor)`` rows."""

    def __init__(self, task: Task, config: FinetuneConfig, data_url: str, output_url: str, unit: dict | None = None):
        self.task = task
        self.config = config
        self.data_url = data_url
        self.output_url = output_url
        self.unit = unit or {}
        self.tokenizer = None

    @property
    def eval_batch(self) -> int:
        return max(self.config.batch_size, self.eval_batch_floor)

    def check(self) -> None:
        """Refuse a config the family cannot run, before any work (default: nothing to check)."""

    def read(self) -> None:
        """Read the official files (and check the eval splits: ``check_eval_split``)."""
        raise NotImplementedError

    def encode(self) -> list[Feature]:
        """Encode the splits with ``self.tokenizer``; return the training features."""
        raise NotImplementedError

    def head(self, encoder: torch.nn.Module) -> torch.nn.Module:
        """The task model: the encoder with the task's head."""
        raise NotImplementedError

    def predict(self, model: torch.nn.Module, device: torch.device) -> Any:
        """Dev predictions of ``model``."""
        raise NotImplementedError

    def score(self, predictions: Any) -> dict[str, float]:
        """The official dev metrics of ``predictions``, named ``eval_*``."""
        raise NotImplementedError

    def write(self, model, predictions: Any, result: TrainResult, device: torch.device) -> dict[str, float]:
        """Write the prediction files (dev, test, submissions) of the best epoch's ``model`` and
        ``predictions``; return the unit's counts (its scores first)."""
        raise NotImplementedError

    def saved(self) -> tuple[str, dict[str, Any]] | None:
        """(architecture, config.json extras) of the saved fine-tuned model, or None: not saved."""
        raise NotImplementedError

    def header(self) -> dict[str, Any]:
        """What ``metrics.json`` starts with, before the counts (default: the task's name)."""
        return {"task": self.task.name}


def run_unit(
    task: Task,
    config: FinetuneConfig,
    data_url: str,
    model_url: str,
    output_url: str,
    log_fn: LogFn | None = None,
    save_model: bool = True,
    unit: dict | None = None,
) -> Manifest:
    """Fine-tune and evaluate ``task`` once (one unit of its grid); returns the unit's manifest."""
    started = time.time()
    family: Family = resolve(task.unit)(task, config, data_url, output_url, unit)
    family.check()
    inputs, family.tokenizer = begin_run(config.seed, model_url, data_url, output_url)
    family.read()
    train_features = family.encode()
    model = family.head(load_encoder(model_url))
    device = pick_device()
    model.to(device)

    def evaluate(m) -> dict[str, float]:
        return family.score(family.predict(m, device))

    result = train(model, train_features, config, evaluate, family.select, log_fn, device)
    counts = family.write(model, family.predict(model, device), result, device)  # the best epoch's weights
    saved = family.saved() if save_model else None
    if saved is not None:
        architecture, extra = saved
        save_finetuned(model, model.config, output_url, architecture, extra, model_url)
    seconds = time.time() - started
    counts.update(best_epoch=float(result.best_epoch), steps=float(result.steps), seconds=seconds)
    write_json(join_url(output_url, "metrics.json"), {**family.header(), **counts, "history": result.history})
    logger.info(
        "%s done in %.1f s: %s",
        task.name,
        seconds,
        ", ".join(f"{k} {v:.4f}" for k, v in counts.items() if k.startswith("eval_")),
    )
    return write_manifest(
        f"finetune-{task.name}", output_url, run_manifest_config(task, config, unit), inputs, counts, seconds=seconds
    )
