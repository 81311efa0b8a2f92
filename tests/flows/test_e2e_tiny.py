"""The whole chain through the real command line, on the bundled sample data.

Beam on FnApiRunner, Prefect's ephemeral server, MLflow on SQLite, torch on CPU: nothing mocked.
Shorter schedules than the tiny preset (overrides) keep it to a few minutes; the preset itself
is what the README's command runs.
"""

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from pipeline.schema import read_manifest

OVERRIDES = [
    "pretrain.phases.0.steps=150",
    "pretrain.phases.1.steps=30",
    "pretrain.warmup_steps=20",
    "pretrain.checkpoint_every=100",
    "examples.dupe_factor=2",
    "finetune.epochs=2",
]


def _run(args, root, env):
    cmd = [sys.executable, "-m", "flows.cli", *args, "--root", str(root)]
    for o in OVERRIDES:
        cmd += ["--set", o]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    env = {**os.environ, "PREFECT_HOME": str(tmp_path_factory.mktemp("prefect-home"))}
    first = _run(["run", "--preset", "tiny"], root, env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-6000:]
    second = _run(["run", "--preset", "tiny"], root, env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-6000:]
    third = _run(["stage", "export", "--preset", "tiny"], root, env)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-6000:]
    return root, first, second, third


def test_every_stage_wrote_its_outputs_and_manifest(chain):
    root, first, _, _ = chain
    for folder in ("corpus", "vocab", "examples", "checkpoints", "model", "finetune/sst2"):
        manifest = read_manifest(str(root / folder))
        assert manifest.files, folder
        for f in manifest.files:
            assert (root / folder / f.path).stat().st_size == f.size
    docs = pq.read_table(root / "corpus" / "wiki").to_pylist()
    assert len(docs) > 20 and all(d["doc_id"].startswith("wiki:") for d in docs)
    assert all("{{" not in s and "[[" not in s for d in docs for s in d["sentences"])
    assert (root / "vocab" / "vocab.txt").read_text().split("\n")[:1] == ["[PAD]"]
    for n in (64, 128):
        assert pq.read_table(root / "examples" / f"seq{n}").num_rows > 100
    assert list((root / "checkpoints").glob("*/step-*"))
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json"):
        assert (root / "model" / name).exists(), name
    assert json.loads((root / "model" / "config.json").read_text())["model_type"] == "bert"
    assert "results:" in first.stdout and str(root) in first.stdout


def test_mlm_loss_falls_and_downstream_is_evaluated(chain):
    root = chain[0]
    counts = read_manifest(str(root / "checkpoints")).counts
    assert counts["last_mlm_loss"] < counts["first_mlm_loss"] - 1.0
    metrics = read_manifest(str(root / "finetune" / "sst2")).counts
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0
    squad = read_manifest(str(root / "finetune" / "squad1")).counts
    assert 0.0 <= squad["eval_exact_match"] <= squad["eval_f1"] <= 100.0
    predictions = json.loads((root / "finetune" / "squad1" / "predictions.json").read_text())
    assert len(predictions) == squad["dev_examples"]  # the official format: question id -> answer


def test_mlflow_holds_runs_and_a_registered_model(chain):
    root = chain[0]
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.get_experiment_by_name("bertflow")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 3  # one per command
    first_parent = min(parents, key=lambda r: r.info.start_time)
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == first_parent.info.run_id}
    assert set(children) == {"corpus", "vocab", "examples", "pretrain", "export", "finetune/sst2", "finetune/squad1"}
    assert client.get_metric_history(children["pretrain"].info.run_id, "mlm_loss")
    assert "vocab_size" in children["vocab"].data.params
    versions = sorted(client.search_model_versions("name='bert-tiny'"), key=lambda v: int(v.version))
    # the second run skipped export (no new version); `bertflow stage export` reran it (version 2)
    assert [str(v.version) for v in versions] == ["1", "2"]
    assert "sst2.eval_accuracy" in versions[0].tags
    assert versions[0].run_id == first_parent.info.run_id


def test_second_run_skips_every_stage(chain):
    root, _, second, _ = chain
    assert "skipped" in second.stdout
    for stage in ("corpus", "vocab", "examples", "pretrain", "export", "finetune/sst2", "finetune/squad1"):
        assert f"stage {stage}: up to date, skipped" in second.stderr, stage


def test_stage_command_reruns_one_stage_alone(chain):
    root, _, _, third = chain
    assert "stage export: running" in third.stderr
    for other in ("corpus", "vocab", "examples", "pretrain", "finetune/sst2", "finetune/squad1"):
        assert f"stage {other}:" not in third.stderr, other
    assert read_manifest(str(root / "model")).files
