"""The Japanese and Chinese presets' data path, fast: corpus -> vocab -> examples of tiny-ja and
tiny-zh on the bundled samples, then a BERT exported with that vocabulary, loaded by transformers
as it is (AutoTokenizer, AutoModelForMaskedLM), tokenising as the pipeline did. The whole chain
(pretraining, fine-tuning, registration) is tests/flows/test_cjk_e2e_slow.py."""

import dataclasses
import json
import unicodedata

import pyarrow.parquet as pq
import pytest
from tiny_bert import tiny_bert_config

from flows.presets import load_config, resolve_data

pytest.importorskip("fugashi")
pytest.importorskip("jieba")
transformers = pytest.importorskip("transformers")


def test_language_presets():
    ja, zh = load_config("tiny-ja"), load_config("tiny-zh")
    assert (ja.vocab.word_tokenizer, ja.vocab.lowercase, ja.examples.whole_word_mask) == ("mecab", False, True)
    assert (zh.vocab.word_tokenizer, zh.examples.segmenter, zh.vocab.lowercase) == ("none", "jieba", True)
    assert resolve_data(ja.data).wiki.endswith("sample-ja/wiki") and resolve_data(zh.data).books.endswith(
        "sample-zh/books"
    )
    base_ja, base_zh = load_config("base-ja"), load_config("base-zh")
    assert base_ja.vocab.vocab_size == 32768  # cl-tohoku/bert-base-japanese-v3
    assert base_zh.vocab.vocab_size == 21128  # bert-base-chinese
    assert base_ja.model.vocab_size is None and base_zh.model.vocab_size is None  # the trained vocabulary's size
    assert base_ja.data.required and base_ja.examples.whole_word_mask and base_zh.examples.segmenter == "jieba"
    with pytest.raises(Exception, match="examples.segmenter"):
        load_config("tiny-ja", {"examples.segmenter": "fugashi"})
    with pytest.raises(Exception, match="vocab.subword"):
        load_config("tiny-zh", {"vocab.subword": "character"})


def _chain(tmp_path, preset: str, overrides: dict, masking: str = "dynamic"):
    from pipeline.corpus.job import run_corpus
    from pipeline.examples.job import run_examples
    from pipeline.vocab.job import run_vocab

    cfg = load_config(preset, overrides)
    data = resolve_data(cfg.data)
    run_corpus(cfg.corpus, {"wiki": data.wiki, "books": data.books}, str(tmp_path / "corpus"))
    run_vocab(cfg.vocab, str(tmp_path / "corpus"), str(tmp_path / "vocab"))
    examples = dataclasses.replace(cfg.examples, dupe_factor=1, masking=masking, max_seq_lengths=(64,),
                                   max_predictions_per_seq=(10,))  # fmt: skip
    manifest = run_examples(examples, str(tmp_path / "corpus"), str(tmp_path / "vocab"), str(tmp_path / "examples"))
    return cfg, manifest


def _export(tmp_path, vocab_size: int):
    import torch

    from model.bert import BertForPreTraining
    from model.export import save_pretrained

    torch.manual_seed(0)
    config = tiny_bert_config(
        vocab_size=vocab_size, num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=128
    )
    save_pretrained(BertForPreTraining(config), str(tmp_path / "model"), vocab_url=str(tmp_path / "vocab"))
    return str(tmp_path / "model")


def _sentences(tmp_path) -> list[str]:
    from pipeline.schema.manifest import read_manifest

    urls = read_manifest(str(tmp_path / "corpus")).file_urls(".parquet")
    return [s for u in urls for doc in pq.ParquetFile(u).read(columns=["sentences"]).column(0).to_pylist() for s in doc]


def _segments_are_corpus_text(tmp_path, hf, normalise, examples: str = "examples") -> int:
    """Every shard segment, decoded with the loaded tokenizer, is text of the corpus."""
    text = normalise("".join(_sentences(tmp_path))).replace(" ", "")
    checked = 0
    for shard in sorted((tmp_path / examples / "seq64").glob("part-*.parquet")):
        for ids in pq.ParquetFile(shard).read(columns=["input_ids"]).column(0).to_pylist()[:200]:
            tokens = hf.convert_ids_to_tokens(ids)
            for part in " ".join(tokens).replace(" ##", "").split("[SEP]"):
                for chunk in part.replace("[CLS]", "").split("[UNK]"):
                    chunk = chunk.replace(" ", "")
                    assert chunk in text, chunk
                    checked += bool(chunk)
    return checked


def test_tiny_ja_data_stages_and_export_load_in_transformers(tmp_path):
    cfg, manifest = _chain(tmp_path, "tiny-ja", {"vocab.vocab_size": 2000})
    assert manifest.counts["seq64.examples"] > 1000
    config = json.loads((tmp_path / "vocab" / "tokenizer_config.json").read_text())
    assert config["word_tokenizer_type"] == "mecab" and config["mecab_kwargs"] == {"mecab_dic": "unidic_lite"}
    model_url = _export(tmp_path, manifest.counts["vocab_size"])
    hf = transformers.AutoTokenizer.from_pretrained(model_url)
    assert type(hf).__name__ == "BertJapaneseTokenizer"
    from tasks.finetune import load_tokenizer

    ours = load_tokenizer(model_url)
    sentences = _sentences(tmp_path)[:400]
    assert len(sentences) >= 300
    for sentence, enc in zip(sentences, ours.encode_batch(sentences)):
        assert enc.ids == hf(sentence)["input_ids"], sentence
    assert _segments_are_corpus_text(tmp_path, hf, lambda t: unicodedata.normalize("NFKC", t)) > 500
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(model_url)
    batch = hf(sentences[:4], return_tensors="pt", padding=True)
    assert mlm(**batch).logits.shape[-1] == manifest.counts["vocab_size"]


def _adjacent_masked_share(tmp_path) -> float:
    """Share of masked positions next to another masked position."""
    adjacent = total = 0
    for shard in sorted((tmp_path / "examples" / "seq64").glob("part-*.parquet")):
        for positions in pq.ParquetFile(shard).read(columns=["masked_positions"]).column(0).to_pylist():
            marks = set(positions)
            total += len(positions)
            adjacent += sum(1 for p in positions if p - 1 in marks or p + 1 in marks)
    return adjacent / total


def test_tiny_ja_character_vocabulary_masks_mecab_words_whole(tmp_path):
    cfg, manifest = _chain(tmp_path / "w", "tiny-ja", {"vocab.subword": "character"}, masking="static")
    vocab = (tmp_path / "w" / "vocab" / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert not any(t.startswith("##") for t in vocab) and manifest.counts["seq64.examples"] > 1000
    hf = transformers.AutoTokenizer.from_pretrained(_export(tmp_path / "w", len(vocab) - 1))
    assert hf.subword_tokenizer_type == "character"
    # whole-word masking over MeCab's words: a masked word of 2+ characters masks neighbours,
    # which masking characters one by one at the same rate rarely does
    _chain(tmp_path / "c", "tiny-ja", {"vocab.subword": "character", "examples.whole_word_mask": False}, "static")
    words, chars = _adjacent_masked_share(tmp_path / "w"), _adjacent_masked_share(tmp_path / "c")
    assert words > 2 * chars and words > 0.4, (words, chars)


def test_tiny_zh_data_stages_and_export_tokenise_as_bert_tokenizer_fast(tmp_path):
    cfg, manifest = _chain(tmp_path, "tiny-zh", {"vocab.vocab_size": 2000})
    model_url = _export(tmp_path, manifest.counts["vocab_size"])
    hf = transformers.AutoTokenizer.from_pretrained(model_url)
    fast = transformers.BertTokenizerFast.from_pretrained(model_url)
    from pipeline.vocab.tokenizer import build_tokenizer, read_vocab

    ours = build_tokenizer(read_vocab(str(tmp_path / "vocab" / "vocab.txt")), cfg.vocab.lowercase)
    sentences = _sentences(tmp_path)[:400]
    for sentence in sentences:
        ids = ours.encode(sentence).ids
        assert ids == fast(sentence)["input_ids"] == hf(sentence)["input_ids"], sentence
        assert all(len(t) == 1 for t in ours.encode(sentence).tokens if "\u4e00" <= t <= "\u9fff")
    assert _segments_are_corpus_text(tmp_path, fast, lambda t: t.lower()) > 500


def test_a_missing_cjk_extra_is_named_before_any_work(monkeypatch):
    import importlib.util

    from flows.hooks import segmenter_preflight

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fugashi" else find(name, *a))
    with pytest.raises(ValueError, match=r"vocab.word_tokenizer: needs fugashi, the 'cjk' extra"):
        segmenter_preflight(load_config("tiny-ja"), {})
    assert segmenter_preflight(load_config("tiny-zh"), {}) == set()  # jieba and nltk are there
    assert segmenter_preflight(load_config("tiny"), {}) == set()


@pytest.mark.parametrize("preset", ["tiny-ja", "tiny-zh"])
def test_every_objective_on_cjk_text_pretrains_and_exports(tmp_path, preset):
    """The language presets with each pretraining objective: the examples of each (their columns,
    segments of corpus text as transformers' tokenizer decodes them, MeCab's whole-word masking
    kept for Japanese), a few pretraining steps, and the export as transformers loads it (an
    MLM-only model as BertForMaskedLM, with no missing or unexpected keys)."""
    from flows.proc.train_entry import masking_from
    from model.config import PhaseConfig, PretrainConfig
    from model.export import run_export
    from model.train import run_pretrain
    from pipeline.examples.job import run_examples
    from pipeline.schema.objectives import OBJECTIVES

    cfg, _ = _chain(tmp_path, preset, {"vocab.vocab_size": 2000})
    vocab = str(tmp_path / "vocab")
    hf = None
    for name, objective in OBJECTIVES.items():
        folder = f"examples-{objective.builder}"
        examples = dataclasses.replace(cfg.examples, objective=name, dupe_factor=1, masking="dynamic",
                                       max_seq_lengths=(64,), max_predictions_per_seq=(10,))  # fmt: skip
        manifest = run_examples(examples, str(tmp_path / "corpus"), vocab, str(tmp_path / folder))
        shard = next((tmp_path / folder / "seq64").glob("part-*.parquet"))
        assert tuple(pq.ParquetFile(shard).schema_arrow.names) == objective.columns, name
        assert manifest.counts["seq64.examples"] > 500, name
        pretrain = str(tmp_path / f"pretrain-{objective.builder}")
        model = tiny_bert_config(vocab_size=manifest.counts["vocab_size"], max_position_embeddings=64)
        mask_fn, pad_id = masking_from(vocab, str(tmp_path / folder))
        assert mask_fn.whole_word_mask is cfg.examples.whole_word_mask  # MeCab's words for Japanese
        trained = run_pretrain(
            PretrainConfig(phases=(PhaseConfig("p1", 64, 3, 8),), learning_rate=1e-3, warmup_steps=1, log_every=1),
            model, str(tmp_path / folder), pretrain, mask_fn=mask_fn, pad_id=pad_id,
        )  # fmt: skip
        assert {k for k in trained.counts if k.startswith("last_") and k.endswith("_loss")} == {
            f"last_{loss}_loss" for loss in objective.losses
        }, name
        export = str(tmp_path / f"export-{objective.builder}")
        run_export(pretrain, vocab, export)
        hf = hf or transformers.AutoTokenizer.from_pretrained(export)
        normalise = (lambda t: unicodedata.normalize("NFKC", t)) if preset == "tiny-ja" else (lambda t: t.lower())
        assert _segments_are_corpus_text(tmp_path, hf, normalise, folder) > 300, name
        auto = transformers.AutoModelForPreTraining if objective.sentence_label else transformers.AutoModelForMaskedLM
        loaded, info = auto.from_pretrained(export, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], (name, info)
        batch = hf(_sentences(tmp_path)[:2], return_tensors="pt", padding=True)
        out = loaded(**batch)
        logits = out.prediction_logits if objective.sentence_label else out.logits
        assert logits.shape[-1] == manifest.counts["vocab_size"], name
