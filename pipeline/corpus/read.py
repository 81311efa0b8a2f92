"""The read half of the corpus job: units of read work (files, multistream ranges) to raw records."""

from __future__ import annotations

import logging
import uuid

import apache_beam as beam
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.beam.shards import write_table
from pipeline.corpus.books import book_stem, iter_book_lines, looks_binary, read_book
from pipeline.corpus.compressed import open_inflated
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.dedup import RUNS, Writing
from pipeline.corpus.documents import page_record
from pipeline.corpus.filters import FILE_EVENTS
from pipeline.corpus.inputs import BOOK_SUFFIXES
from pipeline.corpus.records import CorpusReadError, LongLine, Page
from pipeline.corpus.text import TextReject, iter_text_records, text_kind
from pipeline.corpus.wiki import plan_reads
from pipeline.corpus.wiki_reader import read_wiki, wiki_reader_mode
from pipeline.schema.parquet import READ_OPTIONS
from pipeline.schema.storage import join_url

log = logging.getLogger("bertflow.corpus")

BATCHES = "batches"
PROGRESS_EVERY = 1000


# -- DoFns and composite transforms -------------------------------------------------------------
class _ReadUnit(Writing):
    """(source, url, start, end) -> raw records {doc_id, source, title, text[, layout]}; rejects
    written to runs (announced on the tagged output "runs")."""

    def __init__(self, config: CorpusConfig, work_url: str):
        super().__init__(work_url)
        self.config = config

    def process(self, unit):
        source, url, start, end, part, parts = unit
        read = 0
        if source == "wiki":
            batches = _RecordBatches(self.work_url) if parts == HANDOFF else None
            reader = wiki_reader_mode(self.config.wiki_reader, self.config.beam.runner, self.config.beam.num_workers)
            for item in read_wiki(url, start, end, self.config.max_page_bytes, part, max(parts, 1), reader):
                if isinstance(item, Page):
                    read += 1
                    record, reason = page_record(item)
                    if reason:
                        self.reject(
                            "wiki",
                            reason,
                            record_id=f"wiki:{item.page_id}",
                            title=item.title,
                            url=url,
                            sample=item.text,
                        )
                    elif batches is None:
                        yield record
                    else:
                        for batch in batches.add(record):
                            yield beam.pvalue.TaggedOutput(BATCHES, batch)
                    continue
                if item.kind == "note":
                    self.count(item.reason)
                    continue
                if item.kind == "page":
                    read += 1
                else:
                    log.error("corpus: %s in %s: %s", item.reason, url, item.detail)
                rid = f"wiki:{item.record_id}" if item.record_id else ""
                self.reject(
                    "wiki",
                    item.reason,
                    record_id=rid,
                    title=item.title,
                    url=url,
                    detail=item.detail,
                    sample=item.sample,
                )
            for batch in batches.close() if batches is not None else []:
                yield beam.pvalue.TaggedOutput(BATCHES, batch)
        elif source == "text":
            read = yield from self._text(url)
        elif self.config.books_layout == "line_per_document":
            read = yield from self._book_lines(url)
        else:
            read = 1
            yield from self._book(url)
        self.count(f"{source}_read", read)

    def _not_a_book(self, url: str, rid: str) -> None:
        try:
            reason = "binary_file" if _is_binary(url) else "unsupported_file"
        except (OSError, EOFError, ValueError):
            reason = "binary_file"
        hint = f"not a book file (expected {', '.join(BOOK_SUFFIXES)})"
        if text_kind(url):  # a JSONL or Parquet corpus given as books
            hint += f"; a {text_kind(url)} file is read by the text source: data.text, corpus.sources with 'text'"
        log.error("corpus: %s among the books rejected (%s): %s", url, reason, hint)
        self.reject("books", reason, record_id=rid, url=url, detail=hint)

    def _book(self, url: str):
        rid = f"books:{book_stem(url)}"
        if not url.lower().endswith(BOOK_SUFFIXES):
            self._not_a_book(url, rid)
            return
        try:
            book = read_book(url, self.config.max_book_bytes, self.config.max_line_bytes)
        except CorpusReadError as exc:
            reason = "unreadable_book" if exc.reason == "unreadable_file" else exc.reason
            log.error("corpus: book rejected (%s): %s", reason, exc)
            self.reject("books", reason, record_id=rid, url=url, detail=str(exc))
            return
        if book.encoding != "utf-8":
            self.count("books_reencoded")
            log.warning("corpus: %s is not UTF-8; read as %s", url, book.encoding)
        for line in book.long_lines:  # the book is kept without them
            log.warning("corpus: %s: %s", url, line.detail(self.config.max_line_bytes))
            detail = line.detail(self.config.max_line_bytes)
            self.reject("books", "long_line", record_id=rid, url=url, detail=detail, sample=line.sample())
        yield {"doc_id": f"books:{book.name}", "source": "books", "title": book.title, "text": book.text}

    def _book_lines(self, url: str):
        stem = book_stem(url)
        read = 0
        try:
            if not url.lower().endswith(BOOK_SUFFIXES) or _is_binary(url):
                self._not_a_book(url, f"books:{stem}")
                return 1
            for number, line in iter_book_lines(url, self.config.max_line_bytes):
                read += 1
                rid = f"books:{stem}:{number:09d}"
                if isinstance(line, LongLine):
                    detail = line.detail(self.config.max_line_bytes)
                    self.reject("books", "line_too_long", record_id=rid, url=url, detail=detail, sample=line.sample())
                    continue
                yield {"doc_id": rid, "source": "books", "title": stem, "text": line, "layout": "line"}
        except (OSError, EOFError, ValueError) as exc:  # a cut or corrupt file: a fault, the lines before it kept
            reason = "truncated_file" if isinstance(exc, EOFError) else "unreadable_file"
            detail = f"{url}: {type(exc).__name__}: {exc} ({read} lines read before it, kept)"
            log.error("corpus: %s: %s", reason, detail)
            self.reject("books", reason, url=url, detail=detail)
        return read

    def _text(self, url: str):
        """Records of a JSONL/Parquet/Arrow file; a bad record is a reject naming file and record."""
        read = 0
        try:
            for item in iter_text_records(url, self.config):
                read += 1
                if isinstance(item, TextReject):
                    self.reject(
                        "text", item.reason, record_id=item.record_id, url=url, detail=item.detail, sample=item.sample
                    )
                    continue
                yield item
        except CorpusReadError as exc:
            log.error("corpus: text file rejected (%s): %s", exc.reason, exc)
            if exc.reason in FILE_EVENTS:  # a fault of the file: no record (read stays as far as it got)
                self.reject("text", exc.reason, url=url, detail=str(exc))
            else:
                read += 1
                self.reject("text", exc.reason, record_id=f"text:{url.rsplit('/', 1)[-1]}", url=url, detail=str(exc))
        return read


def _is_binary(url: str) -> bool:
    """Whether the file's first 64 KiB look binary; raises when they cannot be read (a cut or
    corrupt compressed file: a file fault, not a binary book)."""
    with open_inflated(url) as f:
        return looks_binary(f.read(65536))


def plan_units(source: str, urls: list[str], config: CorpusConfig) -> list[tuple]:
    """Units of read work (source, url, start, end, part, parts): multistream dumps split by
    stream ranges; ``part`` of ``parts`` readers of one file (see :func:`spread_units`)."""
    if source != "wiki":
        return [(source, url, None, None, 0, 1) for url in urls]
    return [(source, *unit, 0, 1) for url in urls for unit in plan_reads(url, config.split_bytes)]


HANDOFF = 0
"""``parts`` of a unit read by one reader that hands its page records to every worker (through
record batch files): see :func:`spread_units`."""
BATCH_BYTES = 1 << 20
"""Page text a handing-off reader holds before it writes a record batch file: small enough that
the batches of a file deal out evenly (the local runner deals them once, round robin: 8 MiB
made 2 batches of a 20 MB dump), large enough that a 20 GB dump makes ~20,000 files, not more."""


def spread_units(units: list[tuple], workers: int) -> list[tuple]:
    """Units for ``workers``: when there are fewer than two per worker, each whole dump file
    (one that cannot be split by streams, e.g. a single-stream ``.bz2``) is read by one reader
    that writes its article records to batch files (``parts == HANDOFF``); the batches are
    dealt to every worker to clean. Page text never crosses a shuffle (only batch file URLs).

    Measured (20 MB dump, 2 workers, CPU-seconds of the whole job): the former choice, N
    readers each decompressing the whole file and cleaning every N-th page, took 8.6 against
    6.4 at 1 worker; one reader alone, 6.5 (and was faster in wall time on the loaded machine
    even with its cleaning on one worker). The cost here: the records are written and read once
    more, and the read (decompression and page scan) is not shared out."""
    if workers <= 1 or len(units) >= 2 * workers:
        return units
    return [
        (source, url, start, end, 0, HANDOFF)
        if source == "wiki" and start is None
        else (source, url, start, end, part, parts)
        for source, url, start, end, part, parts in units
    ]


RECORD_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("title", pa.string()),
        pa.field("text", pa.string(), nullable=False),
    ]
)


class _RecordBatches:
    """Records of a handing-off reader, written every ~BATCH_BYTES of text as one batch file
    under ``work_url/batches/``; :meth:`close` returns the URLs written."""

    def __init__(self, work_url: str):
        self.work_url = work_url
        self.rows: list[dict] = []
        self.held = 0
        self.written: list[str] = []

    def add(self, record: dict) -> list[str]:
        self.rows.append(record)
        self.held += len(record["text"])
        return self._flush() if self.held >= BATCH_BYTES else []

    def _flush(self) -> list[str]:
        if not self.rows:
            return []
        url = join_url(self.work_url, "batches", f"{uuid.uuid4().hex}.parquet")
        write_table(url, pa.Table.from_pylist(self.rows, schema=RECORD_SCHEMA))
        self.rows, self.held = [], 0
        return [url]

    def close(self) -> list[str]:
        return self._flush()


class _ReadBatch(beam.DoFn):
    """Record batch file URL -> its records (the file stays until the job removes its work
    folder, so a retried bundle reads it again)."""

    def process(self, url: str):
        fs, path = fsspec.core.url_to_fs(url)
        with fs.open(path, "rb") as f:
            yield from pq.read_table(f, **READ_OPTIONS).to_pylist()


class ReadUnits(beam.PTransform):
    """Read units -> {"records": raw records, "handed": the raw records a handing-off reader
    wrote to batch files, read back wherever the batches were dealt, "runs": reject runs}."""

    def __init__(self, config: CorpusConfig, work_url: str):
        super().__init__()
        self.config = config
        self.work_url = work_url

    def expand(self, units):
        read = units | "ReadUnit" >> beam.ParDo(_ReadUnit(self.config, self.work_url)).with_outputs(
            RUNS, BATCHES, main="records"
        )
        # Cleaned apart from the direct records, not flattened with them: a Flatten of two
        # stages' outputs is a buffer in the local runner, and these are whole pages.
        handed = read[BATCHES] | "SpreadBatches" >> beam.Reshuffle() | "ReadBatch" >> beam.ParDo(_ReadBatch())
        return {"records": read.records, "handed": handed, RUNS: read[RUNS]}
