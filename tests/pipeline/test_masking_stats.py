"""The masking rule checked by statistics on >= 10,000 generated examples per mode.

Modes: static, static with whole-word masking, and dynamic (unmasked pairs, then masked the way
the loader does, with the same ``create_masked_lm_predictions``). Pure functions, no Beam.
Tolerances are the issue's: 15% +- 0.5 pp of eligible tokens, 80/10/10 +- 1 pp, random-next
50% +- 1.5 pp among examples whose A came from a multi-sentence chunk, short targets ~10%.
"""

from __future__ import annotations

import random

import pytest

from pipeline.examples.masking import (
    VocabIds,
    create_instances_from_document,
    create_masked_lm_predictions,
    example_rng,
)

SPECIALS = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
STARTS = [f"w{i}" for i in range(700)]
PIECES = [f"##p{i}" for i in range(250)]
VOCAB = SPECIALS + STARTS + PIECES
IDS = VocabIds.from_vocab(VOCAB)
FIRST = len(SPECIALS)
PIECE0 = FIRST + len(STARTS)
CLS, SEP, MASK = IDS.cls_id, IDS.sep_id, IDS.mask_id
SEQ, CAP, COPIES = 128, 20, 3
MIN_EXAMPLES = 10_000


def make_docs(num_docs: int, seed: int = 17) -> list[list[list[int]]]:
    """Documents of sentences of words; a word is a start token and 0-2 ## pieces."""
    rng = random.Random(seed)
    docs = []
    for _ in range(num_docs):
        doc = []
        for _ in range(rng.randint(2, 30)):
            sentence = []
            for _ in range(rng.randint(3, 22)):
                sentence.append(rng.randrange(FIRST, PIECE0))
                for _ in range(rng.choices((0, 1, 2), (0.6, 0.25, 0.15))[0]):
                    sentence.append(rng.randrange(PIECE0, len(VOCAB)))
            doc.append(sentence)
        docs.append(doc)
    return docs


DOCS = make_docs(1000)


def generate(whole_word_mask: bool, mask: bool) -> list[dict]:
    rows = []
    for d in range(len(DOCS)):
        for copy in range(COPIES):
            rng = example_rng(5, f"doc{d}", copy, SEQ)
            for row in create_instances_from_document(
                d, DOCS, SEQ, 0.1, 0.15, CAP, 0.5, IDS, rng, whole_word_mask, mask=mask
            ):
                row["doc_copy"] = (d, copy)
                rows.append(row)
    return rows


def mask_dynamically(rows: list[dict], epoch: int = 0) -> list[dict]:
    """What the loader does each epoch: the one rule, a generator per (example, epoch)."""
    out = []
    for i, row in enumerate(rows):
        rng = example_rng(5, f"example{i}", epoch, SEQ)
        tokens = row["input_ids"]
        ids, positions, labels = create_masked_lm_predictions(tokens, 0.15, CAP, IDS, rng)
        out.append({**row, "input_ids": ids, "masked_positions": positions, "masked_ids": labels})
    return out


@pytest.fixture(scope="module")
def modes() -> dict[str, list[dict]]:
    unmasked = generate(whole_word_mask=False, mask=False)
    return {
        "static": generate(whole_word_mask=False, mask=True),
        "whole_word": generate(whole_word_mask=True, mask=True),
        "dynamic": mask_dynamically(unmasked),
        "unmasked": unmasked,
    }


def originals(row) -> list[int]:
    ids = list(row["input_ids"])
    for p, t in zip(row["masked_positions"], row["masked_ids"], strict=True):
        ids[p] = t
    return ids


def shares(rows) -> dict[str, float]:
    masked = eligible = as_mask = kept = replaced = 0
    for row in rows:
        orig = originals(row)
        eligible += len(orig) - 3
        masked += len(row["masked_positions"])
        for p in row["masked_positions"]:
            out = row["input_ids"][p]
            as_mask += out == MASK
            kept += out == orig[p]
            replaced += out not in (MASK, orig[p])
    return {
        "masked": masked / eligible,
        "mask": as_mask / masked,
        "kept": kept / masked,
        "replaced": replaced / masked,
    }


@pytest.mark.parametrize("mode", ["static", "whole_word", "dynamic"])
def test_predicted_share_and_80_10_10(modes, mode):
    rows = modes[mode]
    assert len(rows) >= MIN_EXAMPLES
    # Below the cap: round(128 * 0.15) = 19 < 20, so the 15% is never cut.
    assert all(len(r["masked_positions"]) < CAP for r in rows)
    s = shares(rows)
    assert s["masked"] == pytest.approx(0.15, abs=0.005)
    assert s["mask"] == pytest.approx(0.80, abs=0.01)
    assert s["kept"] == pytest.approx(0.10, abs=0.01)
    assert s["replaced"] == pytest.approx(0.10, abs=0.01)


@pytest.mark.parametrize("mode", ["static", "whole_word", "dynamic"])
def test_no_special_masked_or_used_and_labels_are_originals(modes, mode):
    learned = set(IDS.random_ids)
    unmasked_of = {}
    for row in modes["unmasked"]:
        unmasked_of.setdefault(row["doc_copy"], []).append(row["input_ids"])
    for row in modes[mode]:
        orig = originals(row)
        positions = row["masked_positions"]
        assert positions == sorted(set(positions)) and len(positions) >= 1
        for p in positions:
            assert orig[p] in learned  # never [CLS]/[SEP] (nor any other special)
            out = row["input_ids"][p]
            assert out == MASK or out in learned  # replacements: learned pieces only
        assert orig.count(CLS) == 1 and orig.count(SEP) == 2
        assert all(row["input_ids"][i] == orig[i] for i in set(range(len(orig))) - set(positions))
    if mode == "dynamic":  # labels are the tokens of the unmasked pairs the shards hold
        for row, plain in zip(modes["dynamic"], modes["unmasked"], strict=True):
            assert originals(row) == plain["input_ids"]


def test_static_and_dynamic_draw_from_the_same_ids_in_the_same_proportions(modes):
    def replacements(rows):
        return [
            row["input_ids"][p]
            for row in rows
            for p, t in zip(row["masked_positions"], row["masked_ids"], strict=True)
            if row["input_ids"][p] not in (MASK, t)
        ]

    static, dynamic = replacements(modes["static"]), replacements(modes["dynamic"])
    learned = set(IDS.random_ids)
    assert set(static) <= learned and set(dynamic) <= learned
    # Uniform over the learned pieces: starts vs ## pieces in their vocabulary proportion.
    expected = len(PIECES) / len(learned)
    for drawn in (static, dynamic):
        share = sum(t >= PIECE0 for t in drawn) / len(drawn)
        assert share == pytest.approx(expected, abs=0.03)
    s, d = shares(modes["static"]), shares(modes["dynamic"])
    for key in ("masked", "mask", "kept", "replaced"):
        assert s[key] == pytest.approx(d[key], abs=0.01)


def test_random_next_half_among_multi_sentence_chunks(modes):
    rows = modes["static"]
    multi = [r for r in rows if r["multi_sentence_chunk"]]
    single = [r for r in rows if not r["multi_sentence_chunk"]]
    assert len(multi) >= 8000 and single
    share = sum(r["is_random_next"] for r in multi) / len(multi)
    assert share == pytest.approx(0.5, abs=0.015)
    assert all(r["is_random_next"] for r in single)  # the reference's forced random-next
    overall = sum(r["is_random_next"] for r in rows) / len(rows)
    assert overall > share  # so the overall share sits above one half, as on real text


def test_short_targets_about_ten_percent(modes):
    targets = {}
    for r in modes["static"]:
        targets.setdefault(r["doc_copy"], r["target_seq_length"])
    assert len(targets) == len(DOCS) * COPIES
    short = sum(t < SEQ - 3 for t in targets.values()) / len(targets)
    assert short == pytest.approx(0.1, abs=0.015)


def test_whole_word_masks_never_split_a_word(modes):
    pieces_masked = 0
    for row in modes["whole_word"]:
        orig = originals(row)
        chosen = set(row["masked_positions"])
        word: list[int] = []
        for i, t in enumerate(orig + [SEP]):
            if t in IDS.continuation and word and orig[i - 1] not in (CLS, SEP):
                word.append(i)
                continue
            if word:  # the word just ended: all of it masked, or none
                covered = [p in chosen for p in word]
                assert all(covered) or not any(covered), (word, row["masked_positions"])
                pieces_masked += len(word) > 1 and all(covered)
            word = [i] if t not in (CLS, SEP) else []
    assert pieces_masked > 1000


def test_plain_masking_does_split_words(modes):
    # The control: without whole-word masking, some word is masked in part.
    split = 0
    for row in modes["static"]:
        orig, chosen = originals(row), set(row["masked_positions"])
        for p in chosen:
            if p + 1 < len(orig) and orig[p + 1] in IDS.continuation and p + 1 not in chosen:
                split += 1
    assert split > 100
