"""Starting the pretraining process: one plain subprocess, or ``torchrun`` with N processes.

``launch_pretrain(spec, nproc, env)`` is what the pretrain stage calls. It builds the command
(``python -m flows.train_entry --spec JSON``, or ``python -m torch.distributed.run --standalone
--nproc_per_node=N -m flows.train_entry ...``; on several hosts ``--nnodes/--node_rank`` and a
static rendezvous on node 0, from ``BERTFLOW_NNODES``/``BERTFLOW_NODE_RANK``/``BERTFLOW_RDZV_ENDPOINT``
— see ``flows.cluster`` and ``infra/gpu/launch.sh``), gives every training process an
``OMP_NUM_THREADS`` (unless the caller set it: the cores but one, split between the processes;
the spare core serves the orchestrator and the OS — with one of this machine's 2 cores busy,
two OpenMP threads made the tiny step 2x slower than one), and owns
the process tree's lifetime:

- SIGTERM / SIGINT to the launcher (Ctrl-C, a preempted VM, a cancelled Prefect run) is passed
  on as SIGTERM to the training process group; the trainers write a checkpoint and exit
  (torchrun forwards it to its workers and waits for them); after ``grace_s`` the group is killed.
- If the launcher dies without a word (SIGKILL), the child gets SIGTERM from the kernel
  (``PR_SET_PDEATHSIG``), and ``flows.train_entry`` arms the same for itself under torchrun:
  no orphan trainer keeps running.
- Any exception in the launcher (including KeyboardInterrupt outside the main thread) stops the
  tree the same way before it propagates.

Design choice: the child runs in a session of its own, so a terminal's Ctrl-C reaches the
launcher only, and the launcher decides what the trainers get (one SIGTERM, then a deadline),
instead of every process receiving SIGINT at once and torchrun tearing its workers down
before they have written their checkpoint.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("bertflow.launch")

PR_SET_PDEATHSIG = 1
EXIT_PREEMPTED = 143  # 128 + SIGTERM: the trainer stopped on a signal after checkpointing


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux; no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except OSError:  # pragma: no cover - no libc of that name
        pass


ENV_NNODES = "BERTFLOW_NNODES"
ENV_NODE_RANK = "BERTFLOW_NODE_RANK"
ENV_RDZV_ENDPOINT = "BERTFLOW_RDZV_ENDPOINT"
ENV_RDZV_ID = "BERTFLOW_RDZV_ID"


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


def build_command(spec: dict, nproc: int = 1, nodes: Nodes | None = None) -> list[str]:
    """The training command line for ``nproc`` processes on this host (of ``nodes``, default one)."""
    if nproc < 1:
        raise ValueError(f"nproc: must be >= 1, got {nproc}")
    nodes = nodes or Nodes()
    payload = json.dumps(spec)
    entry = ["-m", "flows.train_entry", "--spec", payload]
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
    spec: dict, nproc: int | None = None, env: dict[str, str] | None = None, grace_s: float = 60.0, output=None
) -> int:
    """Run pretraining in its own process tree; return its exit code (0 done, 143 stopped by a signal).

    ``spec`` is train_entry's JSON spec (pretrain, model, examples_url, output_url, and optionally
    vocab_url, restart, init_from); ``nproc`` defaults to ``spec["nproc"]`` (else 1). Blocks until
    the tree has exited.
    """
    nproc = int(nproc or spec.get("nproc") or 1)
    cmd = build_command(spec, nproc, nodes_from_env({**os.environ, **(env or {})}))
    proc = subprocess.Popen(
        cmd,
        env=training_env(nproc, env),
        start_new_session=True,
        preexec_fn=set_parent_death_signal,
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
    )
    log.info(
        "pretraining in %d process(es), pid %d, OMP_NUM_THREADS=%s",
        nproc,
        proc.pid,
        training_env(nproc, env)["OMP_NUM_THREADS"],
    )
    received: list[int] = []
    signalled_at: list[float] = []

    def forward(signum, frame):
        if not received:
            log.warning("%s: asking the trainer to checkpoint and stop", signal.Signals(signum).name)
            signalled_at.append(time.monotonic())
        received.append(signum)
        _signal_group(proc, signal.SIGTERM)

    old = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGTERM, signal.SIGINT):
            old[s] = signal.signal(s, forward)
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if signalled_at and time.monotonic() - signalled_at[0] > grace_s:
                    log.error("trainer still running %.0f s after SIGTERM: killing it", grace_s)
                    _signal_group(proc, signal.SIGKILL)
    except BaseException:
        stop_tree(proc, grace_s)
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if received and code != 0:  # we stopped it (torchrun reports its workers' exit its own way)
        code = EXIT_PREEMPTED
    return code


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_tree(proc: subprocess.Popen, grace_s: float = 60.0) -> int | None:
    """SIGTERM the child's process group, wait up to ``grace_s``, then SIGKILL it."""
    if proc.poll() is not None:
        return proc.returncode
    _signal_group(proc, signal.SIGTERM)
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        return proc.wait()
