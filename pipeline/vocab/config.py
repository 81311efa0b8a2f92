"""Typed configuration of the vocab stage."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.schema.config import LIMITS, check, check_at_most


@dataclass(frozen=True)
class VocabConfig:
    """WordPiece vocabulary in Google's vocab.txt layout."""

    vocab_size: int = 30522
    """Total entries including [PAD], [unused*], [UNK], [CLS], [SEP], [MASK]."""
    min_frequency: int = 2
    """A merge (a WordPiece candidate) must occur at least this many times in the training
    sentences to enter the vocabulary."""
    lowercase: bool = True
    """Lower-case and strip accents before splitting (an "uncased" vocabulary, as Google's
    uncased models); false keeps case (a "cased" one)."""
    num_unused: int = 99
    """[unused0..N-1] slots after [PAD], as in Google's released vocabularies."""
    max_sentences: int = 0
    """Train on at most this many sentences (0: all)."""
    sample_fraction: float = 1.0
    """Train on this share of the documents, picked by a stable digest of doc_id (the same
    documents on every run, spread over the whole corpus rather than its first files)."""

    def __post_init__(self):
        check(
            0.0 < self.sample_fraction <= 1.0,
            "vocab.sample_fraction",
            f"must lie in (0, 1], got {self.sample_fraction}",
        )
        check(self.max_sentences >= 0, "vocab.max_sentences", "must be >= 0 (0: all)")
        check(self.num_unused >= 0, "vocab.num_unused", "must be >= 0")
        check(
            self.vocab_size > self.num_unused + 5 + 100,
            "vocab.vocab_size",
            f"must exceed the {self.num_unused + 5} special entries by at least 100",
        )
        check(self.min_frequency >= 1, "vocab.min_frequency", "must be >= 1")
        check_at_most(self.vocab_size, LIMITS.vocab_size, "vocab.vocab_size", "embedding rows")
