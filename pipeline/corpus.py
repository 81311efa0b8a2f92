"""Stage 1, the corpus job: raw Wikipedia dumps and books to cleaned, deduplicated documents.

    Create(file urls) -> ReadFiles (stream pages / books) -> Reshuffle -> CleanDocuments
    (clean markup, split sentences, filter) -> DedupDocuments (exact, across all sources)
    -> UniqueDocIds -> WriteShards per source -> fill_empty_shards -> _manifest.json (last)

Design choices:
1. One input file is one unit of read work (dumps come in parts); a Reshuffle after reading
   spreads the far costlier cleaning over every worker even when there is a single file.
2. The per-record work is pure functions (:func:`page_record`, :func:`build_document`) that
   return their rejects as a Counter; the DoFns only turn those into Beam counters, so the rules
   are tested without a pipeline and every dropped record is counted under one reason.
3. Output is byte-identical whatever the parallelism: dedup keeps the smallest doc_id of a group,
   and :class:`pipeline.beam_io.WriteShards` places and orders rows by doc_id alone.
4. An unreadable file is logged with its name and counted (``unreadable_file``), not fatal: a
   corrupt part of a 60-part dump should not cost the other 59. Pages read from a dump before
   its fault are kept (streaming cannot take them back); the log says how many.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import time

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipeline.beam_io import WriteShards, counters, fill_empty_shards, parquet_rows, pipeline_options
from pipeline.config import CorpusConfig
from pipeline.readers import (
    BOOK_SUFFIXES,
    WIKI_SUFFIXES,
    CorpusReadError,
    Page,
    expand_inputs,
    iter_pages,
    read_book,
)
from pipeline.schema import (
    DOCUMENT_SCHEMA,
    Manifest,
    clear_stage,
    describe_file,
    fingerprint_input,
    join_url,
    list_files,
    write_manifest,
)
from pipeline.sentences import book_paragraphs, split_sentences
from pipeline.wikitext import clean_wikitext

log = logging.getLogger("bertflow.corpus")

NAMESPACE = "corpus"
SOURCES = ("wiki", "books")
ARTICLE_NAMESPACE = 0
# Every reason a record can be dropped; each is a counter in namespace "corpus" and a manifest count.
REJECT_REASONS = (
    "unreadable_file",
    "redirect",
    "non_article_namespace",
    "empty_after_cleaning",
    "too_few_sentences",
    "sentence_too_short",
    "sentence_too_long",
    "sentence_low_alpha",
    "duplicate_sentence",
    "duplicate_document",
    "duplicate_doc_id",
)
PROGRESS_EVERY = 1000


# -- pure per-record functions ------------------------------------------------------------------
def page_record(page: Page) -> tuple[dict | None, str | None]:
    """(raw record, None) for an article page, (None, reject reason) otherwise."""
    if page.redirect is not None:
        return None, "redirect"
    if page.ns != ARTICLE_NAMESPACE:
        return None, "non_article_namespace"
    return {"doc_id": f"wiki:{page.page_id}", "source": "wiki", "title": page.title,
            "text": page.text}, None


def normalise(text: str) -> str:
    """Case- and whitespace-insensitive form of a sentence or document, for exact dedup."""
    return " ".join(text.casefold().split())


def text_digest(sentences: list[str]) -> str:
    body = "\n".join(normalise(s) for s in sentences)
    return hashlib.blake2b(body.encode("utf-8"), digest_size=16).hexdigest()


def sentence_reject(sentence: str, config: CorpusConfig) -> str | None:
    """The reason a sentence fails the filters, or None when it passes."""
    n = len(sentence)
    if n < config.min_sentence_chars:
        return "sentence_too_short"
    if n > config.max_sentence_chars:
        return "sentence_too_long"
    visible = n - sum(map(str.isspace, sentence))
    letters = sum(map(str.isalpha, sentence))
    if visible == 0 or letters / visible < config.min_alpha_ratio:
        return "sentence_low_alpha"
    return None


def paragraphs_of(record: dict) -> list[str]:
    if record["source"] == "wiki":
        return clean_wikitext(record["text"])
    return book_paragraphs(record["text"])


def build_document(record: dict, config: CorpusConfig) -> tuple[dict | None, collections.Counter]:
    """Clean, split and filter one raw record into a DOCUMENT_SCHEMA row (or None), with rejects."""
    rejects: collections.Counter = collections.Counter()
    sentences: list[str] = []
    seen: set[str] = set()
    split_any = False
    for paragraph in paragraphs_of(record):
        for sentence in split_sentences(paragraph):
            split_any = True
            reason = sentence_reject(sentence, config)
            if reason is None and config.dedup_sentences:
                key = normalise(sentence)
                if key in seen:
                    reason = "duplicate_sentence"
                seen.add(key)
            if reason:
                rejects[reason] += 1
            else:
                sentences.append(sentence)
    if not split_any:
        rejects["empty_after_cleaning"] += 1
        return None, rejects
    if len(sentences) < config.min_doc_sentences:
        rejects["too_few_sentences"] += 1
        return None, rejects
    row = {
        "doc_id": record["doc_id"],
        "source": record["source"],
        "title": record["title"],
        "sentences": sentences,
        "num_sentences": len(sentences),
        "num_chars": sum(len(s) for s in sentences),
    }
    return row, rejects


# -- DoFns and composite transforms -------------------------------------------------------------
class _Counted(beam.DoFn):
    """A DoFn that counts under namespace "corpus", creating each counter once."""

    def setup(self):
        self._counters = {}

    def count(self, name: str, value: int = 1) -> None:
        if name not in self._counters:
            self._counters[name] = Metrics.counter(NAMESPACE, name)
        self._counters[name].inc(value)


class _ReadFile(_Counted):
    def __init__(self, source: str):
        self.source = source

    def process(self, url: str):
        read = 0
        try:
            if self.source == "wiki":
                for page in iter_pages(url):
                    read += 1
                    record, reason = page_record(page)
                    if reason:
                        self.count(reason)
                    else:
                        yield record
            else:
                book = read_book(url)
                read = 1
                yield {"doc_id": f"books:{book.name}", "source": "books", "title": book.title,
                       "text": book.text}
        except CorpusReadError as exc:
            self.count("unreadable_file")
            log.error("corpus: unreadable %s input %s (%d records read before the fault are "
                      "kept): %s", self.source, url, read, exc)
        self.count(f"{self.source}_read", read)


class ReadFiles(beam.PTransform):
    """File URLs of one source -> raw records {doc_id, source, title, text}, articles only."""

    def __init__(self, source: str):
        super().__init__()
        if source not in SOURCES:
            raise ValueError(f"unknown corpus source {source!r}; expected one of {SOURCES}")
        self.source = source

    def expand(self, urls):
        return urls | "ReadFile" >> beam.ParDo(_ReadFile(self.source))


class _BuildDocument(_Counted):
    def __init__(self, config: CorpusConfig):
        self.config = config

    def setup(self):
        super().setup()
        self._processed = 0

    def process(self, record: dict):
        row, rejects = build_document(record, self.config)
        for reason, n in rejects.items():
            self.count(reason, n)
        self._processed += 1
        if self._processed % PROGRESS_EVERY == 0:
            log.info("corpus: %d documents processed by this worker (last %s)",
                     self._processed, record["doc_id"])
        if row is not None:
            yield row


class CleanDocuments(beam.PTransform):
    """Raw records -> document rows: markup cleaned, sentences split and filtered."""

    def __init__(self, config: CorpusConfig):
        super().__init__()
        self.config = config

    def expand(self, records):
        return records | "BuildDocument" >> beam.ParDo(_BuildDocument(self.config))


class _KeepFirst(_Counted):
    """Of a group, keep the row with the smallest sort key; count the others under ``reason``."""

    def __init__(self, reason: str, sort_key):
        self.reason = reason
        self.sort_key = sort_key

    def process(self, element):
        _, rows = element
        rows = sorted(rows, key=self.sort_key)
        if len(rows) > 1:
            self.count(self.reason, len(rows) - 1)
            if self.reason == "duplicate_doc_id":
                log.warning("corpus: %d documents share doc_id %s; kept one",
                            len(rows), rows[0]["doc_id"])
        yield rows[0]


def _by_id(row):
    return row["doc_id"], row["title"]


def _by_text(row):
    return text_digest(row["sentences"]), row["title"]


class DedupDocuments(beam.PTransform):
    """Exact document dedup across all inputs: one row per normalised text, the smallest doc_id."""

    def expand(self, rows):
        return (
            rows
            | "KeyByText" >> beam.Map(lambda row: (text_digest(row["sentences"]), row))
            | "GroupByText" >> beam.GroupByKey()
            | "KeepSmallestId" >> beam.ParDo(_KeepFirst("duplicate_document", _by_id))
        )


class UniqueDocIds(beam.PTransform):
    """One row per doc_id (a page repeated across dump parts), so shard order is total."""

    def expand(self, rows):
        return (
            rows
            | "KeyById" >> beam.Map(lambda row: (row["doc_id"], row))
            | "GroupById" >> beam.GroupByKey()
            | "KeepOne" >> beam.ParDo(_KeepFirst("duplicate_doc_id", _by_text))
        )


class _CountOutput(_Counted):
    def process(self, row):
        source = row["source"]
        self.count(f"{source}_documents")
        self.count(f"{source}_sentences", row["num_sentences"])
        self.count(f"{source}_chars", row["num_chars"])
        yield row


# -- the stage entry point -----------------------------------------------------------------------
def _input_files(name: str, url: str) -> list[str]:
    suffixes = WIKI_SUFFIXES if name == "wiki" else BOOK_SUFFIXES
    return expand_inputs(url, suffixes)


def run_corpus(config: CorpusConfig, inputs: dict[str, str], output_url: str) -> Manifest:
    """Run the corpus job on ``inputs`` ({"wiki": url, "books": url}, each a file, folder or
    glob) and write ``output_url/<source>/part-*.parquet`` plus ``_manifest.json`` last."""
    if not inputs:
        raise ValueError("run_corpus: inputs is empty; give at least one of 'wiki', 'books'")
    for name in inputs:
        if name not in SOURCES:
            raise ValueError(f"run_corpus: unknown input {name!r}; expected one of {SOURCES}")
    started = time.monotonic()
    files = {name: _input_files(name, url) for name, url in sorted(inputs.items())}
    fingerprints = {name: fingerprint_input(inputs[name]) for name in files}
    clear_stage(output_url)
    log.info("corpus: %s -> %s", {n: len(f) for n, f in files.items()}, output_url)

    p = beam.Pipeline(options=pipeline_options(config.beam, job_name="bertflow-corpus"))
    records = []
    for name, urls in files.items():
        records.append(
            p
            | f"Files[{name}]" >> beam.Create(urls)
            | f"Read[{name}]" >> ReadFiles(name)
            | f"Reshuffle[{name}]" >> beam.Reshuffle()
        )
    rows = (
        tuple(records)
        | "FlattenSources" >> beam.Flatten()
        | "Clean" >> CleanDocuments(config)
    )
    if config.dedup_sentences:
        rows = rows | "DedupDocuments" >> DedupDocuments()
    rows = rows | "UniqueDocIds" >> UniqueDocIds() | "CountOutput" >> beam.ParDo(_CountOutput())
    for name in files:
        _ = (
            rows
            | f"Only[{name}]" >> beam.Filter(lambda row, s=name: row["source"] == s)
            | f"Write[{name}]" >> WriteShards(
                join_url(output_url, name), DOCUMENT_SCHEMA, config.num_shards,
                key_fn=lambda row: row["doc_id"])
        )
    result = p.run()
    result.wait_until_finish()

    for name in files:
        fill_empty_shards(join_url(output_url, name), DOCUMENT_SCHEMA, config.num_shards)
    found = counters(result, NAMESPACE)
    counts: dict[str, float] = {reason: 0 for reason in REJECT_REASONS}
    for name in files:
        for what in ("read", "documents", "sentences", "chars"):
            counts[f"{name}_{what}"] = 0
    counts.update(found)
    for what in ("documents", "sentences", "chars"):
        counts[what] = sum(counts[f"{name}_{what}"] for name in files)
    out_files = [
        describe_file(output_url, rel, rows=parquet_rows(join_url(output_url, rel)))
        for rel in list_files(output_url)
    ]
    seconds = time.monotonic() - started
    manifest = write_manifest(
        stage="corpus",
        stage_url=output_url,
        config=dataclasses.asdict(config),
        inputs=fingerprints,
        counts=counts,
        files=out_files,
        seconds=seconds,
    )
    log.info("corpus: %d documents, %d sentences in %.1f s; rejects %s", counts["documents"],
             counts["sentences"], seconds, {r: counts[r] for r in REJECT_REASONS if counts[r]})
    return manifest
