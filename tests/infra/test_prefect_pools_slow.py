"""Every work-pool job template under infra/prefect/ created as the README says, on a real
`prefect server` on 127.0.0.1 (`prefect work-pool create NAME --type T --base-job-template FILE`),
and read back unchanged. Slow tier: `python3 -m pytest -m slow tests/infra/test_prefect_pools_slow.py`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_infra_scripts import POOLS  # the same folder (pytest puts it on sys.path)

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server_env(tmp_path_factory, prefect_server_at):
    with prefect_server_at(tmp_path_factory.mktemp("prefect-pools")) as env:
        yield env


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
