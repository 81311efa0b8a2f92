"""Typed configuration of the examples stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.beam.config import BeamConfig
from pipeline.schema.config import LIMITS, check, check_at_most
from pipeline.schema.objectives import DEFAULT_OBJECTIVE, derive_max_predictions, get_objective

MASKING_MODES = ("static", "dynamic")
SEGMENTERS = ("none", "jieba", "fugashi")  # pipeline.examples.segment.SEGMENTERS


@dataclass(frozen=True)
class ExamplesConfig:
    """Pretraining example creation (MLM + NSP by default, with the reference
    create_pretraining_data.py semantics; see ``objective``)."""

    objective: str = DEFAULT_OBJECTIVE
    """The pretraining objective, a row of pipeline.schema.objectives.OBJECTIVES: "mlm+nsp" (BERT),
    "mlm" (RoBERTa's FULL-SENTENCES, no sentence-level task) or "sop" (ALBERT's sentence order)."""
    max_seq_lengths: tuple[int, ...] = (128, 512)
    """One set of shards per length: {root}/examples/seq{N}/."""
    max_predictions_per_seq: tuple[int, ...] = ()
    """Cap on masked positions, one per entry of max_seq_lengths; empty: derived from
    masked_lm_prob (length x rate rounded up to a multiple of 5: 20 and 80 at 128 and 512 for 15%)."""
    masked_lm_prob: float = 0.15
    """Share of a sequence's tokens chosen for MLM (80% [MASK], 10% random, 10% kept), up to
    max_predictions_per_seq; any value in (0, 1) (ModernBERT: 0.3)."""
    short_seq_prob: float = 0.1
    """Share of examples made shorter than max_seq_length (a random target length), so the model
    also sees short inputs."""
    random_next_prob: float = 0.5
    """Share of NSP pairs whose B is a random span from another document (is_random_next)."""
    dupe_factor: int = 5
    """Copies of each document: each masked differently ("static"), or each a different draw of
    A/B pairs left unmasked ("dynamic")."""
    masking: str = "static"
    """"static": masks written in the shards (the paper). "dynamic": unmasked pairs in the shards
    (empty masked_positions/masked_ids), masked each epoch by the loader (RoBERTa) with
    pipeline.examples.masking.create_masked_lm_predictions."""
    whole_word_mask: bool = False
    """Mask a word and all its ## pieces together (the reference's do_whole_word_mask)."""
    segmenter: str = "none"
    """Word boundaries for whole-word masking of CJK ideographs: "none", "jieba" (Chinese) or
    "fugashi" (Japanese, with unidic-lite); needs the 'cjk' extra and whole_word_mask."""
    seed: int = 12345
    """Seed of the masking and pairing; each document's generator is derived from it and a
    stable digest of its id, so the output does not depend on the worker count."""
    num_shards: int = 4
    """Parquet files per sequence length (row counts within one of each other)."""
    docs_per_bucket: int = 4096
    """Documents per random-next bucket, on average: random-next spans come from the other
    documents of a document's bucket (a stable hash of doc_id), not the whole corpus."""
    bucket_chars: int = 128 << 20
    """At most about this many characters of text per bucket (more buckets when documents are
    long): a bucket's tokens are what a worker holds in memory at once."""
    beam: BeamConfig = field(default_factory=BeamConfig)

    def __post_init__(self):
        get_objective(self.objective)
        check(len(self.max_seq_lengths) >= 1, "examples.max_seq_lengths", "must not be empty")
        check(
            len(self.max_predictions_per_seq) in (0, len(self.max_seq_lengths)),
            "examples.max_predictions_per_seq",
            "needs one entry per examples.max_seq_lengths entry (or none: derived from examples.masked_lm_prob)",
        )
        for n in self.max_seq_lengths:
            check(n >= 16, "examples.max_seq_lengths", f"{n} is too short (min 16)")
            check_at_most(n, LIMITS.positions, "examples.max_seq_lengths", "positions")
        for p, n in zip(self.max_predictions_per_seq, self.max_seq_lengths):
            check(0 < p < n, "examples.max_predictions_per_seq", f"{p} must lie in (0, {n})")
        p = self.masked_lm_prob
        check(0.0 < p < 1.0, "examples.masked_lm_prob", f"must lie in (0, 1), got {p}")
        for name in ("short_seq_prob", "random_next_prob"):
            v = getattr(self, name)
            check(0.0 <= v <= 1.0, f"examples.{name}", f"must lie in [0, 1], got {v}")
        check(self.dupe_factor >= 1, "examples.dupe_factor", "must be >= 1")
        check_at_most(self.dupe_factor, LIMITS.dupe_factor, "examples.dupe_factor", "copies of the corpus on disk")
        check(self.num_shards >= 1, "examples.num_shards", "must be >= 1")
        check_at_most(self.num_shards, LIMITS.shards, "examples.num_shards", "files per length")
        check(
            self.masking in MASKING_MODES,
            "examples.masking",
            f"must be one of {MASKING_MODES}, got {self.masking!r}",
        )
        check(
            self.segmenter in SEGMENTERS,
            "examples.segmenter",
            f"must be one of {SEGMENTERS}, got {self.segmenter!r}",
        )
        check(
            self.segmenter == "none" or self.whole_word_mask,
            "examples.segmenter",
            "word boundaries only serve whole-word masking: set examples.whole_word_mask",
        )
        check(self.docs_per_bucket >= 2, "examples.docs_per_bucket", "must be >= 2")
        check(self.bucket_chars >= 1 << 20, "examples.bucket_chars", "must be >= 1 MiB")

    def max_predictions(self, max_seq_length: int) -> int:
        """The cap of masked positions at ``max_seq_length``: the one set, else the derived one."""
        if self.max_predictions_per_seq:
            return self.max_predictions_per_seq[self.max_seq_lengths.index(max_seq_length)]
        return derive_max_predictions(max_seq_length, self.masked_lm_prob)
