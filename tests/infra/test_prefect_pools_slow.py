"""Every work-pool job template under infra/prefect/ created as the README says, on a real
`prefect server` on 127.0.0.1 (`prefect work-pool create NAME --type T --base-job-template FILE`),
and read back unchanged. Slow tier: `python3 -m pytest -m slow tests/infra/test_prefect_pools_slow.py`."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_infra_scripts import POOLS  # the same folder (pytest puts it on sys.path)

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect-pools")
    port = _free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
    }
    log = open(home / "server.log", "w")
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"]
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
            assert proc.poll() is None, (home / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "prefect server did not become healthy"
            time.sleep(1)
        yield env
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def prefect(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prefect", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("name", sorted(POOLS))
def test_each_template_creates_its_pool(server_env, name):
    path = f"infra/prefect/{name}.json"
    out = prefect(server_env, "work-pool", "create", name, "--type", POOLS[name], "--base-job-template", path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    shown = prefect(server_env, "work-pool", "inspect", name, "--output", "json")
    assert shown.returncode == 0, shown.stderr[-3000:]
    pool = json.loads(shown.stdout)
    assert pool["type"] == POOLS[name]
    assert pool["base_job_template"] == json.loads((REPO / path).read_text())


def test_an_invalid_template_is_refused_by_the_server(server_env, tmp_path):
    """The check the default tier makes offline is the server's: the fault gke-tpu.json had."""
    template = json.loads((REPO / "infra/prefect/gke-tpu.json").read_text())
    template["variables"]["properties"]["description"] = "a string, not a schema"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(template))
    out = prefect(server_env, "work-pool", "create", "bad", "--type", "kubernetes", "--base-job-template", str(bad))
    assert out.returncode != 0 and "Invalid schema" in out.stdout + out.stderr
