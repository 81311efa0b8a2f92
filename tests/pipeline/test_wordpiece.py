"""WordPiece stage: Google's layout, determinism, the tokenizer it writes, run_vocab's outputs."""

from __future__ import annotations

import collections
import itertools
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, pre_tokenizers

from pipeline.schema.config import ConfigError
from pipeline.schema.manifest import ManifestError, read_manifest, write_manifest
from pipeline.schema.parquet import DOCUMENT_SCHEMA
from pipeline.vocab.config import VocabConfig
from pipeline.vocab.job import ParquetSentences, corpus_sentences, in_sample, run_vocab
from pipeline.vocab.tokenizer import bert_normalizer, build_text_tokenizer, build_tokenizer, read_vocab
from pipeline.vocab.wordpiece import count_alphabet, train_vocab

SYLLABLES = [
    "ka",
    "ro",
    "mi",
    "tu",
    "ne",
    "sa",
    "lo",
    "pe",
    "di",
    "gu",
    "an",
    "el",
    "or",
    "is",
    "um",
    "tha",
    "bre",
    "ck",
    "Zu",
    "Åe",
]


def make_sentences(n: int, seed: int = 0) -> list[str]:
    """Invented words from syllables: many equally frequent pairs, so ties are everywhere."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(600)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) + rng.choice(".!?") for _ in range(n)]


SENTENCES = make_sentences(1500)
CONFIG = VocabConfig(vocab_size=600, min_frequency=2, num_unused=99)


@pytest.fixture(scope="module")
def vocab() -> list[str]:
    return train_vocab(SENTENCES, CONFIG)


def test_google_layout(vocab):
    assert len(vocab) == 600
    assert vocab[0] == "[PAD]"
    assert vocab[1:100] == [f"[unused{i}]" for i in range(99)]
    assert vocab[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(set(vocab)) == len(vocab)
    learned = vocab[104:]
    # single characters, then their ## continuations, then merged pieces
    kinds = [0 if len(t) == 1 else 1 if t.startswith("##") and len(t) == 3 else 2 for t in learned]
    assert kinds == sorted(kinds)
    assert {"k", "a", "##a", "."} <= set(learned)
    assert any(t.startswith("##") and len(t) > 3 for t in learned)  # merged continuations
    assert all(t == t.lower() for t in learned)  # lowercase=True (and Å stripped of its ring)
    assert "å" not in learned and "a" in learned


def test_layout_with_other_unused_count():
    v = train_vocab(SENTENCES[:300], VocabConfig(vocab_size=300, num_unused=3))
    assert v[:8] == [
        "[PAD]",
        "[unused0]",
        "[unused1]",
        "[unused2]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
    ]


def test_same_corpus_same_vocab_over_runs(vocab):
    # The tokenizers trainer alone reorders (and at the cut-off re-picks) equally frequent
    # tokens from run to run; each run below gets freshly seeded hash maps.
    runs = [train_vocab(SENTENCES, CONFIG) for _ in range(3)]
    assert all(r == vocab for r in runs)
    assert train_vocab(iter(SENTENCES), CONFIG) == vocab  # a one-shot iterator works too


def test_stable_set_at_several_sizes():
    for size in (250, 333, 480):
        cfg = VocabConfig(vocab_size=size, min_frequency=2)
        first = train_vocab(SENTENCES[:800], cfg)
        assert len(first) == size
        for _ in range(2):
            assert train_vocab(SENTENCES[:800], cfg) == first


def test_stable_set_when_every_merge_ties():
    # Each word "q<a><b>" three times: dozens of ## pairs share the top count, and the cut-off
    # falls among them. The bare tokenizers trainer picks a different token SET almost every run
    # on this corpus (6 distinct sets in 6 runs when checked); ours must not.
    words = ["q" + a + b for a, b in itertools.permutations("abcdefghijkl", 2)] * 3
    random.Random(0).shuffle(words)
    sents = [" ".join(words[i : i + 10]) for i in range(0, len(words), 10)]
    cfg = VocabConfig(vocab_size=210, num_unused=99)
    first = train_vocab(sents, cfg)
    assert len(first) == 210
    for _ in range(4):
        assert train_vocab(sents, cfg) == first


def test_small_corpus_gives_fewer_tokens():
    v = train_vocab(["one tiny sentence here.", "and another tiny one."], CONFIG)
    assert 104 < len(v) < CONFIG.vocab_size
    assert v[100] == "[UNK]"


def test_empty_corpus_is_an_error():
    with pytest.raises(ValueError, match="no sentences"):
        train_vocab([], CONFIG)


def test_cased_vocab_keeps_case():
    v = train_vocab(SENTENCES, VocabConfig(vocab_size=400, lowercase=False))
    assert "Z" in v and "Å" in v


def test_count_alphabet_matches_the_pre_tokenizer():
    text = SENTENCES[:200] + [
        "Café naïve «quoted» 中文字 ﬁne x\u2028yz a\u00a0bc \x1cq [MASK] don't",
        "tab\tsep,comma;semi — dash…",
    ]
    chars, inner, n = count_alphabet(text, lowercase=True, batch_size=7)
    norm, pre = bert_normalizer(True), pre_tokenizers.BertPreTokenizer()
    want_chars, want_inner = collections.Counter(), set()
    for s in text:
        for word, _ in pre.pre_tokenize_str(norm.normalize_str(s)):
            want_chars.update(word)
            want_inner.update(word[1:])
    assert n == len(text)
    assert chars == want_chars
    assert inner == want_inner


def test_tokenizer_json_round_trip_and_pair_encoding(vocab, tmp_path):
    tok = build_tokenizer(vocab, lowercase=True, max_length=32)
    path = tmp_path / "tokenizer.json"
    path.write_text(tok.to_str(pretty=True), encoding="utf-8")
    loaded = Tokenizer.from_file(str(path))
    enc = loaded.encode("Karo mitu ne.", "Salo pe [MASK] Xq!")
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    first_sep = enc.tokens.index("[SEP]")
    assert enc.type_ids == [0] * (first_sep + 1) + [1] * (len(enc.ids) - first_sep - 1)
    assert enc.ids == [vocab.index(t) for t in enc.tokens]  # ids are vocab.txt line numbers
    assert "[MASK]" in enc.tokens  # special tokens are recognised in text
    assert "[UNK]" in enc.tokens  # "x" and "q" never occur in the corpus
    assert loaded.decode(loaded.encode("karo mitu").ids) == "karo mitu"
    long = loaded.encode(" ".join(["karo"] * 100))
    assert len(long.ids) == 32  # truncation to max_length
    spec = json.loads(path.read_text())
    assert spec["model"]["type"] == "WordPiece" and spec["normalizer"]["type"] == "BertNormalizer"


def test_text_tokenizer_does_not_read_special_tokens_in_text(vocab):
    tok = build_text_tokenizer(vocab, lowercase=True)
    enc = tok.encode("karo [SEP] mitu [MASK]", add_special_tokens=False)
    assert not {101, 102, 103} & set(enc.ids)
    assert enc.tokens[2] == "[UNK]"  # the "[" (not in this corpus), then "sep" in pieces
    assert "".join(t.lstrip("#") for t in enc.tokens[3:6]) == "sep"


def test_bert_tokenizer_fast_loads_it(vocab, tmp_path):
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "tokenizer.json"
    path.write_text(build_tokenizer(vocab, lowercase=True).to_str(), encoding="utf-8")
    hf = transformers.BertTokenizerFast(tokenizer_file=str(path))
    out = hf("karo mitu", "salo pe")
    assert out["input_ids"][0] == 101 and out["input_ids"][-1] == 102
    assert hf.mask_token_id == 103 and hf.pad_token_id == 0


def write_corpus(url, sentences_per_doc: list[list[str]], shards: int = 2, count_sentences: bool = True) -> None:
    rows = [
        {
            "doc_id": f"t:{i:04d}",
            "source": "books",
            "title": f"t{i}",
            "sentences": s,
            "num_sentences": len(s),
            "num_chars": sum(map(len, s)),
        }
        for i, s in enumerate(sentences_per_doc)
    ]
    url.mkdir(parents=True, exist_ok=True)
    for k in range(shards):
        table = pa.Table.from_pylist(rows[k::shards], schema=DOCUMENT_SCHEMA)
        pq.write_table(table, url / f"part-{k:05d}-of-{shards:05d}.parquet")
    counts = {"documents": len(rows)} | ({"sentences": sum(map(len, sentences_per_doc))} if count_sentences else {})
    write_manifest("corpus", str(url), {}, {}, counts)  # the counts the corpus stage writes


def test_run_vocab_writes_vocab_tokenizer_and_manifest(tmp_path, vocab):
    corpus = tmp_path / "corpus"
    docs = [SENTENCES[i : i + 15] for i in range(0, len(SENTENCES), 15)]
    write_corpus(corpus, docs)
    out = tmp_path / "vocab"
    (out).mkdir()
    (out / "stale.txt").write_text("left from an earlier run")
    manifest = run_vocab(CONFIG, str(corpus), str(out))

    written = read_vocab(str(out / "vocab.txt"))
    assert (out / "vocab.txt").read_text(encoding="utf-8").count("\n") == len(written) == 600
    assert written == vocab  # same sentences in another order: the same vocabulary
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.token_to_id("[MASK]") == 103 and tok.get_vocab_size() == 600

    again = read_manifest(str(out))
    assert again.stage == "vocab" and again.fingerprint == manifest.fingerprint
    assert sorted(f.path for f in again.files) == ["tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    assert again.counts["vocab_size"] == 600
    assert again.counts["sentences_used"] == len(SENTENCES)
    assert again.inputs["corpus"] == read_manifest(str(corpus)).fingerprint
    assert again.config["vocab_size"] == 600

    capped = run_vocab(VocabConfig(vocab_size=600, max_sentences=100), str(corpus), str(out))
    assert capped.counts["sentences_used"] == 100

    half = VocabConfig(vocab_size=600, sample_fraction=0.5)
    sampled = run_vocab(half, str(corpus), str(out)).counts["sentences_used"]
    kept = [d for i, d in enumerate(docs) if in_sample(f"t:{i:04d}", 0.5)]
    assert sampled == sum(map(len, kept)) and 0.3 * len(SENTENCES) < sampled < 0.7 * len(SENTENCES)
    assert run_vocab(half, str(corpus), str(out)).counts["sentences_used"] == sampled  # stable


def test_sample_sentences_bounds_what_the_trainer_reads_whatever_the_corpus_size(tmp_path):
    cap = 600
    for n_docs in (100, 400):  # 1,500 and 6,000 sentences, 15 a document
        sentences = make_sentences(15 * n_docs, seed=n_docs)
        docs = [sentences[i : i + 15] for i in range(0, len(sentences), 15)]
        corpus = tmp_path / f"corpus-{n_docs}"
        write_corpus(corpus, docs)
        capped = run_vocab(VocabConfig(vocab_size=600, sample_sentences=cap), str(corpus), str(tmp_path / "v"))
        used = capped.counts["sentences_used"]
        assert capped.counts["corpus_sentences"] == len(sentences)
        assert 0.6 * cap < used < 1.4 * cap, (n_docs, used)  # documents kept by digest: about the cap
        # the same documents as the rate it stands for, so the same vocabulary
        rate = VocabConfig(vocab_size=600, sample_fraction=cap / len(sentences))
        by_rate = run_vocab(rate, str(corpus), str(tmp_path / "r"))
        assert by_rate.counts["sentences_used"] == used
        assert read_vocab(str(tmp_path / "v" / "vocab.txt")) == read_vocab(str(tmp_path / "r" / "vocab.txt"))
        # with sample_fraction as well: the smaller of the two rates, within the fraction's sample
        both = VocabConfig(vocab_size=600, sample_fraction=0.5, sample_sentences=cap)
        assert run_vocab(both, str(corpus), str(tmp_path / "b")).counts["sentences_used"] == used
        # a manifest without the sentence count: summed from the files, the same sample
        write_corpus(corpus, docs, count_sentences=False)
        assert "sentences" not in read_manifest(str(corpus)).counts
        uncounted = run_vocab(VocabConfig(vocab_size=600, sample_sentences=cap), str(corpus), str(tmp_path / "u"))
        assert uncounted.counts["sentences_used"] == used
        assert uncounted.counts["corpus_sentences"] == len(sentences)

    # a cap the corpus does not reach: every sentence, the uncapped vocabulary
    corpus = tmp_path / "corpus-100"
    roomy = run_vocab(VocabConfig(vocab_size=600, sample_sentences=10**6), str(corpus), str(tmp_path / "v"))
    assert roomy.counts["sentences_used"] == roomy.counts["corpus_sentences"] == 1500
    run_vocab(VocabConfig(vocab_size=600), str(corpus), str(tmp_path / "r"))
    assert read_vocab(str(tmp_path / "v" / "vocab.txt")) == read_vocab(str(tmp_path / "r" / "vocab.txt"))


@pytest.mark.parametrize("fraction", [0.005, 0.3, 1.0])  # 0.005: one document, in the second file
def test_parquet_sentences_are_those_of_the_sampled_documents_in_order(tmp_path, fraction):
    docs = [SENTENCES[i : i + 3] for i in range(0, len(SENTENCES), 3)]  # 500 documents, 2 files
    write_corpus(tmp_path / "corpus", docs)
    urls = read_manifest(str(tmp_path / "corpus")).file_urls(".parquet")
    expected = [
        sentence
        for k in range(2)  # the files in order, each a slice of the rows
        for i, doc in list(enumerate(docs))[k::2]
        if in_sample(f"t:{i:04d}", fraction)
        for sentence in doc
    ]
    assert list(ParquetSentences(urls, sample_fraction=fraction)) == expected
    assert 0 < len(expected) and (fraction < 1.0 or len(expected) == len(SENTENCES))
    assert list(ParquetSentences(urls, max_sentences=7, sample_fraction=fraction)) == expected[:7]
    assert corpus_sentences(urls) == len(SENTENCES)


def test_sample_fraction_is_validated():
    with pytest.raises(ConfigError, match="vocab.sample_fraction"):
        VocabConfig(sample_fraction=0.0)
    with pytest.raises(ConfigError, match="vocab.sample_sentences"):
        VocabConfig(sample_sentences=-1)


def test_run_vocab_refuses_an_unfinished_corpus(tmp_path):
    (tmp_path / "corpus").mkdir()
    with pytest.raises(ManifestError):
        run_vocab(CONFIG, str(tmp_path / "corpus"), str(tmp_path / "vocab"))


# -- Google's layout at full size, and Hugging Face tokenising exactly as the pipeline ---------
def test_google_layout_at_30522_entries():
    rng = random.Random(4)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(5, 9))) for _ in range(20000)]
    sentences = [" ".join(words[i : i + 10]) + "." for i in range(0, len(words), 10)] * 2
    vocab = train_vocab(sentences, VocabConfig(vocab_size=30522))
    assert len(vocab) == 30522 == len(set(vocab))
    assert vocab[0] == "[PAD]" and vocab[1:100] == [f"[unused{i}]" for i in range(99)]
    assert vocab[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]


TRICKY = [
    "Café déjà vu: Ångström naïve façade, ÉCOLE Über.",
    "北京大学的学生在东京大学学习。漢字と日本語のテキスト!",
    "Punctuation!? (brackets) [square] {curly} -- em—dash … «quotes» 'single' \"double\" #hash @at",
    "a" * 150 + " supercalifragilisticexpialidocious " + "x" * 99 + " tail",
    "Mixed CASE WoRdS and numbers 12345 3.14 2,000",
]


def tricky_corpus(seed: int = 2) -> list[str]:
    rng = random.Random(seed)
    out = list(TRICKY) * 3
    for _ in range(400):
        out.append(" ".join(rng.choice(TRICKY).split()[: rng.randint(2, 9)]))
    return out + SENTENCES[:400]


@pytest.mark.parametrize("lowercase", [True, False])
def test_hugging_face_tokenizes_exactly_as_the_pipeline(tmp_path, lowercase):
    transformers = pytest.importorskip("transformers")
    corpus = tmp_path / "corpus"
    sentences = tricky_corpus()
    write_corpus(corpus, [sentences[i : i + 20] for i in range(0, len(sentences), 20)])
    out = tmp_path / "vocab"
    run_vocab(VocabConfig(vocab_size=800, min_frequency=1, lowercase=lowercase), str(corpus), str(out))
    vocab = read_vocab(str(out / "vocab.txt"))
    ours = build_text_tokenizer(vocab, lowercase)
    pair = build_tokenizer(vocab, lowercase)
    from_dir = transformers.BertTokenizerFast.from_pretrained(str(out))
    # As Google releases a model: vocab.txt (and the config), no tokenizer.json.
    txt_only = tmp_path / "txt_only"
    txt_only.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json"):
        (txt_only / name).write_bytes((out / name).read_bytes())
    from_txt = transformers.BertTokenizerFast.from_pretrained(str(txt_only))
    assert from_txt.backend_tokenizer.get_vocab_size() == len(vocab)
    checked_unk = False
    for text in TRICKY + SENTENCES[:50]:
        expected = ours.encode(text, add_special_tokens=False).ids
        for hf in (from_dir, from_txt):
            assert hf.encode(text, add_special_tokens=False) == expected, (text, lowercase)
        assert from_dir(text, "karo mitu")["input_ids"] == pair.encode(text, "karo mitu").ids
        checked_unk |= 100 in expected  # the 150-letter word is [UNK], as in BERT
    assert checked_unk
    assert ("北" in vocab) and ("##京" not in vocab)  # ideographs are words of their own
    assert ("é" in vocab) != lowercase  # accents kept only when cased


# Printable ASCII with what BERT's normalizer and pre-tokenizer treat apart (punctuation, runs of
# it, tab/newline/return, controls, DEL), and characters outside ASCII that they treat apart too
# (accents, combining marks, ideographs, Unicode punctuation and spaces, format characters).
_ASCII = [chr(c) for c in range(0x20, 0x7F)] + ["\t", "\n", "\r", " ", " ", "\x00", "\x0b", "\x1f", "\x7f"]
_OTHER = ["é", "Å", "Σ", "ς", "İ", "\u0301", "中", "文", "«", "»", "—", "…", "“", "¿", "\u00a0", "\u3000", "\u200b",
          "\ufeff", "ﬁ", "١", "।", "🙂", "\ufffd"]  # fmt: skip


def _mixed(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(300)]
    out = []
    for _ in range(count):
        parts = [rng.choice(words) if rng.random() < 0.7 else rng.choice(_ASCII) for _ in range(rng.randint(0, 25))]
        if rng.random() < 0.25:  # a quarter not plain: a character outside ASCII somewhere
            parts.insert(rng.randint(0, len(parts)), rng.choice(_OTHER))
        out.append("".join(p if rng.random() < 0.5 else p + " " for p in parts))
    return out


def _bert_words(sentences, lowercase):
    norm, pre = bert_normalizer(lowercase), pre_tokenizers.BertPreTokenizer()
    return collections.Counter(w for s in sentences for w, _ in pre.pre_tokenize_str(norm.normalize_str(s)))


@pytest.mark.parametrize("lowercase", [True, False])
def test_plain_text_gives_berts_words_and_characters(lowercase):
    """Most sentences are lowercased by Python and split without Unicode tables: the words a
    trainer reads, and the characters and word-inner characters counted, are BERT's."""
    from pipeline.vocab.tokenizer import plain_pre_tokenizer
    from pipeline.vocab.wordpiece import _PlainText

    sentences = _mixed(3, 3000)
    plain = _PlainText(lowercase)
    pre = plain_pre_tokenizer()
    got = collections.Counter(
        w for i in range(0, len(sentences), 500) for w, _ in pre.pre_tokenize_str(plain.words(sentences[i : i + 500]))
    )
    assert got == _bert_words(sentences, lowercase)
    assert plain.spaced  # punctuation outside ASCII was met and spaced
    fast = count_alphabet(sentences, lowercase, batch_size=97)
    slow = count_alphabet(sentences, lowercase, batch_size=97, normalizer=bert_normalizer(lowercase))
    assert fast == slow and len(fast[0]) > 60


def test_plain_text_words_differ_without_the_spacing_or_the_control_check():
    """What keeps the words equal: Unicode punctuation spaced, and a control character sending
    its sentence through BERT's normalizer (it drops it; the plain path would keep it)."""
    from pipeline.vocab.tokenizer import plain_pre_tokenizer
    from pipeline.vocab.wordpiece import _PlainText

    pre = plain_pre_tokenizer()
    for sentences in (["said «yes» then"], ["ab\x00cd ef"]):
        plain = _PlainText(True)
        spaced = collections.Counter(w for w, _ in pre.pre_tokenize_str(plain.words(sentences)))
        unspaced = collections.Counter(w for w, _ in pre.pre_tokenize_str("\n".join(sentences).lower()))
        assert spaced == _bert_words(sentences, True) != unspaced


@pytest.mark.parametrize("lowercase", [True, False])
def test_vocabulary_trained_through_plain_text_is_the_bert_trainers(lowercase):
    """The whole training, against the trainer reading the raw sentences through BERT's own
    normalizer and pre-tokenizer (as the stage did before): the same list, entry for entry.
    U+061D is punctuation to Python's tables and not to Rust's: "ko\u061dwv" is one word to the
    trainer, with ##\u061d and ##w pieces that Python's split alone does not foresee."""
    from tokenizers import models, trainers

    from pipeline.vocab import wordpiece

    sentences = _mixed(5, 4000) + SENTENCES + ["ko\u061dwv ka"] * 3
    config = VocabConfig(vocab_size=900, lowercase=lowercase)
    got = train_vocab(sentences, config)

    def bert_pieces(sentences, config, budget, alphabet, continuations):
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer, tok.pre_tokenizer = bert_normalizer(config.lowercase), pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(
            vocab_size=budget, min_frequency=config.min_frequency, show_progress=False,
            special_tokens=continuations, initial_alphabet=alphabet, limit_alphabet=len(alphabet),
            continuing_subword_prefix="##",
        )  # fmt: skip
        tok.train_from_iterator(iter(sentences), trainer)
        return [t for t, _ in sorted(tok.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1])]

    originals = wordpiece._train_pieces, wordpiece._learn_from_words
    try:  # the stage's trainer reads counted words; this one, the sentences themselves
        wordpiece._train_pieces, wordpiece._learn_from_words = bert_pieces, wordpiece._learn_from_text
        want = train_vocab(sentences, config)
    finally:
        wordpiece._train_pieces, wordpiece._learn_from_words = originals
    assert got == want and len(got) == 900


@pytest.mark.parametrize("lowercase", [True, False])
def test_count_words_counts_berts_words_and_characters(lowercase):
    """One pass gives BERT's words with their counts (what the trainer reads instead of the
    text) and the characters count_alphabet gives."""
    from pipeline.vocab.wordpiece import count_words

    sentences = _mixed(7, 3000)
    counted = count_words(iter(sentences), lowercase, batch_size=97)
    words = _bert_words(sentences, lowercase)
    assert counted.words == words and counted.floor == 0
    chars, inner, number = count_alphabet(sentences, lowercase, batch_size=97)
    assert (counted.chars, counted.sentences) == (chars, number)
    # count_alphabet's inner characters, and those inside BERT's words (the Unicode tables of
    # Python and Rust disagree on a few punctuation characters)
    assert counted.inner == inner | set("".join(w[1:] for w in words))


def _zipf_sentences(count: int, seed: int = 0) -> list[str]:
    """Sentences over a long-tailed vocabulary: a few frequent words, tens of thousands seen once."""
    rng = random.Random(seed)
    common = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(400)]
    out = []
    for i in range(count):
        words = [common[min(int(rng.paretovariate(1.2)) - 1, 399)] for _ in range(rng.randint(5, 12))]
        words.insert(rng.randint(0, len(words)), f"{rng.choice(SYLLABLES)}q{i}x")  # a new word each sentence
        out.append(" ".join(words) + ".")
    return out


def test_max_words_bounds_the_words_held_and_keeps_the_frequent_ones_exact():
    from pipeline.vocab.wordpiece import count_words

    sentences = _zipf_sentences(20_000)
    exact = count_words(sentences, True)
    capped = count_words(sentences, True, max_words=2_000, batch_size=500)
    assert len(exact.words) > 20_000 and exact.floor == 0
    assert len(capped.words) <= 2_000 and capped.floor >= 1 and capped.prunes >= 5
    for word, count in capped.words.items():
        assert count <= exact.words[word]
    for word, count in exact.words.most_common(50):  # seen 29 times or more of 20,000 sentences
        assert capped.words[word] == count
    assert (capped.chars, capped.inner) == (exact.chars, exact.inner)  # the alphabet sees every word


def test_max_words_vocabulary_same_under_the_cap_and_close_over_it():
    from pipeline.vocab.wordpiece import count_words, train_vocab_with_stats

    sentences = _zipf_sentences(20_000, seed=1)
    config = VocabConfig(vocab_size=700)
    full, full_stats = train_vocab_with_stats(sentences, config)
    same, same_stats = train_vocab_with_stats(sentences, VocabConfig(vocab_size=700, max_words=10**6))
    capped, capped_stats = train_vocab_with_stats(sentences, VocabConfig(vocab_size=700, max_words=3_000))
    assert same == full and same_stats == full_stats and full_stats["words_dropped_at_most_seen"] == 0
    assert full_stats["trainer_words"] > 20_000 and capped_stats["trainer_words"] <= 3_000
    assert capped_stats["words_dropped_at_most_seen"] >= 1 and capped != full
    # What the dropped words (here a new one in every sentence) taught is lost; the frequent
    # words' pieces are not: the 60 most common tokenize alike with both vocabularies.
    common = [w for w, _ in count_words(sentences, True).words.most_common(60)]
    with_full, with_capped = build_text_tokenizer(full, True), build_text_tokenizer(capped, True)
    assert [with_full.encode(w).tokens for w in common] == [with_capped.encode(w).tokens for w in common]


def test_bert_words_read_once_from_the_sentences():
    """The words counted in one pass: a re-iterable source is read once (the text path: twice)."""

    class Counting:
        def __init__(self, items):
            self.items, self.reads = items, 0

        def __iter__(self):
            self.reads += 1
            return iter(self.items)

    source = Counting(SENTENCES)
    assert train_vocab(source, CONFIG) == train_vocab(SENTENCES, CONFIG) and source.reads == 1
    assert train_vocab(iter(SENTENCES), CONFIG) == train_vocab(SENTENCES, CONFIG)


def test_max_words_is_validated():
    with pytest.raises(ConfigError, match="vocab.max_words"):
        VocabConfig(max_words=-1)
    with pytest.raises(ConfigError, match="vocab.max_words.*word_tokenizer=none"):
        VocabConfig(max_words=1000, word_tokenizer="mecab")
