"""SQuAD: reader errors, doc-stride windows that map back to the exact answers, span decoding,
and a SQuAD unit end to end (v1.1 and v2.0) on a tiny random model."""

import json
import random

import pytest

from pipeline.schema.manifest import read_manifest
from tasks.config import FinetuneConfig, SquadConfig
from tasks.driver import run_unit
from tasks.metrics import squad_evaluate
from tasks.registry import get_task
from tasks.squad import (
    SquadDataError,
    decode_predictions,
    gold_answers,
    make_features,
    read_squad,
)


def run_squad(config, data_url, model_url, output_url, version="1.1", **kwargs):
    """One unit of SQuAD v1.1 (row squad1) or v2.0 (squad2)."""
    return run_unit(
        get_task("squad1" if version == "1.1" else "squad2"), config, data_url, model_url, output_url, **kwargs
    )


PAIRS = [("france", "paris"), ("italy", "rome"), ("germany", "berlin"), ("spain", "madrid"), ("portugal", "lisbon")]
FILLER = "the movie was long and the music was very dark , the story was quite short .".split()


def make_article(rng: random.Random, index: int, impossible: bool) -> dict:
    """A long paragraph (several windows at max_seq_length 32) with one fact per country."""
    parts, qas = [], []
    text = ""
    for country, city in rng.sample(PAIRS, 3):
        text += " ".join(rng.sample(FILLER, 8)) + " "
        sentence = f"the capital of {country} is {city} . "
        start = len(text) + sentence.index(city)
        text += sentence
        qas.append(
            {
                "id": f"q{index}-{country}",
                "question": f"what is the capital of {country} ?",
                "answers": [{"text": city, "answer_start": start}],
            }
        )
    text += "a naïve café in Oslo ; "
    qas.append(
        {
            "id": f"q{index}-cafe",
            "question": "what is in oslo ?",
            "answers": [
                {"text": "naïve café", "answer_start": text.index("naïve café")},
                {"text": "café", "answer_start": text.index("café")},
            ],
        }
    )
    if impossible:
        qas.append(
            {
                "id": f"q{index}-norway",
                "question": "what is the capital of norway ?",
                "answers": [],
                "is_impossible": True,
                "plausible_answers": [{"text": "oslo", "answer_start": text.index("Oslo")}],
            }
        )
    parts.append({"context": text.strip(), "qas": qas})
    return {"title": f"t{index}", "paragraphs": parts}


def write_squad(folder, version: str, n_train: int = 6, n_dev: int = 3, seed: int = 0):
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    impossible = version == "2.0"
    for split, n, offset in (("train", n_train, 0), ("dev", n_dev, 100)):
        data = {"version": f"v{version}", "data": [make_article(rng, offset + i, impossible) for i in range(n)]}
        (folder / f"{split}-v{version}.json").write_text(json.dumps(data, ensure_ascii=False))
    return folder


def test_reader_v1_and_v2(tmp_path):
    write_squad(tmp_path / "v1", "1.1")
    examples = read_squad(str(tmp_path / "v1" / "train-v1.1.json"), "1.1")
    assert len(examples) == 6 * 4 and not any(e.is_impossible for e in examples)
    cafe = next(e for e in examples if e.qid.endswith("cafe"))
    assert [t for t, _ in cafe.answers] == ["naïve café", "café"]
    write_squad(tmp_path / "v2", "2.0")
    examples = read_squad(str(tmp_path / "v2" / "dev-v2.0.json"), "2.0")
    norway = [e for e in examples if e.qid.endswith("norway")]
    assert len(norway) == 3 and all(e.is_impossible and e.answers == [] for e in norway)
    assert gold_answers(norway)[norway[0].qid] == []


@pytest.mark.parametrize(
    "qa,message",
    [
        ({"question": "q?", "answers": [{"text": "a", "answer_start": 0}]}, "a question without an 'id'"),
        ({"id": "x1", "answers": [{"text": "a", "answer_start": 0}]}, "question x1: 'question' missing"),
        ({"id": "x2", "question": "q?", "answers": []}, "question x2: no answers"),
        (
            {"id": "x3", "question": "q?", "answers": [{"text": "a", "answer_start": 99}]},
            "question x3: answers\\[0\\].answer_start 99 outside the context",
        ),
        ({"id": "x4", "question": "q?", "answers": [{"text": "a"}]}, "question x4: answers\\[0\\] needs"),
    ],
)
def test_reader_errors_name_the_question(tmp_path, qa, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "a b c", "qas": [qa]}]}]}))
    with pytest.raises(SquadDataError, match=message):
        read_squad(str(path), "1.1")


def test_reader_rejects_duplicate_ids_and_bad_json(tmp_path):
    path = tmp_path / "bad.json"
    qa = {"id": "dup", "question": "q?", "answers": [{"text": "a", "answer_start": 0}]}
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "a b", "qas": [qa, qa]}]}]}))
    with pytest.raises(SquadDataError, match="question dup: duplicate question id"):
        read_squad(str(path))
    path.write_text("{not json")
    with pytest.raises(SquadDataError, match="bad.json: not valid JSON"):
        read_squad(str(path))


WINDOW_ARGS = dict(max_seq_length=32, doc_stride=6, max_query_length=8)


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_windows_map_back_to_the_exact_answer_text(tmp_path, tiny_tokenizer, version):
    write_squad(tmp_path, version)
    examples = read_squad(str(tmp_path / f"train-v{version}.json"), version)
    features, windows, skipped = make_features(tiny_tokenizer, examples, training=True, **WINDOW_ARGS)
    assert skipped == 0 and len(features) == len(windows)
    per_example = {}
    for f, w in zip(features, windows):
        assert len(f["input_ids"]) <= 32 and len(w.offsets) == len(f["input_ids"])
        per_example.setdefault(w.example_index, []).append((f, w))
    assert max(len(v) for v in per_example.values()) > 3  # long contexts really are split
    for index, ex in enumerate(examples):
        found = []
        for f, w in per_example[index]:
            s, e = f["start_positions"], f["end_positions"]
            if s == 0:
                assert e == 0
                continue
            found.append(ex.context[w.offsets[s][0] : w.offsets[e][1]])
        if ex.is_impossible:
            assert found == []  # every window points at [CLS]
        else:
            assert found and set(found) == {ex.answers[0][0]}, ex.qid  # exact, accents included
        # every context token is "max context" in exactly one window
        homes = {}
        for _f, w in per_example[index]:
            for off, home in zip(w.offsets, w.max_context):
                if off is not None:
                    homes[off] = homes.get(off, 0) + int(home)
        assert set(homes.values()) == {1}


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_decoding_recovers_answers_from_ideal_logits(tmp_path, tiny_tokenizer, version):
    write_squad(tmp_path, version)
    examples = read_squad(str(tmp_path / f"dev-v{version}.json"), version)
    labelled, _, _ = make_features(tiny_tokenizer, examples, training=True, **WINDOW_ARGS)
    features, windows, _ = make_features(tiny_tokenizer, examples, **WINDOW_ARGS)
    starts, ends = [], []
    for f, lab in zip(features, labelled):
        s, e = [0.0] * len(f["input_ids"]), [0.0] * len(f["input_ids"])
        s[lab["start_positions"]] += 10.0  # the answer span, or [CLS] where there is none
        e[lab["end_positions"]] += 10.0
        starts.append(s)
        ends.append(e)
    predictions, null_odds = decode_predictions(examples, windows, starts, ends, version)
    assert set(predictions) == {e.qid for e in examples}
    for ex in examples:
        assert predictions[ex.qid] == (ex.answers[0][0] if ex.answers else "")
    scores = squad_evaluate(gold_answers(examples), predictions, version)
    assert scores["exact_match" if version == "1.1" else "exact"] == 100.0 and scores["f1"] == 100.0
    assert bool(null_odds) == (version == "2.0")
    # a span longer than max_answer_length is never chosen
    short, _ = decode_predictions(examples, windows, starts, ends, version, max_answer_length=1)
    cafe = next(e for e in examples if e.qid.endswith("cafe"))
    assert short[cafe.qid] != "naïve café"


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_run_squad_end_to_end(tmp_path, tiny_model_url, version):
    data = write_squad(tmp_path / "squad", version)
    out = tmp_path / "out"
    logged = []
    config = FinetuneConfig(
        learning_rate=1e-3,
        batch_size=8,
        epochs=2,
        max_seq_length=32,
        squad=SquadConfig(doc_stride=6, max_query_length=8),
    )
    manifest = run_squad(
        config, str(data), tiny_model_url, str(out), version=version, log_fn=lambda m, s: logged.append(m)
    )
    assert manifest.stage == ("finetune-squad1" if version == "1.1" else "finetune-squad2")
    assert read_manifest(str(out)).fingerprint == manifest.fingerprint
    assert manifest.config["squad"]["doc_stride"] == 6
    assert manifest.config["task"] == ("squad1" if version == "1.1" else "squad2")
    predictions = json.loads((out / "predictions.json").read_text())
    dev = read_squad(str(data / f"dev-v{version}.json"), version)
    assert set(predictions) == {e.qid for e in dev} and all(isinstance(v, str) for v in predictions.values())
    for ex in dev:  # every answer is a slice of its context (or "" for no answer)
        assert predictions[ex.qid] in ex.context
    metrics = json.loads((out / "metrics.json").read_text())
    exact = "exact_match" if version == "1.1" else "exact"  # as each official script names it
    assert {exact, "f1", "history", "best_epoch"} <= set(metrics)
    assert metrics == {**metrics, **squad_evaluate(gold_answers(dev), predictions, version)}
    assert manifest.counts["eval_f1"] == metrics["f1"]
    assert manifest.counts["train_features"] > manifest.counts["train_examples"]
    if version == "2.0":
        assert "NoAns_exact" in metrics and (out / "null_odds.json").exists()
        # the null threshold was tuned on dev: the scores at it are the official best F1
        null_odds = json.loads((out / "null_odds.json").read_text())
        assert set(null_odds) == set(predictions)
        assert metrics["f1"] == pytest.approx(metrics["best_f1"])
        assert metrics["null_score_diff_threshold"] == metrics["best_f1_thresh"]
    assert any("eval_f1" in m for m in logged) and any("train_loss" in m for m in logged)
    config_json = json.loads((out / "model" / "config.json").read_text())
    assert config_json["architectures"] == ["BertForQuestionAnswering"]


# -- windows that always fit ----------------------------------------------------------------------
TINY_SQUAD = SquadConfig(max_query_length=16, doc_stride=32)  # the tiny preset's, in its 64-token window
LONG_QUESTION = " ".join(["what", "is", "the", "capital", "of", "france"] + FILLER * 6) + " ?"  # 90+ pieces


def _with_a_long_question(folder, version: str) -> str:
    """write_squad's files with one more question per article: a run-on question of 90+ pieces."""
    write_squad(folder, version)
    for split in ("train", "dev"):
        path = folder / f"{split}-v{version}.json"
        data = json.loads(path.read_text())
        for article in data["data"]:
            paragraph = article["paragraphs"][0]
            paris = next((qa for qa in paragraph["qas"] if qa["id"].endswith("france")), None)
            if paris is not None:
                long = {**paris, "id": paris["id"] + "-long", "question": LONG_QUESTION}
                paragraph["qas"].append(long)
        path.write_text(json.dumps(data, ensure_ascii=False))
    return str(folder)


def test_a_long_question_is_cut_and_every_window_keeps_its_context(tmp_path, tiny_tokenizer):
    """At the tiny preset's window a question of 61+ pieces used to raise "max_seq_length 64 leaves
    no room for the context" and kill the unit; now it is cut to max_query_length."""
    assert len(tiny_tokenizer.encode(LONG_QUESTION, add_special_tokens=False).ids) > 61
    data = _with_a_long_question(tmp_path, "1.1")
    examples = read_squad(f"{data}/train-v1.1.json", "1.1")
    long = [i for i, e in enumerate(examples) if e.qid.endswith("-long")]
    assert long
    args = dict(max_seq_length=64, doc_stride=TINY_SQUAD.doc_stride, max_query_length=TINY_SQUAD.max_query_length)
    features, windows, skipped = make_features(tiny_tokenizer, examples, training=True, **args)
    assert skipped == 0
    per_example: dict[int, list[int]] = {}
    for f, w in zip(features, windows):
        assert len(f["input_ids"]) <= 64
        question = f["token_type_ids"].count(0) - 2  # [CLS] question [SEP]
        assert question == 16 if w.example_index in long else question <= 16  # cut, not dropped
        per_example.setdefault(w.example_index, []).append(sum(1 for o in w.offsets if o is not None))
    for contexts in per_example.values():  # every window but an example's last is full: >= doc_stride
        assert all(n >= 32 for n in contexts[:-1]) and contexts[-1] >= 1
    assert any(len(contexts) > 1 for i, contexts in per_example.items() if i in long)
    found = {windows[i].example_index for i, f in enumerate(features) if f["start_positions"] > 0}
    assert set(long) <= found  # the long question's answer is still labelled in some window


def test_a_window_too_small_for_question_and_stride_is_refused_naming_the_fields(tiny_tokenizer):
    old_tiny = SquadConfig()  # max_query_length 64, doc_stride 128 in the 64-token window
    with pytest.raises(ValueError, match="finetune.max_seq_length: a SQuAD window of 64 tokens cannot hold"):
        old_tiny.check_window(64)
    with pytest.raises(ValueError, match="max_query_length 64 \\+ 3 special tokens \\+ finetune.squad.doc_stride 128"):
        make_features(tiny_tokenizer, [], max_seq_length=64, doc_stride=128, max_query_length=64)
    with pytest.raises(ValueError, match="finetune.squad.max_seq_length: a SQuAD window of 40"):
        SquadConfig(max_seq_length=40, doc_stride=8, max_query_length=32).check_window(128)
    SquadConfig(max_seq_length=40, doc_stride=5, max_query_length=32).check_window(128)  # 32 + 3 + 5 fits
    TINY_SQUAD.check_window(64)


def test_run_squad_with_a_long_question_at_the_tiny_window(tmp_path, tiny_model_url):
    """The tiny preset's own fine-tuning config (its window, query length and stride)."""
    import dataclasses

    from flows.presets import load_config

    tiny = load_config("tiny").finetune
    assert (tiny.max_seq_length, tiny.squad) == (64, TINY_SQUAD)
    data = _with_a_long_question(tmp_path / "squad", "1.1")
    config = dataclasses.replace(tiny, epochs=1, batch_size=8)
    manifest = run_squad(config, data, tiny_model_url, str(tmp_path / "out"), version="1.1", save_model=False)
    predictions = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert any(q.endswith("-long") for q in predictions) and manifest.counts["train_skipped"] == 0


def test_a_v2_file_read_as_v1_names_what_it_is(tmp_path):
    write_squad(tmp_path, "2.0")
    with pytest.raises(SquadDataError, match="norway: marked is_impossible, which SQuAD v1.1 does not have") as e:
        read_squad(str(tmp_path / "dev-v2.0.json"), "1.1")
    assert "not marked is_impossible" not in str(e.value)
    qa = {"id": "x9", "question": "q?", "answers": []}
    path = tmp_path / "v2.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "a b c", "qas": [qa]}]}]}))
    with pytest.raises(SquadDataError, match="x9: no answers and not marked is_impossible"):
        read_squad(str(path), "2.0")
    with pytest.raises(SquadDataError, match="x9: no answers \\(every SQuAD v1.1 question has at least one\\)"):
        read_squad(str(path), "1.1")
