"""The command line's process tree, owned by a small supervisor: the process a person signals.

``bertflow run`` and ``bertflow stage`` run as two processes. The **supervisor** is the command
itself (its pid, in the terminal's foreground process group); it imports nothing heavy and only
watches. The **worker** is the same command line again (``BERTFLOW_WORKER=1``) in a session of
its own: it runs the flow, Prefect's temporary server, the stage processes, Beam's workers and
the training tree. Why two:

1. A terminal's Ctrl-C goes to every process of the foreground group at once. With everything
   in that group, Prefect's temporary server died before the flow could record anything (the flow
   then hung for minutes on ``ConnectError``), and the downstream units died of the SIGINT (exit
   -2) and were retried. In its own session, the worker's tree sees only what the supervisor
   sends.
2. Prefect's engine replaces SIGTERM's handler while a flow runs (``TerminationSignal``), and
   Beam turns a ``KeyboardInterrupt`` into a ``RuntimeError`` that Prefect retried. The worker is
   sent SIGINT only, and its handler (``flows.cli``) records the stop request first
   (``flows.proc.protocol.STOP``): no stage, unit or retry starts after it.
3. Whatever state the worker is in, the supervisor can still end the tree: a second signal, or
   a worker still running :data:`STOP_DEADLINE_S` after the first, kills every process of it.

The protocol: the first SIGINT/SIGTERM -> one SIGINT to the worker, whose handler sends SIGTERM to
every stage process and training tree (the trainer writes its checkpoint), lets the flow unwind
(MLflow runs end ``KILLED``) and exits 130; a second signal -> SIGKILL to the worker and all its
descendants. When the worker has exited, what is left of its session (Prefect's server, a Beam
worker) gets SIGTERM, then SIGKILL after :data:`SWEEP_GRACE_S`. The worker has
``PR_SET_PDEATHSIG`` = SIGINT, so a SIGKILLed supervisor stops it the same way. Exit code:
128 + the signal the supervisor got (130 for SIGINT, 143 for SIGTERM), else the worker's.

Cost: one more Python process (~20 MB, imports only this module and the protocol) and the
worker's start-up (~1 s). Linux only for ``PR_SET_PDEATHSIG`` and ``/proc`` (elsewhere the
supervisor still forwards and kills its direct child).

The run's last words are the supervisor's: the worker hands its closing line (the error of a
failed run, the stop notice) to the supervisor through a file (:func:`say_last`), which prints it
after the worker and what is left of its session have exited. Printed by the worker itself, the
error was followed by whatever its exit ran (Prefect's ``Stopping temporary server`` line) and
was not the last line on stderr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from flows.proc.protocol import GRACE_SECONDS, describe_exit, set_parent_death_signal
from pipeline.runtime import module_command

ENV_WORKER = "BERTFLOW_WORKER"
ENV_LAST_WORDS = "BERTFLOW_LAST_WORDS"
"""The file the worker writes its closing line to; the supervisor prints it last."""
STOP_DEADLINE_S = GRACE_SECONDS + 30.0
"""How long the worker has after the first signal (the trainer's checkpoint takes up to
``GRACE_SECONDS``) before the supervisor kills the tree."""
SWEEP_GRACE_S = 5.0


def is_worker() -> bool:
    """Whether this process is a supervised worker (it runs the flow itself)."""
    return os.environ.get(ENV_WORKER) == "1"


def say_last(line: str) -> None:
    """The run's closing line: to the supervisor, which prints it last, when this process is a
    supervised worker; else straight to stderr."""
    path = os.environ.get(ENV_LAST_WORDS) if is_worker() else None
    if not path:
        print(line, file=sys.stderr, flush=True)
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(line.rstrip("\n") + "\n")


def _worker_preexec() -> None:
    set_parent_death_signal(signal.SIGINT)


def supervise(argv: list[str], what: str, command: list[str] | None = None) -> int:
    """Run ``python -m flows.cli ARGV`` (or ``command``) as the worker and own its lifetime; its
    exit code. (Started through ``pipeline.runtime.module_command``: its collector tuned before
    its first import.) The worker's closing line (:func:`say_last`) is printed last, after the sweep."""
    with tempfile.TemporaryDirectory(prefix="bertflow-supervisor-") as tmp:
        last_words = os.path.join(tmp, "last-words")
        rc = _supervise(command or module_command("flows.cli", *argv), what, last_words)
        if os.path.exists(last_words):
            with open(last_words, encoding="utf-8") as f:
                sys.stderr.write(f.read())
            sys.stderr.flush()
    return rc


def _supervise(command: list[str], what: str, last_words: str) -> int:
    proc = subprocess.Popen(
        command,
        env={**os.environ, ENV_WORKER: "1", ENV_LAST_WORDS: last_words},
        start_new_session=True,
        preexec_fn=_worker_preexec if sys.platform.startswith("linux") else None,
    )
    received: list[int] = []

    def on_signal(signum, frame):
        received.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    forwarded_at: float | None = None
    killed = False
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if received and forwarded_at is None:
                name = signal.Signals(received[0]).name
                print(
                    f"bertflow: {what}: {name}: stopping (stage processes first, the trainer writes its "
                    f"checkpoint); {name} again kills every process of the run at once",
                    file=sys.stderr,
                    flush=True,
                )
                _send(proc.pid, signal.SIGINT)
                forwarded_at = time.monotonic()
            elif forwarded_at is not None and not killed:
                late = time.monotonic() - forwarded_at > STOP_DEADLINE_S
                if len(received) > 1 or late:
                    why = "asked again" if len(received) > 1 else f"still running {STOP_DEADLINE_S:.0f} s after"
                    print(f"bertflow: {what}: {why}: killing every process of the run", file=sys.stderr, flush=True)
                    kill_tree(proc.pid, signal.SIGKILL)
                    killed = True
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        sweep(proc.pid)
    if received:
        return 0 if rc == 0 else 128 + received[0]
    if rc < 0:
        print(f"bertflow: {what}: the run's process {describe_exit(rc)}", file=sys.stderr, flush=True)
        return 1
    return rc


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# -- the tree, read from /proc -----------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, int, int, str] | None:
    """(ppid, process group, session, state) of ``pid``, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[2]), int(fields[3]), fields[0]


def processes() -> dict[int, tuple[int, int, int, str]]:
    """Every live process: pid -> (ppid, process group, session, state)."""
    out = {}
    if not os.path.isdir("/proc"):
        return out
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[3] != "Z":
                out[int(entry)] = st
    return out


def descendants(pid: int, table: dict[int, tuple[int, int, int, str]] | None = None) -> set[int]:
    """Every live descendant of ``pid`` (children, their children, ...)."""
    table = processes() if table is None else table
    children: dict[int, list[int]] = {}
    for p, (ppid, *_rest) in table.items():
        children.setdefault(ppid, []).append(p)
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def tree(pid: int) -> set[int]:
    """``pid``'s descendants and every process of the session or process group it leads (what
    outlives a parent there: Prefect's server, a Beam worker), ``pid`` itself excluded."""
    table = processes()
    return (descendants(pid, table) | {p for p, (_, pgid, sid, _s) in table.items() if pid in (pgid, sid)}) - {
        pid,
        os.getpid(),
    }


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """``sig`` to ``pid`` and its whole tree (read before the first signal changes it)."""
    others = tree(pid)
    _send(pid, sig)
    for p in others:
        _send(p, sig)


def sweep(pid: int) -> set[int]:
    """After the worker ``pid`` exited: SIGTERM to what is left of its session and group, SIGKILL
    after :data:`SWEEP_GRACE_S`; returns the pids it found."""
    left = tree(pid)
    for p in left:
        _send(p, signal.SIGTERM)
    deadline = time.monotonic() + SWEEP_GRACE_S
    while time.monotonic() < deadline and any(_stat(p) not in (None,) and _stat(p)[3] != "Z" for p in left):
        time.sleep(0.1)
    for p in left:
        st = _stat(p)
        if st is not None and st[3] != "Z":
            _send(p, signal.SIGKILL)
    return left
