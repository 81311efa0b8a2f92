"""Typed configuration of the corpus stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.beam.config import BeamConfig
from pipeline.corpus.sources import CORPUS_SOURCES, DEFAULT_SOURCES
from pipeline.schema.config import LIMITS, check, check_at_most, suggest

BOOKS_LAYOUTS = ("paragraphs", "line_per_document")
WIKI_READERS = ("auto", "process", "thread", "inline")


@dataclass(frozen=True)
class CorpusConfig:
    """Cleaning, sentence splitting, filtering and dedup of raw corpora into documents."""

    sources: tuple[str, ...] = DEFAULT_SOURCES
    """Sources this run needs, of ``pipeline.corpus.sources.SOURCES`` ("wiki", "books", "text");
    each must be given and non-empty (a clear
    error before any work). ("wiki",) runs on Wikipedia alone; an input of a source not listed
    here is ignored (data.text set with "text" left out is refused)."""
    allow_empty_sources: bool = False
    """A source whose files yield no document fails the stage, naming the source, its files and its
    top reject reasons (documents 0 is never "done"); true lets such a source be empty."""
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
    """A book file larger than this (bytes, decompressed) is rejected (file_too_large), unread
    past the limit."""
    max_line_bytes: int = 16 << 20
    """A line longer than this (bytes) is skipped unread, never held whole: in the
    line_per_document layout and in a JSONL text file it is a rejected record (line_too_long),
    in a book a dropped part (long_line; the rest of the book is kept), a Parquet/Arrow text
    value this long is a rejected record (record_too_large). Bounds a worker's memory whatever
    the input's line lengths (default 16 MiB)."""
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
    thread; a whole .bz2 through indexed_bzip2's faster decoder); "auto": "process" with a local
    runner and 2+ cores per worker, "inline" on one core or a local runner with a core or less per
    worker, else "thread". The output is the same."""
    text_field: str = "text"
    """The text source's field (JSONL key, Parquet/Arrow column) holding each document's text; a
    record without it, or with a null or non-string one, is rejected (missing_text)."""
    text_id_field: str = "id"
    """The text source's id field, used when a file has it: doc_id "text:<id>" (ids must be unique:
    a repeat is a duplicate_doc_id reject); without it "text:<file stem>:<record number>"."""
    text_title_field: str = "title"
    """The text source's title field, used when a file has it; else the title is empty."""
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
                f"unknown source {source!r}{suggest(source, CORPUS_SOURCES)}; expected some of {CORPUS_SOURCES}",
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
        check(self.max_line_bytes >= 1024, "corpus.max_line_bytes", "must be >= 1024")
        check(bool(self.text_field), "corpus.text_field", "must name a field")
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
        check_at_most(self.num_shards, LIMITS.shards, "corpus.num_shards", "files per source")
