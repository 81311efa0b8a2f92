"""The example builders of the pretraining objectives (``pipeline.schema.objectives.OBJECTIVES``).

A builder turns one bucket's documents (sorted by ``doc_id``) into rows, for one sequence length:
``builder(doc_ids, docs, length, max_predictions, config, vocab)`` yields
``(doc_id, copy, index, row)``; ``(doc_id, copy, index)`` is the row's place in the global order
(``pipeline.examples.job.example_key``) and must be unique. A row holds its objective's columns
plus keys that are not columns, for the stage's counters: ``special_tokens`` (the [CLS]/[SEP]
tokens, never masked) and, with a sentence-level label, ``multi_sentence_chunk``. The masking is
the one rule of :mod:`pipeline.examples.masking`; every draw comes from a generator seeded by a
stable digest (:func:`~pipeline.examples.masking.example_rng`), never by arrival order.

Adding an objective: a builder here and a row in the table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Iterator, Sequence
from typing import Any

from pipeline.examples.config import ExamplesConfig
from pipeline.examples.masking import (
    VocabIds,
    create_instances_from_document,
    create_masked_lm_predictions,
    example_rng,
    truncate_seq_pair,
)
from pipeline.schema.objectives import get_objective

Rows = Iterator[tuple[str, int, int, dict[str, Any]]]
Docs = Sequence[Sequence[Sequence[int]]]


def builder_of(objective: str):
    """The builder function of an objective's row."""
    return globals()[get_objective(objective).builder]


def _mask(tokens: list[int], max_predictions: int, cfg: ExamplesConfig, vocab: VocabIds, rng: random.Random):
    if cfg.masking != "static":
        return tokens, [], []
    return create_masked_lm_predictions(tokens, cfg.masked_lm_prob, max_predictions, vocab, rng, cfg.whole_word_mask)


# -- mlm+nsp: the paper's A/B pairs, B random half the time ---------------------------------------
def nsp_pairs(
    doc_ids: Sequence[str], docs: Docs, length: int, max_predictions: int, cfg: ExamplesConfig, vocab: VocabIds
) -> Rows:
    """The reference's instances (:func:`~pipeline.examples.masking.create_instances_from_document`)."""
    for index, doc_id in enumerate(doc_ids):
        view = docs.with_current(index) if hasattr(docs, "with_current") else docs  # its sentences as lists once
        for copy in range(cfg.dupe_factor):
            rng = example_rng(cfg.seed, doc_id, copy, length)
            instances = create_instances_from_document(
                index,
                view,
                max_seq_length=length,
                short_seq_prob=cfg.short_seq_prob,
                masked_lm_prob=cfg.masked_lm_prob,
                max_predictions_per_seq=max_predictions,
                random_next_prob=cfg.random_next_prob,
                vocab=vocab,
                rng=rng,
                whole_word_mask=cfg.whole_word_mask,
                mask=cfg.masking == "static",
            )
            for k, row in enumerate(instances):
                row["special_tokens"] = 3
                yield doc_id, copy, k, row


# -- sop: two consecutive spans of one document, swapped half the time ----------------------------
def sentence_order(
    doc_ids: Sequence[str], docs: Docs, length: int, max_predictions: int, cfg: ExamplesConfig, vocab: VocabIds
) -> Rows:
    """ALBERT's sentence-order prediction: A and B are consecutive spans of one document (a chunk
    cut at a random sentence boundary; a one-sentence chunk at a random token), and with
    ``random_next_prob`` they are swapped (``is_swapped``, the negative). Chunking and truncation
    follow the reference's MLM + NSP instances."""
    for doc_id, document in zip(doc_ids, docs, strict=True):
        for copy in range(cfg.dupe_factor):
            rng = example_rng(cfg.seed, doc_id, copy, length)
            for k, row in enumerate(_order_instances(document, length, max_predictions, cfg, vocab, rng)):
                yield doc_id, copy, k, row


def _order_instances(
    document: Sequence[Sequence[int]],
    length: int,
    max_predictions: int,
    cfg: ExamplesConfig,
    vocab: VocabIds,
    rng: random.Random,
) -> Iterator[dict[str, Any]]:
    max_num_tokens = length - 3  # [CLS], [SEP], [SEP]
    target = max_num_tokens
    if rng.random() < cfg.short_seq_prob:
        target = rng.randint(2, max_num_tokens)
    chunk: list[Sequence[int]] = []
    current = 0
    for i, sentence in enumerate(document):
        chunk.append(sentence)
        current += len(sentence)
        if i < len(document) - 1 and current < target:
            continue
        if len(chunk) >= 2:
            a_end = rng.randint(1, len(chunk) - 1)
            tokens_a = [t for s in chunk[:a_end] for t in s]
            tokens_b = [t for s in chunk[a_end:] for t in s]
        else:  # one sentence: cut at a token (a one-token sentence makes no pair)
            only = list(chunk[0])
            if len(only) < 2:
                chunk, current = [], 0
                continue
            cut = rng.randint(1, len(only) - 1)
            tokens_a, tokens_b = only[:cut], only[cut:]
        multi = len(chunk) >= 2
        chunk, current = [], 0
        truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
        swapped = rng.random() < cfg.random_next_prob
        if swapped:
            tokens_a, tokens_b = tokens_b, tokens_a
        tokens = [vocab.cls_id, *tokens_a, vocab.sep_id, *tokens_b, vocab.sep_id]
        output, positions, labels = _mask(tokens, max_predictions, cfg, vocab, rng)
        yield {
            "input_ids": output,
            "len_a": len(tokens_a) + 2,
            "masked_positions": positions,
            "masked_ids": labels,
            "is_swapped": swapped,
            "multi_sentence_chunk": multi,
            "special_tokens": 3,
        }


# -- mlm: RoBERTa's FULL-SENTENCES ----------------------------------------------------------------
def _stream_order(seed: int, copy: int, doc_id: str) -> bytes:
    return hashlib.blake2b(json.dumps([seed, copy, doc_id]).encode("utf-8"), digest_size=8).digest()


def full_sentences(
    doc_ids: Sequence[str], docs: Docs, length: int, max_predictions: int, cfg: ExamplesConfig, vocab: VocabIds
) -> Rows:
    """``[CLS] s1 s2 ... [SEP] t1 t2 ... [SEP]``: whole sentences packed contiguously up to the
    length, crossing into the next document with a ``[SEP]`` between them; one segment, no
    sentence-level label. Each copy walks the bucket's documents in an order of its own (a
    stable digest of (seed, copy, doc_id)); a sentence longer than the room left starts the next
    example (cut to the length when it alone is longer). A row is keyed by the document its first
    sentence comes from; ``short_seq_prob`` shortens an example's target as in the reference."""
    max_tokens = length - 2  # [CLS] ... [SEP]
    for copy in range(cfg.dupe_factor):
        order = sorted(range(len(doc_ids)), key=lambda i, copy=copy: _stream_order(cfg.seed, copy, doc_ids[i]))
        started: dict[str, int] = {}
        seq: list[int] = []
        head: _Head | None = None
        for i in order:
            doc_id, first = doc_ids[i], True
            for sentence in docs[i]:
                if head is not None and len(sentence) > head.target - len(seq) - (1 if first else 0):
                    yield _packed_row(head, seq, copy, max_predictions, cfg, vocab)
                    seq, head = [], None
                if head is None:
                    head = _Head.open(doc_id, started, copy, length, max_tokens, cfg)
                elif first:
                    seq.append(vocab.sep_id)
                seq.extend(sentence[: head.target - len(seq)])
                first = False
                if len(seq) >= head.target:
                    yield _packed_row(head, seq, copy, max_predictions, cfg, vocab)
                    seq, head = [], None
        if head is not None and seq:
            yield _packed_row(head, seq, copy, max_predictions, cfg, vocab)


@dataclasses.dataclass(frozen=True)
class _Head:
    """The start of a packed example: its document, its index there, its generator and target."""

    doc_id: str
    index: int
    rng: random.Random
    target: int

    @classmethod
    def open(cls, doc_id: str, started: dict[str, int], copy: int, length: int, max_tokens: int, cfg) -> _Head:
        k = started.get(doc_id, 0)
        started[doc_id] = k + 1
        rng = example_rng(cfg.seed, f"{doc_id}#{k}", copy, length)
        target = max_tokens
        if rng.random() < cfg.short_seq_prob:
            target = rng.randint(2, max_tokens)
        return cls(doc_id, k, rng, target)


def _packed_row(head: _Head, seq: list[int], copy: int, max_predictions: int, cfg: ExamplesConfig, vocab: VocabIds):
    tokens = [vocab.cls_id, *seq, vocab.sep_id]
    output, positions, labels = _mask(tokens, max_predictions, cfg, vocab, head.rng)
    row = {
        "input_ids": output,
        "masked_positions": positions,
        "masked_ids": labels,
        "special_tokens": 2 + seq.count(vocab.sep_id),
    }
    return head.doc_id, copy, head.index, row
