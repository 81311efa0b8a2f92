"""Prefect's temporary server, kept up between commands for a while: one start for a series of
``bertflow stage`` and ``bertflow run`` commands instead of one start each.

Without a ``PREFECT_API_URL`` every command used to start Prefect's temporary server and stop
it at its end: 3.1-3.6 CPU-seconds per command, all of it the server's imports (FastAPI, the ORM,
the services), measured with ``benchmarks/bench_commands.py --stage-fit`` (docs/speed.md, "A
stage's fixed cost"), more than the whole rest of a stage's fixed cost. Build tools answer the
same cost the same way (Gradle's daemon, Bazel's server, sccache): the first command starts the
server, later ones use it, and it stops by itself once no command has used it for
``BERTFLOW_PREFECT_SERVER_LINGER_S`` seconds (default :data:`DEFAULT_LINGER_S`; ``0`` stops it
with the command, as before).

One server per Prefect database and server settings, its files beside the database
(``<database>.server-<key>.*``):

- ``.json``, the state: the host's pid and port, written by the host once it listens, removed
  by it when it stops;
- ``.clients``, the lease: every command holds a shared ``flock`` on it while its flow runs; the
  host stops only when it can take the lock exclusively (no command attached) and has been idle
  for the linger (the file's mtime, touched by every attach and detach, counts as use). It holds
  the exclusive lock until it has exited, so a command never attaches to a server that is going;
- ``.lock``: one command at a time starts a host;
- ``.log``: the host's own output (it is detached from every command's terminal and pipes).

The host is ``python -m flows.shared_server`` in a session of its own: the same app as
Prefect's ``SubprocessASGIServer`` (``prefect.server.api.server:create_app``, uvicorn, the same
environment), on a socket it binds itself (no port race). A command's supervisor sweeps only the
worker's own session, so the host outlives the command; a second signal that kills "every
process of the run" kills it too, and the next command starts another.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

ENV_LINGER = "BERTFLOW_PREFECT_SERVER_LINGER_S"
DEFAULT_LINGER_S = 120.0
"""Two minutes: a series of commands pays one start; idle, the server costs ~1 CPU-second a minute
and ~200 MB (docs/speed.md), so it does not wait long for the next command."""
POLL_S = 0.5
_STARTED: list[subprocess.Popen] = []
"""The hosts this process started, kept referenced: they outlive it by design."""


class Unshareable(OSError):
    """The server's files cannot be made beside the database (a read-only or foreign folder): the
    command starts a server of its own, as with a linger of 0."""


def linger_seconds() -> float:
    """``BERTFLOW_PREFECT_SERVER_LINGER_S`` as seconds (default :data:`DEFAULT_LINGER_S`)."""
    raw = os.environ.get(ENV_LINGER, "").strip()
    if not raw:
        return DEFAULT_LINGER_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise ValueError(f"{ENV_LINGER}={raw!r}: expected seconds >= 0 (0 stops the server with each command)")
    return value


def server_key(env: dict[str, str]) -> str:
    """What a server must share with a command to serve it: the interpreter, Prefect's version and
    the server's settings (``PREFECT_SERVER_*``, ``PREFECT_API_DATABASE_*``)."""
    import prefect

    wanted = sorted((k, v) for k, v in env.items() if k.startswith(("PREFECT_SERVER_", "PREFECT_API_DATABASE")))
    text = json.dumps([sys.executable, prefect.__version__, wanted])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def paths(database: str, key: str) -> dict[str, str]:
    base = f"{database}.server-{key}"
    return {kind: f"{base}.{kind}" for kind in ("json", "clients", "lock", "log")}


def read_state(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        return state if isinstance(state, dict) and {"pid", "port"} <= state.keys() else None
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie too: its health check says the rest)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def healthy(api_url: str) -> bool:
    """Whether Prefect's API at ``api_url`` answers its ``/health``."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


@contextmanager
def attached(
    database: str,
    env: dict[str, str],
    linger: float,
    timeout: float,
    meanwhile: Callable[[], object] | None,
    log,
) -> Iterator[str]:
    """The address (``http://127.0.0.1:PORT``) of the shared server of ``database``, started here
    when none is up; this command holds its lease for the block."""
    import fcntl

    from flows.filelock import exclusive, wait_for_flock

    files = paths(database, server_key(env))
    deadline = time.monotonic() + timeout
    try:
        lease = os.open(files["clients"], os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise Unshareable(f"{files['clients']}: {exc.strerror or exc}") from exc
    try:
        stopping = f"Prefect's temporary server ({files['clients']}) was still stopping after {timeout} s"
        wait_for_flock(lease, fcntl.LOCK_SH, deadline, stopping, poll=0.05)
        _touch(files["clients"])
        address, started = _running(files["json"]), False
        if address is None:
            busy = f"another command was starting Prefect's temporary server for {timeout} s ({files['lock']})"
            with exclusive(files["lock"], timeout, busy):
                address = _running(files["json"])  # started by the command that held the lock
                if address is None:
                    address, started = _start(files, env, deadline, meanwhile, log, linger), True
        if not started:
            log.info("Using the temporary server on %s (started by an earlier command)", address)
            if meanwhile is not None:
                meanwhile()
        yield address
        log.info("The temporary server stays up %.0f s after the last command (%s=0: no wait)", linger, ENV_LINGER)
    finally:
        _touch(files["clients"])
        os.close(lease)


def _running(state_path: str) -> str | None:
    state = read_state(state_path)
    if state is None or not alive(int(state["pid"])):
        return None
    address = f"http://127.0.0.1:{int(state['port'])}"
    return address if healthy(f"{address}/api") else None


def _start(files, env, deadline, meanwhile, log, linger) -> str:
    from pipeline.runtime import module_command

    with open(files["log"], "ab") as out:
        proc = subprocess.Popen(
            module_command("flows.shared_server", files["json"], files["clients"], str(linger)),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,  # not the command's session: its supervisor's sweep leaves it
        )
    _STARTED.append(proc)
    if meanwhile is not None:
        meanwhile()
    while True:
        state = read_state(files["json"])
        if state is not None and int(state["pid"]) == proc.pid:
            address = f"http://127.0.0.1:{int(state['port'])}"
            if healthy(f"{address}/api"):
                log.info("Starting temporary server on %s (shared: later commands use it)", address)
                return address
        code = proc.poll()
        if code is not None:
            raise RuntimeError(f"Prefect's temporary server exited with code {code}; its output: {files['log']}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"Prefect's temporary server did not answer in time; its output: {files['log']}")
        time.sleep(0.1)


def _write_state(path: str, port: int) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"pid": os.getpid(), "port": port, "started": time.time()}, f)
    os.replace(tmp, path)


def _remove_state_if_ours(path: str) -> None:
    state = read_state(path)
    if state is not None and int(state["pid"]) == os.getpid():
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def _watch(server, state_path: str, clients_path: str, linger: float) -> None:
    """Stop ``server`` once no command holds the lease and none has for ``linger`` seconds; the
    exclusive lock is kept from that decision to this process's exit."""
    import fcntl

    fd = os.open(clients_path, os.O_RDWR | os.O_CREAT, 0o644)
    free_since: float | None = None
    while not server.should_exit:
        time.sleep(POLL_S)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            free_since = None
            continue
        now = time.time()
        free_since = free_since or now
        try:
            last_use = os.stat(clients_path).st_mtime
        except OSError:
            last_use = now
        state = read_state(state_path)
        replaced = state is None or int(state["pid"]) != os.getpid()  # nobody can find this one any more
        if replaced or now - max(free_since, last_use) >= linger:
            _remove_state_if_ours(state_path)
            server.should_exit = True
            return  # fd stays open, the lock held, until the process exits
        fcntl.flock(fd, fcntl.LOCK_UN)


def host(state_path: str, clients_path: str, linger: float) -> None:
    """Serve Prefect's API on a free port of 127.0.0.1 until :func:`_watch` stops it."""
    import socket
    import threading

    import prefect
    import uvicorn

    sys.path.insert(0, str(prefect.__module_path__.parent))  # uvicorn's --app-dir, as Prefect runs it
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True, log_level="error", lifespan="on")
    server = uvicorn.Server(config)
    _write_state(state_path, sock.getsockname()[1])
    threading.Thread(target=_watch, args=(server, state_path, clients_path, linger), daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        _remove_state_if_ours(state_path)


if __name__ == "__main__":
    host(sys.argv[1], sys.argv[2], float(sys.argv[3]))
