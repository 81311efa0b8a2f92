"""The examples job encodes many sentences as one text, split at a mark: the same ids as one by one."""

from __future__ import annotations

import random

import pytest

from pipeline.examples.tokens import (
    SENTENCE_MARK,
    TokenizeToBuckets,
    encode_joined,
    flat_ids,
    joined_tokenizer,
    plain_tokenizer,
)
from pipeline.vocab.tokenizer import build_text_tokenizer, special_tokens

# Texts whose tokenizing depends on a character's neighbours, if anything does: case (final
# sigma, dotted I), accents and combining marks at a sentence's start or end, decomposed forms,
# ideographs (padded with spaces), control and invisible characters (dropped or made spaces),
# whitespace-only and empty sentences, literal special tokens, other scripts.
TRICKY = [
    "Hello world.",
    "ΟΔΟΣ ΣΟΦΙΑΣ",
    "İstanbul IS big.",
    "\u0301leading combining acute",
    "trailing combining\u0301",
    "naïve café",
    "nai\u0308ve cafe\u0301",
    "北京大学 in 上海",
    "東京で勉強",
    "\x00\x01\x02",
    "   ",
    "",
    "tab\there\u00a0nbsp",
    "zero\u200bwidth\ufeffmarks",
    "[SEP] and [MASK] as text",
    "🙂 emoji 👍🏽",
    "مرحبا بالعالم",
    "क्ष्‍ ZWJ",
    "ẞtraße STRASSE",
    "a",
    "x" * 300,
]


def vocab_for(texts: list[str]) -> list[str]:
    chars = sorted({c for t in texts for c in t.lower() + t if not c.isspace()})
    words = sorted({w.lower() for t in texts for w in t.split()} | {w for t in texts for w in t.split()})
    return list(dict.fromkeys(special_tokens(9) + chars + ["##" + c for c in chars] + words))


def one_by_one(tok, sentences: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch_fast(sentences, add_special_tokens=False)]


def split(flat: tuple) -> list[list[int]]:
    """(values, lengths) back to one list per sentence."""
    values, lengths = flat
    assert len(values) == sum(lengths)
    ends = [int(x) for x in lengths.cumsum()]
    return [values[e - n : e].tolist() for e, n in zip(ends, lengths.tolist(), strict=True)]


@pytest.mark.parametrize("lowercase", [True, False])
@pytest.mark.parametrize("per_text", [1, 3, 64])
def test_joined_ids_equal_one_by_one(lowercase, per_text):
    rng = random.Random(7)
    sentences = [rng.choice(TRICKY) for _ in range(200)]
    # Random strings over the tricky texts' characters too: any neighbour next to any other.
    pool = sorted({c for t in TRICKY for c in t}) + [" "] * 10
    sentences += ["".join(rng.choice(pool) for _ in range(rng.randint(0, 30))) for _ in range(300)]
    vocab = vocab_for(TRICKY)
    expected = one_by_one(build_text_tokenizer(vocab, lowercase), sentences)
    got = encode_joined(joined_tokenizer(vocab, lowercase), sentences, per_text=per_text)
    assert split(got) == expected
    assert any(not ids for ids in expected) and sum(map(len, expected)) > 2000  # empties and plenty of ids


# Printable ASCII with what BERT's tokenizer treats apart: every punctuation character (ASCII
# punctuation, the "[SEP]" of a text, runs of them), whitespace it splits at (tab, newline,
# return), controls it drops (a sentence holding one is not plain), DEL, digits, both cases.
ASCII = [chr(c) for c in range(0x20, 0x7F)] + ["\t", "\n", "\r", " ", " ", "\x00", "\x0b", "\x0c", "\x1f", "\x7f"]


def plain_mix(rng: random.Random) -> list[str]:
    """Sentences of random ASCII (some with controls), of the tricky texts, and of both."""
    out = ["".join(rng.choice(ASCII) for _ in range(rng.randint(0, 40))) for _ in range(400)]
    out += ["[SEP] e.g. U.S.A. -- (a+b)^2=c; ~x|y`z {q} <p> 3.14 $5 50% #1 @me a_b \\ / \"q\" 'r'", "..." * 40]
    out += [rng.choice(TRICKY) for _ in range(100)]
    out += [
        "".join(rng.choice(ASCII + ["é", "Σ", "北", "\u0301"]) for _ in range(rng.randint(0, 40))) for _ in range(100)
    ]
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("lowercase", [True, False])
@pytest.mark.parametrize("per_text", [1, 5, 64])
def test_plain_ascii_sentences_encoded_apart_give_the_same_ids(lowercase, per_text):
    """The plain tokenizer (lowercase, whitespace split, ASCII punctuation isolated) on the
    printable-ASCII sentences, the joined BERT tokenizer on the rest, put back in order: the
    ids of BERT's tokenizer one sentence at a time."""
    rng = random.Random(11)
    sentences = plain_mix(rng)
    vocab = vocab_for(TRICKY + ["".join(ASCII), "the quick brown fox", "sep mask"])
    vocab += [w for w in ("[SEP]", "e.g", "##g", "usa", "USA") if w not in vocab]
    expected = one_by_one(build_text_tokenizer(vocab, lowercase), sentences)
    plain = plain_tokenizer(vocab, lowercase)
    got = encode_joined(joined_tokenizer(vocab, lowercase), sentences, per_text=per_text, plain=plain)
    assert split(got) == expected
    # Both parts were used, and the plain part alone differs from BERT's on a control character
    # (dropped by BERT's normalizer, kept by the plain one): the control check is what keeps them equal.
    assert sum(s.isascii() for s in sentences) > 300 and sum(not s.isascii() for s in sentences) > 50
    with_control = next(s for s in sentences if "\x00" in s and len(s) > 5)
    assert one_by_one(plain, [with_control]) != expected[sentences.index(with_control)]


def test_plain_tokenizer_differs_from_bert_on_what_is_not_ascii():
    """Why the split is needed: outside ASCII the plain tokenizer keeps accents and case forms,
    pads no ideograph and isolates no Unicode punctuation."""
    vocab = vocab_for(TRICKY + ["naive cafe", "“quoted”"])
    bert, plain = build_text_tokenizer(vocab, True), plain_tokenizer(vocab, True)
    for text in ("naïve café", "北京大学", "“quoted”"):
        assert one_by_one(plain, [text]) != one_by_one(bert, [text])
    assert plain_tokenizer(vocab[:20] + ["hello", "hello"] + vocab[20:], True) is None


def test_a_chunk_all_ascii_or_none_ascii_takes_one_tokenizer():
    vocab = vocab_for(TRICKY)
    joined, plain = joined_tokenizer(vocab, True), plain_tokenizer(vocab, True)
    for sentences in (["Hello world.", "", "a b, c!"], ["naïve café", "北京大学 in 上海"], []):
        assert split(encode_joined(joined, sentences, plain=plain)) == one_by_one(
            build_text_tokenizer(vocab, True), sentences
        )


def test_a_sentence_holding_the_mark_is_refused_and_the_dofn_encodes_one_by_one():
    vocab = vocab_for(TRICKY)
    sentences = ["before", f"a{SENTENCE_MARK}b", "after", SENTENCE_MARK]
    assert encode_joined(joined_tokenizer(vocab, True), sentences) is None
    dofn = TokenizeToBuckets(vocab, True, 1, "/nonexistent")
    dofn.setup()
    expected = one_by_one(build_text_tokenizer(vocab, True), sentences)
    assert split(dofn._encode(sentences)) == expected
    assert split(dofn._encode(TRICKY)) == one_by_one(build_text_tokenizer(vocab, True), TRICKY)
    # Without the fallback the mark would be taken for a boundary: the split would differ.
    assert len(expected) == 4 and expected[1]


def test_the_mark_is_a_token_of_its_own_outside_the_vocabulary():
    vocab = vocab_for(TRICKY)
    tok = joined_tokenizer(vocab, True)
    mark = tok.token_to_id(SENTENCE_MARK)
    assert mark == len(vocab)
    ids = tok.encode(f"hello{SENTENCE_MARK}world", add_special_tokens=False).ids
    assert ids.count(mark) == 1 and ids.index(mark) == 1


def test_a_vocabulary_with_repeated_lines_is_encoded_one_by_one():
    """Repeated lines leave fewer ids than lines: the id after them is some line's own, so the
    mark cannot have it; the dofn then encodes one sentence at a time, with the same ids."""
    vocab = vocab_for(TRICKY)
    repeated = vocab[:20] + ["hello", "hello", "world"] + vocab[20:]
    assert joined_tokenizer(repeated, True) is None
    dofn = TokenizeToBuckets(repeated, True, 1, "/nonexistent")
    dofn.setup()
    assert dofn.joined is None and dofn.plain is None
    assert split(dofn._encode(TRICKY)) == one_by_one(build_text_tokenizer(repeated, True), TRICKY)


def test_flat_ids_keep_empty_lists_and_order():
    values, lengths = flat_ids([[5, 6], [], [7], []])
    assert values.tolist() == [5, 6, 7] and lengths.tolist() == [2, 0, 1, 0]
    values, lengths = flat_ids([])
    assert values.tolist() == [] and lengths.tolist() == []


def test_token_files_hold_each_documents_sentences_as_one_by_one_encoding_gives_them(tmp_path, monkeypatch):
    """The DoFn end to end: documents in, per-bucket token files out, as the sentences encoded
    one by one give them: empty-after-tokenizing sentences dropped, documents left with none
    skipped, a sentence holding the mark and documents across several flushes included."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import pipeline.examples.tokens as tokens
    from pipeline.schema.parquet import DOCUMENT_SCHEMA

    monkeypatch.setattr(tokens, "FLUSH_TOKENS", 50)  # several flushes, buffers across documents
    monkeypatch.setattr(tokens, "ENCODE_SENTENCES", 7)  # several encode calls per batch
    rng = random.Random(3)
    docs = [[rng.choice(TRICKY) for _ in range(rng.randint(1, 12))] for _ in range(40)]
    docs[5] = ["\x00\x01", "   "]  # nothing left: skipped
    docs[9] = ["kept", f"holds the mark {SENTENCE_MARK} itself", "\x02"]
    rows = [
        {"doc_id": f"d{i:03d}", "source": "wiki", "title": "t", "sentences": d, "num_sentences": len(d),
         "num_chars": sum(map(len, d))}
        for i, d in enumerate(docs)
    ]  # fmt: skip
    url = str(tmp_path / "docs.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=DOCUMENT_SCHEMA), url, row_group_size=8)
    vocab = vocab_for(TRICKY)
    dofn = TokenizeToBuckets(vocab, True, 3, str(tmp_path / "work"))
    dofn.setup()
    out = list(dofn.process((0, [(url, 0, -1)])))
    assert sorted(b for b, _ in out) == [0, 1, 2]
    got = {}
    for _, file in out:
        table = pq.read_table(file)
        assert table.schema == tokens.token_schema(len(vocab))
        for doc_id, sentences in zip(table.column("doc_id").to_pylist(), table.column("sentences").to_pylist()):
            got.setdefault(doc_id, []).extend(sentences)  # a document is in one flush of one file
    reference = build_text_tokenizer(vocab, True)
    expected = {}
    for row in rows:
        ids = [s for s in one_by_one(reference, row["sentences"]) if s]
        if ids:
            expected[row["doc_id"]] = ids
    assert got == expected
    assert "d005" not in got and len(got["d009"]) == 2


def test_an_id_that_does_not_fit_the_token_files_is_an_error_not_a_wrapped_id(tmp_path):
    import numpy as np

    dofn = TokenizeToBuckets(vocab_for(TRICKY), True, 1, str(tmp_path))
    dofn.setup()
    buffers = {0: (["d0"], [np.array([7, 70_000], dtype=np.uint32)], [np.array([2])])}
    with pytest.raises(ValueError, match="token id 70000 does not fit the token files' uint16"):
        dofn._flush(buffers, {}, 0)
