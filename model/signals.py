"""Stopping on SIGTERM/SIGINT without losing work: record the signal, finish the step, checkpoint.

``model.train.fit`` runs inside :class:`StopSignals`; after each step every process agrees
whether any got a signal (``Backend.any_rank``), and if so all write a checkpoint and raise
:class:`Preempted` (the training process exits 143, or 130 for SIGINT; a rerun resumes).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

log = logging.getLogger("bertflow.pretrain")


class Preempted(RuntimeError):
    """Training stopped on a signal after writing a checkpoint; rerun to resume."""

    def __init__(self, signum: int, step: int):
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step} (checkpoint written)")
        self.signum, self.step = signum, step


class StopSignals:
    """Records SIGTERM/SIGINT instead of dying, so the loop can checkpoint first.

    Installed only in the main thread (Python's rule); a second signal of the same kind while
    stopping falls back to the default action.
    """

    def __init__(self):
        self.requested: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum, frame):
        if self.requested is not None:  # asked twice: stop now
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
            return
        self.requested = signum
        log.warning(
            "%s received: finishing this step, writing a checkpoint, then stopping", signal.Signals(signum).name
        )

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
        return False
