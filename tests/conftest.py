"""Test-wide settings: hermetic Prefect/MLflow homes, no telemetry, no network."""

import os
import re
import tempfile

_HOME = tempfile.mkdtemp(prefix="bertflow-test-home-")
os.environ.setdefault("PREFECT_HOME", os.path.join(_HOME, "prefect"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every command of the suite stops its Prefect temporary server as it ends (no server outlives a
# test); tests/flows/test_shared_server.py runs the default, a server kept up between commands.
os.environ.setdefault("BERTFLOW_PREFECT_SERVER_LINGER_S", "0")


import logging  # noqa: E402 - after the environment above, which imports read

import pytest  # noqa: E402 - after the environment above, which imports read

E2E_FIXTURES = ("chain", "cli_env", "prefect_server")
"""Fixtures that make a test end-to-end: the tiny chain run through the CLI (``chain``, and the
reruns, kills and signals that start from it), or a Prefect server harness. A test that uses one
is marked ``e2e`` here; kill and signal tests that start their own processes carry the mark in
their file."""


def pytest_unconfigure(config):
    """The session's Prefect/MLflow home goes with the session (one was left in /tmp per run)."""
    import shutil

    shutil.rmtree(_HOME, ignore_errors=True)


def _absent(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is None
    except ImportError:
        return True


OPTIONAL_STACK = ("apache_beam", "prefect", "mlflow")
"""The data and orchestration stack. A GPU machine's image has torch, transformers and pyarrow but
none of these (nor some of the test extra: zstandard), and ``pytest -m gpu`` must still collect
there (benchmarks/device_check.py)."""
ABSENT_STACK = tuple(m for m in OPTIONAL_STACK if _absent(m))
OURS = ("flows", "pipeline", "model", "tasks", "synth", "tiny_bert", "pretrain_shards", "fuzz_texts")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """Where the stack is not installed (and only there: a partial environment), a test file that
    cannot be imported for want of a third-party package is reported skipped, naming the package,
    instead of failing the whole collection; a missing module of the project's own still fails
    it, and in the full environment nothing changes."""
    report = yield
    if ABSENT_STACK and report.failed and isinstance(collector, pytest.Module):
        found = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", str(report.longrepr))
        if found and found.group(1).split(".")[0] not in OURS:
            report.outcome = "skipped"
            report.longrepr = (str(collector.path), 0, f"Skipped: needs {found.group(1)}, which is not installed here")
    return report


def pytest_collection_modifyitems(config, items):
    for item in items:
        if set(E2E_FIXTURES) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _stop_request_cleared():
    """A test that signals its own process (the launcher's SIGTERM tests) leaves the process-wide
    stop request set (``flows.proc.protocol.STOP``); later tests start without one."""
    yield
    try:
        from flows.proc.protocol import STOP
    except ImportError:  # an environment without flows' dependencies
        return
    STOP.clear()


@pytest.fixture(autouse=True)
def _bertflow_logger_restored():
    """The CLI configures the ``bertflow`` logger (its own handler, no propagation) when a test
    calls ``main`` in-process; put it back so later tests' ``caplog`` sees its records."""
    logger = logging.getLogger("bertflow")
    handlers, propagate, level = logger.handlers[:], logger.propagate, logger.level
    yield
    logger.handlers[:] = handlers
    logger.propagate = propagate
    logger.setLevel(level)


@pytest.fixture
def one_torch_thread():
    """One intra-op torch thread for the test, the old count after it: tiny models run faster on
    one, and on a small shared CPU box two spinning OpenMP threads make them 10-30x slower
    (measured). ``tests/model`` and ``tests/tasks`` use it for every test (their conftest);
    elsewhere ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- servers the tests start: a free port, a wait until healthy, an `mlflow server` -----------------
def free_port() -> int:
    """A free TCP port on 127.0.0.1 (free when asked: the server started on it binds it next)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_healthy(url: str, proc, seconds: float, log=None, what: str = "server", step: float = 1.0) -> None:
    """Poll ``url`` until it answers (any 2xx), while ``proc`` (the server's ``Popen``) lives, for
    at most ``seconds``: a server that exits fails with its log's tail (``log``: a path), one that
    never answers with "``what`` did not become healthy"."""
    import time
    import urllib.request

    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                r.read()
                return
        except OSError:
            tail = ""
            if log is not None and os.path.exists(log):
                with open(log, errors="replace") as f:
                    tail = f.read()[-3000:]
            assert proc.poll() is None, f"{what} exited ({proc.returncode}) before answering {url}:\n{tail}"
            assert time.monotonic() < deadline, f"{what} did not become healthy at {url} in {seconds:.0f} s:\n{tail}"
            time.sleep(step)


def start_mlflow_server(store, port: int | None = None, seconds: float = 400, new_session: bool = False):
    """``(proc, url)``: ``mlflow server`` with one worker on ``port`` (a free one by default), its
    SQLite file ``store/server.db``, artifacts in ``store/artifacts`` and log in ``store/server.log``,
    healthy. One worker: uvicorn's supervisor of several kills workers that answer its pings late
    (4 took over 180 s to start at a load of 30 on 2 cores). ``new_session``: its own process group,
    so ``os.killpg(proc.pid, SIGKILL)`` takes its workers too (a crashed host)."""
    import subprocess
    import sys

    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    os.makedirs(store, exist_ok=True)
    log_path = os.path.join(store, "server.log")
    cmd = [sys.executable, "-m", "mlflow", "server", "--workers", "1", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{store}/server.db",
           "--artifacts-destination", os.path.join(store, "artifacts")]  # fmt: skip
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}, stdout=log, stderr=log,
                                start_new_session=new_session)  # fmt: skip
    try:
        wait_until_healthy(f"{url}/health", proc, seconds, log=log_path, what="mlflow server")
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise
    return proc, url


@pytest.fixture(scope="session")
def servers():
    """The helpers above for tests that start their own servers: ``servers.free_port()``,
    ``servers.wait_until_healthy(url, proc, seconds, log=...)``,
    ``servers.start_mlflow_server(store, port=None, new_session=False)``."""
    import types

    return types.SimpleNamespace(
        free_port=free_port, wait_until_healthy=wait_until_healthy, start_mlflow_server=start_mlflow_server
    )


# -- a local GCS: gcp-storage-emulator on 127.0.0.1 ---------------------------------------------
@pytest.fixture(scope="session")
def gcs_emulator():
    """The URL of a fresh in-memory GCS emulator on a free loopback port (gone after the session).

    ``STORAGE_EMULATOR_HOST`` points at it while it runs, so gcsfs, google-cloud-storage (Beam's
    own GCS IO) and subprocesses all talk to it; skipped when the emulator is not installed
    (``pip install -e '.[test]'``)."""
    import shutil
    import subprocess
    import sys

    exe = shutil.which("gcp-storage-emulator") or os.path.join(os.path.dirname(sys.executable), "gcp-storage-emulator")
    if not os.path.exists(exe):
        pytest.skip("gcp-storage-emulator is not installed (the test extra has it)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # its request log goes to a file: an unread pipe fills up and then blocks the emulator
    log_path = os.path.join(_HOME, f"gcs-emulator-{port}.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [exe, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until_healthy(f"{url}/storage/v1/b", proc, 30, log=log_path, what="gcp-storage-emulator", step=0.05)
    except AssertionError as exc:
        proc.kill()
        pytest.fail(f"gcp-storage-emulator did not start on {url}: {exc}")
    old = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = url
    _clear_gcsfs_instances()
    yield url
    _clear_gcsfs_instances()
    if old is None:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
        os.environ["STORAGE_EMULATOR_HOST"] = old
    proc.terminate()
    proc.wait(timeout=10)


def _clear_gcsfs_instances():
    """gcsfs caches filesystems by their arguments, not by the emulator's address."""
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def gcs_objects_written(gcs_emulator):
    """``gcs_objects_written(bucket, prefix)``: the names of the objects uploaded so far under
    ``gs://bucket/prefix``, read from the emulator's request log (objects since deleted too)."""
    import re
    import urllib.parse

    log_path = os.path.join(_HOME, f"gcs-emulator-{gcs_emulator.rsplit(':', 1)[1]}.log")

    def written(bucket: str, prefix: str) -> set[str]:
        pattern = re.compile(rf'"POST /upload/storage/v1/b/{re.escape(bucket)}/o\?name=([^& ]+)')
        with open(log_path, errors="replace") as f:
            names = {urllib.parse.unquote(m.group(1)) for m in pattern.finditer(f.read())}
        return {n for n in names if n.startswith(prefix)}

    return written


@pytest.fixture
def gcs_bucket(gcs_emulator, request):
    """``gs://<a new bucket>`` on the emulator, one per test."""
    import re

    import fsspec

    name = "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:50].strip("-")
    fs = fsspec.filesystem("gs", token="anon")
    fs.mkdir(name)
    return f"gs://{name}"


@pytest.fixture(scope="session")
def prefect_server_at():
    """``with prefect_server_at(home, **env) as env:`` a real ``prefect server start`` on a free
    loopback port, its ``PREFECT_HOME`` in ``home``, healthy before the block runs and stopped
    after it; ``env`` is the environment that talks to it (the slow tiers' deployment and pool
    tests)."""
    import contextlib
    import subprocess
    import sys

    @contextlib.contextmanager
    def start(home, **extra_env):
        port = free_port()
        env = {
            **os.environ,
            "PREFECT_HOME": str(home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
            **extra_env,
        }
        cmd = [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-ui",
        ]
        log_path = os.path.join(home, "server.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
            try:
                wait_until_healthy(
                    f"http://127.0.0.1:{port}/api/health", proc, 180, log=log_path, what="prefect server"
                )
                yield env
            finally:
                proc.terminate()
                proc.wait(timeout=30)

    return start


# -- a tracking server: `mlflow server` on 127.0.0.1 ---------------------------------------------
@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """The URL of a fresh ``mlflow server`` on a free loopback port, its SQLite store and
    artifacts in a temporary folder, healthy before the tests run and stopped after the module."""
    proc, url = start_mlflow_server(tmp_path_factory.mktemp("mlflow-server"), seconds=600)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
