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
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
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
    model towards sequences that always end where the text ends).
    """
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc) >= 1
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


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
    for index in chosen:
        if rng.random() < 0.8:
            # 80% of the time, replace with [MASK]
            masked_token = vocab.mask_id
        elif rng.random() < 0.5:
            # 10% of the time, keep the original
            masked_token = tokens[index]
        else:
            # 10% of the time, replace with a random token
            masked_token = vocab.random_ids[rng.randint(0, len(vocab.random_ids) - 1)]
        output_tokens[index] = masked_token
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
        candidates = [i for i, t in enumerate(tokens) if t not in special]
        return rng.sample(candidates, min(num_to_predict, len(candidates)))

    cand_indexes: list[list[int]] = []
    after_special = True
    for i, token in enumerate(tokens):
        if token in special:
            after_special = True
            continue
        # A ## piece continues the word before it, but never across [SEP] (B may start
        # mid-word after truncation; the reference would join it to A's last word).
        if not after_special and token in vocab.continuation:
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])
        after_special = False
    rng.shuffle(cand_indexes)
    chosen: list[int] = []
    for index_set in cand_indexes:
        if len(chosen) >= num_to_predict:
            break
        # A whole word that would overshoot the budget is skipped, not cut.
        if len(chosen) + len(index_set) > num_to_predict:
            continue
        chosen.extend(index_set)  # words are disjoint: no index is covered twice
    return chosen


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
    max_num_tokens = max_seq_length - 3  # [CLS], [SEP], [SEP]

    # Mostly fill the sequence; sometimes (short_seq_prob) aim shorter, so that the model also
    # sees the short sequences of fine-tuning. Drawn once per document, as in the reference.
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances: list[dict[str, Any]] = []
    current_chunk: list[Sequence[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                # How many chunk sentences go into A.
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a = [t for seg in current_chunk[:a_end] for t in seg]

                tokens_b: list[int] = []
                if len(current_chunk) == 1 or rng.random() < random_next_prob:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    random_index = _pick_other_document(doc_index, len(docs), rng)
                    random_document = docs[random_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    # The chunk's B sentences were not used: put them back.
                    i -= len(current_chunk) - a_end
                else:
                    is_random_next = False
                    tokens_b = [t for seg in current_chunk[a_end:] for t in seg]
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                assert tokens_a and tokens_b, "empty segment: documents must hold no empty sentence"

                tokens = [vocab.cls_id, *tokens_a, vocab.sep_id, *tokens_b, vocab.sep_id]
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
                        "multi_sentence_chunk": len(current_chunk) >= 2,
                        "target_seq_length": target_seq_length,
                    }
                )
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def _pick_other_document(doc_index: int, num_docs: int, rng: random.Random) -> int:
    # Ten tries, as the reference: with a single document it ends up using itself.
    random_index = doc_index
    for _ in range(10):
        random_index = rng.randint(0, num_docs - 1)
        if random_index != doc_index:
            break
    return random_index
