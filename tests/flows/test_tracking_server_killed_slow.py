"""The tracking server going away under a real run (issue 28; ``flows.tracking``, design choice 5):
a real ``mlflow server`` on 127.0.0.1 is SIGKILLed (with its workers, as a crashed host would go)
once pretraining, or fine-tuning, has logged its first steps to it, and kept down. The run
(``bertflow run --preset tiny --mlflow-uri http://127.0.0.1:PORT`` on a root holding the shared
chain's finished upstream folders, so only that stage and what follows run) must fail within a
bounded time, its last line naming the server, nothing retried, no model version registered.
The server is then restarted on the same store and port, and the same command finishes and
registers exactly one version, leaving no run ``RUNNING``.

The wait for a refusing server is cut to a few seconds through ``BERTFLOW_TRACKING_WAIT_S`` (the
default is 120 s); the bound asserted is that wait plus generous room for the flow's own ending
on a loaded 2-core machine. In CI's default tier (marked ``ci``); alone:
``python3 -m pytest -m slow tests/flows/test_tracking_server_killed_slow.py``.
"""

import os
import re
import shutil
import signal
import subprocess
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.ci]  # in CI's default tier (README, "Slow cases")

WAIT_S = 10
"""``BERTFLOW_TRACKING_WAIT_S`` of the runs: how long a call waits for the killed server."""
BOUND_S = 240
"""From the kill to the CLI's exit: the wait (a stage's process, then at most one call of the
flow's own process each try once), the flow's ending and the process tree's exit."""
ONLY_SST2 = ['finetune_tasks=["sst2"]']  # what follows the stage: one downstream task is enough
# stage -> (the chain's folders copied into the root, the log line saying it has logged steps)
CASES = {
    # past its first checkpoint (every 50 steps in the chain's config): the rerun has one to resume from
    "pretrain": (("corpus", "vocab", "examples"), "pretrain | phase phase1 step 60/"),
    "finetune": (("corpus", "vocab", "examples", "checkpoints", "model"), "bertflow.finetune | step "),
}


def kill(server: subprocess.Popen) -> None:
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.wait(timeout=30)


def client_of(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def logged_steps(uri: str, stage: str) -> bool:
    """Whether a run of ``stage`` (a unit's run for fine-tuning) holds a metric on the server."""
    client = client_of(uri)
    experiment = client.get_experiment_by_name("bertflow")
    if experiment is None:
        return False
    runs = client.search_runs([experiment.experiment_id], filter_string="attributes.status = 'RUNNING'")
    return any(r.data.metrics for r in runs if r.data.tags.get("bertflow.stage", "").startswith(stage))


def versions(uri: str) -> list:
    return client_of(uri).search_model_versions()


@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
def test_a_server_killed_in_a_stage_fails_the_run_naming_it_and_a_rerun_after_its_restart_registers_once(
    servers, stage, chain, cli, cli_env, tmp_path
):
    upstream, started = CASES[stage]
    root = tmp_path / "root"
    root.mkdir()
    for folder in upstream:
        shutil.copytree(chain[0] / folder, root / folder)
    store = tmp_path / "store"
    store.mkdir()
    port = servers.free_port()
    uri = f"http://127.0.0.1:{port}"
    env = {**cli_env, "BERTFLOW_TRACKING_WAIT_S": str(WAIT_S), "MLFLOW_DISABLE_TELEMETRY": "true"}
    cmd = cli(["run", "--preset", "tiny"], root) + ["--mlflow-uri", uri]
    for o in ONLY_SST2:
        cmd += ["--set", o]

    server = servers.start_mlflow_server(store, port, new_session=True)[0]
    try:
        log_path = tmp_path / "killed.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 900
        # the stage runs and the server holds its first logged steps: then the server goes
        while not (started in log_path.read_text(errors="replace") and logged_steps(uri, stage)):
            assert proc.poll() is None, f"the run ended before {stage} logged:\n{log_path.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"{stage} never logged a step"
            time.sleep(0.5)
        kill(server)
        killed_at = time.monotonic()
        try:
            rc = proc.wait(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            raise AssertionError(f"still running {BOUND_S} s after the server was killed:\n"
                                 f"{log_path.read_text()[-4000:]}") from None  # fmt: skip
        took = time.monotonic() - killed_at
        text = log_path.read_text(errors="replace")
        print(f"{stage}: the run exited {rc} {took:.0f} s after the server was killed")
        last = text.strip().splitlines()[-1]
        print(f"{stage}: last line: {last}")
        assert rc == 6, text[-4000:]  # EXIT_CODES: the tracking server went away
        assert last.startswith("bertflow: run failed") and f"MLflow tracking server {uri} refused connections" in last
        # a call waited the window for the server, then failed naming it; nothing was retried
        assert f"MLflow tracking server {uri} refused connections for " in text
        # (Prefect's "Retry 1/3 will start ..."; urllib3's own "Retrying (Retry(total=...))" lines are MLflow's)
        assert re.search(r"Retry \d+/\d+", text) is None, "a stage or unit was retried for a gone server"
        if stage == "pretrain":  # the trainer met it, and ended with the code that says so
            assert "pretrain: the training process" in last and "checkpoints kept" in last, last
            assert "exited with code 6 (the MLflow tracking server went away)" in last, last
            assert not (root / "model").exists()  # nothing after pretraining ran

        # restarted on the same store and port: nothing was registered, the rerun finishes and registers once
        server = servers.start_mlflow_server(store, port, new_session=True)[0]
        assert versions(uri) == []
        start = time.monotonic()
        again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
        print(f"{stage}: the rerun exited {again.returncode} in {time.monotonic() - start:.0f} s")
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-5000:]
        if stage == "pretrain":  # from a checkpoint the failed run kept, not from step 1
            first = re.search(r"phase phase1: .* steps (\d+)\.\.", again.stdout + again.stderr)
            assert first is not None and int(first.group(1)) > 50, (again.stdout + again.stderr)[-3000:]
        registered = versions(uri)
        assert [(v.name, v.version) for v in registered] == [("bert-tiny", "1")]
        client = client_of(uri)
        runs = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id])
        statuses = {r.info.status for r in runs}
        assert "RUNNING" not in statuses and "KILLED" in statuses, statuses  # the failed run's leftovers marked
    finally:
        if server.poll() is None:
            kill(server)
