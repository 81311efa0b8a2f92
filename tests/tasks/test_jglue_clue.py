"""JGLUE and CLUE (tasks/jglue.py, tasks/clue.py, tasks/jsonl.py): readers of the official files,
their metrics against values computed by hand from the official definitions, and one real
fine-tuning unit of each runner (classification, regression, multiple choice, span QA) on a
tiny random BERT with a MeCab (Japanese) or BERT-Chinese vocabulary trained on the samples."""

import json
from pathlib import Path

import pytest
from tiny_bert import tiny_bert_config

from tasks.clue import cmrc2018_evaluate, mixed_segmentation, read_clue, wsc_text
from tasks.jglue import jsquad_evaluate, jsquad_f1, read_jglue
from tasks.jsonl import JsonlDataError, find_split
from tasks.registry import TASKS

DATA = Path(__file__).resolve().parents[2] / "data"
pytest.importorskip("fugashi", reason="needs the cjk extra (installed by the test extra)")


# -- metrics ---------------------------------------------------------------------------------------
def test_jsquad_metric_is_jglue_character_f1():
    # "東京都" vs "東京": common characters 東,京 -> P = 2/2, R = 2/3, F1 = 0.8
    assert jsquad_f1("東京都", "東京") == pytest.approx(0.8)
    # a trailing 。 is removed, case folded, whitespace runs collapsed; spaces count as characters
    assert jsquad_f1("ＡＢ。", "ＡＢ") == 1.0 and jsquad_f1("a  b", "A b") == 1.0
    # "a b" vs "ab": chars [a, ' ', b] vs [a, b]: P = 1, R = 2/3 -> 0.8
    assert jsquad_f1("a b", "ab") == pytest.approx(0.8)
    gold = {"q1": ["小笠原諸島", "小笠原諸島を除く日本"], "q2": ["雨季"], "q3": ["5月"]}
    pred = {"q1": "小笠原諸島を除く", "q2": "雨季。", "q3": "6月"}
    # q1: best is vs "小笠原諸島を除く日本": 8 common of 8 pred / 10 gold -> 2*1*0.8/1.8 = 0.8889
    # q2: exact after 。 removal; q3: 月 common -> P = R = 1/2 -> 0.5
    scores = jsquad_evaluate(gold, pred)
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * (16 / 18 + 1 + 0.5) / 3)
    # questions without a prediction are left out of the average, as squad_metrics does
    assert jsquad_evaluate(gold, {"q2": "雨季"}) == {"exact_match": 100.0, "f1": 100.0}


def test_cmrc2018_metric_is_the_official_lcs_f1_over_mixed_segmentation():
    pytest.importorskip("nltk")
    # ideographs one by one, other runs as nltk words; lower-cased; its punctuation dropped before
    # the run is cut, so "University，1898" is one run, as in cmrc2018_evaluate.py
    assert mixed_segmentation("北京大学Peking University，1898年", rm_punc=True) == [
        "北", "京", "大", "学", "peking", "university1898", "年",
    ]  # fmt: skip
    assert mixed_segmentation("北京，1898年") == ["北", "京", "，", "1898", "年"]
    gold = {"a": ["北京大学"], "b": ["1898年", "1898"], "c": ["清华大学"], "d": ["北京"]}
    pred = {"a": "北京大学。", "b": "光绪1898年", "c": "大学清华"}
    # a: exact (。 removed). b: LCS of [光,绪,1898,年] and [1898,年] = 2 -> P=1/2, R=1 -> 2/3; no EM.
    # c: LCS of [大,学,清,华] and [清,华,大,学] is a substring: 2 -> P = R = 1/2 -> 0.5 (a bag would say 1).
    # d: no prediction -> 0, still counted
    scores = cmrc2018_evaluate(gold, pred)
    assert scores["exact_match"] == pytest.approx(100 * 1 / 4)
    assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3 + 0.5 + 0) / 4)
    assert scores["average"] == pytest.approx((scores["exact_match"] + scores["f1"]) / 2)
    assert scores["skipped"] == 1.0


# -- readers ---------------------------------------------------------------------------------------
def test_readers_take_the_official_files_and_name_bad_rows(tmp_path):
    jnli = TASKS["jnli"]
    split = read_jglue(find_split(str(DATA / "sample-ja" / jnli.folder), ("valid-v*.json",)), jnli, "dev")
    assert len(split.examples) == 150 and {e.label for e in split.examples} == set(jnli.layout.labels)
    folder = tmp_path / "jnli-v1.3"
    folder.mkdir()
    row = {"sentence_pair_id": "0", "yjcaptions_id": "1-2", "sentence1": "猫がいる。", "sentence2": "犬がいる。"}
    (folder / "valid-v1.1.json").write_text("")
    (folder / "valid-v1.3.json").write_text(
        json.dumps({**row, "label": "neutral"}, ensure_ascii=False)
        + "\n"
        + json.dumps({**row, "label": "unknown"})
        + "\n"
    )
    url = find_split(str(folder), ("valid-v*.json",))
    assert url.endswith("valid-v1.3.json")  # the newest version in the folder
    with pytest.raises(JsonlDataError, match=r"valid-v1.3.json:2: 'label': 'unknown' is not one of"):
        read_jglue(url, jnli, "dev")

    ocnli = TASKS["ocnli"]
    dev = read_clue(str(DATA / "sample-zh" / ocnli.folder / "dev.json"), ocnli, "dev")
    train = read_clue(str(DATA / "sample-zh" / ocnli.folder / "train.json"), ocnli, "train")
    assert dev.skipped + train.skipped == 1  # the one "-" row: skipped and counted
    obj = {"target": {"span2_index": 10, "span1_index": 0, "span1_text": "王芳", "span2_text": "他"},
           "idx": 0, "label": "true", "text": "王芳把书送给了吴强，他很高兴。"}  # fmt: skip
    assert wsc_text("x", 1, obj) == "_王芳_把书送给了吴强，[他]很高兴。"
    with pytest.raises(JsonlDataError, match="span1"):
        wsc_text("x", 1, {**obj, "target": {**obj["target"], "span1_index": 3}})
    csl = read_clue(str(DATA / "sample-zh" / TASKS["csl"].folder / "dev.json"), TASKS["csl"], "dev")
    assert all(e.text_b and " " in e.text_a for e in csl.examples)


# -- one real unit of each runner ------------------------------------------------------------------
def sample_sentences(lang: str) -> list[str]:
    """Sentences of the sample's books (the corpus stage's paragraph and sentence rules)."""
    from pipeline.corpus.sentences import book_paragraphs, split_sentences

    books = sorted((DATA / f"sample-{lang}" / "books").glob("*.txt"))
    return [s for b in books for p in book_paragraphs(b.read_text(encoding="utf-8")) for s in split_sentences(p)]


@pytest.fixture(scope="module")
def cjk_models(tmp_path_factory):
    """Tiny random BERTs exported with a MeCab vocabulary (Japanese) and BERT's (Chinese)."""
    import torch

    from model.bert import BertModel
    from model.export import save_pretrained
    from pipeline.vocab.config import VocabConfig
    from pipeline.vocab.job import SegmentedSentences, write_segmented_tokenizer
    from pipeline.vocab.tokenizer import build_tokenizer, tokenizer_config, write_vocab
    from pipeline.vocab.wordpiece import train_vocab_with_stats

    root = tmp_path_factory.mktemp("cjk")
    urls = {}
    for lang, config in (("ja", VocabConfig(vocab_size=1500, lowercase=False, word_tokenizer="mecab")),
                         ("zh", VocabConfig(vocab_size=1500))):  # fmt: skip
        sentences = sample_sentences(lang)
        if config.word_tokenizer == "none":
            vocab, _ = train_vocab_with_stats(sentences, config)
        else:
            vocab, _ = train_vocab_with_stats(SegmentedSentences(sentences, "mecab", False), config)
        vdir = root / f"vocab-{lang}"
        vdir.mkdir()
        write_vocab(vocab, str(vdir / "vocab.txt"))
        if config.word_tokenizer == "none":
            (vdir / "tokenizer.json").write_text(build_tokenizer(vocab, True).to_str())
            (vdir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(True)))
        else:
            write_segmented_tokenizer(vocab, config, str(vdir))
        torch.manual_seed(0)
        bert = BertModel(
            tiny_bert_config(
                vocab_size=len(vocab), num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=128
            )
        )
        save_pretrained(bert, str(root / f"model-{lang}"), vocab_url=str(vdir))
        urls[lang] = str(root / f"model-{lang}")
    return urls


@pytest.mark.parametrize("name", ["jnli", "jsts", "jcommonsenseqa", "jsquad", "afqmc", "cmrc2018"])
def test_one_unit_of_each_runner_on_the_bundled_sets(tmp_path, cjk_models, name):
    from tasks.config import FinetuneConfig, SquadConfig
    from tasks.registry import get_task

    task = get_task(name)
    lang = "ja" if task.family == "jglue" else "zh"
    config = FinetuneConfig(learning_rate=1e-3, batch_size=32, epochs=0.25, max_seq_length=64,
                            squad=SquadConfig(max_seq_length=96, doc_stride=32, max_query_length=32))  # fmt: skip
    data = str(DATA / f"sample-{lang}" / task.folder)
    manifest = task.run(config, data, cjk_models[lang], str(tmp_path / name), save_model=name == "jsquad")
    counts = manifest.counts
    assert task.metric in counts and counts["dev_examples"] >= 100
    assert -100.0 <= task.percent(counts[task.metric]) <= 100.0  # Pearson may be negative
    out = tmp_path / name
    if task.options["kind"] == "qa":
        predictions = json.loads((out / "predictions.json").read_text(encoding="utf-8"))
        assert len(predictions) == counts["dev_examples"] and "eval_exact_match" in counts
    else:
        assert len((out / "predictions.jsonl").read_text().splitlines()) == counts["dev_examples"]
    if name == "jsquad":  # the fine-tuned folder keeps the MeCab tokenizer config for AutoTokenizer
        cfg = json.loads((out / "model" / "tokenizer_config.json").read_text())
        assert cfg["tokenizer_class"] == "BertJapaneseTokenizer" and cfg["word_tokenizer_type"] == "mecab"


def test_a_dev_split_with_no_usable_row_fails_the_task_before_training(tmp_path, cjk_models):
    """OCNLI's dev file with every row unlabelled ('-', skipped as the baselines do) leaves nothing
    to score: the task fails naming the file, the floor and the skipped rows, before any training,
    instead of a 0.0 that would enter the averages."""
    import shutil

    from tasks.config import FinetuneConfig
    from tasks.finetune import TooFewRowsError
    from tasks.registry import get_task

    task = get_task("ocnli")
    data = tmp_path / task.folder
    shutil.copytree(DATA / "sample-zh" / task.folder, data)
    rows = [json.loads(line) for line in (data / "dev.json").read_text(encoding="utf-8").splitlines()]
    (data / "dev.json").write_text("".join(json.dumps({**r, "label": "-"}, ensure_ascii=False) + "\n" for r in rows))
    with pytest.raises(TooFewRowsError, match=rf"dev split .* has 0 usable row.*{len(rows)} unlabelled"):
        task.run(FinetuneConfig(epochs=1, max_seq_length=64), str(data), cjk_models["zh"], str(tmp_path / "out"))
    assert not (tmp_path / "out" / "_manifest.json").exists()


@pytest.mark.parametrize("name", ["jnli", "jcommonsenseqa", "jsquad", "cmrc2018"])
def test_a_dev_split_below_the_floor_fails_every_family(tmp_path, cjk_models, name):
    """finetune.min_eval_examples holds for the JGLUE/CLUE runners (classification, choice, span QA)
    as for GLUE and SQuAD."""
    from tasks.config import FinetuneConfig
    from tasks.finetune import TooFewRowsError
    from tasks.registry import get_task

    task = get_task(name)
    lang = "ja" if task.family == "jglue" else "zh"
    config = FinetuneConfig(epochs=1, max_seq_length=64, min_eval_examples=100_000)
    with pytest.raises(TooFewRowsError, match="fewer than finetune.min_eval_examples=100000"):
        task.run(config, str(DATA / f"sample-{lang}" / task.folder), cjk_models[lang], str(tmp_path / "out"))
