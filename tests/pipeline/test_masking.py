"""MLM + NSP example creation: the reference's statistics, invariants and structure."""

from __future__ import annotations

import random
import subprocess
import sys

import pyarrow as pa
import pytest

from pipeline.examples.masking import (
    VocabIds,
    create_instances_from_document,
    create_masked_lm_predictions,
    example_rng,
    truncate_seq_pair,
)
from pipeline.schema.parquet import example_schema

SPECIALS = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FIRST = len(SPECIALS)  # 104
CLS, SEP, MASK = 101, 102, 103


def make_docs(num_docs: int, seed: int = 7) -> tuple[list[list[list[int]]], list[str]]:
    """Documents whose token ids increase along the document and never repeat across documents,
    so an example's original tokens tell which document and which order they came from."""
    rng = random.Random(seed)
    docs, next_id = [], FIRST
    for _ in range(num_docs):
        doc = []
        for _ in range(rng.randint(8, 30)):
            n = rng.randint(3, 25)
            doc.append(list(range(next_id, next_id + n)))
            next_id += n
        docs.append(doc)
    vocab = SPECIALS + [f"w{i}" for i in range(FIRST, next_id)]
    return docs, vocab


DOCS, VOCAB = make_docs(40)
IDS = VocabIds.from_vocab(VOCAB)
DOC_OF = {t: d for d, doc in enumerate(DOCS) for s in doc for t in s}


def make_instances(
    max_seq_length=128,
    short_seq_prob=0.1,
    random_next_prob=0.5,
    max_pred=20,
    copies=3,
    whole_word_mask=False,
    docs=DOCS,
    vocab=IDS,
):
    out = []
    for d in range(len(docs)):
        for copy in range(copies):
            rng = example_rng(1, f"doc{d}", copy, max_seq_length)
            out += create_instances_from_document(
                d,
                docs,
                max_seq_length,
                short_seq_prob,
                0.15,
                max_pred,
                random_next_prob,
                vocab,
                rng,
                whole_word_mask,
            )
    return out


def originals(row) -> list[int]:
    ids = list(row["input_ids"])
    for p, t in zip(row["masked_positions"], row["masked_ids"], strict=True):
        ids[p] = t
    return ids


@pytest.fixture(scope="module")
def instances():
    return make_instances()


def test_vocab_ids_come_from_the_vocabulary():
    ids = VocabIds.from_vocab(["[PAD]", "[MASK]", "a", "[CLS]", "##b", "[unused0]", "[SEP]", "[UNK]"])
    assert (ids.cls_id, ids.sep_id, ids.mask_id) == (3, 6, 1)
    assert ids.random_ids == (2, 4)
    assert ids.continuation == frozenset({4})
    with pytest.raises(ValueError, match="MASK"):
        VocabIds.from_vocab(["[CLS]", "[SEP]", "a"])


def test_truncate_seq_pair_trims_the_longer_side_at_both_ends():
    fronts = backs = 0
    for seed in range(200):
        rng = random.Random(seed)
        a, b = list(range(10)), list(range(100, 130))
        truncate_seq_pair(a, b, 25, rng)
        assert len(a) + len(b) == 25
        assert a == list(range(10))  # never trimmed: b stayed longer
        fronts += b[0] != 100
        backs += b[-1] != 129
    assert fronts > 50 and backs > 50
    a, b = list(range(30)), list(range(100, 130))
    truncate_seq_pair(a, b, 20, random.Random(0))
    assert len(a) == len(b) == 10


def test_masking_statistics():
    rng = random.Random(3)
    masked = total = as_mask = kept = replaced = 0
    for _ in range(3000):
        a = [rng.randint(FIRST, len(VOCAB) - 1) for _ in range(rng.randint(5, 60))]
        b = [rng.randint(FIRST, len(VOCAB) - 1) for _ in range(rng.randint(5, 60))]
        tokens = [CLS, *a, SEP, *b, SEP]
        out, positions, labels = create_masked_lm_predictions(tokens, 0.15, 40, IDS, rng)
        assert len(positions) == min(40, max(1, round(len(tokens) * 0.15)))
        assert positions == sorted(set(positions))
        assert labels == [tokens[p] for p in positions]  # labels are the originals
        assert all(tokens[p] not in (CLS, SEP) for p in positions)
        unmasked = set(range(len(tokens))) - set(positions)
        assert all(out[i] == tokens[i] for i in unmasked)
        masked += len(positions)
        total += len(tokens)
        for p in positions:
            if out[p] == MASK:
                as_mask += 1
            elif out[p] == tokens[p]:
                kept += 1
            else:
                replaced += 1
                assert out[p] >= FIRST  # random tokens are never specials
    assert masked / total == pytest.approx(0.15, abs=0.01)
    assert as_mask / masked == pytest.approx(0.8, abs=0.015)
    assert kept / masked == pytest.approx(0.1, abs=0.01)
    assert replaced / masked == pytest.approx(0.1, abs=0.01)


def test_max_predictions_caps_masking():
    tokens = [CLS, *range(FIRST, FIRST + 200), SEP, *range(FIRST, FIRST + 200), SEP]
    _, positions, _ = create_masked_lm_predictions(tokens, 0.15, 7, IDS, random.Random(0))
    assert len(positions) == 7
    tokens = [CLS, FIRST, FIRST + 1, SEP, FIRST + 2, SEP]
    _, positions, _ = create_masked_lm_predictions(tokens, 1.0, 50, IDS, random.Random(0))
    assert positions == [1, 2, 4]  # everything but [CLS]/[SEP]


def test_whole_word_masking_masks_words_together():
    vocab = SPECIALS + ["run", "##ning", "##s", "cat", "dog", "##gy"]
    ids = VocabIds.from_vocab(vocab)
    run, ning, s_, cat, dog, gy = range(FIRST, FIRST + 6)
    words = [[run, ning, s_], [cat], [dog, gy], [run], [run, ning]]
    rng = random.Random(5)
    seen_multi = False
    for _ in range(500):
        seq = [t for _ in range(8) for t in rng.choice(words)]
        tokens = [CLS, *seq[:10], SEP, *seq[10:], SEP]
        _, positions, labels = create_masked_lm_predictions(tokens, 0.3, 10, ids, rng, True)
        chosen = set(positions)
        assert len(chosen) <= 10
        for p in positions:
            if tokens[p] in ids.continuation and tokens[p - 1] != SEP:
                assert p - 1 in chosen  # a piece is never masked without its word's start
            if p + 1 < len(tokens) and tokens[p + 1] in ids.continuation:
                assert p + 1 in chosen  # nor a word start without its pieces
                seen_multi = True
    assert seen_multi


def test_instances_structure(instances):
    assert len(instances) > 300
    for row in instances:
        ids = row["input_ids"]
        assert len(ids) <= 128
        assert ids[0] == CLS and ids[row["len_a"] - 1] == SEP and ids[-1] == SEP
        assert ids.count(SEP) == 2 and ids.count(CLS) == 1
        assert len(row["masked_positions"]) <= 20
        orig = originals(row)
        a, b = orig[1 : row["len_a"] - 1], orig[row["len_a"] : -1]
        assert a and b
        assert a == sorted(a) and b == sorted(b)  # each segment in document order
        doc_a = {DOC_OF[t] for t in a}
        assert len(doc_a) == 1
        if row["is_random_next"]:
            assert {DOC_OF[t] for t in b}.isdisjoint(doc_a)  # B from ANOTHER document
        else:
            assert {DOC_OF[t] for t in b} == doc_a and a[-1] < b[0]  # the real continuation


def test_instances_fit_the_schema(instances):
    table = pa.Table.from_pylist(instances, schema=example_schema(len(VOCAB), 128))
    assert table.num_rows == len(instances)


def test_random_next_about_half(instances):
    share = sum(r["is_random_next"] for r in instances) / len(instances)
    # One-sentence chunks are always random-next (as in the reference): a little over 0.5.
    assert 0.45 <= share <= 0.62
    never = make_instances(random_next_prob=0.0, copies=1)
    single = [r for r in never if r["is_random_next"]]
    assert len(single) < 0.2 * len(never)  # only the forced one-sentence chunks


def test_short_seq_prob_makes_shorter_examples():
    full = make_instances(short_seq_prob=0.0, copies=2)
    short = make_instances(short_seq_prob=1.0, copies=2)
    mean = lambda rows: sum(len(r["input_ids"]) for r in rows) / len(rows)
    assert mean(short) < 0.75 * mean(full)
    assert len(short) > len(full)
    assert mean(full) > 100  # target is max_seq_length: most examples nearly full


def test_masked_share_in_instances(instances):
    masked = sum(len(r["masked_positions"]) for r in instances)
    tokens = sum(len(r["input_ids"]) for r in instances)
    assert masked / tokens == pytest.approx(0.15, abs=0.01)


def test_single_document_uses_itself():
    docs = DOCS[:1]
    rows = make_instances(docs=docs, copies=2)
    assert rows and all(len(r["input_ids"]) <= 128 for r in rows)


def test_rng_is_stable_and_keyed():
    first = example_rng(12345, "wiki:42", 0, 128).random()
    assert first == example_rng(12345, "wiki:42", 0, 128).random()
    others = {
        example_rng(12345, "wiki:42", 1, 128).random(),
        example_rng(12345, "wiki:43", 0, 128).random(),
        example_rng(12345, "wiki:42", 0, 512).random(),
        example_rng(1, "wiki:42", 0, 128).random(),
    }
    assert first not in others and len(others) == 4
    code = "from pipeline.examples.masking import example_rng; print(example_rng(12345, 'wiki:42', 0, 128).random())"
    for hashseed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={"PYTHONHASHSEED": hashseed, "PYTHONPATH": "."},
            check=True,
        )
        assert float(out.stdout) == first


def test_same_rng_same_instances():
    a = make_instances(copies=1)
    b = make_instances(copies=1)
    assert a == b
