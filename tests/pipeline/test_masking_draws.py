"""The masking's fast paths draw exactly what the plain ``random.Random`` calls draw.

``pipeline.examples.masking`` replaces ``rng.sample(candidates, k)``, ``rng.randint`` and the
one-token-at-a-time truncation by code without per-draw method calls; the example shards stay
byte-identical only if every number drawn, and the generator's state after, are the same. Each
test runs the plain form (the reference's calls, written out here) beside the fast one on the same
seeds and compares the results and ``rng.getstate()``.
"""

from __future__ import annotations

import random

import pytest

from pipeline.examples.masking import (
    VocabIds,
    _choose_masked_positions,
    create_masked_lm_predictions,
    sample_range,
    shuffle_list,
    truncate_seq_pair,
)

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" if i % 3 else f"##w{i}" for i in range(5, 400)]
IDS = VocabIds.from_vocab(VOCAB)
CLS, SEP, MASK = 2, 3, 4


def plain_truncate(tokens_a, tokens_b, max_num_tokens, rng):
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def plain_words(tokens, num_to_predict, rng):
    """The whole-word choice as the loop the module had: words built token by token, shuffled."""
    cand_indexes, after_special = [], True
    for i, token in enumerate(tokens):
        if token in (CLS, SEP):
            after_special = True
            continue
        if not after_special and token in IDS.continuation:
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])
        after_special = False
    rng.shuffle(cand_indexes)
    chosen = []
    for index_set in cand_indexes:
        if len(chosen) >= num_to_predict:
            break
        if len(chosen) + len(index_set) > num_to_predict:
            continue
        chosen.extend(index_set)
    return chosen


def plain_masking(tokens, chosen, rng):
    out = list(tokens)
    for index in chosen:
        if rng.random() < 0.8:
            out[index] = MASK
        elif rng.random() < 0.5:
            out[index] = tokens[index]
        else:
            out[index] = IDS.random_ids[rng.randint(0, len(IDS.random_ids) - 1)]
    return out


@pytest.mark.parametrize("seed", range(3))
def test_sample_range_draws_what_random_sample_draws(seed):
    """Both of CPython's strategies (a pool for small populations, a set for large ones) and the
    edges: k = 0, k = n, n = 1, and sizes around the switch between them."""
    sizes = (1, 2, 5, 21, 22, 40, 84, 85, 86, 125, 126, 300, 509, 5000)
    cases = [(n, k) for n in sizes for k in sorted({0, 1, 5, 6, 19, 20, 80, n}) if k <= n]
    for n, k in cases:
        fast, plain = random.Random(seed * 1000 + n), random.Random(seed * 1000 + n)
        assert sample_range(fast, n, k) == plain.sample(range(n), k), (n, k)
        assert fast.getstate() == plain.getstate(), (n, k)
    with pytest.raises(ValueError):
        sample_range(random.Random(0), 3, 4)


def test_shuffle_list_draws_what_random_shuffle_draws():
    for n in (0, 1, 2, 3, 17, 100, 1000):
        for seed in range(3):
            fast, plain = random.Random(seed), random.Random(seed)
            a, b = list(range(n)), list(range(n))
            shuffle_list(fast, a)
            plain.shuffle(b)
            assert a == b and fast.getstate() == plain.getstate(), (n, seed)


def test_randbelow_is_randint_from_zero():
    """The masking calls ``rng._randbelow(n)`` where the reference calls ``rng.randint(0, n - 1)``."""
    for n in (1, 2, 3, 7, 8, 9, 395, 4096, 30_000):
        fast, plain = random.Random(n), random.Random(n)
        assert [fast._randbelow(n) for _ in range(50)] == [plain.randint(0, n - 1) for _ in range(50)]
        assert [2 + fast._randbelow(n) for _ in range(5)] == [plain.randint(2, n + 1) for _ in range(5)]
        assert fast.getstate() == plain.getstate()


def test_truncation_draws_what_the_one_token_loop_draws():
    gen = random.Random(5)
    for case in range(400):
        a = list(range(gen.randint(0, 200)))
        b = list(range(1000, 1000 + gen.randint(1, 200)))
        limit = gen.randint(max(1, len(b) // 2), 260)
        fast_a, fast_b, plain_a, plain_b = list(a), list(b), list(a), list(b)
        fast, plain = random.Random(case), random.Random(case)
        truncate_seq_pair(fast_a, fast_b, limit, fast)
        plain_truncate(plain_a, plain_b, limit, plain)
        assert (fast_a, fast_b) == (plain_a, plain_b), case
        assert fast.getstate() == plain.getstate(), case


def _pair(gen: random.Random, specials_inside: bool) -> list[int]:
    a = [gen.randint(5, 399) for _ in range(gen.randint(1, 120))]
    b = [gen.randint(5, 399) for _ in range(gen.randint(1, 120))]
    if specials_inside:  # a text that held "[SEP]" or "[CLS]" tokenizes to their ids
        for _ in range(gen.randint(1, 4)):
            side = a if gen.random() < 0.5 else b
            side.insert(gen.randint(0, len(side)), gen.choice((CLS, SEP)))
    return [CLS, *a, SEP, *b, SEP]


@pytest.mark.parametrize("specials_inside", [False, True])
def test_positions_and_masks_draw_what_the_reference_draws(specials_inside):
    """The positions are ``rng.sample`` of the non-special positions, whatever the layout; then
    the 80/10/10 choice per position, the random token from ``randint``."""
    gen = random.Random(11 + specials_inside)
    for case in range(300):
        tokens = _pair(gen, specials_inside)
        if gen.random() < 0.2:  # full-sentences rows: [CLS] s1 [SEP] s2 ... [SEP], no B
            tokens = [CLS, *(t for t in tokens if t not in (CLS, SEP)), SEP]
        k = gen.randint(1, 30)
        fast, plain = random.Random(case), random.Random(case)
        candidates = [i for i, t in enumerate(tokens) if t not in (CLS, SEP)]
        expected = plain.sample(candidates, min(k, len(candidates)))
        assert _choose_masked_positions(tokens, k, IDS, fast, False) == expected, case
        assert fast.getstate() == plain.getstate()

        fast, plain = random.Random(case), random.Random(case)
        out, positions, labels = create_masked_lm_predictions(tokens, 0.15, k, IDS, fast)
        n = min(k, max(1, round(len(tokens) * 0.15)))
        chosen = plain.sample(candidates, min(n, len(candidates)))
        assert out == plain_masking(tokens, chosen, plain), case
        assert positions == sorted(chosen) and labels == [tokens[p] for p in positions]
        assert fast.getstate() == plain.getstate(), case


@pytest.mark.parametrize("specials_inside", [False, True])
def test_whole_words_draw_what_the_token_loop_draws(specials_inside):
    """Whole-word masking: words are a token and its ## pieces, never across [CLS]/[SEP] (a ##
    piece first in A or B, or right after a special inside, starts a word); shuffled, then
    taken while they fit the budget."""
    gen = random.Random(21 + specials_inside)
    for case in range(300):
        tokens = _pair(gen, specials_inside)
        if gen.random() < 0.3:  # a ## piece first in B (B cut mid-word) or first in A
            tokens[gen.choice((1, tokens.index(SEP) + 1 if tokens.index(SEP) + 1 < len(tokens) - 1 else 1))] = 6
        k = gen.randint(1, 30)
        fast, plain = random.Random(case), random.Random(case)
        assert _choose_masked_positions(tokens, k, IDS, fast, True) == plain_words(tokens, k, plain), case
        assert fast.getstate() == plain.getstate(), case
