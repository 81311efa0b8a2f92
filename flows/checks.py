"""What is checked before any work starts, and the lock that keeps two runs off one root.

``preflight`` runs in the CLI before Prefect's server starts and again at the top of every flow
(a deployment run has no CLI): the root is a folder (or can be made one), every raw input
exists and is not empty, the tracking store answers, a preset that needs the user's corpora
(``data.required``: base, large) has them set, and the pretrain stage's backend exists on this
host (``check_backend``: a CUDA device for ``cuda``, an importable ``torch_xla`` for ``xla``).
Each failure is one line naming the path or field.

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
from flows.stages import stage_inputs, written_by_this_run
from flows.tracking import check_tracking_uri

log = logging.getLogger("bertflow.flow")
LOCK_NAME = ".bertflow.lock"


class RootBusyError(RuntimeError):
    """Another run holds the root."""


class BackendUnavailableError(OSError):
    """The configured training backend does not exist on this host."""


def check_data(cfg: RunConfig) -> None:
    """A preset that needs the user's corpora (``data.required``) has ``data.wiki`` and
    ``data.books`` set, and not to the deployments' ``CHANGE-ME`` placeholders."""
    if not cfg.data.required:
        return
    hints = {
        "wiki": "a Wikipedia dump by date, e.g. gs://BUCKET/dumps/enwiki-20261101-pages-articles-multistream*.xml.bz2 "
        "(`bertflow fetch-wiki --lang en --date 20261101 --out gs://BUCKET/dumps`)",
        "books": "a folder of one UTF-8 .txt per book, e.g. gs://BUCKET/books",
    }
    for name, hint in hints.items():
        url = getattr(cfg.data, name)
        if not url or "CHANGE-ME" in url:
            what = "is not set" if not url else f"is still the placeholder {url}"
            raise ValueError(
                f"data.{name}: the {cfg.preset} preset runs on the paper's data and data.{name} {what}; "
                f"--set data.{name}=URL with {hint}"
            )


def check_backend(cfg: RunConfig) -> None:
    """The pretrain stage's backend exists here, decided in seconds: a CUDA device (and
    ``pretrain.nproc`` of them) for ``cuda``; ``torch_xla`` importable for ``xla`` (not imported)."""
    p = cfg.pretrain
    where = f"pretrain.backend={p.backend} (preset {cfg.preset}; $BERTFLOW_BACKEND picks it for base/large)"
    if p.backend == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BackendUnavailableError(
                f"{where}, but torch {torch.__version__} sees no CUDA device on this host: run it on a GPU "
                "host (infra/gpu, the k8s-gpu pool), with the xla backend on a TPU VM (infra/tpu), or "
                "--set pretrain.backend=cpu for a (very slow) smoke run"
            )
        if p.nproc > torch.cuda.device_count():
            raise BackendUnavailableError(
                f"pretrain.nproc={p.nproc} processes but this host has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif p.backend == "xla":
        import importlib.util

        if importlib.util.find_spec("torch_xla") is None:
            raise BackendUnavailableError(
                f"{where}, but torch_xla is not importable here: install the xla extra on the TPU VM "
                "(infra/tpu/install.sh; torch==2.9.0 torch-xla[tpu]==2.9.0), or run on a GPU host with "
                "BERTFLOW_BACKEND=cuda"
            )


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    return os.path.abspath(url.removeprefix("file://"))


def preflight(
    cfg: RunConfig, root: str, stages: list[str], tracking_uri: str | None, given: dict[str, str] | None = None
) -> None:
    """Raise a one-line error naming the path when the run cannot work; do nothing else.
    ``given``: input URLs replacing the defaults (a stage flow's parameters)."""
    if is_local(root):
        path = local_path(root)
        if os.path.exists(path) and not os.path.isdir(path):
            raise NotADirectoryError(f"--root {root} is a file, not a folder")
        parent = path
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.access(parent, os.W_OK):
            raise PermissionError(f"--root {root}: {parent} is not writable")
    from pipeline.schema.manifest import fingerprint_input

    if "corpus" in stages:
        check_data(cfg)
    if "pretrain" in stages:
        check_backend(cfg)
    for stage in stages:
        inputs = stage_inputs(stage, cfg, root, given)
        if stage == "corpus":  # its sources may be optional (corpus.sources): the stage's own check
            from pipeline.corpus import CorpusInputError, check_corpus_inputs

            try:
                check_corpus_inputs(cfg.corpus, inputs)
            except CorpusInputError as exc:
                raise FileNotFoundError(str(exc)) from None
            continue
        for name, url in inputs.items():
            if written_by_this_run(name, url, root):
                continue  # an earlier stage of this run writes it
            try:
                fingerprint_input(url)
            except FileNotFoundError as exc:
                raise FileNotFoundError(f"stage {stage}, input {name}: {exc}") from None
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
