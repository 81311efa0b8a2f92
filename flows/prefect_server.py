"""Prefect's temporary server for one command's flow, started here rather than by Prefect's client.

Without a ``PREFECT_API_URL``, Prefect's client starts a temporary server the first time a flow
asks for its API (``get_client`` -> ``prefect.server.api.server.SubprocessASGIServer``): a
``python -m uvicorn --factory prefect.server.api.server:create_app`` process. To start it, the
client imports ``prefect.server.api.server``, the whole server (FastAPI routes, ORM models,
services): 4.4 of the 18 CPU-seconds of the worker's ``bertflow stage corpus`` on the tiny
sample, profiled with py-spy (docs/speed.md, "A stage's fixed cost"), in a process that never
serves a request. :func:`temporary_server` starts the same command, with the same environment,
on a free port of 127.0.0.1, waits for its ``/health`` as Prefect does, points the flow at it
(``PREFECT_API_URL``, for this process only, through Prefect's ``temporary_settings``) and stops
it at the end, logging Prefect's own lines ("Starting temporary server on ...", "Stopping
temporary server on ..."). The server process is the one Prefect would start: same database,
same migrations on start, same UI-less ephemeral app.

By default the server is shared and outlives the command (``flows.shared_server``): the next
command within ``BERTFLOW_PREFECT_SERVER_LINGER_S`` seconds uses it instead of starting one (its
start is 3-4 CPU-seconds of imports, the largest part of a stage's fixed cost); the setting ``0``
keeps the server to the command, started and stopped here as described above.

Nothing changes when Prefect has an API (``PREFECT_API_URL``: a ``prefect server`` or Cloud) or
its ephemeral mode is off: then it yields ``None`` and Prefect's client does what it always did.
The UI address Prefect would infer from the temporary API (``View at http://127.0.0.1:PORT/...``,
a page of a server that is gone when the command ends, and serves no UI) is left empty, as it is
for Prefect's own temporary server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from flows.shared_server import healthy

PORT_IN_USE = 3
"""uvicorn's exit code when the port was taken between the choice and the bind (Prefect's too)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(port: int) -> list[str]:
    """The command Prefect's ``SubprocessASGIServer`` runs (prefect 3.x, ``_run_uvicorn_command``:
    ``python -m uvicorn`` and the same arguments), its garbage collector as in bertflow's own
    processes (``pipeline.runtime.module_command``: the server's start is mostly imports, of which
    the collector took 0.28 of 2.9 CPU-seconds at Python's thresholds)."""
    import prefect

    from pipeline.runtime import module_command

    return module_command(
        "uvicorn", "--app-dir", str(prefect.__module_path__.parent),
        "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "error", "--lifespan", "on",
    )  # fmt: skip


def server_env() -> dict[str, str]:
    """The server's environment, as Prefect gives it: this process's, its settings, no UI."""
    from prefect.settings import get_current_settings

    return {
        **os.environ,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        **get_current_settings().to_environment_variables(exclude_unset=True),
    }


def _drain_to_api(timeout_s: float = 5.0) -> None:
    """Send the log lines and events Prefect still holds before its server goes (as Prefect's
    ``prefect_test_harness`` does): stopped first, they were retried at the interpreter's exit
    for ~50 s ("Error logging to API ... All connection attempts failed")."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout_s)


@contextmanager
def temporary_server(meanwhile: Callable[[], object] | None = None) -> Iterator[str | None]:
    """Prefect's temporary server for the flow run inside the block; its API URL, or ``None``
    when Prefect has an API of its own or no ephemeral mode (then nothing is started).
    ``meanwhile``: work of this process done while the server starts on another core (the
    imports the flow needs anyway: the command's wall time, not its CPU)."""
    from prefect.logging import get_logger
    from prefect.logging.configuration import ensure_logging_setup
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, get_current_settings, temporary_settings

    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        yield None
        return
    from flows.prefect_db import prefect_sqlite_path
    from flows.shared_server import Unshareable, attached, linger_seconds

    linger = linger_seconds()
    ensure_logging_setup()  # what `import prefect.main` does, which the flow's import does later
    logger = get_logger()  # "prefect", as the lines Prefect logs for its own temporary server
    timeout = settings.server.ephemeral.startup_timeout_seconds
    env = server_env()
    database = prefect_sqlite_path()
    with ExitStack() as stack:
        address = None
        if linger > 0 and database is not None:  # shared between commands (flows.shared_server)
            try:
                address = stack.enter_context(attached(database, env, linger, timeout, meanwhile, logger))
            except Unshareable as exc:
                logger.warning("Prefect's temporary server cannot be shared (%s): this command starts its own", exc)
        if address is None:
            address = stack.enter_context(_own_server(env, timeout, meanwhile, logger))
        try:
            with temporary_settings({PREFECT_API_URL: f"{address}/api", PREFECT_UI_URL: ""}):
                yield f"{address}/api"
        finally:
            _drain_to_api()  # before the server goes (this command's own) or the command ends


@contextmanager
def _own_server(env: dict[str, str], timeout: float, meanwhile, logger) -> Iterator[str]:
    """A server of this command's own, on a free port, stopped at the end of the block."""
    port = _free_port()
    address = f"http://127.0.0.1:{port}"
    logger.info("Starting temporary server on %s", address)
    proc = subprocess.Popen(server_command(port), env=env)
    try:
        deadline = time.monotonic() + timeout
        if meanwhile is not None:
            meanwhile()
        while not healthy(f"{address}/api"):
            code = proc.poll()
            if code == PORT_IN_USE:  # taken meanwhile: another port, as Prefect does
                port = _free_port()
                address = f"http://127.0.0.1:{port}"
                proc = subprocess.Popen(server_command(port), env=env)
            elif code is not None:
                raise RuntimeError(f"Prefect's temporary server on {address} exited with code {code}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Prefect's temporary server on {address} did not answer within {timeout} s")
            time.sleep(0.1)
        yield address
    finally:
        logger.info("Stopping temporary server on %s", address)
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
