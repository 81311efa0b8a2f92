"""Test-wide settings: hermetic Prefect/MLflow homes, no telemetry, no network."""

import os
import tempfile

_HOME = tempfile.mkdtemp(prefix="bertflow-test-home-")
os.environ.setdefault("PREFECT_HOME", os.path.join(_HOME, "prefect"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import logging  # noqa: E402 - after the environment above, which imports read

import pytest  # noqa: E402 - after the environment above, which imports read


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


# -- a local GCS: gcp-storage-emulator on 127.0.0.1 ---------------------------------------------
@pytest.fixture(scope="session")
def gcs_emulator():
    """The URL of a fresh in-memory GCS emulator on a free loopback port (gone after the session).

    ``STORAGE_EMULATOR_HOST`` points at it while it runs, so gcsfs, google-cloud-storage (Beam's
    own GCS IO) and subprocesses all talk to it; skipped when the emulator is not installed
    (``pip install -e '.[test]'``)."""
    import shutil
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    exe = shutil.which("gcp-storage-emulator") or os.path.join(os.path.dirname(sys.executable), "gcp-storage-emulator")
    if not os.path.exists(exe):
        pytest.skip("gcp-storage-emulator is not installed (the test extra has it)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    # its request log goes to a file: an unread pipe fills up and then blocks the emulator
    log_path = os.path.join(_HOME, f"gcs-emulator-{port}.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [exe, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1) as r:
                r.read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                with open(log_path, errors="replace") as f:
                    pytest.fail(f"gcp-storage-emulator did not start on {url}: {f.read()[-2000:]}")
            time.sleep(0.05)
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
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    @contextlib.contextmanager
    def start(home, **extra_env):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
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
        with open(os.path.join(home, "server.log"), "w") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
            try:
                deadline = time.monotonic() + 180
                while True:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2) as r:
                            if r.status == 200:
                                break
                    except OSError:
                        pass
                    assert proc.poll() is None, open(os.path.join(home, "server.log")).read()[-3000:]
                    assert time.monotonic() < deadline, "prefect server did not become healthy"
                    time.sleep(1)
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
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    tmp = tmp_path_factory.mktemp("mlflow-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    cmd += ["--backend-store-uri", f"sqlite:///{tmp}/server.db", "--artifacts-destination", str(tmp / "artifacts")]
    with open(tmp / "server.log", "wb") as log:
        proc = subprocess.Popen(cmd, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}, stdout=log, stderr=log)
    try:  # one worker, and time to start on a loaded machine (4 took over 180 s at a load of 30 on 2 cores)
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, (tmp / "server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "mlflow server did not become healthy"
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
