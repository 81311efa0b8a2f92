"""The downstream registry and a task's grid: every task by name, per-task URLs, units that are
skipped when finished and retried alone when failed, median/min/max over seeds, the results table
and the GLUE average; one real task (STS-B on the bundled sample) keeps full-precision predictions."""

import json
import math
import pathlib

import pytest

import tasks.units as U
from model.contract import fingerprint_input, write_manifest
from tasks.config import FinetuneConfig, GridConfig
from tasks.metrics import pearson
from tasks.registry import TASKS, Task, get_task
from tasks.results import summarize

SAMPLE = pathlib.Path(__file__).resolve().parents[2] / "data" / "sample"
PAPER = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "squad1", "squad2", "conll2003", "swag"]


def test_every_task_by_name_with_its_data_url():
    cjk = {"jglue": "sample-ja", "clue": "sample-zh"}  # JGLUE, CLUE: the Japanese and Chinese samples
    english = {n for n, t in TASKS.items() if t.family not in cjk}
    assert set(PAPER) | {"conll2003_features"} == english
    assert {n for n, t in TASKS.items() if t.family == "jglue"} == {
        "marc_ja",
        "jsts",
        "jnli",
        "jsquad",
        "jcommonsenseqa",
    }
    assert {"afqmc", "tnews", "iflytek", "cmnli", "ocnli", "cluewsc2020", "csl", "cmrc2018"} <= set(TASKS)
    for name, task in TASKS.items():
        root = SAMPLE.parent / cjk[task.family] if task.family in cjk else SAMPLE
        assert (root / task.folder).is_dir(), name
    assert U.task_data_url(get_task("mrpc"), "/data", {"mrpc": "gs://b/MRPC"}) == "gs://b/MRPC"
    assert U.task_data_url(get_task("mnli"), "/data", {"mrpc": "gs://b/MRPC"}) == "/data/glue/MNLI"
    with pytest.raises(KeyError, match="unknown downstream task 'nope'"):
        U.manifest_config(get_task("nope"), FinetuneConfig())


def test_every_row_resolves_its_family_steps():
    """One driver for every unit: each row names a Family whose steps it gives; the JSON-lines
    rows their files and, for span QA, their official scorer; ``get_task`` is the one lookup."""
    from tasks.driver import Family
    from tasks.registry import resolve

    for name, task in TASKS.items():
        family = resolve(task.unit)
        assert issubclass(family, Family) and family is not Family, name
        for step in ("read", "encode", "head", "predict", "score", "write", "saved"):
            assert getattr(family, step) is not getattr(Family, step), (name, step)
        if task.files:
            train, dev = resolve(task.files)
            assert train and dev, name
        assert bool(task.scorer) == (task.unit == "tasks.jsonl:SpanQa"), name
        if task.scorer:
            assert callable(resolve(task.scorer)), name
    assert get_task("SST-2") is TASKS["sst2"] and get_task("STS-B") is TASKS["stsb"]


def test_plan_units_paper_grid_and_features():
    from tasks.config import PAPER_GRID, FeatureConfig

    units = U.plan_units(get_task("mrpc"), FinetuneConfig(grid=PAPER_GRID))
    assert len(units) == 4 * 2 * 3 * 5 and len({u["unit_id"] for u in units}) == len(units)
    assert json.loads(json.dumps(units)) == units
    assert units[0] == {
        "learning_rate": 5e-5,
        "batch_size": 16,
        "epochs": 2.0,
        "seed": 1,
        "unit_id": "lr5e-05_bs16_ep2_seed1",
    }
    single = U.plan_units(get_task("sst2"), FinetuneConfig(learning_rate=1e-4, seed=7))
    assert [u["unit_id"] for u in single] == ["lr0.0001_bs32_ep3_seed7"]
    feats = U.plan_units(
        get_task("conll2003_features"), FinetuneConfig(features=FeatureConfig(layer_mixes=("last", "sum_all")))
    )
    assert [u["feature_mix"] for u in feats] == ["last", "sum_all"]


@pytest.fixture
def fake_task(monkeypatch):
    """A task whose run writes a manifest with a score from (lr, seed), and fails on one unit."""
    calls = []

    def run_task(task, config, data_url, model_url, output_url, log_fn=None, save_model=True, unit=None):
        import fsspec

        calls.append(unit["unit_id"])
        if config.seed == 3 and config.learning_rate == 1.0 and not FAIL_ONCE.get("done"):
            FAIL_ONCE["done"] = True
            raise RuntimeError("out of memory (pretend)")
        score = {0.5: 0.6, 1.0: 0.7}[config.learning_rate] + 0.01 * config.seed
        with fsspec.open(f"{output_url}/predictions.tsv", "w", auto_mkdir=True) as f:  # local or memory://
            f.write(f"{unit['unit_id']}\n")
        return write_manifest(
            "finetune-fake",
            output_url,
            U.unit_manifest_config(get_task("fake"), config, unit),
            {"model": fingerprint_input(model_url), "data": fingerprint_input(data_url)},
            {"eval_accuracy": score, "dev_examples": 3.0},
        )

    FAIL_ONCE: dict = {}
    # every unit's run (Task.run -> tasks.driver.run_unit) is the one above
    monkeypatch.setattr("tasks.driver.run_unit", run_task)
    monkeypatch.setitem(
        TASKS, "fake", Task("fake", "fake", "fake", "eval_accuracy", 100.0, "tasks.fake:read", "tasks.fake:Head",
                            glue_average=True)
    )  # fmt: skip
    return calls


def test_grid_units_aggregate_skip_and_retry(tmp_path, fake_task):
    (tmp_path / "data" / "fake").mkdir(parents=True)
    (tmp_path / "data" / "fake" / "train.tsv").write_text("x")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    config = FinetuneConfig(grid=GridConfig(learning_rates=(0.5, 1.0), seeds=(1, 2, 3)))
    out = tmp_path / "out"
    manifest = U.run_downstream(get_task("fake"), config, str(tmp_path / "data"), str(tmp_path / "model"), str(out))
    results = json.loads((out / "results.json").read_text())
    # lr 1.0: seeds 1, 2 ran (0.71, 0.72), seed 3 failed -> median 0.715; lr 0.5: 0.61 0.62 0.63 -> 0.62
    assert results["best"]["learning_rate"] == 1.0 and results["seeds"] == 2
    assert results["dev_median"] == pytest.approx(71.5) and results["dev_min"] == pytest.approx(71.0)
    assert results["dev_max"] == pytest.approx(72.0)
    assert [f["unit_id"] for f in results["failed"]] == ["lr1_bs32_ep3_seed3"]
    assert "out of memory" in results["failed"][0]["error"]
    assert manifest.counts["units_failed"] == 1 and manifest.counts["dev_median"] == pytest.approx(71.5)
    assert (out / "predictions.tsv").read_text() == "lr1_bs32_ep3_seed2\n"  # the best seed's
    assert "| 1 | 32 | 3 | 2 | 71.50 | 71.00 | 72.00 |" in (out / "results.md").read_text()
    assert manifest.config == U.manifest_config(get_task("fake"), config)
    # rerun: finished units are skipped, the failed one alone is retried
    fake_task.clear()
    manifest = U.run_downstream(get_task("fake"), config, str(tmp_path / "data"), str(tmp_path / "model"), str(out))
    assert fake_task == ["lr1_bs32_ep3_seed3"]
    assert manifest.counts["units_failed"] == 0 and manifest.counts["dev_median"] == pytest.approx(72.0)
    # a new model (a refresh): every unit starts over by itself, none is kept or refused
    (tmp_path / "model" / "config.json").write_text('{"refreshed": 1}')
    fake_task.clear()
    manifest = U.run_downstream(get_task("fake"), config, str(tmp_path / "data"), str(tmp_path / "model"), str(out))
    assert len(fake_task) == 6 and manifest.inputs["model"] == fingerprint_input(str(tmp_path / "model"))
    # the per-model table and the GLUE average
    summary = summarize({"fake": str(out)}, str(tmp_path / "all"), model="m")
    assert summary["glue_average"] == pytest.approx(72.0) and summary["glue_average_tasks"] == ["fake"]
    assert (
        "| fake | accuracy | 72.00 | 71.00 | 73.00 | 3 | 1 | 32 | 3 | 0/6 |"
        in (tmp_path / "all" / "results.md").read_text()
    )


def test_all_units_failing_is_an_error(tmp_path, fake_task):
    config = FinetuneConfig(grid=GridConfig(seeds=(1,)))
    with pytest.raises(RuntimeError, match="fake: all 1 units failed"):
        U.aggregate(get_task("fake"), config, [str(tmp_path / "never-ran")], str(tmp_path / "out"))


def test_stsb_predictions_keep_full_precision(tmp_path, tiny_model_url):
    config = FinetuneConfig(learning_rate=1e-3, batch_size=32, epochs=1, max_seq_length=48)
    manifest = U.run_downstream(get_task("stsb"), config, str(SAMPLE), tiny_model_url, str(tmp_path / "out"))
    rows = [line.split("\t") for line in (tmp_path / "out" / "predictions.tsv").read_text().splitlines()[1:]]
    preds, labels = [float(r[1]) for r in rows], [float(r[2]) for r in rows]
    assert pearson(preds, labels) == manifest.counts["eval_pearson"]  # recomputable from the file, exactly
    assert any(len(r[1].split(".")[-1]) > 3 for r in rows)
    submission = (tmp_path / "out" / "submission" / "STS-B.tsv").read_text().splitlines()
    assert submission[0] == "index\tprediction" and all(0 <= float(r.split("\t")[1]) <= 5 for r in submission[1:])
    assert not math.isnan(manifest.counts["dev_median"])


def test_the_best_grid_points_weights_are_kept_in_hf_layout(tmp_path, tiny_model_url):
    """A grid of two points on SST-2: the best one's fine-tuned model is under <task>/model and
    loads with transformers' AutoModelForSequenceClassification and AutoTokenizer, giving the
    gathered dev accuracy; the other unit's weights are removed, its manifest saying so."""
    import torch
    import transformers

    config = FinetuneConfig(batch_size=32, epochs=0.25, max_seq_length=24,
                            grid=GridConfig(learning_rates=(1e-3, 1e-5)))  # fmt: skip
    out = tmp_path / "sst2"
    manifest = U.run_downstream(get_task("sst2"), config, str(SAMPLE), tiny_model_url, str(out))
    results = json.loads((out / "results.json").read_text())
    best = results["best_unit"]
    (other,) = {u["unit_id"] for u in U.plan_units(get_task("sst2"), config)} - {best}
    assert results["model"] == "model" and manifest.counts["model_kept"] == 1
    assert (out / "units" / best / "model" / "model.safetensors").exists()
    assert not (out / "units" / other / "model").exists()
    from model.contract import read_manifest

    assert not [f for f in read_manifest(str(out / "units" / other)).files if f.path.startswith("model/")]
    assert {"model/model.safetensors", "model/config.json", "model/vocab.txt"} <= {f.path for f in manifest.files}

    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(out / "model")).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out / "model"))
    rows = [line.split("\t") for line in (SAMPLE / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:]]
    batch = tokenizer([r[0] for r in rows], truncation=True, max_length=24, padding=True, return_tensors="pt")
    with torch.no_grad():
        guess = hf(**batch).logits.argmax(-1).tolist()
    accuracy = 100 * sum(g == int(r[1]) for g, r in zip(guess, rows)) / len(rows)
    assert accuracy == pytest.approx(results["dev_median"])


def test_glue_submission_has_the_servers_file_names(tmp_path, tiny_model_url):
    config = FinetuneConfig(learning_rate=1e-3, batch_size=32, epochs=1, max_seq_length=48)
    U.run_downstream(get_task("mnli"), config, str(SAMPLE), tiny_model_url, str(tmp_path / "mnli"))
    summarize({"mnli": str(tmp_path / "mnli")}, str(tmp_path / "all"))
    folder = tmp_path / "all" / "glue_submission"
    assert sorted(p.name for p in folder.iterdir()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    rows = (folder / "AX.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 26
    assert {r.split("\t")[1] for r in rows[1:]} <= {"entailment", "neutral", "contradiction"}


def test_overrides_reach_every_task_option():
    from flows.overrides import parse_overrides
    from flows.presets import load_config, resolve_data
    from pipeline.schema.config import ConfigError

    cfg = load_config(
        "tiny",
        parse_overrides(
            [
                "data.downstream_urls.mrpc=/data/glue_data/MRPC",
                "finetune.squad.doc_stride=64",
                "finetune.squad.null_score_diff_threshold=-1.5",
                "finetune.grid.seeds=[1,2,3]",
                "finetune.ner.label_scheme=asis",
                'finetune.features.layer_mixes=["sum_all"]',
                'finetune_tasks=["mrpc","stsb","swag"]',
            ]
        ),
    )
    assert cfg.finetune.squad.doc_stride == 64 and cfg.finetune.squad.null_score_diff_threshold == -1.5
    assert cfg.finetune.grid.seeds == (1, 2, 3) and cfg.finetune.ner.label_scheme == "asis"
    assert resolve_data(cfg.data).downstream_urls == {"mrpc": "/data/glue_data/MRPC"}
    assert len(U.plan_units(get_task("mrpc"), cfg.finetune)) == 2 * 3  # tiny's two learning rates x three seeds
    for bad, field in (
        (["data.downstream_urls.nope=/x"], "data.downstream_urls.nope"),
        (["finetune.squad.doc_stride=0"], "finetune.squad.doc_stride"),
        (["finetune.squad.max_seq_length=512"], "finetune.squad.max_seq_length"),
        (['finetune.features.layer_mixes=["middle"]'], "finetune.features.layer_mixes"),
    ):
        with pytest.raises((ConfigError, ValueError), match=field):
            load_config("tiny", parse_overrides(bad))


@pytest.mark.slow
def test_units_in_processes_give_the_sequential_results(tmp_path, tiny_model_url):
    """Two workers (spawned processes) and one: the same units, the same figures, bit for bit."""
    results = {}
    for workers in (1, 2):
        config = FinetuneConfig(
            learning_rate=1e-3,
            batch_size=32,
            epochs=1,
            max_seq_length=48,
            grid=GridConfig(seeds=(1, 2), workers=workers),
        )
        out = tmp_path / f"w{workers}"
        U.run_downstream(get_task("rte"), config, str(SAMPLE), tiny_model_url, str(out))
        results[workers] = {
            p.parent.name: json.loads(p.read_text())["history"]  # losses, metrics per epoch
            for p in (out / "units").glob("*/metrics.json")
        }
    assert len(results[1]) == 2 and results[1] == results[2]
    losses = [h[0]["train_loss"] for h in results[1].values()]
    assert losses[0] != losses[1]  # the seeds differ, so equality above is not a coincidence


def test_units_no_longer_planned_are_removed_on_fsspec_urls(fake_task):
    """On a memory:// root (as gs://): a grid that shrinks drops the old units' folders."""
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/dsgrid/data/fake/train.tsv", b"x")
    fs.pipe("/dsgrid/model/config.json", b"{}")
    out = "memory://dsgrid/out"
    for seeds in ((1, 2), (2,)):
        config = FinetuneConfig(grid=GridConfig(learning_rates=(0.5,), seeds=seeds))
        manifest = U.run_downstream(get_task("fake"), config, "memory://dsgrid/data", "memory://dsgrid/model", out)
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/dsgrid/out/units", detail=False)) == ["lr0.5_bs32_ep3_seed2"]
    assert manifest.counts["units"] == 1 and manifest.counts["dev_median"] == pytest.approx(62.0)
    assert fake_task == ["lr0.5_bs32_ep3_seed1", "lr0.5_bs32_ep3_seed2"]  # seed 2 was not rerun


def test_a_task_with_no_training_rows_never_ends_done(tmp_path, tiny_model_url):
    """SST-2 whose train.tsv is its header alone: every unit fails and the task with it, naming
    why; no manifest, so the stage is not "done"."""
    from model.contract import has_manifest

    data = tmp_path / "SST-2"
    data.mkdir()
    (data / "train.tsv").write_text("sentence\tlabel\n")
    (data / "dev.tsv").write_text((SAMPLE / "glue" / "SST-2" / "dev.tsv").read_text())
    config = FinetuneConfig(learning_rate=1e-3, batch_size=8, epochs=1, max_seq_length=32)
    with pytest.raises(RuntimeError, match="sst2: all 1 units failed.*no training"):
        U.run_downstream(get_task("sst2"), config, str(data), tiny_model_url, str(tmp_path / "out"))
    assert not has_manifest(str(tmp_path / "out"))


def test_a_unit_that_scored_no_dev_row_never_enters_the_results(tmp_path, fake_task):
    """A unit manifest of an older run with dev_examples 0 (a score of nothing) is listed as failed
    and left out of the median, the best point and the GLUE average."""
    config = FinetuneConfig(grid=GridConfig(seeds=(1, 2)))
    units = U.plan_units(get_task("fake"), config)
    urls = [str(tmp_path / "units" / u["unit_id"]) for u in units]
    for url, u, (score, rows) in zip(urls, units, [(0.0, 0.0), (0.8, 5.0)]):
        write_manifest("finetune-fake", url, U.unit_manifest_config(get_task("fake"), config, u), {},
                       {"eval_accuracy": score, "dev_examples": rows})  # fmt: skip
    manifest = U.aggregate(get_task("fake"), config, urls, str(tmp_path / "out"), units=units)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [f["unit_id"] for f in results["failed"]] == [units[0]["unit_id"]]
    assert "0 usable dev rows" in results["failed"][0]["error"]
    assert results["dev_median"] == pytest.approx(80.0) and manifest.counts["units_failed"] == 1
