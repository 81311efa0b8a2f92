"""What is checked before any work starts, and the lock that keeps two runs off one root.

``preflight`` runs in the CLI before Prefect's server starts and again at the top of every flow
(a deployment run has no CLI): the root is a folder (or can be made one), each stage's row's
own ``preflight`` passes (``flows.hooks``: a preset that needs the user's corpora has them set,
the pretrain stage's backend exists on this host), every other raw input exists and is not
empty, and the tracking store answers. Each failure is one line naming the path or field.

``RootLock`` is an exclusive ``flock`` on ``{root}/.bertflow.lock``: a second run on the same
root refuses at once, naming the process that holds it, instead of racing the first (which
corrupted shards and the MLflow database). The kernel drops the lock when its process dies, so
a SIGKILLed run never leaves the root locked. Remote roots (``gs://``) cannot be flocked: there
the lock is not taken and a warning says so (run one flow per root).
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from flows.presets import RunConfig
from flows.table import get_stage, stage_inputs, written_by_this_run
from flows.tracking import check_tracking_uri

log = logging.getLogger("bertflow.flow")
LOCK_NAME = ".bertflow.lock"


class RootBusyError(RuntimeError):
    """Another run holds the root."""


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    return os.path.abspath(url.removeprefix("file://"))


def absolute_root(root: str) -> str:
    """A local root as an absolute path (a URL as given): what runs are tagged with and lineage
    names, so a store shared by runs started from different folders holds no relative path."""
    return os.path.abspath(root) if "://" not in root else root


def stages_to_run(
    cfg: RunConfig, root: str, stages: list[str], forced: set[str], given: dict[str, str] | None = None
) -> list[str]:
    """The stages of ``stages`` (in chain order) that a run skipping finished stages will run: from
    the first that is forced (its group in ``forced``) or not done, every one after it too (an
    upstream rerun may change their inputs; the runner checks each again before it runs)."""
    from flows.runner import stage_state

    for i, stage in enumerate(stages):
        if stage.split("/", 1)[0] in forced or stage_state(stage, cfg, root, given).state != "done":
            return stages[i:]
    return []


def preflight(
    cfg: RunConfig,
    root: str,
    stages: list[str],
    tracking_uri: str | None,
    given: dict[str, str] | None = None,
    forced: set[str] | None = None,
) -> None:
    """Raise a one-line error naming the path when the run cannot work; do nothing else.
    ``given``: input URLs replacing the defaults (a stage flow's parameters). ``forced``: the
    groups a run that skips finished stages reruns (None: every stage runs); the stages it will
    skip are not checked (a disk estimate for a finished stage refused a run that would skip it)."""
    if forced is not None:
        stages = stages_to_run(cfg, root, stages, forced, given)
    if is_local(root):
        path = local_path(root)
        if os.path.exists(path) and not os.path.isdir(path):
            raise NotADirectoryError(f"--root {root} is a file, not a folder")
        parent = path
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.access(parent, os.W_OK):
            raise PermissionError(f"--root {root}: {parent} is not writable")
    from pipeline.schema.manifest import check_inputs_agree, fingerprint_input

    running = {get_stage(s).provides for s in stages} - {""}  # what this run writes before it is read
    for stage in stages:
        inputs = stage_inputs(stage, cfg, root, given)
        row = get_stage(stage)
        checked = (row.preflight(cfg, inputs) if row.preflight is not None else None) or set()
        for name, url in inputs.items():
            if name in checked or written_by_this_run(name, url, root):
                continue  # the row's own check took it, or an earlier stage of this run writes it
            try:
                fingerprint_input(url)
            except FileNotFoundError as exc:
                raise FileNotFoundError(f"stage {stage}, input {name}: {exc}") from None

        # inputs that must belong together, unless this run writes one of them first (the runner
        # checks those again before the stage runs)
        first = {n for n in running if written_by_this_run(n, inputs.get(n, ""), root)}  # this run writes them first
        check_inputs_agree(inputs, [(a, b) for a, b in row.agree if not {a, b} & first])
    if tracking_uri:
        check_tracking_uri(tracking_uri)


class RootLock:
    """An exclusive, re-entrant (within this process) lock on a run root."""

    _held: dict[str, tuple[int, int]] = {}  # path -> (fd, depth)
    _guard = threading.Lock()

    def __init__(self, root: str):
        self.root = root
        self.path = os.path.join(local_path(root), LOCK_NAME) if is_local(root) else None

    def __enter__(self) -> RootLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        if self.path is None:
            log.warning("root %s is remote: no lock is taken; run one flow per root", self.root)
            return
        import fcntl

        with self._guard:
            if self.path in self._held:
                fd, depth = self._held[self.path]
                self._held[self.path] = (fd, depth + 1)
                return
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise RootBusyError(
                    f"root {self.root} is in use by {holder}; wait for that run to finish, or use another --root"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
            self._held[self.path] = (fd, 1)

    def release(self) -> None:
        if self.path is None:
            return
        with self._guard:
            if self.path not in self._held:
                return
            fd, depth = self._held[self.path]
            if depth > 1:
                self._held[self.path] = (fd, depth - 1)
                return
            del self._held[self.path]
            os.close(fd)  # closing drops the flock
