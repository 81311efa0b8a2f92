"""Two runs on two roots sharing one new tracking store, started together, on a new Prefect home
(the server case in CI's default tier, marked ``ci``; both: ``python -m pytest -m slow
tests/flows/test_shared_store_slow.py``): a SQLite file, and an ``mlflow server`` as a team shares it.

Each root starts from the shared chain's data stages (corpus, vocab, examples copied in), so the
two runs pretrain, export, fine-tune and register at once, which is where they share the store.
Both finish and register their own version; the store's artifacts live beside it (the server's
under its artifact root), so moving one root away breaks no model; lineage tags name absolute
paths though the roots were given relative.
"""

import os
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.slow

SHORT = [
    "pretrain.phases.0.steps=60",
    "pretrain.phases.1.steps=10",
    "pretrain.warmup_steps=10",
    "pretrain.checkpoint_every=50",
    "finetune_tasks=[]",  # the store is shared by the registration, not by fine-tuning: none (CI time)
]


# CI runs the server case (marked ``ci``: a team's store); the SQLite case is slow only (its new store's
# creation by two processes at once is a default-tier test, tests/flows/test_tracking.py)
@pytest.mark.parametrize("store", ["sqlite", pytest.param("server", marks=pytest.mark.ci)])
def test_two_runs_on_one_new_store_both_register_and_keep_their_artifacts(tmp_path, store, servers, chain, cli):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "MLFLOW_DISABLE_TELEMETRY": "true"}
    server = None
    if store == "sqlite":
        uri = f"sqlite:///{tmp_path / 'team' / 'mlflow.db'}"
        artifacts = f"file://{tmp_path}/team/mlartifacts/"
    else:
        server, uri = servers.start_mlflow_server(tmp_path / "team")  # as a team runs it: store, artifacts
        artifacts = "mlflow-artifacts:/"  # the server's: stored under its --artifacts-destination
    try:
        _two_runs(tmp_path, uri, env, artifacts, chain[0], cli)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    if server is not None:
        assert any((tmp_path / "team" / "artifacts").rglob("model.safetensors"))


def _two_runs(tmp_path, uri: str, env: dict, artifacts: str, chain_root, cli) -> None:
    runs = []
    for name in ("concA", "concB"):
        for folder in ("corpus", "vocab", "examples"):  # the data stages done: skipped by both runs
            shutil.copytree(chain_root / folder, tmp_path / "runs" / name / folder)
        cmd = [*cli(["run", "--preset", "tiny"], f"runs/{name}"), "--mlflow-uri", uri]
        for o in SHORT:  # after the chain's own: a shorter pretraining and fine-tuning
            cmd += ["--set", o]
        runs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True))  # fmt: skip
    outs = [p.communicate(timeout=3600) for p in runs]
    assert [p.returncode for p in runs] == [0, 0], [o[1][-3000:] for o in outs]

    import mlflow
    import pandas as pd

    client = mlflow.MlflowClient(uri, uri)
    versions = client.search_model_versions("name = 'bert-tiny'")
    by_root = {v.tags["bertflow.model_url"].rsplit("/", 1)[0]: v for v in versions}
    assert sorted(by_root) == [str(tmp_path / "runs" / "concA"), str(tmp_path / "runs" / "concB")]
    for root, v in by_root.items():  # the two exports are byte-identical: still a version each, its own lineage
        urls = [v.tags[k] for k in v.tags if k.startswith("lineage.") and k.endswith(".url")]
        assert urls and all(os.path.isabs(u) and u.startswith(root + "/") for u in urls), (root, urls)
        logged = client.get_logged_model(v.source.removeprefix("models:/"))  # the version's source: its logged model
        assert logged.artifact_location.startswith(artifacts), logged.artifact_location
    shutil.move(tmp_path / "runs" / "concA", tmp_path / "elsewhere")  # the first root goes away
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    for v in versions:
        model = mlflow.pyfunc.load_model(f"models:/bert-tiny/{v.version}")
        assert len(model.predict(pd.DataFrame({"text": ["the [MASK] of the river"]}))["filled"][0]) == 1
