"""The parent side of a stage process: start it, stream its output, own its lifetime.

Two kinds of child (``where`` in the stage table):

- a **stage process** (``python -m flows.proc.stage_entry --spec FILE``): one row of the table
  run in a fresh process (each downstream unit), its lines streamed back through our loggers;
- the **training process** (``python -m flows.proc.train_entry --spec FILE``, or ``torchrun``
  with ``pretrain.nproc`` processes; on several hosts ``--nnodes/--node_rank`` and a static
  rendezvous on node 0 from ``BERTFLOW_NNODES``/``BERTFLOW_NODE_RANK``/``BERTFLOW_RDZV_ENDPOINT``,
  see ``flows.proc.cluster`` and ``infra/gpu/launch.sh``).

Every training process gets an ``OMP_NUM_THREADS`` unless the caller set one: the cores but one,
split between the processes (the spare core serves the orchestrator and the OS — with one of
this machine's 2 cores busy, two OpenMP threads made the tiny step 2x slower than one).

Lifetime (``flows.proc.protocol``): a child dies with us (``PR_SET_PDEATHSIG``); on Ctrl-C /
SIGTERM / a timeout we pass SIGTERM on and give it time to write a checkpoint before SIGKILL.
Every live child is registered here, so the CLI's stop handler reaches all of them at once
(:func:`stop_children`: the downstream units running in the flow's threads included), and after
the stop request no new child starts.
The training tree runs in a session of its own, so a terminal's Ctrl-C reaches the launcher
only, and the launcher decides what the trainers get (one SIGTERM, then a deadline), instead of
every process receiving SIGINT at once and torchrun tearing its workers down before they have
written their checkpoint. This module never imports the stage table: the caller passes what the
row says (timeout, names).
"""

from __future__ import annotations

import contextvars
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from flows.proc.protocol import (
    ENV_PROGRESS_TOTAL,
    EXIT_TERMINATED,
    EXIT_TRACKING_GONE,
    GRACE_SECONDS,
    STOP,
    ProcessSpec,
    StageProcessError,
    child_threads,
    forward,
    set_parent_death_signal,
    signal_group,
    stop_process,
    write_spec,
)

log = logging.getLogger("bertflow.launch")

ENV_NNODES = "BERTFLOW_NNODES"
ENV_NODE_RANK = "BERTFLOW_NODE_RANK"
ENV_RDZV_ENDPOINT = "BERTFLOW_RDZV_ENDPOINT"
ENV_RDZV_ID = "BERTFLOW_RDZV_ID"


# -- the live children -----------------------------------------------------------------------------
_LIVE: dict[int, tuple[subprocess.Popen, bool]] = {}
"""pid -> (process, whether it leads a process group of its own: the training tree)."""
_LIVE_LOCK = threading.Lock()


def _track(proc: subprocess.Popen, group: bool) -> None:
    """Register a child just started; stop it at once when a stop came first (no window between
    the stop handler's sweep and a start)."""
    with _LIVE_LOCK:
        _LIVE[proc.pid] = (proc, group)
    if STOP.requested is not None:
        signal_group(proc, signal.SIGTERM) if group else proc.send_signal(signal.SIGTERM)


def _untrack(proc: subprocess.Popen) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(proc.pid, None)


def stop_children(sig: int = signal.SIGTERM) -> int:
    """Send ``sig`` to every live child (a training tree: its whole group); how many got it.
    Does not wait: each child's own launcher waits for it (the trainer's checkpoint)."""
    with _LIVE_LOCK:
        live = list(_LIVE.values())
    for proc, group in live:
        if proc.poll() is None:
            if group:
                signal_group(proc, sig)
            else:
                try:
                    proc.send_signal(sig)
                except ProcessLookupError:
                    pass
    return len(live)


# -- a stage process ------------------------------------------------------------------------------
def run_entry(
    spec: ProcessSpec,
    what: str,
    logger_name: str,
    env: dict[str, str],
    parallel: int = 1,
    on_progress: Callable[[int, int], None] | None = None,
    timeout_s: float | None = None,
) -> None:
    """Run ``python -m flows.proc.stage_entry`` on ``spec`` and wait; raise
    :class:`~flows.proc.protocol.StageProcessError` naming ``what`` and how it ended when it fails
    (``StopRequested`` instead of starting after a stop request). ``parallel``: children sharing
    this machine (their threads split the cores)."""
    STOP.check(what)
    proc_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    if "OMP_NUM_THREADS" not in os.environ:
        proc_env["OMP_NUM_THREADS"] = child_threads(parallel)
    with tempfile.TemporaryDirectory(prefix="bertflow-spec-") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        write_spec(spec_path, spec)
        cmd = [sys.executable, "-m", "flows.proc.stage_entry", "--spec", spec_path]
        errors: list[str] = []
        code = _run_streaming(cmd, proc_env, logging.getLogger(logger_name), on_progress, timeout_s, what, errors)
    if code == EXIT_TRACKING_GONE:  # it waited for the server: this process tries it once from now on
        from flows.tracking import ENV_TRACKING_URI, give_up

        give_up(proc_env.get(ENV_TRACKING_URI))
    if code != 0:
        raise StageProcessError(what, code, errors[-1] if errors else "see its log lines above")


def _run_streaming(
    cmd, env, logger: logging.Logger, on_progress, timeout_s: float | None, what: str, errors: list[str] | None = None
) -> int:
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        preexec_fn=set_parent_death_signal if sys.platform.startswith("linux") else None,
    )
    _track(proc, group=False)
    context = contextvars.copy_context()  # Prefect's run context: log and artifact calls from the reader
    reader = threading.Thread(target=context.run, args=(forward, proc.stdout, logger, on_progress, errors), daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        raise TimeoutError(f"{what}: still running after {timeout_s:.0f} s (the stage's timeout); stopped") from None
    except BaseException:  # Ctrl-C, SIGTERM turned into an exception, a Prefect timeout
        stop_process(proc)
        raise
    finally:
        _untrack(proc)
        reader.join(timeout=5)
    return code


# -- the training process -------------------------------------------------------------------------
@dataclass(frozen=True)
class Nodes:
    """Several hosts in one torchrun job (static rendezvous: node ``node_rank`` of ``nnodes``,
    the store on ``rdzv_endpoint`` = node 0's host:port). One node: ``--standalone``."""

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = ""
    rdzv_id: str = "bertflow"

    def __post_init__(self):
        if self.nnodes < 1:
            raise ValueError(f"{ENV_NNODES}: must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"{ENV_NODE_RANK}: must lie in [0, {self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1 and ":" not in self.rdzv_endpoint:
            raise ValueError(
                f"{ENV_RDZV_ENDPOINT}: {self.nnodes} nodes need node 0's HOST:PORT, got {self.rdzv_endpoint!r}"
            )

    def torchrun_args(self) -> list[str]:
        if self.nnodes == 1:
            return ["--standalone"]
        return [
            f"--nnodes={self.nnodes}",
            f"--node_rank={self.node_rank}",
            "--rdzv_backend=static",
            f"--rdzv_endpoint={self.rdzv_endpoint}",
            f"--rdzv_id={self.rdzv_id}",
        ]


def nodes_from_env(env: dict[str, str] | None = None) -> Nodes:
    """The node layout from ``BERTFLOW_NNODES`` / ``BERTFLOW_NODE_RANK`` (else a Kubernetes
    indexed Job's ``JOB_COMPLETION_INDEX``) / ``BERTFLOW_RDZV_ENDPOINT`` / ``BERTFLOW_RDZV_ID``."""
    env = os.environ if env is None else env
    try:
        nnodes = int(env.get(ENV_NNODES) or 1)
        rank = int(env.get(ENV_NODE_RANK) or env.get("JOB_COMPLETION_INDEX") or 0)
    except ValueError as exc:
        raise ValueError(f"{ENV_NNODES}/{ENV_NODE_RANK}: expected integers ({exc})") from None
    return Nodes(nnodes, rank, env.get(ENV_RDZV_ENDPOINT, ""), env.get(ENV_RDZV_ID) or "bertflow")


def build_command(spec_path: str, nproc: int = 1, nodes: Nodes | None = None) -> list[str]:
    """The training command line for ``nproc`` processes on this host (of ``nodes``, default one),
    every process reading its spec from the file ``spec_path``."""
    if nproc < 1:
        raise ValueError(f"nproc: must be >= 1, got {nproc}")
    nodes = nodes or Nodes()
    entry = ["-m", "flows.proc.train_entry", "--spec", spec_path]
    if nproc == 1 and nodes.nnodes == 1:
        return [sys.executable, *entry]
    return [sys.executable, "-m", "torch.distributed.run", *nodes.torchrun_args(), f"--nproc_per_node={nproc}", *entry]


def training_env(nproc: int = 1, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the training process(es): ours + ``env``, with OMP_NUM_THREADS set."""
    out = {**os.environ, **(env or {})}
    if "OMP_NUM_THREADS" not in out:
        out["OMP_NUM_THREADS"] = str(max(1, ((os.cpu_count() or 1) - 1) // nproc))
    return out


def launch_pretrain(
    spec: ProcessSpec,
    nproc: int | None = None,
    env: dict[str, str] | None = None,
    grace_s: float = GRACE_SECONDS,
    output=None,
) -> int:
    """Run pretraining in its own process tree; return its exit code (0 done, 143 stopped by a
    signal; see ``flows.proc.protocol``). Blocks until the tree has exited.

    ``spec`` is the pretrain call's (``flows.calls.StageCall.spec``), written to a file only its
    owner reads for the tree's life; ``nproc`` defaults to the config's ``pretrain.nproc``.
    SIGTERM / SIGINT to this process (Ctrl-C, a preempted VM, a cancelled Prefect run) is passed on
    as SIGTERM to the training process group (torchrun forwards it to its workers); after
    ``grace_s`` the group is killed. Any exception here stops the tree the same way first.
    """
    STOP.check("pretraining")
    nproc = int(nproc or spec.config["pretrain"]["nproc"] or 1)
    with tempfile.TemporaryDirectory(prefix="bertflow-spec-") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        write_spec(spec_path, spec)
        cmd = build_command(spec_path, nproc, nodes_from_env({**os.environ, **(env or {})}))
        return _run_training(cmd, nproc, env, grace_s, output)


def _run_training(cmd: list[str], nproc: int, env: dict[str, str] | None, grace_s: float, output) -> int:
    """Run the training tree ``cmd`` and wait (see :func:`launch_pretrain`)."""
    proc = subprocess.Popen(
        cmd,
        env=training_env(nproc, env),
        start_new_session=True,
        preexec_fn=set_parent_death_signal,
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
    )
    _track(proc, group=True)
    log.info(
        "pretraining in %d process(es), pid %d, OMP_NUM_THREADS=%s",
        nproc,
        proc.pid,
        training_env(nproc, env)["OMP_NUM_THREADS"],
    )
    received: list[int] = []
    signalled_at: list[float] = []

    def pass_on(signum, frame):
        STOP.request(signum)  # the flow must not retry the stage nor start another
        if not received:
            log.warning("%s: asking the trainer to checkpoint and stop", signal.Signals(signum).name)
            signalled_at.append(time.monotonic())
        received.append(signum)
        signal_group(proc, signal.SIGTERM)

    old = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGTERM, signal.SIGINT):
            old[s] = signal.signal(s, pass_on)
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if signalled_at and time.monotonic() - signalled_at[0] > grace_s:
                    log.error("trainer still running %.0f s after SIGTERM: killing it", grace_s)
                    signal_group(proc, signal.SIGKILL)
    except BaseException:
        stop_process(proc, grace_s, group=True)
        raise
    finally:
        _untrack(proc)
        for s, h in old.items():
            signal.signal(s, h)
    # we stopped it (torchrun reports its workers' exit its own way)
    if (received or STOP.requested is not None) and code != 0:
        code = EXIT_TERMINATED
    return code


def launch_training(
    spec: ProcessSpec,
    total_steps: int,
    env: dict[str, str],
    on_progress: Callable[[int, int], None] | None = None,
    errors: list[str] | None = None,
) -> int:
    """:func:`launch_pretrain` with the tree's output streamed through the ``bertflow.pretrain``
    logger (progress lines to ``on_progress``, ERROR records to ``errors``), like any stage
    process; returns its exit code."""
    proc_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1", ENV_PROGRESS_TOTAL: str(total_steps)}
    logger = logging.getLogger("bertflow.pretrain")
    read_fd, write_fd = os.pipe()
    context = contextvars.copy_context()
    reader = threading.Thread(
        target=context.run,
        daemon=True,
        args=(forward, os.fdopen(read_fd, "r", errors="replace"), logger, on_progress, errors),
    )
    reader.start()
    try:
        return launch_pretrain(spec, env=proc_env, output=write_fd)
    finally:
        os.close(write_fd)  # the children hold their own copies: EOF once they are gone
        reader.join(timeout=10)
