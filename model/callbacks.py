"""What the training loop tells an observer on every process, and the data trace built on it.

``model.train.fit`` calls a :class:`Callbacks` object at the start of training, after every
optimizer step (with the ``(shard, row)`` keys of the examples this process trained on) and at
the end (with this process's whole model, if the callbacks ask for it). Metrics go the other way,
through ``log_fn``, on the main process only. The loop itself reads no environment variable:
whoever starts it (``flows/proc/train_entry.py``, a test) decides which callbacks to pass.

:class:`DataTrace` writes what each process saw and holds into a folder, for the tests that check
that data-parallel ranks and TPU hosts read disjoint data and end with the same weights:
``rank{r}.pid`` (the process id, at the start), ``rank{r}.txt`` (one line per step: the keys
``shard:row`` of its examples) and ``rank{r}.weights.pt`` (its weights, at the end), ``r`` being
the data rank.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn


class Callbacks:
    """No-op hooks; subclass and override. Called on every process, in the same order."""

    wants_weights = False
    """Whether :meth:`on_fit_end` gets the model: gathering it is a collective under FSDP, so
    this must be the same on every process."""

    def on_fit_start(self, rank: int) -> None:
        """Training (of every remaining phase) starts on the process of data rank ``rank``."""

    def on_step(self, keys: np.ndarray) -> None:
        """One optimizer step done; ``keys`` (n, 2): (shard, row) of this process's examples."""

    def on_fit_end(self, model: nn.Module | None) -> None:
        """Every step done (not called when training stops on a signal or an error); ``model``:
        this process's whole model when :attr:`wants_weights` (None on FSDP ranks but 0)."""


class DataTrace(Callbacks):
    """Writes ``rank{r}.pid``, ``rank{r}.txt`` and ``rank{r}.weights.pt`` into ``folder``."""

    wants_weights = True

    def __init__(self, folder: str | os.PathLike):
        self.folder = str(folder)
        self.rank = 0

    def _path(self, suffix: str) -> str:
        return os.path.join(self.folder, f"rank{self.rank}.{suffix}")

    def on_fit_start(self, rank: int) -> None:
        self.rank = rank
        with open(self._path("pid"), "w") as f:
            f.write(str(os.getpid()))

    def on_step(self, keys: np.ndarray) -> None:
        with open(self._path("txt"), "a") as f:
            f.write(" ".join(f"{a}:{b}" for a, b in keys.tolist()) + "\n")

    def on_fit_end(self, model: nn.Module | None) -> None:
        if model is not None:
            torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, self._path("weights.pt"))
