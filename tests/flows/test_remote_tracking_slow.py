"""The chain against a remote MLflow tracking server (`mlflow server` on 127.0.0.1) instead of
the SQLite file: runs, datasets, the registered pyfunc model and its alias all go through HTTP.
Slow tier: `python3 -m pytest -m slow tests/flows/test_remote_tracking_slow.py`."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SHORT = [
    "pretrain.phases.0.steps=40",
    "pretrain.phases.1.steps=10",
    "pretrain.warmup_steps=5",
    "examples.dupe_factor=1",
    "finetune.epochs=1",
    'finetune_tasks=["sst2"]',
]


def test_the_chain_tracks_to_a_remote_server_and_the_champion_loads_from_it(servers, tmp_path):
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PREFECT_HOME": str(tmp_path / "prefect")}
    server, uri = servers.start_mlflow_server(tmp_path / "server", seconds=180)
    try:
        cmd = [sys.executable, "-m", "flows.cli", "run", "--root", str(tmp_path / "root"), "--mlflow-uri", uri]
        for o in SHORT:
            cmd += ["--set", o]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        assert out.returncode == 0, out.stderr[-4000:]
        assert not (tmp_path / "root" / "mlflow.db").exists()  # nothing went to the default file

        import mlflow
        import pandas as pd

        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        model = mlflow.pyfunc.load_model("models:/bert-tiny@champion")
        assert len(model.predict(pd.DataFrame({"text": ["a [MASK] b"]}))["filled"][0]) == 1
        client = mlflow.MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id])
        assert {r.info.run_name for r in runs} >= {"corpus", "pretrain", "finetune/sst2"}
    finally:
        server.terminate()
        server.wait(timeout=30)
