"""The deployments as a user meets them: a real `prefect server` on 127.0.0.1, a process work
pool, `prefect deploy --all` from prefect.yaml, `pretrain/tiny` run by a worker. Slow tier:
`python3 -m pytest -m slow tests/flows/test_deployments_slow.py` (about 5 minutes)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHORT = {
    "pretrain.phases.0.steps": 40,
    "pretrain.phases.1.steps": 10,
    "pretrain.warmup_steps": 5,
    "pretrain.log_every": 5,
    "examples.dupe_factor": 1,
    "finetune.epochs": 1,
}

pytestmark = [pytest.mark.slow, pytest.mark.production]


@pytest.fixture(scope="module")
def server(tmp_path_factory, prefect_server_at):
    with prefect_server_at(tmp_path_factory.mktemp("prefect-server"), BERTFLOW_HOME=str(REPO)) as env:
        prefect(env, "work-pool", "create", "local-process", "--type", "process")
        # the cloud pools the base/large deployments target, with their job templates from infra/
        prefect(
            env,
            "work-pool",
            "create",
            "k8s-gpu",
            "--type",
            "kubernetes",
            "--base-job-template",
            "infra/prefect/k8s-gpu.json",
        )
        prefect(
            env,
            "work-pool",
            "create",
            "vertex-tpu",
            "--type",
            "vertex-ai",
            "--base-job-template",
            "infra/prefect/vertex-tpu.json",
        )
        prefect(env, "--no-prompt", "deploy", "--all")
        yield env


def prefect(env, *args, timeout=300) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "prefect", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, f"prefect {' '.join(args)}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def run_deployment(env, name: str, params: dict) -> dict:
    """`prefect deployment run NAME`, then a worker that runs it once; the final state and logs."""
    args = ["deployment", "run", name]
    for k, v in params.items():
        args += ["--param", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    out = prefect(env, *args)
    run_id = next(line.split()[-1] for line in out.splitlines() if "UUID" in line)
    prefect(env, "worker", "start", "--pool", "local-process", "--run-once", timeout=1200)
    code = (
        "import asyncio, json, sys\nfrom prefect.client.orchestration import get_client\n"
        "from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, TaskRunFilter, \\\n"
        "    FlowRunFilter, FlowRunFilterId\n"
        "async def main(i):\n    async with get_client() as c:\n        fr = await c.read_flow_run(i)\n"
        "        logs = await c.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[i])))\n"
        "        trs = await c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[i])))\n"
        "        print(json.dumps({'state': fr.state.type.value, 'name': fr.state.name, 'message': fr.state.message,\n"
        "          'logs': [l.message for l in logs], 'tasks': {t.name: t.state.name for t in trs}}))\n"
        "asyncio.run(main(sys.argv[1]))\n"
    )
    res = subprocess.run([sys.executable, "-c", code, run_id], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    """The root `pretrain/tiny` runs in (the first test); later tests fine-tune its model."""
    return tmp_path_factory.mktemp("tiny") / "root"


def test_pretrain_tiny_runs_on_a_worker_and_a_rerun_shows_skipped_stages(server, tiny_root):
    root = tiny_root
    first = run_deployment(server, "pretrain/tiny", {"root": str(root), "overrides": SHORT})
    assert first["state"] == "COMPLETED", first
    logs = "\n".join(first["logs"])
    assert "stage corpus: running" in logs and "stage pretrain: done" in logs  # bertflow's own lines
    assert "phase phase1" in logs  # a line of the training process itself
    assert (root / "model" / "model.safetensors").exists()
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert client.get_model_version_by_alias("bert-tiny", "champion")

    second = run_deployment(server, "pretrain/tiny", {"root": str(root), "overrides": SHORT})
    assert second["state"] == "COMPLETED"
    from flows.table import CHAIN

    stage_states = {k: v for k, v in second["tasks"].items() if k.split("/")[0] in CHAIN}
    assert stage_states and set(stage_states.values()) == {"Skipped"}, second["tasks"]


def test_a_deployment_that_cannot_work_fails_in_seconds(server, tmp_path):
    start = time.monotonic()
    bad = run_deployment(server, "pretrain/tiny", {"root": str(tmp_path / "r"), "mlflow_uri": "http://127.0.0.1:9"})
    assert bad["state"] in ("FAILED", "CRASHED") and "does not answer" in (bad["message"] or "") + "\n".join(
        bad["logs"]
    )
    assert time.monotonic() - start < 240  # worker start included; no stage ran
    assert not (tmp_path / "r" / "corpus").exists()


def test_one_stage_reruns_alone_from_its_own_deployment(server, tmp_path):
    root = tmp_path / "root"
    run = run_deployment(server, "stage-corpus/default", {"root": str(root)})
    assert run["state"] == "COMPLETED", run
    assert (root / "corpus" / "_manifest.json").exists() and not (root / "vocab").exists()


def test_downstream_units_fan_out_as_runs_of_their_deployment(server, tiny_root, tmp_path):
    """`finetune.grid.dispatch=deployment`: each unit is a run of `finetune-unit/default`, picked up
    by a worker like any deployment run (a GPU pool's at scale), and the task gathers them."""
    model = tiny_root / "model"
    assert (model / "config.json").exists(), "needs the model of test_pretrain_tiny_runs_on_a_worker..."
    root = tmp_path / "root"
    log = open(tmp_path / "worker.log", "w")
    worker = subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", "local-process"],
        env=server,
        cwd=REPO,
        stdout=log,
        stderr=log,
        start_new_session=True,  # its group is killed if a graceful stop hangs
    )
    try:
        overrides = {
            **SHORT,
            "finetune_tasks": ["sst2"],
            "finetune.grid.learning_rates": [5e-4, 1e-3],
            "finetune.grid.dispatch": "deployment",
        }
        out = prefect(
            server,
            "deployment",
            "run",
            "stage-finetune/default",
            "--param",
            f"root={root}",
            "--param",
            f"model_url={model}",
            "--param",
            f"overrides={json.dumps(overrides)}",
        )
        run_id = next(line.split()[-1] for line in out.splitlines() if "UUID" in line)
        runs = _wait_for_runs(server, run_id, timeout=900)
    finally:
        # A graceful stop; how long Prefect's worker takes to shut down is not what this checks
        # (at a load of 4-6 on 2 cores it took over 60 s after its runs had completed): then its group.
        worker.terminate()
        try:
            worker.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=60)
        log.close()
    parent = runs[run_id]
    assert parent["state"] == "COMPLETED", (parent, (tmp_path / "worker.log").read_text()[-3000:])
    units = {r["parameters"]["unit_id"]: r for i, r in runs.items() if r["deployment"] == "finetune-unit/default"}
    from flows.presets import load_config
    from tasks.registry import get_task
    from tasks.units import plan_units

    planned = [u["unit_id"] for u in plan_units(get_task("sst2"), load_config("tiny", overrides).finetune)]
    assert sorted(units) == sorted(planned) and all(r["state"] == "COMPLETED" for r in units.values())
    assert all(r["parent_task_run_id"] for r in units.values())  # subflow runs of the unit tasks
    results = json.loads((root / "finetune" / "sst2" / "results.json").read_text())
    assert results["failed"] == [] and results["units"] == len(planned)
    for unit in planned:
        assert (root / "finetune" / "sst2" / "units" / unit / "_manifest.json").exists()


def _wait_for_runs(env, run_id: str, timeout: float) -> dict:
    """Poll until flow run ``run_id`` is final; every flow run on the server, by id."""
    code = (
        "import asyncio, json, sys\nfrom prefect.client.orchestration import get_client\n"
        "async def main(i):\n    async with get_client() as c:\n        runs = await c.read_flow_runs()\n"
        "        deps = {d.id: d.name for d in await c.read_deployments()}\n"
        "        flows = {f.id: f.name for f in await c.read_flows()}\n"
        "        print(json.dumps({str(r.id): {'state': r.state.type.value if r.state else None,\n"
        "          'deployment': f\"{flows.get(r.flow_id)}/{deps.get(r.deployment_id)}\", 'parameters': r.parameters,\n"
        "          'parent_task_run_id': str(r.parent_task_run_id or '')} for r in runs}, default=str))\n"
        "asyncio.run(main(sys.argv[1]))\n"
    )
    deadline = time.monotonic() + timeout
    while True:
        res = subprocess.run([sys.executable, "-c", code, run_id], env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        runs = json.loads(res.stdout.strip().splitlines()[-1])
        if runs.get(run_id, {}).get("state") in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return runs
        assert time.monotonic() < deadline, f"flow run {run_id} not finished after {timeout} s: {runs.get(run_id)}"
        time.sleep(3)
