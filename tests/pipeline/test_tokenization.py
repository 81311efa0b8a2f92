"""The segmenting tokenizers (pipeline/schema/tokenization.py) against transformers, on the
bundled Japanese and Chinese samples: a vocabulary trained here, the same tokens as
BertJapaneseTokenizer (MeCab + unidic-lite, WordPiece or characters) and BertTokenizerFast."""

import bz2
import json
import re
import unicodedata
from pathlib import Path

import pytest

from pipeline.corpus.sentences import book_paragraphs, split_sentences
from pipeline.corpus.wikitext import clean_wikitext
from pipeline.schema.tokenization import WordTokenizer, hf_tokenizer_config, nfkc_aligned, word_tokenizer_of
from pipeline.vocab.config import VocabConfig
from pipeline.vocab.job import SegmentedSentences, write_segmented_tokenizer
from pipeline.vocab.tokenizer import write_vocab
from pipeline.vocab.wordpiece import train_char_vocab, train_vocab_with_stats

pytest.importorskip("fugashi", reason="needs the cjk extra (installed by the test extra)")
pytest.importorskip("jieba")
transformers = pytest.importorskip("transformers")

DATA = Path(__file__).resolve().parents[2] / "data"


def sample_sentences(lang: str) -> list[str]:
    """Sentences of the bundled sample's wiki pages and books, cleaned as the corpus stage does."""
    root = DATA / f"sample-{lang}"
    xml = bz2.open(next((root / "wiki").glob("*.xml.bz2"))).read().decode("utf-8")
    import html

    texts = [html.unescape(t) for t in re.findall(r'<text bytes="\d+" xml:space="preserve">(.*?)</text>', xml, re.S)]
    paragraphs = [p for t in texts if not t.startswith("#") for p in clean_wikitext(t)]
    for book in sorted((root / "books").glob("*.txt")):
        paragraphs += book_paragraphs(book.read_text(encoding="utf-8"))
    return [s for p in paragraphs for s in split_sentences(p)]


def task_texts(lang: str) -> list[str]:
    """Downstream texts: JSQuAD contexts with their " [SEP] ", JNLI pairs; CLUE sentences."""
    root = DATA / f"sample-{lang}"
    out = []
    for path in sorted(root.rglob("*.json")):
        text = path.read_text(encoding="utf-8")
        if text.startswith('{"version"'):
            data = json.loads(text)
            out += [p["context"] for a in data["data"] for p in a["paragraphs"]][:40]
        else:
            rows = [json.loads(line) for line in text.splitlines()[:30]]
            out += [r[k] for r in rows for k in ("sentence", "sentence1", "sentence2", "text") if k in r]
    return out


def trained(lang: str, tmp_path: Path, **fields) -> tuple[list[str], Path]:
    config = VocabConfig(vocab_size=2000, min_frequency=2, **fields)
    words = SegmentedSentences(sample_sentences(lang), config.word_tokenizer, config.lowercase)
    train = train_char_vocab if config.subword == "character" else train_vocab_with_stats
    vocab, _ = train(words, config)
    write_vocab(vocab, str(tmp_path / "vocab.txt"))
    write_segmented_tokenizer(vocab, config, str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    return vocab, tmp_path


@pytest.mark.parametrize("subword", ["wordpiece", "character"])
def test_mecab_tokens_equal_bert_japanese_tokenizer_on_the_japanese_sample(tmp_path, subword):
    vocab, folder = trained("ja", tmp_path, lowercase=False, word_tokenizer="mecab", subword=subword)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert type(hf).__name__ == "BertJapaneseTokenizer"
    assert hf.word_tokenizer_type == "mecab" and hf.subword_tokenizer_type == subword
    ours = WordTokenizer(vocab, "mecab", subword)
    texts = sample_sentences("ja")[:400] + task_texts("ja")
    assert len(texts) >= 400
    # odd inputs too: full-width Latin and digits, half-width kana, a dakuten as a combining mark
    texts += ["ＡＢＣ株式会社は２０２０年に設立。ｶﾀｶﾅ", "か\u3099ら「と」", "[SEP] と [MASK]", "Tokyo  東京\u3000都"]
    encodings = ours.encode_batch(texts)
    for text, enc in zip(texts, encodings):
        assert enc.ids == hf(text)["input_ids"], text
    unk = ours.token_to_id("[UNK]")
    assert sum(enc.ids.count(unk) for enc in encodings) < 0.02 * sum(len(e.ids) for e in encodings)
    # pairs: [CLS] A [SEP] B [SEP], as transformers builds them
    a, b = texts[0], texts[1]
    assert ours.encode(a, b).ids == hf(a, b)["input_ids"]


def test_mecab_offsets_point_at_the_original_characters(tmp_path):
    vocab, _ = trained("ja", tmp_path, lowercase=False, word_tokenizer="mecab")
    tok = WordTokenizer(vocab, "mecab")
    texts = sample_sentences("ja")[:50] + ["ＡＢＣの名産は「りんご」である。ｶﾀｶﾅも書く。"]
    starts = []
    for text, enc in zip(texts, tok.encode_batch(texts, add_special_tokens=False)):
        for token, (start, end) in zip(enc.tokens, enc.offsets):
            if token != "[UNK]":
                assert unicodedata.normalize("NFKC", text[start:end]) == token.removeprefix("##"), (token, start, end)
        assert enc.word_starts[0]
        assert enc.word_starts == [not t.startswith("##") for t in enc.tokens]  # a MeCab word: a piece and its ##s
        starts += enc.word_starts
    assert not all(starts)
    assert nfkc_aligned("か\u3099ﾀ") == ("がタ", [(0, 2), (2, 3)])


def test_chinese_default_keeps_one_token_per_ideograph_and_jieba_exports_load_in_transformers(tmp_path):
    # vocab.word_tokenizer=jieba: jieba's words before WordPiece; the export's tokenizer.json
    # is BertTokenizerFast on jieba-segmented text
    vocab, folder = trained("zh", tmp_path, word_tokenizer="jieba")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert word_tokenizer_of(config) == ("jieba", "wordpiece", True)
    assert config["tokenize_chinese_chars"] is False
    hf = transformers.BertTokenizerFast.from_pretrained(str(folder))
    ours = WordTokenizer(vocab, "jieba", lowercase=True)
    texts = sample_sentences("zh")[:300] + task_texts("zh")
    for text in texts:
        enc = ours.encode(text)
        assert enc.ids == hf(" ".join(ours.segmenter.words(text)))["input_ids"], text
        for token, (s, e) in zip(enc.tokens, enc.offsets):
            if token not in ("[CLS]", "[SEP]", "[UNK]"):
                assert text[s:e].lower() == token.removeprefix("##")
    assert any(len(t) > 1 and re.match("[\u4e00-\u9fff]+$", t) for t in vocab)  # words, not single ideographs


def test_word_tokenizer_configs_name_the_transformers_classes():
    ja = hf_tokenizer_config("mecab", "character", False)
    assert ja["tokenizer_class"] == "BertJapaneseTokenizer" and ja["mecab_kwargs"] == {"mecab_dic": "unidic_lite"}
    assert word_tokenizer_of(ja) == ("mecab", "character", False)
    assert word_tokenizer_of(hf_tokenizer_config("none", "wordpiece", True)) is None
    with pytest.raises(ValueError, match="mecab_dic"):
        word_tokenizer_of({**ja, "mecab_kwargs": {"mecab_dic": "ipadic"}})
    with pytest.raises(ValueError, match="character"):
        WordTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "jieba", "character")


def test_a_loaded_tokenizer_pickles_and_tokenises_the_same_after(tmp_path):
    import pickle

    vocab, _ = trained("ja", tmp_path, lowercase=False, word_tokenizer="mecab")
    tok = WordTokenizer(vocab, "mecab")
    text = sample_sentences("ja")[0]
    before = tok.encode(text).ids  # the tagger is loaded now
    assert pickle.loads(pickle.dumps(tok)).encode(text).ids == before


def test_segmented_vocabularies_are_deterministic(tmp_path):
    a, _ = trained("ja", tmp_path / "a", lowercase=False, word_tokenizer="mecab")
    b, _ = trained("ja", tmp_path / "b", lowercase=False, word_tokenizer="mecab")
    assert a == b and len(a) > 500
    chars, _ = trained("ja", tmp_path / "c", lowercase=False, word_tokenizer="mecab", subword="character")
    assert not any(t.startswith("##") for t in chars) and all(len(t) == 1 for t in chars[104:])


@pytest.mark.parametrize(
    ("word_tokenizer", "subword", "sentences"),
    [
        ("mecab", "character", ["。"]),
        ("mecab", "wordpiece", []),
        ("mecab", "character", []),
        ("jieba", "wordpiece", []),
    ],  # fmt: skip
)
def test_a_segmented_vocabulary_with_nothing_learnt_never_ends_done(tmp_path, word_tokenizer, subword, sentences):
    """The vocab stage's empty-output rule holds on the segmenting path too: a corpus stage that
    finished with 0 documents (corpus.allow_empty_sources), or a character vocabulary whose one
    character is seen less than min_frequency, gives nothing to learn, and the stage fails with
    no manifest (the latter used to write a vocabulary of the specials alone, "done")."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.schema.manifest import has_manifest, write_manifest
    from pipeline.schema.parquet import DOCUMENT_SCHEMA
    from pipeline.vocab.job import run_vocab

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = [{"doc_id": "t:0", "source": "books", "title": "t", "sentences": sentences, "num_sentences": 1,
             "num_chars": 1}] if sentences else []  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows, schema=DOCUMENT_SCHEMA), corpus / "part-00000-of-00001.parquet")
    write_manifest("corpus", str(corpus), {}, {}, {"documents": len(rows)})
    config = VocabConfig(vocab_size=300, min_frequency=2, word_tokenizer=word_tokenizer, subword=subword)
    with pytest.raises(ValueError, match="vocab: no piece learnt|no sentences"):
        run_vocab(config, str(corpus), str(tmp_path / "v"))
    assert not has_manifest(str(tmp_path / "v"))
