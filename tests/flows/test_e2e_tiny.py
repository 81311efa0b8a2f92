"""The whole chain through the real command line, on the bundled sample data (see conftest)."""

import json
import os

import pyarrow.parquet as pq
import pytest

from flows.overrides import parse_overrides
from flows.presets import load_config
from pipeline.schema.manifest import read_manifest
from tasks.registry import get_task
from tasks.units import plan_units


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
    # each task clearly above chance (SST-2: 50% balanced; SQuAD F1 and entity F1: about 0)
    best = {
        t: json.loads((root / "finetune" / t / "results.json").read_text()) for t in ("sst2", "squad1", "conll2003")
    }
    print({t: (r["metric"], round(r["dev_median"], 2)) for t, r in best.items()})
    assert best["sst2"]["dev_median"] >= 65.0
    assert best["squad1"]["dev_median"] >= 10.0
    assert best["conll2003"]["dev_median"] >= 20.0
    table = (root / "finetune" / "results.md").read_text()
    assert all(t in table for t in best)


def test_the_model_card_has_the_scores_and_the_fine_tuned_models_load(chain):
    """After the run (and a lone `stage export`): the exported folder's card, read as the Hub
    reads it, holds every task's dev score; nothing in the folder names this machine's paths; each
    task's best fine-tuned model loads with transformers' AutoModelFor<Task>."""
    import transformers
    from huggingface_hub import ModelCard

    root = chain[0]
    card = ModelCard.load(str(root / "model" / "README.md"))
    scores = {r.dataset_type: r.metric_value for r in card.data.eval_results}
    best = {
        t: json.loads((root / "finetune" / t / "results.json").read_text()) for t in ("sst2", "squad1", "conll2003")
    }
    assert scores == {
        "glue": round(best["sst2"]["dev_median"], 2),
        "squad": round(best["squad1"]["dev_median"], 2),
        "conll2003": round(best["conll2003"]["dev_median"], 2),
    }
    assert card.data.library_name == "transformers" and "## How to load" in card.text
    config = json.loads((root / "model" / "config.json").read_text())
    assert config["dtype"] == "float32" and "torch_dtype" not in config
    for path in (root / "model").rglob("*"):
        if path.is_file():
            assert str(root) not in path.read_bytes().decode("utf-8", "replace"), path.name
    for task, auto in (("sst2", transformers.AutoModelForSequenceClassification),
                       ("squad1", transformers.AutoModelForQuestionAnswering),
                       ("conll2003", transformers.AutoModelForTokenClassification)):  # fmt: skip
        assert best[task]["model"] == "model"
        auto.from_pretrained(str(root / "finetune" / task / "model"))
        kept = [u for u in (root / "finetune" / task / "units").iterdir() if (u / "model").exists()]
        assert [u.name for u in kept] == [best[task]["best_unit"]]


def test_mlflow_holds_runs_and_a_registered_model(chain, chain_overrides):
    root = chain[0]
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.get_experiment_by_name("bertflow")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 3  # one per command
    first_parent, second_parent, _ = sorted(parents, key=lambda r: r.info.start_time)
    # the second run skipped every stage: no run of its own for any of them, its parent says so
    assert not [r for r in runs if r.data.tags.get("mlflow.parentRunId") == second_parent.info.run_id]
    assert second_parent.data.tags["bertflow.outcome"] == "nothing to do"
    ours = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == first_parent.info.run_id]
    children = {r.info.run_name: r for r in ours if "bertflow.unit" not in r.data.tags}
    assert set(children) == {
        "corpus",
        "vocab",
        "examples",
        "pretrain",
        "export",
        "finetune/sst2",
        "finetune/squad1",
        "finetune/conll2003",
    }
    # the grid fanned out: one finished child run per unit, holding that unit's training curve
    cfg = load_config("tiny", parse_overrides(chain_overrides))
    units = {
        (r.data.tags["bertflow.stage"], r.data.tags["bertflow.unit"]): r for r in ours if "bertflow.unit" in r.data.tags
    }
    planned = {
        (f"finetune/{t}", u["unit_id"])
        for t in ("sst2", "squad1", "conll2003")
        for u in plan_units(get_task(t), cfg.finetune)
    }
    assert set(units) == planned and len(planned) >= 6
    assert all(r.info.status == "FINISHED" for r in units.values())
    assert all(client.get_metric_history(r.info.run_id, "train_loss") for r in units.values())
    assert client.get_metric_history(children["pretrain"].info.run_id, "mlm_loss")
    assert "vocab_size" in children["vocab"].data.params
    corpus_params = children["corpus"].data.params
    assert "min_sentence_chars" in corpus_params and "beam.extra_args" not in corpus_params  # how it ran: parent's
    parent_params = first_parent.data.params
    assert "not-for-the-logs" not in json.dumps(parent_params) and "***" in parent_params["corpus.beam.extra_args"]
    assert "not-for-the-logs" not in (root / "corpus" / "_manifest.json").read_text()
    inputs = {
        d.dataset.name: d.dataset.source for d in client.get_run(children["examples"].info.run_id).inputs.dataset_inputs
    }
    assert set(inputs) == {"corpus", "vocab"} and str(root / "vocab") in inputs["vocab"]  # lineage
    assert children["pretrain"].data.tags["bertflow.status"] == "done"
    artifacts = {a.path for a in client.list_artifacts(children["pretrain"].info.run_id)}
    assert {"manifest.json", "loss_curve.png"} <= artifacts
    assert first_parent.data.tags["bertflow.git_commit"] and first_parent.data.tags["bertflow.config_fingerprint"]
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # MLflow opens its training runs
    for r in units.values():  # each unit's grid point is its params
        assert {"learning_rate", "batch_size", "epochs", "seed"} <= set(r.data.params)
        assert float(r.data.params["learning_rate"]) in cfg.finetune.grid.learning_rates
    versions = sorted(client.search_model_versions("name='bert-tiny'"), key=lambda v: int(v.version))
    # one export, one version: the second run skipped export and `bertflow stage export` rewrote
    # the same weights, so neither registered another
    assert [str(v.version) for v in versions] == ["1"]
    v1 = versions[0]
    assert v1.run_id == first_parent.info.run_id
    assert v1.tags["bertflow.export_fingerprint"] == read_manifest(str(root / "model")).fingerprint
    assert v1.tags["lineage.raw.wiki"].endswith("data/sample/wiki")
    assert v1.tags["lineage.examples.fingerprint"] == read_manifest(str(root / "examples")).fingerprint
    # scored in percent on every task: SST-2's accuracy as 76.5, not 0.765
    percents = {t: float(v1.tags[f"{t}.score_percent"]) for t in ("sst2", "squad1", "conll2003")}
    assert all(1.0 < p <= 100.0 for p in percents.values())
    assert float(v1.tags["bertflow.score"]) == pytest.approx(sum(percents.values()) / 3, abs=1e-3)
    assert float(v1.tags["bertflow.glue_average"]) == pytest.approx(percents["sst2"], abs=1e-3)
    assert "in percent" in client.get_model_version("bert-tiny", "1").description
    assert str(client.get_model_version_by_alias("bert-tiny", "champion").version) == "1"


def test_the_champion_loads_back_as_a_pyfunc_model(chain):
    root = chain[0]
    import mlflow
    import pandas as pd

    uri = f"sqlite:///{root}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    model = mlflow.pyfunc.load_model("models:/bert-tiny@champion")
    # the model is code and one copy of the weights (the Hugging Face folder), no pickle
    local = mlflow.artifacts.download_artifacts("models:/bert-tiny@champion")
    files = {os.path.relpath(os.path.join(d, f), local) for d, _, fs in os.walk(local) for f in fs}
    assert not any(f.endswith((".pkl", ".pickle")) for f in files), files
    assert sum(f.endswith("model.safetensors") for f in files) == 1
    assert "served_model.py" in " ".join(files)
    # a list, a string and a DataFrame all work; a [MASK] after 300 words is still filled
    assert (
        model.predict(["the [MASK] of the river"])["filled"][0] == model.predict("the [MASK] of the river")["filled"][0]
    )
    long = " ".join(["the town lies on the river"] * 60) + " the [MASK] of the river"
    with pytest.warns(UserWarning, match="overlapping windows"):
        far = model.predict(long)
    assert len(far["filled"][0]) == 1 and far["windows"][0] > 1
    out = model.predict(pd.DataFrame({"text": ["the [MASK] of the river", "a plain sentence"]}))
    assert [len(f) for f in out["filled"]] == [1, 0]
    assert out["filled"][0][0] not in ("[MASK]", "[PAD]")
    hidden = json.loads((root / "model" / "config.json").read_text())["hidden_size"]
    assert len(out["cls_embedding"][0]) == len(out["mean_embedding"][1]) == hidden


NOISE = (
    "ignoring weights this model does not have",  # the heads a fine-tuning backbone drops, once per unit
    "apitools not found",  # Beam at import, without the gcp extra
    "Add type hints to the `predict` method",  # MLflow, at logging and at every load
    "already exists",  # MLflow's register_model on a brand-new registry
    "Downloading artifacts",  # MLflow's progress bars, one line per update in a file
)


def test_a_successful_run_prints_no_warning_that_is_not_its_users(chain):
    """What a newcomer reads as trouble and cannot act on: none of it in the first run's output,
    nor when the registered model loads."""
    import warnings

    import mlflow

    root, first, _, _ = chain
    for text in NOISE:
        assert text not in first.stderr and text not in first.stdout, text
    assert "registered bert-tiny version 1" in first.stderr  # what is said instead
    uri = f"sqlite:///{root}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mlflow.pyfunc.load_model("models:/bert-tiny@champion")
    assert not [str(w.message) for w in caught if "type hint" in str(w.message)]


def test_second_run_skips_every_stage(chain):
    root, _, second, _ = chain
    assert "skipped" in second.stdout
    # answered from the manifests and the store, without the flow (tests/flows/test_finished_run.py)
    assert "answered from the manifests" in second.stderr and "Starting temporary server" not in second.stderr
    for stage in (
        "corpus",
        "vocab",
        "examples",
        "pretrain",
        "export",
        "finetune/sst2",
        "finetune/squad1",
        "finetune/conll2003",
    ):
        assert f"stage {stage}: up to date, skipped" in second.stderr, stage


def test_stage_command_reruns_one_stage_alone(chain):
    root, _, _, third = chain
    assert "stage export: running" in third.stderr
    for other in ("corpus", "vocab", "examples", "pretrain", "finetune/sst2", "finetune/squad1"):
        assert f"stage {other}:" not in third.stderr, other
    assert read_manifest(str(root / "model")).files


def test_status_lists_every_stage_done_and_inspect_decodes_outputs(chain, cli, cli_env, run_command):
    import subprocess
    import sys

    root = chain[0]
    out = subprocess.run(
        cli(["status", "--preset", "tiny", "--json", "--verify"], root),
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout)
    assert [r["stage"] for r in rows][-3:] == ["finetune/sst2", "finetune/squad1", "finetune/conll2003"]
    assert {r["state"] for r in rows} == {"done"} and all(r["mlflow_run"] for r in rows)
    # a finished root's status reads manifests and the store: no torch, Beam, Prefect or MLflow
    code, loaded, out, err = run_command(cli(["status", "--preset", "tiny", "--json"], root)[3:], cli_env)
    assert code == 0 and json.loads(out) == rows, err[-2000:]
    assert not {"torch", "apache_beam", "prefect", "mlflow"} & set(loaded), loaded

    def inspect(url):
        res = subprocess.run(
            [sys.executable, "-m", "flows.cli", "inspect", str(url), "-n", "3"],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        return res.stdout

    assert "[MASK]→" in inspect(root / "examples" / "seq64") and "[CLS]" in inspect(root / "examples")
    corpus = inspect(root / "corpus")
    assert corpus.startswith(("books:", "wiki:")) and " sentences)" in corpus
    assert "eval_exact_match" in inspect(root / "finetune" / "squad1")


def test_only_a_run_that_trains_makes_a_progress_artifact(chain, cli_env):
    """Three commands, one of which trained: one progress artifact (a skipped stage made one at 0%).

    Only the chain's own flow runs count (their ``root`` parameter): the session's Prefect home is
    shared with other tests of the chain (faults, signals) that train roots of their own."""
    import sqlite3

    root = chain[0]
    with sqlite3.connect(os.path.join(cli_env["PREFECT_HOME"], "prefect.db")) as db:
        runs = db.execute(
            "select count(*) from flow_run where json_extract(parameters, '$.root') = ?", (str(root),)
        ).fetchone()[0]
        rows = db.execute(
            "select a.key, a.data from artifact a join flow_run f on a.flow_run_id = f.id"
            " where a.type = 'progress' and json_extract(f.parameters, '$.root') = ?",
            (str(root),),
        ).fetchall()
    assert runs == 2  # the first run and `stage export`; the second run answered from the manifests
    assert [(key, float(data)) for key, data in rows] == [("pretrain-progress", 100.0)]
