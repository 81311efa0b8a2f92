"""What a stage process and its parent share: the spec, progress lines, exit codes, and dying together.

- **The spec**: one JSON file (never a pickle: any host can read it and nothing of the parent's
  code runs), written ``0600`` since it may hold credentials (:func:`write_spec`).
- **Progress**: the child prints ``bertflow.progress DONE TOTAL`` lines on stderr
  (:func:`progress_reporter`); the parent turns them into progress bars and Prefect's progress
  artifact instead of logging them (:func:`forward`).
- **Exit codes** of a stage process: 0 done, 1 failed, 3 a checkpoint that cannot continue under
  this config (pretraining: rerun with ``--force pretrain``), 130 / 143 stopped by SIGINT /
  SIGTERM (the trainer wrote its checkpoint first; a rerun resumes).
- **Dying together**: a child is started with ``PR_SET_PDEATHSIG`` (:func:`set_parent_death_signal`,
  Linux), so a killed parent never leaves an orphan; stopping is SIGTERM, a grace period for the
  checkpoint, then SIGKILL (:func:`stop_process`).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_RESUME_REFUSED = 3
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143
STOPPED_BY_SIGNAL = (EXIT_INTERRUPTED, EXIT_TERMINATED)

CHILD_LOG_FORMAT = "%(levelname)s %(name)s | %(message)s"
"""How a child formats its ``bertflow.*`` log records; the parent logs each again under the
child's logger name and level (:func:`forward`), adding the time."""
_CHILD_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) (bertflow[\w.]*) \| (.*)$")
PROGRESS_PREFIX = "bertflow.progress "
ENV_PROGRESS_TOTAL = "BERTFLOW_PROGRESS_TOTAL"
GRACE_SECONDS = 60.0
"""How long a child has to checkpoint and exit after SIGTERM before it is killed."""
_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux; no-op elsewhere).
    Also the ``preexec_fn`` of a child: it runs between fork and exec."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except OSError:  # no libc of that name
        pass


def child_threads(parallel: int) -> str:
    """Threads per child when ``parallel`` children share this machine's cores."""
    return str(max(1, (os.cpu_count() or 1) // max(1, parallel)))


# -- the spec ---------------------------------------------------------------------------------------
def write_spec(path: str, spec: dict[str, Any]) -> None:
    """Write a child's spec to a new file only its owner can read (it may hold credentials)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f)


def read_spec(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


# -- progress -------------------------------------------------------------------------------------
def progress_reporter(log_fn):
    """In the child: wrap a stage's ``log_fn`` so that each call also prints a progress line for
    the parent (when the parent passed the total in ``BERTFLOW_PROGRESS_TOTAL``)."""
    total = int(os.environ.get(ENV_PROGRESS_TOTAL, "0") or 0)

    def report(metrics: dict[str, float], step: int) -> None:
        if log_fn is not None:
            log_fn(metrics, step)
        if total:
            print(f"{PROGRESS_PREFIX}{step} {total}", file=sys.stderr, flush=True)

    return report


def parse_progress(line: str) -> tuple[int, int] | None:
    """(done, total) of a progress line, None for any other line."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        done, total = (int(x) for x in line[len(PROGRESS_PREFIX) :].split()[:2])
    except ValueError:
        return None
    return done, total


def forward(stream, logger: logging.Logger, on_progress: Callable[[int, int], None] | None) -> None:
    """In the parent: log each line of a child's output (a record of the child's ``bertflow.*``
    loggers under its own name and level, any other line under ``logger``), except progress
    lines, which go to ``on_progress``."""
    for line in stream:
        line = line.rstrip("\n")
        if line.startswith(PROGRESS_PREFIX):
            progress = parse_progress(line)
            if progress is not None and on_progress is not None:
                on_progress(*progress)
            continue
        record = _CHILD_LINE.match(line)
        if record:
            logging.getLogger(record.group(2)).log(logging.getLevelName(record.group(1)), "%s", record.group(3))
        elif line:
            logger.info("%s", line)


LISTENERS: list[Callable[[str, int, int], None]] = []
"""Called with (stage, done, total) on every progress line (the CLI's progress bar)."""


def notify_progress(stage: str, done: int, total: int) -> None:
    for listener in list(LISTENERS):
        listener(stage, done, total)


# -- stopping -------------------------------------------------------------------------------------
def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group ``proc`` leads (started with ``start_new_session``)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_process(proc: subprocess.Popen, grace: float = GRACE_SECONDS, group: bool = False) -> int | None:
    """SIGTERM (a trainer checkpoints and exits), then SIGKILL after ``grace`` seconds; returns
    the exit code. ``group``: signal the child's whole process group (torchrun and its workers)."""
    if proc.poll() is not None:
        return proc.returncode

    def send(sig: int) -> None:
        if group:
            signal_group(proc, sig)
        else:
            proc.send_signal(sig)

    send(signal.SIGTERM)
    try:
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        return proc.wait()
