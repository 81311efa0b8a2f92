"""What a stage process and its parent share: the spec, progress lines, exit codes, and dying together.

- **The spec**: one JSON file (never a pickle: any host can read it and nothing of the parent's
  code runs), written ``0600`` since it may hold credentials (:func:`write_spec`).
- **Progress**: the child prints ``bertflow.progress DONE TOTAL`` lines on stderr
  (:func:`progress_reporter`); the parent turns them into progress bars and Prefect's progress
  artifact instead of logging them (:func:`forward`).
- **Exit codes** of a stage process: 0 done, 1 failed (worth a retry: a lost worker, a busy
  database), 2 bad input or config (deterministic: never retried), 3 a checkpoint that cannot
  continue under this config (pretraining: rerun with ``--force pretrain``), 4 the training loss
  diverged (NaN/inf; the message names the step and the checkpoint), 5 the disk is full (the
  message names the file and the filesystem; never retried), 6 the MLflow tracking server
  refused connections for the whole wait (``flows.tracking``, design choice 5: the message names
  it; never retried, a retry would wait for it again; a rerun after its restart resumes), 130 / 143 stopped by SIGINT /
  SIGTERM (the trainer wrote its checkpoint first; a rerun resumes); a negative code is the
  signal that killed it (-9: most often the kernel's out-of-memory killer). The parent turns a
  non-zero code into a :class:`StageProcessError` that says which of these it was and whether a
  retry can help (:func:`describe_exit`, :func:`worth_retrying`).
- **Dying together**: a child is started with ``PR_SET_PDEATHSIG`` (:func:`set_parent_death_signal`,
  Linux), so a killed parent never leaves an orphan; stopping is SIGTERM, a grace period for the
  checkpoint, then SIGKILL (:func:`stop_process`).
- **The stop request** (:data:`STOP`): the first SIGINT/SIGTERM the flow's process gets is
  recorded once for the whole process; from then on no stage, unit or retry starts, and every
  failure is the interruption's, not a reason to retry.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_RESUME_REFUSED = 3
EXIT_DIVERGED = 4
EXIT_DISK_FULL = 5
EXIT_TRACKING_GONE = 6
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143
STOPPED_BY_SIGNAL = (EXIT_INTERRUPTED, EXIT_TERMINATED, -signal.SIGINT, -signal.SIGTERM)
NOT_RETRIED = (EXIT_BAD_INPUT, EXIT_RESUME_REFUSED, EXIT_DIVERGED, EXIT_DISK_FULL, EXIT_TRACKING_GONE,
               -signal.SIGKILL, *STOPPED_BY_SIGNAL)  # fmt: skip
"""Exit codes a retry cannot change: bad input, a refused resume, a divergence, a full disk (the
retry fills it again, and its MLflow calls then fail on the full disk instead, hiding the cause),
a tracking server gone for the whole wait (the retry waits for it again), an interruption, and
SIGKILL (on one machine the kernel's OOM killer, which kills the retry the same way)."""
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "os error 28", "database or disk is full")

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
@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    """What every child is started from, a stage process and the training process alike (one
    shape across process boundaries; ``flows.calls.StageCall.spec`` builds it): the row's name,
    the root, the output and input URLs, the run config as ``dataclasses.asdict`` gives it (the
    child rebuilds it through ``flows.presets.config_from_dict``, so every value is validated
    again), and the call's options."""

    stage: str
    root: str
    url: str
    inputs: dict[str, str]
    config: dict[str, Any]
    restart: bool = False
    unit: dict[str, Any] | None = None


def write_spec(path: str, spec: ProcessSpec) -> None:
    """Write a child's spec to a new file only its owner can read (it may hold credentials)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(dataclasses.asdict(spec), f)


def read_spec(path: str) -> ProcessSpec:
    with open(path) as f:
        return ProcessSpec(**json.load(f))


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


def forward(
    stream, logger: logging.Logger, on_progress: Callable[[int, int], None] | None, errors: list[str] | None = None
) -> None:
    """In the parent: log each line of a child's output (a record of the child's ``bertflow.*``
    loggers under its own name and level, any other line under ``logger``), except progress
    lines, which go to ``on_progress``. ``errors`` collects the child's ERROR records (the last
    one goes into the failure's message: the file, the step, the checkpoint it names)."""
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
            if errors is not None and record.group(1) in ("ERROR", "CRITICAL"):
                errors.append(record.group(3))
                del errors[:-5]
        elif line:
            logger.info("%s", line)


LISTENERS: list[Callable[[str, int, int], None]] = []
"""Called with (stage, done, total) on every progress line (the CLI's progress bar)."""


def notify_progress(stage: str, done: int, total: int) -> None:
    for listener in list(LISTENERS):
        listener(stage, done, total)


# -- exit codes and what a retry can do -------------------------------------------------------------
def describe_exit(code: int) -> str:
    """A child's exit code in words: ``exited with code 1``, ``killed by signal 9 (SIGKILL: out of
    memory?)``, ``stopped by SIGTERM``..."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = ": out of memory? (the kernel's OOM killer sends it)" if -code == signal.SIGKILL else ""
        return f"exited with code {code}: killed by signal {-code} ({name}{why})"
    words = {
        EXIT_BAD_INPUT: "bad input or config",
        EXIT_RESUME_REFUSED: "its checkpoints cannot continue under this config",
        EXIT_DIVERGED: "the training loss diverged",
        EXIT_DISK_FULL: "the disk is full",
        EXIT_TRACKING_GONE: "the MLflow tracking server went away",
        EXIT_INTERRUPTED: "stopped by SIGINT",
        EXIT_TERMINATED: "stopped by SIGTERM",
    }
    return f"exited with code {code}" + (f" ({words[code]})" if code in words else "")


class StageProcessError(RuntimeError):
    """A stage's process ended with a non-zero code; ``retryable`` says whether a retry can help."""

    def __init__(self, what: str, code: int, hint: str = ""):
        super().__init__(f"{what}: its process {describe_exit(code)}" + (f"; {hint}" if hint else ""))
        self.what, self.code = what, code

    @property
    def retryable(self) -> bool:
        return self.code not in NOT_RETRIED


class StopRequested(RuntimeError):
    """Raised instead of starting work (a stage, a unit, a process) after the stop request."""


def _deterministic_types() -> tuple[type[BaseException], ...]:
    from pipeline.schema.manifest import ManifestError  # ConfigError is a ValueError

    return (ValueError, KeyError, TypeError, FloatingPointError, FileNotFoundError, NotADirectoryError, ManifestError)


class DiskFullError(OSError):
    """A stage met a full disk (its message from :func:`describe_disk_full`); never retried."""

    deterministic = True


def disk_full(exc: BaseException | None) -> OSError | None:
    """The ``ENOSPC``/``EDQUOT`` error behind ``exc`` (itself, its cause or its context), or None:
    torch and pyarrow wrap the OS's error in their own."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return exc
        text = str(exc)
        if any(t in text for t in _DISK_FULL_TEXT):  # safetensors, Beam and SQLite keep only the words
            return OSError(errno.ENOSPC, text[:300])
        exc = exc.__cause__ or exc.__context__
    return None


def describe_disk_full(err: OSError, where: str) -> str:
    """One line naming the full disk: the file being written, the filesystem's mount point and
    its free space."""
    import shutil

    path = os.path.abspath(str(err.filename or where.removeprefix("file://")))
    folder = path
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    mount = folder
    while not os.path.ismount(mount) and os.path.dirname(mount) != mount:
        mount = os.path.dirname(mount)
    try:
        usage = shutil.disk_usage(folder)
        space = f"{usage.free / 1e6:,.1f} MB free of {usage.total / 1e6:,.1f} MB"
    except OSError:
        space = "free space unknown"
    what = "disk quota exceeded" if err.errno == errno.EDQUOT else "no space left on the disk"
    return (
        f"{what} writing {path} (the filesystem mounted at {mount}: {space}); free space there or use a root on "
        "a larger disk, then rerun: finished stages and good checkpoints are kept"
    )


def is_deterministic(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is an error of the input, the config or the code, which a
    retry meets again: a ConfigError/ValueError of bad input, a missing file, a manifest error, a
    divergence, a child that exited with one of :data:`NOT_RETRIED`, any exception whose class says
    ``deterministic = True`` (a host too small for the stage)."""
    kinds = _deterministic_types()
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, StageProcessError):
            return not exc.retryable
        if isinstance(exc, (kinds, StopRequested, TimeoutError)) or getattr(exc, "deterministic", False):
            return True
        if disk_full(exc) is not None:  # a retry fills the same disk again
            return True
        exc = exc.__cause__  # an explicit ``raise ... from``: what decided the failure
    return False


def tracking_gone(exc: BaseException | None) -> BaseException | None:
    """The ``flows.tracking.TrackingServerGone`` behind ``exc`` (itself, its cause or its
    context), or None."""
    from flows.tracking import TrackingServerGone

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, TrackingServerGone):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def worth_retrying(exc: BaseException | None) -> bool:
    """A failed stage or unit is retried only for what a retry can fix (a lost worker, a busy
    database, a network error): never after the stop request, never for a deterministic error."""
    if STOP.requested is not None:
        return False
    if exc is None:  # nothing to judge by: the row's retries decide
        return True
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return False
    return not is_deterministic(exc)


def exit_code_for(exc: BaseException) -> int:
    """A stage process's exit code for the exception that ended it (see the module docstring)."""
    if isinstance(exc, KeyboardInterrupt) or STOP.requested is not None:
        return 128 + (STOP.requested or signal.SIGINT)
    if isinstance(exc, FloatingPointError):
        return EXIT_DIVERGED
    if disk_full(exc) is not None:
        return EXIT_DISK_FULL
    if tracking_gone(exc) is not None:
        return EXIT_TRACKING_GONE
    return EXIT_BAD_INPUT if is_deterministic(exc) else EXIT_FAILED


# -- the stop request ------------------------------------------------------------------------------
class StopRequest:
    """The one stop request of this process: the signal that asked (None: none yet)."""

    def __init__(self):
        self.requested: int | None = None
        self._lock = threading.Lock()

    def request(self, signum: int) -> bool:
        """Record ``signum``; True the first time (later signals change nothing)."""
        with self._lock:
            if self.requested is not None:
                return False
            self.requested = int(signum)
            return True

    def check(self, what: str) -> None:
        """Raise :class:`StopRequested` instead of starting ``what`` once a stop was requested."""
        if self.requested is not None:
            raise StopRequested(f"{what}: not started, {signal.Signals(self.requested).name} asked to stop")

    def clear(self) -> None:
        """Forget the request (tests; a process that goes on after a handled stop)."""
        with self._lock:
            self.requested = None


STOP = StopRequest()


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
