"""GLUE: the nine TSV layouts, malformed-row errors, and run_glue end to end on a tiny model."""

import hashlib
import json
import random
import shutil

import fsspec
import pytest

from pipeline.schema.manifest import read_manifest
from tasks.config import FinetuneConfig
from tasks.driver import run_unit
from tasks.finetune import TooFewRowsError
from tasks.glue import GlueDataError, compute_metrics, read_split
from tasks.registry import family_tasks, get_task

TASKS = {name: t.layout for name, t in family_tasks("glue").items()}


def layout(name: str):
    """A GLUE task's layout by its registry or GLUE name ("SST-2", "sst2")."""
    return get_task(name).layout


def run_glue(config, name, *args, **kwargs):
    """One unit of a GLUE task, its row looked up by name (the registry's ``Task.run``)."""
    return run_unit(get_task(name), config, *args, **kwargs)


SAMPLE = __import__("pathlib").Path(__file__).resolve().parents[2] / "data" / "sample"
MNLI_TRAIN_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label"
)
MNLI_DEV_HEADER = MNLI_TRAIN_HEADER.replace("label1\tgold_label", "label1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")

# task, split, file text (GLUE's real layouts), expected first example (text_a, text_b, label)
LAYOUTS = [
    (
        "CoLA",
        "train",
        "gj04\t1\t\tOur friends won't buy this analysis.\ngj04\t0\t*\tThey drank the pub.\n",
        ("Our friends won't buy this analysis.", None, "1"),
    ),
    (
        "CoLA",
        "test",
        "index\tsentence\n0\tBill whistled past the house.\n",
        ("Bill whistled past the house.", None, None),
    ),
    ("SST-2", "dev", "sentence\tlabel\nit 's a charming journey . \t1\n", ("it 's a charming journey . ", None, "1")),
    (
        "MRPC",
        "train",
        "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t702876\t702977\tAmrozi accused "
        "his brother.\tReferring to him, Amrozi accused.\n",
        ("Amrozi accused his brother.", "Referring to him, Amrozi accused.", "1"),
    ),
    (
        "STS-B",
        "dev",
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
        "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA man with a hard hat is dancing.\t"
        "A man wearing a hard hat is dancing.\t5.000\n",
        ("A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0),
    ),
    (
        "QQP",
        "train",
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n133273\t213221\t213222\t"
        "How is the life of a math student?\tWhich level of prepration is enough?\t0\n",
        ("How is the life of a math student?", "Which level of prepration is enough?", "0"),
    ),
    ("QQP", "test", "id\tquestion1\tquestion2\n7\tWhy?\tWhy not?\n", ("Why?", "Why not?", None)),
    (
        "MNLI",
        "train",
        f"{MNLI_TRAIN_HEADER}\n31193\t16130\t16130n\tgovernment\t( ( x ) )\t( y )\t(ROOT x)\t"
        "(ROOT y)\tConceptually cream skimming has two dimensions.\tProduct and geography are what make "
        "cream skimming work. \tneutral\tneutral\n",
        (
            "Conceptually cream skimming has two dimensions.",
            "Product and geography are what make cream skimming work. ",
            "neutral",
        ),
    ),
    (
        "MNLI",
        "dev",
        f"{MNLI_DEV_HEADER}\n0\t63735\t63735n\tslate\tp\th\tP\tH\tThe new rights are nice enough\t"
        "Everyone really likes the newest benefits \tneutral\tentailment\tneutral\tneutral\tneutral\tneutral\n",
        ("The new rights are nice enough", "Everyone really likes the newest benefits ", "neutral"),
    ),
    (
        "QNLI",
        "dev",
        "index\tquestion\tsentence\tlabel\n0\tWhat came into force after the new "
        "constitution was herald?\tAs of that day, the new constitution heralding the Second Republic "
        "came into force.\tentailment\n",
        (
            "What came into force after the new constitution was herald?",
            "As of that day, the new constitution heralding the Second Republic came into force.",
            "entailment",
        ),
    ),
    (
        "RTE",
        "train",
        "index\tsentence1\tsentence2\tlabel\n0\tNo Weapons of Mass Destruction Found in "
        "Iraq Yet.\tWeapons of Mass Destruction Found in Iraq.\tnot_entailment\n",
        (
            "No Weapons of Mass Destruction Found in Iraq Yet.",
            "Weapons of Mass Destruction Found in Iraq.",
            "not_entailment",
        ),
    ),
    (
        "WNLI",
        "dev",
        "index\tsentence1\tsentence2\tlabel\n0\tThe drain is clogged with hair. It has to "
        "be cleaned.\tThe hair has to be cleaned.\t0\n",
        ("The drain is clogged with hair. It has to be cleaned.", "The hair has to be cleaned.", "0"),
    ),
]


def test_nine_tasks_with_official_metrics():
    assert sorted(t.folder for t in TASKS.values()) == sorted(
        ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI"]
    )
    assert layout("CoLA").metrics == ("mcc",)
    assert set(layout("mrpc").metrics) == set(layout("QQP").metrics) == {"f1", "accuracy"}
    assert layout("sts-b").metrics == ("pearson", "spearman") and layout("STS-B").is_regression
    for name in ("SST-2", "MNLI", "QNLI", "RTE", "WNLI"):
        assert layout(name).metrics == ("accuracy",)
    assert layout("MNLI").dev_files == ("dev_matched.tsv", "dev_mismatched.tsv")
    with pytest.raises(KeyError, match="unknown downstream task 'SQuAD'"):
        get_task("SQuAD")
    # the best-epoch score is the mean of the task's metrics
    assert compute_metrics(layout("MRPC"), [1, 0, 1, 1], [1, 1, 1, 0]) == pytest.approx(
        {"f1": 4 / 6, "accuracy": 0.5, "score": (4 / 6 + 0.5) / 2}
    )


@pytest.mark.parametrize("task,split,text,expected", LAYOUTS, ids=[f"{t}-{s}" for t, s, _, _ in LAYOUTS])
def test_reader_layouts(tmp_path, task, split, text, expected):
    path = tmp_path / f"{split}.tsv"
    path.write_text(text, encoding="utf-8")
    got = read_split(str(path), layout(task), split)
    first = got.examples[0]
    assert (first.text_a, first.text_b, first.label) == expected
    assert got.skipped == 0
    if task == "CoLA" and split == "train":
        assert [e.label for e in got.examples] == ["1", "0"]  # no header line eaten
    if split == "test":
        assert first.index == text.splitlines()[1].split("\t")[0]


def test_malformed_row_names_file_line_and_column(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\na fine movie\t1\na broken row without label\nok\t0\n")
    with pytest.raises(GlueDataError, match=r"train\.tsv:3: column 'label' \(#2\) missing"):
        read_split(str(path), layout("SST-2"), "train")
    path.write_text("sentence\tlabel\na fine movie\t2\n")
    with pytest.raises(GlueDataError, match=r"train\.tsv:2: column 'label': '2' is not one of \['0', '1'\]"):
        read_split(str(path), layout("SST-2"), "train")
    path.write_text("index\tsentence1\tsentence2\tscore\n0\ta\tb\tfive\n")
    with pytest.raises(GlueDataError, match=r":2: column 'score': 'five' is not a number"):
        read_split(str(path), layout("STS-B"), "train")
    path.write_text("text\tlabel\nx\t1\n")
    with pytest.raises(GlueDataError, match=r"train\.tsv:1: column 'sentence' missing from the header"):
        read_split(str(path), layout("SST-2"), "train")
    path.write_bytes(b"sentence\tlabel\nok\t1\n\xff\xfe\t0\n")
    with pytest.raises(GlueDataError, match=r"train\.tsv:3: not valid UTF-8"):
        read_split(str(path), layout("SST-2"), "train")


def test_qqp_policy_skips_and_counts_malformed_rows(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text(
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        "1\t1\t2\tq one?\tq two?\t1\n"
        "2\t3\t4\tcut short\n"  # too few fields
        "3\t5\t6\tq?\tq!\tmaybe\n"  # bad label
        "4\t7\t8\tq three?\tq four?\t0\n"
    )
    got = read_split(str(path), layout("QQP"), "train")
    assert [e.label for e in got.examples] == ["1", "0"]
    assert got.skipped == 2


# -- run_glue end to end ----------------------------------------------------------------------------
FILLER = ("movie film plot actor scene story music the was and really quite a very long short dark bright").split()


def keyword_sentences(rng: random.Random, n: int) -> list[tuple[str, int]]:
    """Label 1 iff the sentence holds "excellent": learnable from the [CLS] vector."""
    rows = []
    for _ in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(4, 9))]
        label = int(rng.random() < 0.5)
        if label:
            words.insert(rng.randrange(len(words) + 1), "excellent")
        rows.append((" ".join(words), label))
    return rows


@pytest.fixture()
def sst2_folder(tmp_path):
    rng = random.Random(1)
    folder = tmp_path / "SST-2"
    folder.mkdir()
    for name, n in (("train", 160), ("dev", 40)):
        lines = ["sentence\tlabel"] + [f"{s}\t{y}" for s, y in keyword_sentences(rng, n)]
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n")
    (folder / "test.tsv").write_text("index\tsentence\n0\ta very excellent movie\n1\tthe plot was dark\n")
    return folder


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


SST2_CONFIG = FinetuneConfig(learning_rate=2e-3, batch_size=16, epochs=8, max_seq_length=32, seed=3)


def test_run_glue_learns_keyword_task_and_writes_everything(tmp_path, sst2_folder, tiny_model_url):
    logged = []
    out = tmp_path / "out"
    manifest = run_glue(
        SST2_CONFIG,
        "SST-2",
        str(sst2_folder),
        tiny_model_url,
        str(out),
        log_fn=lambda m, step: logged.append((step, dict(m))),
    )

    assert manifest.stage == "finetune-sst2"
    assert manifest.counts["eval_accuracy"] >= 0.95
    assert manifest.counts["train_examples"] == 160 and manifest.counts["dev_examples"] == 40
    assert manifest.counts["steps"] == 80 and manifest.counts["seconds"] > 0
    assert set(manifest.inputs) == {"model", "data"}
    assert read_manifest(str(out)).fingerprint == manifest.fingerprint
    paths = {f.path for f in manifest.files}
    assert {
        "metrics.json",
        "predictions.tsv",
        "model/model.safetensors",
        "model/config.json",
        "model/tokenizer.json",
        "submission/SST-2.tsv",
    } <= paths

    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["history"]) == 8
    best = max(metrics["history"], key=lambda h: h["eval_score"])
    assert metrics["best_epoch"] == best["epoch"] and metrics["eval_accuracy"] == best["eval_accuracy"]

    rows = (out / "predictions.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction\tlabel" and len(rows) == 41
    assert sum(r.split("\t")[1] == r.split("\t")[2] for r in rows[1:]) / 40 == metrics["eval_accuracy"]
    assert (out / "submission" / "SST-2.tsv").read_text() == "index\tprediction\n0\t1\n1\t0\n"

    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["num_labels"] == 2
    assert config["dtype"] == "float32" and "torch_dtype" not in config and config["transformers_version"]
    from safetensors.torch import load_file

    keys = set(load_file(str(out / "model" / "model.safetensors")))
    assert {"classifier.weight", "classifier.bias", "bert.pooler.dense.weight"} <= keys
    assert all(k.startswith(("bert.", "classifier.")) for k in keys)

    train_logs = [m for _, m in logged if "train_loss" in m]
    eval_logs = [m for _, m in logged if "eval_accuracy" in m]
    assert len(eval_logs) == 8 and train_logs and all("learning_rate" in m for m in train_logs)
    assert [s for s, _ in logged] == sorted(s for s, _ in logged)

    # Same seed, same everything: byte-identical weights and predictions.
    again = tmp_path / "again"
    run_glue(SST2_CONFIG, "sst2", str(sst2_folder), tiny_model_url, str(again))
    assert sha(again / "model" / "model.safetensors") == sha(out / "model" / "model.safetensors")
    assert sha(again / "predictions.tsv") == sha(out / "predictions.tsv")


def test_run_glue_refuses_to_overwrite_its_input(sst2_folder, tiny_model_url):
    with pytest.raises(ValueError, match="would overwrite the input"):
        run_glue(SST2_CONFIG, "SST-2", str(sst2_folder), tiny_model_url, str(sst2_folder.parent))


def test_run_glue_regression_on_fsspec_urls(tiny_model_url):
    """STS-B (regression, pairs) with every path a memory:// URL: nothing assumes local files."""
    fs = fsspec.filesystem("memory")
    fs.put(tiny_model_url, "/model", recursive=True)
    rng = random.Random(5)
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    for name, n in (("train", 24), ("dev", 12)):
        lines = [header]
        for i in range(n):
            a, b = (" ".join(rng.choice(FILLER) for _ in range(5)) for _ in range(2))
            lines.append(f"{i}\tg\tf\t2012\t{i}\tnone\tnone\t{a}\t{b}\t{rng.uniform(0, 5):.3f}")
        with fs.open(f"/stsb/{name}.tsv", "w") as f:
            f.write("\n".join(lines) + "\n")
    config = FinetuneConfig(learning_rate=1e-3, batch_size=8, epochs=1.5, max_seq_length=24)
    manifest = run_glue(config, "STS-B", "memory://stsb", "memory://model", "memory://out/stsb")
    assert {"eval_pearson", "eval_spearman", "eval_score"} <= set(manifest.counts)
    assert manifest.counts["steps"] == 5  # ceil(1.5 * 3)
    with fs.open("/out/stsb/metrics.json") as f:
        assert len(json.load(f)["history"]) == 2  # a full epoch and the half one
    with fs.open("/out/stsb/predictions.tsv") as f:
        rows = f.read().decode().splitlines()[1:]
    assert len(rows) == 12 and all(0.0 <= float(r.split("\t")[1]) <= 5.0 for r in rows)
    assert json.loads(fs.cat("/out/stsb/model/config.json"))["problem_type"] == "regression"
    fs.rm("/", recursive=True)


def test_run_glue_mnli_scores_both_dev_sets_and_writes_both_submissions(tmp_path, tiny_model_url):
    folder = tmp_path / "MNLI"
    folder.mkdir()
    rng = random.Random(2)
    labels = ("contradiction", "entailment", "neutral")

    def rows(header, n, extra_labels):
        out = [header]
        for i in range(n):
            a, b = (" ".join(rng.choice(FILLER) for _ in range(4)) for _ in range(2))
            y = rng.choice(labels)
            out.append("\t".join([str(i), "1", "1n", "g", "p", "h", "P", "H", a, b, *([y] * extra_labels)]))
        return "\n".join(out) + "\n"

    (folder / "train.tsv").write_text(rows(MNLI_TRAIN_HEADER, 12, 2))
    (folder / "dev_matched.tsv").write_text(rows(MNLI_DEV_HEADER, 6, 6))
    (folder / "dev_mismatched.tsv").write_text(rows(MNLI_DEV_HEADER, 5, 6))
    test_header = (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
        "sentence1_parse\tsentence2_parse\tsentence1\tsentence2"
    )
    (folder / "test_matched.tsv").write_text(rows(test_header, 3, 0))
    (folder / "test_mismatched.tsv").write_text(rows(test_header, 4, 0))
    config = FinetuneConfig(learning_rate=1e-3, batch_size=4, epochs=1, max_seq_length=24)
    manifest = run_glue(config, "MNLI", str(folder), tiny_model_url, str(tmp_path / "out"))
    assert {"eval_accuracy", "eval_mm_accuracy"} <= set(manifest.counts)
    assert manifest.counts["dev_examples"] == 6 and manifest.counts["dev_mm_examples"] == 5
    out = tmp_path / "out"
    assert len((out / "predictions_mm.tsv").read_text().splitlines()) == 6
    m = (out / "submission" / "MNLI-m.tsv").read_text().splitlines()
    mm = (out / "submission" / "MNLI-mm.tsv").read_text().splitlines()
    assert len(m) == 4 and len(mm) == 5 and m[0] == "index\tprediction"
    assert all(r.split("\t")[1] in labels for r in m[1:] + mm[1:])
    shutil.rmtree(out)


def test_crlf_files_read_like_lf(tmp_path):
    """Windows line ends: the '\\r' never reaches the last column (a label, CoLA's sentence)."""
    cola = "gj04\t1\t\tOur friends won't buy this analysis.\r\ngj04\t0\t*\tThey drank the pub.\r\n"
    (tmp_path / "cola.tsv").write_bytes(cola.encode())
    got = read_split(str(tmp_path / "cola.tsv"), layout("CoLA"), "dev").examples
    assert [(e.text_a, e.label) for e in got] == [
        ("Our friends won't buy this analysis.", "1"),
        ("They drank the pub.", "0"),
    ]
    rte = "index\tsentence1\tsentence2\tlabel\r\n0\ta\tb\tnot_entailment\r\n"
    (tmp_path / "rte.tsv").write_bytes(rte.encode())
    assert read_split(str(tmp_path / "rte.tsv"), layout("RTE"), "train").examples[0].label == "not_entailment"


def test_a_dev_split_with_no_usable_row_fails_the_task_and_stays_out_of_the_average(tmp_path, tiny_model_url):
    """Issue 19 point 5: QQP's dev file (the bundled sample) with every row malformed gave
    dev_examples 0, eval_f1 0.0, "done", and a GLUE average that included the 0. Now the task
    fails before training, naming the file and the reader's reject count, and has no results."""
    import shutil

    from tasks.results import summarize
    from tasks.units import run_downstream

    data = tmp_path / "glue" / "QQP"
    shutil.copytree(SAMPLE / "glue" / "QQP", data)
    lines = (data / "dev.tsv").read_text().splitlines()
    (data / "dev.tsv").write_text("\n".join([lines[0]] + [line.rsplit("\t", 1)[0] for line in lines[1:]]) + "\n")
    config = FinetuneConfig(learning_rate=1e-3, batch_size=32, epochs=1, max_seq_length=32)
    with pytest.raises(TooFewRowsError, match=r"qqp: dev split .*dev.tsv has 0 usable row\(s\).*100 malformed"):
        run_glue(config, "qqp", str(data), tiny_model_url, str(tmp_path / "one"))
    out = tmp_path / "finetune" / "qqp"
    with pytest.raises(RuntimeError, match=r"qqp: all 1 units failed.*TooFewRowsError"):
        run_downstream(get_task("qqp"), config, str(tmp_path), tiny_model_url, str(out))
    assert not (out / "results.json").exists()
    summary = summarize({"qqp": str(out)}, str(tmp_path / "all"))
    assert summary["glue_average"] is None and summary["tasks"] == [{"task": "qqp", "missing": True}]
