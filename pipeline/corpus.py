"""Stage 1, the corpus job: raw Wikipedia dumps and books to cleaned, deduplicated documents.

    check_corpus_inputs -> plan_units (files, multistream ranges) -> spread_units -> Create
    -> Reshuffle -> ReadUnits (pages / books / lines; rejects to runs; a handing-off reader's
    records to batch files, dealt to every worker) -> CleanToFragments
    (clean markup, split sentences, filter; documents to fragment files, their keys and the
    rejects to runs; run URLs out) -> DedupAndWrite (pipeline.corpus_dedup; the decisions in
    pipeline.corpus_decide: exact documents, [near], one per doc_id, paragraphs across the
    corpus; drops applied per fragment, runs merged into shards)
    -> fill_empty_shards -> _manifest.json (last)

Design choices:
1. A unit of read work is a file, or a byte range of whole bz2 streams of a multistream dump
   (:func:`pipeline.dumps.plan_reads`, planned before the pipeline), so one big dump is read by
   many workers; a file that cannot be split is read once and its records handed to every
   worker through batch files (:func:`spread_units`). Page text never crosses a shuffle (only
   batch file URLs do).
2. The per-record work is pure functions (:func:`page_record`, :func:`build_paragraphs`) that
   return their rejects as a Counter; the DoFns turn those into Beam counters and reject rows.
3. Nothing is lost silently: every record read is either a document or a reject with a reason
   (``{source}_read == documents + sum of RECORD_REJECTS``, checked by a test), every reject row
   goes to ``rejects/`` with a sample, and a fault in a file costs only what is unreadable
   (:mod:`pipeline.dumps` resynchronises at the next page).
4. Output is byte-identical whatever the parallelism: every dedup decision sorts by stable
   keys, and the shards are a merge of key-sorted runs (:mod:`pipeline.corpus_dedup`).
5. ``rejects/`` is written beside the source folders but left out of the manifest's ``files``:
   downstream stages read every ``.parquet`` the manifest lists as documents. Its row count is
   the manifest count ``rejects_written``.
"""

from __future__ import annotations

import collections
import logging
import re
import time
import uuid

import apache_beam as beam
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import filters
from pipeline.beam_io import check_runner_urls, counters, fill_empty_shards, make_pipeline, parquet_rows
from pipeline.config import CORPUS_SOURCES, CorpusConfig, output_config
from pipeline.corpus_decide import KEY_SCHEMA, PartitionedRuns, key_row
from pipeline.corpus_dedup import (
    KEYS,
    NAMESPACE,
    REJECTS_FOLDER,
    RUNS,
    DedupAndWrite,
    FragmentWriter,
    Writing,
    doc_digest,
    norms_digest,
    norms_hash,
    paragraph_hash,
    windowed,
)
from pipeline.dump_reader import wiki_reader_mode
from pipeline.dumps import iter_wiki, plan_reads
from pipeline.filters import (
    FILE_EVENTS,
    NOTES,
    PART_DROPS,
    RECORD_REJECTS,
    REJECT_REASONS,
    REJECT_SCHEMA,
    normalise,
    sentence_reject,
    text_digest,
)
from pipeline.readers import (
    BOOK_SUFFIXES,
    WIKI_SUFFIXES,
    CorpusReadError,
    Page,
    book_stem,
    expand_inputs,
    iter_book_lines,
    looks_binary,
    read_book,
)
from pipeline.schema.manifest import Manifest, clear_stage, describe_file, fingerprint_input, list_files, write_manifest
from pipeline.schema.parquet import DOCUMENT_SCHEMA
from pipeline.schema.storage import join_url
from pipeline.sentences import book_paragraphs, split_sentences, strip_boilerplate
from pipeline.shards import write_table
from pipeline.wikitext import clean_wikitext

__all__ = [
    "run_corpus",
    "check_corpus_inputs",
    "CorpusInputError",
    "build_document",
    "build_paragraphs",
    "page_record",
    "REJECT_REASONS",
    "RECORD_REJECTS",
    "sentence_reject",
    "normalise",
    "text_digest",
]

log = logging.getLogger("bertflow.corpus")

SOURCES = CORPUS_SOURCES
ARTICLE_NAMESPACE = 0
WORK_DIR = "_work"
BATCHES = "batches"
PROGRESS_EVERY = 1000
_DISAMBIGUATION = re.compile(
    r"\{\{\s*(?:disambiguation|disambig|dab|hndis|geodis|numberdis|letter-numbercombdisambig)"
    r"\s*(?:\||\}\})",
    re.I,
)


class CorpusInputError(ValueError):
    """A corpus input is missing or empty when the config needs it; the message names it."""


# -- inputs ------------------------------------------------------------------------------------
def _input_files(name: str, url: str) -> list[str]:
    # Books: every file, so a stray binary or .pdf is counted as a reject rather than skipped.
    return expand_inputs(url, WIKI_SUFFIXES if name == "wiki" else None)


def check_corpus_inputs(config: CorpusConfig, inputs: dict[str, str]) -> dict[str, list[str]]:
    """The input files of each source the run uses, or a clear error before any work starts.

    Every source in ``config.sources`` must be given in ``inputs`` and name at least one
    non-empty file; an input of a source not in ``config.sources`` is ignored (logged), so a
    preset that always passes both can run on one. Raises :class:`CorpusInputError` naming the
    source, the URL and what to change.
    """
    for name in inputs:
        if name not in SOURCES:
            raise CorpusInputError(f"corpus: unknown input {name!r}; expected some of {SOURCES}")
    files: dict[str, list[str]] = {}
    for name in config.sources:
        url = inputs.get(name)
        if not url:
            raise CorpusInputError(
                f"corpus: corpus.sources includes {name!r} but no {name} input was given; give "
                f"one (data.{name}) or leave {name!r} out of corpus.sources"
            )
        try:
            found = _input_files(name, url)
        except FileNotFoundError:
            raise CorpusInputError(
                f"corpus: the {name} input {url} matches no files; corpus.sources includes "
                f"{name!r}, so it may not be empty"
            ) from None
        fs, _ = fsspec.core.url_to_fs(found[0])
        if all(fs.size(fsspec.core.url_to_fs(u)[1]) == 0 for u in found):
            raise CorpusInputError(
                f"corpus: the {name} input {url} holds only empty files ({len(found)}); "
                f"corpus.sources includes {name!r}, so it may not be empty"
            )
        files[name] = found
    for name in sorted(set(inputs) - set(config.sources)):
        log.warning("corpus: ignoring the %s input %s (not in corpus.sources %s)", name, inputs[name], config.sources)
    return files


# -- pure per-record functions ------------------------------------------------------------------
def page_record(page: Page) -> tuple[dict | None, str | None]:
    """(raw record, None) for an article page, (None, reject reason) otherwise."""
    if page.redirect is not None:
        return None, "redirect"
    if page.ns != ARTICLE_NAMESPACE:
        return None, "non_article_namespace"
    if _DISAMBIGUATION.search(page.text):
        return None, "disambiguation"
    return {"doc_id": f"wiki:{page.page_id}", "source": "wiki", "title": page.title, "text": page.text}, None


def paragraphs_of(record: dict, config: CorpusConfig) -> list[str]:
    if record["source"] == "wiki":
        return clean_wikitext(record["text"])
    if record.get("layout") == "line":
        return [" ".join(record["text"].split())]
    text = strip_boilerplate(record["text"]) if config.strip_boilerplate else record["text"]
    return book_paragraphs(text)


def build_paragraphs(record: dict, config: CorpusConfig) -> tuple[list[list[str]] | None, collections.Counter]:
    """Clean, split and filter one raw record into its paragraphs' kept sentences (or None).

    The Counter holds every sentence/paragraph dropped by reason and, when the record is
    dropped, exactly one reason of :data:`pipeline.filters.RECORD_REJECTS`. Paragraphs left
    with no sentence are left out.
    """
    kept, _, rejects = _build_paragraphs(record, config)
    return kept, rejects


def _build_paragraphs(record: dict, config: CorpusConfig):
    """:func:`build_paragraphs`, with the normalised form (:func:`pipeline.filters.normalise`)
    of every kept sentence when ``config.dedup_sentences`` (computed for the sentence dedup
    anyway; the document digest and paragraph hashes are made from it), else None."""
    rejects: collections.Counter = collections.Counter()
    paragraphs = paragraphs_of(record, config)
    reason = filters.document_reject(paragraphs, config)
    if reason:
        rejects[reason] += 1
        return None, None, rejects
    dedup = config.dedup_sentences
    if dedup:
        paragraphs, dropped = filters.dedup_paragraphs(paragraphs)
        if dropped:
            rejects["duplicate_paragraph"] += dropped
    kept: list[list[str]] = []
    norms: list[list[str]] = []
    seen: set[str] = set()
    split_any = False
    num_sentences = num_chars = 0
    for paragraph in paragraphs:
        sentences = []
        keys = []
        for sentence in split_sentences(paragraph):
            split_any = True
            reason = sentence_reject(sentence, config)
            if reason is None and dedup:
                key = normalise(sentence)
                if key in seen:
                    reason = "duplicate_sentence"
                seen.add(key)
            if reason:
                rejects[reason] += 1
            else:
                sentences.append(sentence)
                num_chars += len(sentence)
                if dedup:
                    keys.append(key)
        if sentences:
            kept.append(sentences)
            norms.append(keys)
            num_sentences += len(sentences)
    if not split_any:
        rejects["empty_after_cleaning"] += 1
        return None, None, rejects
    if num_sentences < config.min_doc_sentences:
        rejects["too_few_sentences"] += 1
        return None, None, rejects
    if num_chars < config.min_doc_chars:
        rejects["doc_too_short"] += 1
        return None, None, rejects
    return kept, norms if dedup else None, rejects


def build_document(record: dict, config: CorpusConfig) -> tuple[dict | None, collections.Counter]:
    """Clean, split and filter one raw record into a DOCUMENT_SCHEMA row (or None), with rejects
    (see :func:`build_paragraphs`); corpus-wide dedup comes later."""
    paragraphs, rejects = build_paragraphs(record, config)
    if paragraphs is None:
        return None, rejects
    sentences = [s for p in paragraphs for s in p]
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
            for item in iter_wiki(url, start, end, self.config.max_page_bytes, part, max(parts, 1), reader):
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
        elif self.config.books_layout == "line_per_document":
            read = yield from self._book_lines(url)
        else:
            read = 1
            yield from self._book(url)
        self.count(f"{source}_read", read)

    def _book(self, url: str):
        rid = f"books:{book_stem(url)}"
        if not url.lower().endswith(BOOK_SUFFIXES):
            reason = "binary_file" if _is_binary(url) else "unsupported_file"
            log.error("corpus: %s among the books rejected (%s)", url, reason)
            self.reject(
                "books", reason, record_id=rid, url=url, detail=f"not a book file (expected {', '.join(BOOK_SUFFIXES)})"
            )
            return
        try:
            book = read_book(url, self.config.max_book_bytes)
        except CorpusReadError as exc:
            reason = "unreadable_book" if exc.reason == "unreadable_file" else exc.reason
            log.error("corpus: book rejected (%s): %s", reason, exc)
            self.reject("books", reason, record_id=rid, url=url, detail=str(exc))
            return
        if book.encoding != "utf-8":
            self.count("books_reencoded")
            log.warning("corpus: %s is not UTF-8; read as %s", url, book.encoding)
        yield {"doc_id": f"books:{book.name}", "source": "books", "title": book.title, "text": book.text}

    def _book_lines(self, url: str):
        stem = book_stem(url)
        if _is_binary(url) or not url.lower().endswith(BOOK_SUFFIXES):
            reason = "binary_file" if _is_binary(url) else "unsupported_file"
            log.error("corpus: %s among the books rejected (%s)", url, reason)
            self.reject("books", reason, record_id=f"books:{stem}", url=url)
            return 1
        read = 0
        for number, line in iter_book_lines(url):
            read += 1
            yield {
                "doc_id": f"books:{stem}:{number:09d}",
                "source": "books",
                "title": stem,
                "text": line,
                "layout": "line",
            }
        return read


def _is_binary(url: str) -> bool:
    try:
        with fsspec.open(url, "rb", compression="infer") as f:
            return looks_binary(f.read(65536))
    except (OSError, EOFError, ValueError):
        return True


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
            yield from pq.read_table(f).to_pylist()


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


class _CleanToFragments(Writing):
    """Raw record -> its document written to a fragment and its key row (digest, doc_id, title,
    ref, paragraph hashes[, minhash]) to a key run; rejects written to runs; fragment ids
    (tagged "fragments"), key runs ("keys") and runs ("runs") at the end of each bundle."""

    def __init__(self, config: CorpusConfig, work_url: str, partitions: int = 1):
        super().__init__(work_url)
        self.config = config
        self.partitions = partitions

    def start_bundle(self):
        super().start_bundle()
        self._fragments = FragmentWriter(self.work_url)
        self._keys = PartitionedRuns(join_url(self.work_url, RUNS), KEYS, KEY_SCHEMA, self.partitions)
        self._processed = 0

    def process(self, record: dict):
        self._clean(record)

    def _clean(self, record: dict) -> None:
        paragraphs, norms, rejects = _build_paragraphs(record, self.config)
        for reason, n in rejects.items():
            if reason not in RECORD_REJECTS:
                self.count(reason, n)
        self._processed += 1
        if self._processed % PROGRESS_EVERY == 0:
            log.info("corpus: %d documents processed by this worker (last %s)", self._processed, record["doc_id"])
        if paragraphs is None:
            reason = next(r for r in rejects if r in RECORD_REJECTS)
            self.reject(
                record["source"], reason, record_id=record["doc_id"], title=record["title"], sample=record["text"]
            )
            return
        # The digest and hashes normalise each sentence; the dedup above already did (the
        # same strings: normalise(" ".join(p)) == " ".join(map(normalise, p)), no kept
        # sentence normalising to "").
        digest = doc_digest(paragraphs) if norms is None else norms_digest(norms)
        ref = self._fragments.add(
            {
                "doc_id": record["doc_id"],
                "source": record["source"],
                "title": record["title"],
                "digest": digest,
                "paragraphs": paragraphs,
            }
        )
        if not self.config.dedup_paragraphs:
            hashes = []
        elif norms is None:
            hashes = [paragraph_hash(p) for p in paragraphs]
        else:
            hashes = [norms_hash(n) for n in norms]
        sig = filters.minhash([s for p in paragraphs for s in p]) if self.config.near_dup_threshold > 0 else None
        self._keys.add(key_row(bytes.fromhex(digest), record["doc_id"], record["title"], ref, hashes, sig))

    def finish_bundle(self):
        for fragment in self._fragments.close():
            yield beam.pvalue.TaggedOutput("fragments", windowed(fragment))
        for item in self._keys.close():
            yield beam.pvalue.TaggedOutput(KEYS, windowed(item))
        yield from super().finish_bundle()


class CleanToFragments(beam.PTransform):
    """Raw records -> key runs ``(partition, run)`` ("keys"), fragment ids ("fragments") and
    reject runs ("runs")."""

    def __init__(self, config: CorpusConfig, work_url: str, partitions: int = 1):
        super().__init__()
        self.config = config
        self.work_url = work_url
        self.partitions = partitions

    def expand(self, records):
        return records | "BuildDocument" >> beam.ParDo(
            _CleanToFragments(self.config, self.work_url, self.partitions)
        ).with_outputs("fragments", RUNS, KEYS, main="none")


def dedup_partitions(config: CorpusConfig, workers: int) -> int:
    """Key ranges each dedup pass is split into: one per worker (near-duplicate detection
    needs every signature in one place: one)."""
    return 1 if config.near_dup_threshold > 0 else max(1, workers)


def build_corpus_pipeline(config: CorpusConfig, files: dict[str, list[str]], output_url: str) -> beam.Pipeline:
    """The corpus job over ``files`` (source -> input file URLs), built, not run, with the
    options of ``config.beam`` (any runner: a test validates it for Dataflow without submitting)."""
    check_runner_urls(config.beam, {**files, "output": [output_url]})
    # Page text never crosses a shuffle: each worker cleans what it reads.
    workers = config.beam.num_workers if config.beam.runner in ("FnApiRunner", "DirectRunner") else 64
    units = spread_units([u for name, urls in files.items() for u in plan_units(name, urls, config)], workers)
    log.info("corpus: %d read units for %d workers", len(units), workers)

    work = join_url(output_url, WORK_DIR)
    p = make_pipeline(config.beam, job_name="bertflow-corpus")
    read = p | "Units" >> beam.Create(units) | "SpreadUnits" >> beam.Reshuffle() | "Read" >> ReadUnits(config, work)
    partitions = dedup_partitions(config, workers)
    cleaned = read["records"] | "Clean" >> CleanToFragments(config, work, partitions)
    handed = read["handed"] | "CleanHanded" >> CleanToFragments(config, work, partitions)
    keys = (cleaned.keys, handed.keys) | "AllKeys" >> beam.Flatten()
    fragments = (cleaned.fragments, handed.fragments) | "AllFragments" >> beam.Flatten()
    runs = (read[RUNS], cleaned[RUNS], handed[RUNS]) | "ReadRuns" >> beam.Flatten()
    _ = (keys, fragments, runs) | "Dedup" >> DedupAndWrite(config, work, output_url, partitions)
    return p


# -- the stage entry point -----------------------------------------------------------------------
def run_corpus(config: CorpusConfig, inputs: dict[str, str], output_url: str) -> Manifest:
    """Run the corpus job on ``inputs`` ({"wiki": url, "books": url}, each a file, folder or
    glob) and write ``output_url/<source>/part-*.parquet``, ``output_url/rejects/`` and
    ``_manifest.json`` last. Raises CorpusInputError before any work when an input the config
    needs is missing or empty."""
    started = time.monotonic()
    files = check_corpus_inputs(config, inputs)
    fingerprints = {name: fingerprint_input(inputs[name]) for name in files}
    clear_stage(output_url)
    log.info("corpus: %s -> %s", {n: len(f) for n, f in files.items()}, output_url)

    p = build_corpus_pipeline(config, files, output_url)
    work = join_url(output_url, WORK_DIR)
    result = p.run()
    result.wait_until_finish()

    fs, work_path = fsspec.core.url_to_fs(work)
    if fs.exists(work_path):
        fs.rm(work_path, recursive=True)
    for name in list(files) + [REJECTS_FOLDER]:
        schema = REJECT_SCHEMA if name == REJECTS_FOLDER else DOCUMENT_SCHEMA
        fill_empty_shards(join_url(output_url, name), schema, config.num_shards)
    counts = _counts(counters(result, NAMESPACE), files)
    out_files, rejects_written = [], 0
    for rel in list_files(output_url):
        n = parquet_rows(join_url(output_url, rel))
        if rel.startswith(REJECTS_FOLDER + "/"):
            rejects_written += n
        else:
            out_files.append(describe_file(output_url, rel, rows=n))
    counts["rejects_written"] = rejects_written
    seconds = time.monotonic() - started
    manifest = write_manifest(
        stage="corpus",
        stage_url=output_url,
        config=output_config(config),
        inputs=fingerprints,
        counts=counts,
        files=out_files,
        seconds=seconds,
    )
    log.info(
        "corpus: %d documents, %d sentences in %.1f s; rejects %s (rows in %s)",
        counts["documents"],
        counts["sentences"],
        seconds,
        {r: counts[r] for r in REJECT_REASONS if counts[r]},
        join_url(output_url, REJECTS_FOLDER),
    )
    return manifest


def _counts(found: dict[str, int], files: dict[str, list[str]]) -> dict[str, float]:
    counts: dict[str, float] = {reason: 0 for reason in REJECT_REASONS + NOTES}
    for name in files:
        for what in ("read", "documents", "sentences", "chars"):
            counts[f"{name}_{what}"] = 0
    counts.update(found)
    for what in ("read", "documents", "sentences", "chars"):
        counts[what] = sum(counts[f"{name}_{what}"] for name in files)
    counts["records_rejected"] = sum(counts[r] for r in RECORD_REJECTS)
    counts["file_faults"] = sum(counts[r] for r in FILE_EVENTS)
    counts["parts_dropped"] = sum(counts[r] for r in PART_DROPS)
    return counts
