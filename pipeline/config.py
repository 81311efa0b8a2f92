"""Typed configuration of the data stages (corpus, vocab, examples).

Each dataclass validates itself in ``__post_init__``; a bad value fails at load, before any work
starts, with a message naming the field.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from pipeline.schema.config import check


@dataclass(frozen=True)
class BeamConfig:
    """How a Beam job runs: the local runner by default; Dataflow, Flink or Spark by setting the
    runner and its options here (``--set corpus.beam.runner=DataflowRunner``). Every field maps
    to one Beam pipeline option (see :func:`pipeline.beam_io.beam_args`); ``options`` and
    ``extra_args`` pass anything else through as it is."""

    runner: str = "FnApiRunner"
    """Beam runner. FnApiRunner runs offline; DataflowRunner, FlinkRunner, SparkRunner at scale."""
    num_workers: int = 1
    """Local runners: worker processes (DirectRunner multi_processing when > 1). DataflowRunner:
    the initial number of worker VMs (--num_workers)."""
    max_num_workers: int = 0
    """DataflowRunner: the autoscaling ceiling (--max_num_workers); 0: the service's default."""
    project: str = ""
    """DataflowRunner: the Google Cloud project (--project)."""
    region: str = ""
    """DataflowRunner: the region that runs the job, e.g. us-central1 (--region)."""
    temp_location: str = ""
    """DataflowRunner: a gs:// folder for temporary and staged files (--temp_location)."""
    machine_type: str = ""
    """DataflowRunner: the worker VM type, e.g. n2-highmem-4 (--machine_type); empty: the default."""
    sdk_container_image: str = ""
    """Worker image with our code and pinned dependencies (--sdk_container_image), built from
    infra/dataflow/Dockerfile. DataflowRunner needs it or ``setup_file``."""
    setup_file: str = ""
    """A setup.py that packages our Beam code for the workers (--setup_file); the alternative to
    a worker image (see infra/dataflow/run.sh --setup-file)."""
    fork_workers: bool = True
    """FnApiRunner at num_workers > 1: fork the worker processes from the driver (they share its
    imports and start in milliseconds, see pipeline.local_workers) instead of starting each as a
    fresh Python (~1.5 s of imports each). False: Beam's own subprocess workers. Linux only."""
    options: dict[str, Any] = field(default_factory=dict)
    """Further pipeline options by name: {"flink_master": "host:8081"} -> --flink_master=host:8081;
    true -> a bare flag, false/null -> left out, a list -> the option repeated."""
    extra_args: tuple[str, ...] = ()
    """Further pipeline options as command-line words, passed last, e.g. ("--experiments=x",)."""

    def __post_init__(self):
        check(isinstance(self.runner, str) and bool(self.runner), "beam.runner", "must name a runner")
        check(self.num_workers >= 1, "beam.num_workers", f"must be >= 1, got {self.num_workers}")
        check(self.max_num_workers >= 0, "beam.max_num_workers", f"must be >= 0, got {self.max_num_workers}")
        check(
            self.max_num_workers == 0 or self.max_num_workers >= self.num_workers,
            "beam.max_num_workers",
            f"{self.max_num_workers} is below beam.num_workers={self.num_workers}",
        )
        for key in self.options:
            check(
                isinstance(key, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", key) is not None,
                f"beam.options.{key}",
                "must be a pipeline option name without dashes, e.g. flink_master",
            )
        if self.runner == "DataflowRunner":
            given = self._named_options()
            for name in ("project", "region", "temp_location"):
                check(
                    bool(getattr(self, name)) or name in given,
                    f"beam.{name}",
                    "DataflowRunner needs it (e.g. --set corpus.beam.%s=...)" % name,
                )
            temp = self.temp_location or str(self.options.get("temp_location", "gs://"))
            check(temp.startswith("gs://"), "beam.temp_location", f"must be a gs:// folder for Dataflow, got {temp!r}")
            check(
                bool(self.sdk_container_image or self.setup_file)
                or bool(given & {"sdk_container_image", "setup_file", "extra_package", "extra_packages"}),
                "beam.sdk_container_image",
                "DataflowRunner workers need our code: set beam.sdk_container_image (an image built "
                "from infra/dataflow/Dockerfile) or beam.setup_file (infra/dataflow/run.sh --setup-file)",
            )

    def _named_options(self) -> set[str]:
        """Option names given through ``options`` or ``extra_args``."""
        names = {k for k, v in self.options.items() if v not in (None, False, "")}
        names |= {a[2:].split("=", 1)[0] for a in self.extra_args if a.startswith("--")}
        return names


CORPUS_SOURCES = ("wiki", "books")
BOOKS_LAYOUTS = ("paragraphs", "line_per_document")
WIKI_READERS = ("auto", "process", "thread", "inline")


@dataclass(frozen=True)
class CorpusConfig:
    """Cleaning, sentence splitting, filtering and dedup of raw corpora into documents."""

    sources: tuple[str, ...] = CORPUS_SOURCES
    """Sources this run needs; each must be given and non-empty (a clear error before any work).
    ("wiki",) runs on Wikipedia alone; an input of a source not listed here is ignored."""
    min_sentence_chars: int = 12
    """Sentences shorter than this (after cleaning) are dropped as junk."""
    max_sentence_chars: int = 2000
    """Sentences longer than this are dropped as junk (tables flattened, runaway markup)."""
    min_alpha_ratio: float = 0.5
    """Minimum share of letters among a sentence's non-space characters."""
    min_doc_sentences: int = 2
    """Documents with fewer sentences are dropped (NSP needs a continuation)."""
    min_doc_chars: int = 0
    """Documents with fewer characters (kept sentences) are dropped (doc_too_short); 0: off."""
    max_doc_chars: int = 5_000_000
    """Documents whose cleaned text is longer are dropped (doc_too_long)."""
    min_doc_alpha_ratio: float = 0.3
    """Documents whose cleaned text has a smaller share of letters are dropped (mostly_non_text)."""
    dedup_sentences: bool = True
    """Drop sentences and paragraphs repeated within a document, and documents whose text was
    seen before."""
    dedup_paragraphs: bool = True
    """Drop a paragraph already kept by another document (exact, normalised text), across the
    whole corpus: the document with the smallest doc_id keeps it (duplicate_paragraph_corpus;
    a document left with nothing is all_paragraphs_duplicate)."""
    near_dup_threshold: float = 0.0
    """Jaccard threshold of MinHash LSH near-duplicate document removal (needs datasketch);
    0: off. Gathers every document's signature in one worker."""
    max_page_bytes: int = 16 << 20
    """A dump page larger than this is skipped unread (page_too_large): bounds worker memory."""
    max_book_bytes: int = 256 << 20
    """A book file larger than this is rejected (file_too_large)."""
    books_layout: str = "paragraphs"
    """"paragraphs": one book a file, blank-line paragraphs; "line_per_document": every line
    of a file is a document (news/crawl layouts)."""
    strip_boilerplate: bool = True
    """Cut Project Gutenberg-style front matter and licence text from books."""
    split_bytes: int = 64 << 20
    """Multistream .bz2 dumps with their index are read in ranges of about this many
    compressed bytes, each a unit of parallel work; 0: one unit per file."""
    wiki_reader: str = "auto"
    """How a worker reads a dump: "process" (a child process decompresses, scans and parses
    pages beside the cleaning), "thread" (decompression on a second thread), "inline" (one
    thread); "auto": "process" with a local runner and 2+ cores per worker, else "thread" with
    2+ cores, else "inline". The output is the same."""
    num_shards: int = 2
    """Parquet files per source."""
    beam: BeamConfig = field(default_factory=BeamConfig)

    def __post_init__(self):
        if isinstance(self.sources, str):  # "wiki" or "wiki,books" from a command line
            object.__setattr__(self, "sources", tuple(s for s in self.sources.split(",") if s))
        else:
            object.__setattr__(self, "sources", tuple(self.sources))
        check(len(self.sources) >= 1, "corpus.sources", "must name at least one source")
        for source in self.sources:
            check(
                source in CORPUS_SOURCES,
                "corpus.sources",
                f"unknown source {source!r}; expected some of {CORPUS_SOURCES}",
            )
        check(self.min_sentence_chars >= 0, "corpus.min_sentence_chars", "must be >= 0")
        check(
            self.max_sentence_chars > self.min_sentence_chars,
            "corpus.max_sentence_chars",
            "must be greater than corpus.min_sentence_chars",
        )
        check(0.0 <= self.min_alpha_ratio <= 1.0, "corpus.min_alpha_ratio", "must lie in [0, 1]")
        check(self.min_doc_sentences >= 1, "corpus.min_doc_sentences", "must be >= 1")
        check(self.min_doc_chars >= 0, "corpus.min_doc_chars", "must be >= 0")
        check(
            self.max_doc_chars > self.min_doc_chars, "corpus.max_doc_chars", "must be greater than corpus.min_doc_chars"
        )
        check(0.0 <= self.min_doc_alpha_ratio <= 1.0, "corpus.min_doc_alpha_ratio", "must lie in [0, 1]")
        check(0.0 <= self.near_dup_threshold < 1.0, "corpus.near_dup_threshold", "must lie in [0, 1)")
        check(self.max_page_bytes >= 1024, "corpus.max_page_bytes", "must be >= 1024")
        check(self.max_book_bytes >= 1024, "corpus.max_book_bytes", "must be >= 1024")
        check(
            self.books_layout in BOOKS_LAYOUTS,
            "corpus.books_layout",
            f"must be one of {BOOKS_LAYOUTS}, got {self.books_layout!r}",
        )
        check(self.split_bytes >= 0, "corpus.split_bytes", "must be >= 0")
        check(
            self.wiki_reader in WIKI_READERS,
            "corpus.wiki_reader",
            f"must be one of {WIKI_READERS}, got {self.wiki_reader!r}",
        )
        check(self.num_shards >= 1, "corpus.num_shards", "must be >= 1")


@dataclass(frozen=True)
class VocabConfig:
    """WordPiece vocabulary in Google's vocab.txt layout."""

    vocab_size: int = 30522
    """Total entries including [PAD], [unused*], [UNK], [CLS], [SEP], [MASK]."""
    min_frequency: int = 2
    lowercase: bool = True
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


MASKING_MODES = ("static", "dynamic")
SEGMENTERS = ("none", "jieba", "fugashi")  # pipeline.segment.SEGMENTERS


@dataclass(frozen=True)
class ExamplesConfig:
    """MLM + NSP example creation, with the reference create_pretraining_data.py semantics."""

    max_seq_lengths: tuple[int, ...] = (128, 512)
    """One set of shards per length: {root}/examples/seq{N}/."""
    max_predictions_per_seq: tuple[int, ...] = (20, 80)
    """Cap on masked positions, one per entry of max_seq_lengths."""
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    random_next_prob: float = 0.5
    dupe_factor: int = 5
    """Copies of each document: each masked differently ("static"), or each a different draw of
    A/B pairs left unmasked ("dynamic")."""
    masking: str = "static"
    """"static": masks written in the shards (the paper). "dynamic": unmasked pairs in the shards
    (empty masked_positions/masked_ids), masked each epoch by the loader (RoBERTa) with
    pipeline.masking.create_masked_lm_predictions."""
    whole_word_mask: bool = False
    """Mask a word and all its ## pieces together (the reference's do_whole_word_mask)."""
    segmenter: str = "none"
    """Word boundaries for whole-word masking of CJK ideographs: "none", "jieba" (Chinese) or
    "fugashi" (Japanese, with unidic-lite); needs the 'cjk' extra and whole_word_mask."""
    seed: int = 12345
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
        check(len(self.max_seq_lengths) >= 1, "examples.max_seq_lengths", "must not be empty")
        check(
            len(self.max_predictions_per_seq) == len(self.max_seq_lengths),
            "examples.max_predictions_per_seq",
            "needs one entry per examples.max_seq_lengths entry",
        )
        for n in self.max_seq_lengths:
            check(n >= 16, "examples.max_seq_lengths", f"{n} is too short (min 16)")
        for p, n in zip(self.max_predictions_per_seq, self.max_seq_lengths):
            check(0 < p < n, "examples.max_predictions_per_seq", f"{p} must lie in (0, {n})")
        for name in ("masked_lm_prob", "short_seq_prob", "random_next_prob"):
            v = getattr(self, name)
            check(0.0 <= v <= 1.0, f"examples.{name}", f"must lie in [0, 1], got {v}")
        check(self.dupe_factor >= 1, "examples.dupe_factor", "must be >= 1")
        check(self.num_shards >= 1, "examples.num_shards", "must be >= 1")
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


def to_dict(cfg) -> dict:
    """A plain dict of a config (tuples as lists), for manifests and MLflow params."""
    return dataclasses.asdict(cfg)


def output_config(cfg) -> dict:
    """What a Beam stage's manifest records and its skip check compares: the config without
    ``beam``. How a job runs (runner, workers, project, image) does not change what it writes,
    since the shards are byte-identical whatever the runner and its parallelism, so moving a
    stage from the local runner to Dataflow does not make it, and every stage after it, rerun."""
    out = to_dict(cfg)
    out.pop("beam", None)
    return out
