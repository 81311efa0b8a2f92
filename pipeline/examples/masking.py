"""Pure MLM + NSP example creation, after google-research/bert ``create_pretraining_data.py``.

The functions mirror the reference's (``truncate_seq_pair``, ``create_masked_lm_predictions``,
``create_instances_from_document``), with the random generator passed in explicitly and the
reference's draws in the reference's places (but for point 1), so its semantics carry over.
How this differs from the reference:

1. Tokens are ids, not strings; the special ids come from the vocabulary (:class:`VocabIds`).
   Without whole-word masking, the positions are drawn with ``rng.sample`` instead of shuffling
   every candidate (same distribution, a fraction of the draws: this is the hot loop).
2. No global FLAGS: every knob is an argument (``random_next_prob`` replaces the literal 0.5).
3. The "random token" of the 10% branch is drawn from the learned tokens only, never from
   ``[PAD]``, ``[unusedN]``, ``[CLS]`` ... (the reference draws from the whole vocabulary, so
   ~0.3% of its replacements are ids the model never otherwise sees).
4. An instance is a row dict of the examples Parquet schema (``pipeline.schema.parquet.example_schema``):
   unpadded ``input_ids``, ``len_a`` (the length of ``[CLS] A [SEP]``), sorted
   ``masked_positions``, the original ``masked_ids``, ``is_random_next``.
5. With whole-word masking a ``##`` piece right after ``[SEP]`` (B cut mid-word by truncation)
   starts a word of its own; the reference would glue it to A's last word across the ``[SEP]``.
6. The generator is seeded per (seed, doc_id, copy, max_seq_length) through blake2b
   (:func:`example_rng`), never from the order in which a worker meets the documents.

The hot paths draw what ``rng.sample``, ``rng.shuffle``, ``rng.randint`` and a one-token-at-a-time
truncation draw, number for number, without their per-draw Python calls (:func:`sample_range`,
:func:`shuffle_list`, ``rng._randbelow``, cuts counted then made once): the shards are
byte-identical to those of the plain calls, and tests/pipeline/test_masking_draws.py compares each
against the plain call and the state after.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import random
import re
from collections.abc import Sequence
from typing import Any

_SPECIAL = re.compile(r"^\[(PAD|UNK|CLS|SEP|MASK|unused\d+)\]$")


@dataclasses.dataclass(frozen=True)
class VocabIds:
    """The ids example creation needs, looked up from a vocabulary."""

    cls_id: int
    sep_id: int
    mask_id: int
    random_ids: tuple[int, ...]
    """Candidates for the 10% random replacement: every non-special token."""
    continuation: frozenset[int]
    """Ids of ``##`` pieces: whole-word masking keeps them with the word they continue."""

    @classmethod
    def from_vocab(cls, vocab: Sequence[str]) -> VocabIds:
        ids = {t: i for i, t in enumerate(vocab)}
        missing = [t for t in ("[CLS]", "[SEP]", "[MASK]") if t not in ids]
        if missing:
            raise ValueError(f"vocabulary lacks the special tokens {missing}")
        return cls(
            cls_id=ids["[CLS]"],
            sep_id=ids["[SEP]"],
            mask_id=ids["[MASK]"],
            random_ids=tuple(i for i, t in enumerate(vocab) if not _SPECIAL.match(t)),
            continuation=frozenset(i for i, t in enumerate(vocab) if t.startswith("##")),
        )


def example_rng(seed: int, doc_id: str, copy: int, max_seq_length: int) -> random.Random:
    """A generator seeded from a stable digest of (seed, doc_id, copy, max_seq_length)."""
    key = json.dumps([seed, doc_id, copy, max_seq_length]).encode("utf-8")
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Truncate a pair in place to ``max_num_tokens`` in total, one token at a time.

    The longer side loses a token, from its front or its back at random (to avoid biasing the
    model towards sequences that always end where the text ends). The reference's loop, one
    ``rng.random()`` per token removed, in its order; the tokens are cut once at the end.
    """
    lengths = [len(tokens_a), len(tokens_b)]
    if lengths[0] + lengths[1] <= max_num_tokens:
        return
    draw = rng.random
    fronts, ends = [0, 0], list(lengths)  # per side: tokens cut at the front, where the kept ones end
    while lengths[0] + lengths[1] > max_num_tokens:
        side = 0 if lengths[0] > lengths[1] else 1
        assert lengths[side] >= 1
        if draw() < 0.5:
            fronts[side] += 1
        else:
            ends[side] -= 1
        lengths[side] -= 1
    for tokens, front, end in zip((tokens_a, tokens_b), fronts, ends, strict=True):
        del tokens[end:], tokens[:front]


def create_masked_lm_predictions(
    tokens: list[int],
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    vocab: VocabIds,
    rng: random.Random,
    whole_word_mask: bool = False,
) -> tuple[list[int], list[int], list[int]]:
    """Mask ``tokens`` (``[CLS] A [SEP] B [SEP]``): (output tokens, positions, original ids).

    ``round(len * masked_lm_prob)`` positions (at least 1, at most ``max_predictions_per_seq``)
    are predicted, never ``[CLS]``/``[SEP]``. With ``whole_word_mask`` a word and its ``##``
    pieces are masked together or not at all.
    """
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
    chosen = _choose_masked_positions(tokens, num_to_predict, vocab, rng, whole_word_mask)

    output_tokens = list(tokens)
    draw, below = rng.random, rng._randbelow  # randint(0, n - 1) is _randbelow(n): the same draw
    random_ids = vocab.random_ids
    num_random = len(random_ids)
    mask_id = vocab.mask_id
    for index in chosen:
        if draw() < 0.8:
            # 80% of the time, replace with [MASK]
            output_tokens[index] = mask_id
        elif draw() >= 0.5:
            # 10% of the time, replace with a random token (the other 10%: keep the original)
            output_tokens[index] = random_ids[below(num_random)]
    positions = sorted(chosen)
    return output_tokens, positions, [tokens[p] for p in positions]


def _choose_masked_positions(
    tokens: list[int],
    num_to_predict: int,
    vocab: VocabIds,
    rng: random.Random,
    whole_word_mask: bool,
) -> list[int]:
    special = (vocab.cls_id, vocab.sep_id)
    if not whole_word_mask:
        # The reference shuffles every candidate and takes the first num_to_predict: the same
        # distribution as a sample, which draws num_to_predict numbers instead of len(tokens).
        # Drawn as rng.sample(candidates, k) draws (see sample_range), then mapped to positions.
        skipped = _special_positions(tokens, vocab)
        num_candidates = len(tokens) - len(skipped)
        picks = sample_range(rng, num_candidates, min(num_to_predict, num_candidates))
        if len(skipped) == 3 and skipped[2] == len(tokens) - 1 and skipped[0] == 0:  # [CLS] A [SEP] B [SEP]
            sep = skipped[1]
            return [j + 1 if j < sep - 1 else j + 2 for j in picks]
        return [_skip(j, skipped) for j in picks]

    # Words: a position starts one unless it is a ## piece right after a non-special token (a ##
    # piece continues the word before it, but never across [SEP]: B may start mid-word after
    # truncation, and the reference would join it to A's last word). [CLS]/[SEP] are words of
    # their own, left out.
    continuation = vocab.continuation
    starts = [
        i for i, token in enumerate(tokens) if token not in continuation or i == 0 or tokens[i - 1] in special
    ]  # fmt: skip
    end_of = dict(zip(starts, [*starts[1:], len(tokens)]))  # a word's first position -> its end
    words = [a for a in starts if tokens[a] not in special]
    shuffle_list(rng, words)
    chosen: list[int] = []
    for start in words:
        if len(chosen) >= num_to_predict:
            break
        # A whole word that would overshoot the budget is skipped, not cut.
        if len(chosen) + end_of[start] - start > num_to_predict:
            continue
        chosen.extend(range(start, end_of[start]))  # words are disjoint: no index is covered twice
    return chosen


def _special_positions(tokens: list[int], vocab: VocabIds) -> list[int]:
    """Where ``[CLS]`` and ``[SEP]`` are in ``tokens``, in order (two scans in C, not a loop per token)."""
    out: list[int] = []
    for value in (vocab.cls_id, vocab.sep_id):
        at = -1
        for _ in range(tokens.count(value)):
            at = tokens.index(value, at + 1)
            out.append(at)
    out.sort()
    return out


def shuffle_list(rng: random.Random, items: list) -> None:
    """``rng.shuffle(items)``, draw for draw: CPython's swaps from the end, each index from
    ``_randbelow`` (``getrandbits`` until below the bound), without its per-draw method calls."""
    getrandbits = rng.getrandbits
    for i in reversed(range(1, len(items))):
        bound = i + 1
        bits = bound.bit_length()
        j = getrandbits(bits)
        while j >= bound:
            j = getrandbits(bits)
        items[i], items[j] = items[j], items[i]


@functools.cache
def _set_size(k: int) -> int:
    """``Random.sample``'s threshold: above it, a set of the numbers taken is smaller than a pool."""
    return 21 + (4 ** math.ceil(math.log(k * 3, 4)) if k > 5 else 0)


def sample_range(rng: random.Random, n: int, k: int) -> list[int]:
    """``rng.sample(range(n), k)``, draw for draw, leaving ``rng`` in the same state.

    ``random.Random.sample`` as CPython writes it (a pool of ``n`` for small ``n``, else a set of
    the numbers already taken; every number from ``_randbelow``: ``getrandbits`` of ``n``'s bit
    length until one is below ``n``), without its per-draw method calls: this is the masking's hot
    loop. tests/pipeline/test_masking_draws.py checks it against ``rng.sample`` itself.
    """
    if not 0 <= k <= n:
        raise ValueError("Sample larger than population or is negative")
    getrandbits = rng.getrandbits
    result = [0] * k
    if n <= _set_size(k):
        pool = list(range(n))
        for i in range(k):
            left = n - i
            bits = left.bit_length()
            j = getrandbits(bits)
            while j >= left:
                j = getrandbits(bits)
            result[i] = pool[j]
            pool[j] = pool[left - 1]
    else:
        bits = n.bit_length()
        selected: set[int] = set()
        for i in range(k):
            j = getrandbits(bits)
            while j >= n or j in selected:
                j = getrandbits(bits)
            selected.add(j)
            result[i] = j
    return result


def _skip(j: int, skipped: list[int]) -> int:
    """The position of the ``j``-th token not at a position of ``skipped`` (sorted)."""
    for at in skipped:
        if at > j:
            break
        j += 1
    return j


def create_instances_from_document(
    doc_index: int,
    docs: Sequence[Sequence[Sequence[int]]],
    max_seq_length: int,
    short_seq_prob: float,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    random_next_prob: float,
    vocab: VocabIds,
    rng: random.Random,
    whole_word_mask: bool = False,
    mask: bool = True,
) -> list[dict[str, Any]]:
    """The examples of ``docs[doc_index]`` (a list of tokenized sentences, none empty).

    ``mask=False`` (dynamic masking: the loader masks each epoch with
    :func:`create_masked_lm_predictions`) leaves the tokens as they are, with empty
    ``masked_positions``/``masked_ids``. Each row also carries two keys that are not columns:
    ``multi_sentence_chunk``, whether A came from a chunk of two or more sentences (the examples
    for which B is random with ``random_next_prob``; a one-sentence chunk is always
    random-next), and ``target_seq_length``, the document's (short with ``short_seq_prob``).

    Sentences are gathered into chunks of about ``target_seq_length`` tokens; each chunk is cut
    at a random sentence boundary into A and B. B is the real continuation, or (with
    ``random_next_prob``, and always for a one-sentence chunk) a span of another document of
    ``docs``, in which case the chunk's unused sentences are put back for the next example.
    """
    document = docs[doc_index]
    num_sentences = len(document)
    max_num_tokens = max_seq_length - 3  # [CLS], [SEP], [SEP]
    below = rng._randbelow  # rng.randint(a, b) is a + rng._randbelow(b - a + 1): the same draw, no wrappers
    cls_id, sep_id = vocab.cls_id, vocab.sep_id

    # Mostly fill the sequence; sometimes (short_seq_prob) aim shorter, so that the model also
    # sees the short sequences of fine-tuning. Drawn once per document, as in the reference.
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = 2 + below(max_num_tokens - 1)  # randint(2, max_num_tokens)

    instances: list[dict[str, Any]] = []
    current_chunk: list[Sequence[int]] = []
    current_length = 0
    i = 0
    while i < num_sentences:
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == num_sentences - 1 or current_length >= target_seq_length:
            if current_chunk:
                # How many chunk sentences go into A.
                chunk_size = len(current_chunk)
                a_end = 1
                if chunk_size >= 2:
                    a_end = 1 + below(chunk_size - 1)  # randint(1, chunk_size - 1)
                tokens_a = _joined(current_chunk[:a_end])

                if chunk_size == 1 or rng.random() < random_next_prob:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    random_index = _pick_other_document(doc_index, len(docs), rng)
                    random_document = docs[random_index]
                    tokens_b: list[int] = []
                    for j in range(below(len(random_document)), len(random_document)):  # randint(0, len - 1)
                        tokens_b += random_document[j]
                        if len(tokens_b) >= target_b_length:
                            break
                    # The chunk's B sentences were not used: put them back.
                    i -= chunk_size - a_end
                else:
                    is_random_next = False
                    tokens_b = _joined(current_chunk[a_end:])
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                assert tokens_a and tokens_b, "empty segment: documents must hold no empty sentence"

                tokens = [cls_id, *tokens_a, sep_id, *tokens_b, sep_id]
                if mask:
                    output, positions, labels = create_masked_lm_predictions(
                        tokens, masked_lm_prob, max_predictions_per_seq, vocab, rng, whole_word_mask
                    )
                else:
                    output, positions, labels = tokens, [], []
                instances.append(
                    {
                        "input_ids": output,
                        "len_a": len(tokens_a) + 2,
                        "masked_positions": positions,
                        "masked_ids": labels,
                        "is_random_next": is_random_next,
                        "multi_sentence_chunk": chunk_size >= 2,
                        "target_seq_length": target_seq_length,
                    }
                )
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def _joined(segments: Sequence[Sequence[int]]) -> list[int]:
    """The segments' tokens in one list (extended a segment at a time, not a token at a time)."""
    out: list[int] = []
    for segment in segments:
        out += segment
    return out


def _pick_other_document(doc_index: int, num_docs: int, rng: random.Random) -> int:
    # Ten tries, as the reference: with a single document it ends up using itself.
    random_index = doc_index
    for _ in range(10):
        random_index = rng._randbelow(num_docs)  # randint(0, num_docs - 1)
        if random_index != doc_index:
            break
    return random_index
