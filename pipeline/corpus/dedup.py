"""Corpus-wide exact dedup decided on small keys; document text and keys move through files, not shuffles.

The corpus job used to group whole documents (exact dedup, unique doc ids, output shards,
rejects with their samples), then small keys, one per document and per paragraph: Beam's local
runner holds every grouped element in memory in the driver, so the stage grew with the dump.
Here no Beam element is per document:

1. Workers write the documents they build to **fragments** (Parquet files of at most
   :data:`FRAGMENT_ROWS` documents, paragraphs kept as lists of sentences), each document's
   small key row (text digest, doc_id, title, ``ref = (fragment, row)``, paragraph hashes
   [, minhash]) to key-sorted runs, and rejects to key-sorted runs
   (:class:`pipeline.beam.shards.RunWriter`); only run URLs and fragment ids go on.
2. The decisions are sorted passes over the key runs (:mod:`pipeline.corpus.decide`, bounded
   memory), each split into key ranges run in parallel: exact documents (smallest
   ``(doc_id, title)`` kept), near duplicates (optional), one row per doc_id (smallest
   ``(digest, title)`` kept), then paragraphs across the corpus (of the documents that hold a
   paragraph, the smallest doc_id keeps it). Only survivors take part, so no text is lost to a
   dropped document. The drops are written as one file per fragment.
3. Each fragment is read once (grouped with its drops file) and its kept documents go
   to key-sorted runs (:func:`apply_drops`), and every output folder is a streaming merge of
   its runs (:func:`pipeline.beam.shards.merge_runs_in_levels`, at most :data:`MAX_FAN_IN` at once):
   balanced shards in the order of a 64-bit digest of doc_id (rejects: of the whole row).

What it costs: every document is written and read twice more (a fragment, then a run), and its
key row a few times (one per decision pass). The runner holds one element per run, fragment and
output folder, nothing per document. Output does not depend on the worker count: every decision
sorts by stable keys, and equal run keys mean equal rows.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.beam.dofns import RUNS
from pipeline.beam.io import shard_name
from pipeline.beam.shards import (
    KEY,
    iter_transient,
    merge_runs_in_levels,
    read_transient,
    release_unused_memory,
    use_lean_memory_pool,
    write_transient,
)
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.decide import HASH_BYTES, drop_files, exact_documents, one_per_doc_id, shared_paragraphs, sort_key
from pipeline.corpus.filters import REJECT_SCHEMA, digest, normalise, text_digest
from pipeline.corpus.rejects import REJECTS_FOLDER, ROW_GROUP_ROWS, Rejecting
from pipeline.schema.parquet import DOCUMENT_SCHEMA
from pipeline.schema.storage import join_url

log = logging.getLogger("bertflow.corpus")

DIGEST_BYTES = 16
"""Raw bytes of a document text digest (:func:`pipeline.corpus.filters.text_digest`, hex there)."""
FRAGMENT_ROWS = 1000
"""Documents a worker holds before it writes them as one fragment (bounds worker memory)."""
FRAGMENT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("title", pa.string()),
        pa.field("digest", pa.string(), nullable=False),
        pa.field("paragraphs", pa.list_(pa.list_(pa.string()))),
    ]
)


FRAGMENT_ID_CHARS = 16


def paragraph_hash(sentences: list[str]) -> bytes:
    """Stable 12-byte hash of a paragraph's kept sentences, case- and whitespace-normalised."""
    text = normalise(" ".join(sentences))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=HASH_BYTES).digest()


def doc_digest(paragraphs: list[list[str]]) -> str:
    """The exact-dedup digest of a document: its sentences, paragraph breaks ignored."""
    return text_digest([s for p in paragraphs for s in p])


def norms_digest(norms: list[list[str]]) -> str:
    """:func:`doc_digest` from the sentences already normalised (:func:`pipeline.corpus.filters.normalise`)."""
    return digest("\n".join(s for p in norms for s in p))


def norms_hash(norms: list[str]) -> bytes:
    """:func:`paragraph_hash` from the paragraph's sentences already normalised."""
    return hashlib.blake2b(" ".join(norms).encode("utf-8"), digest_size=HASH_BYTES).digest()


# -- decisions applied ----------------------------------------------------------------------
def apply_drops(
    row: dict[str, Any], paragraphs_dropped: dict[int, str], config: CorpusConfig
) -> tuple[dict[str, Any] | None, str | None]:
    """A fragment row with the paragraphs at the given indexes removed -> (document row, None)
    or (None, the record reject reason) when what is left fails the document filters."""
    paragraphs = [p for i, p in enumerate(row["paragraphs"]) if i not in paragraphs_dropped]
    sentences = [s for p in paragraphs for s in p]
    if not sentences:
        return None, "all_paragraphs_duplicate"
    if len(sentences) < config.min_doc_sentences:
        return None, "too_few_sentences"
    num_chars = sum(len(s) for s in sentences)
    if num_chars < config.min_doc_chars:
        return None, "doc_too_short"
    return {
        "doc_id": row["doc_id"],
        "source": row["source"],
        "title": row["title"],
        "sentences": sentences,
        "num_sentences": len(sentences),
        "num_chars": num_chars,
    }, None


# -- fragments --------------------------------------------------------------------------------
class FragmentWriter:
    """Buffer a worker's documents; every FRAGMENT_ROWS write them as one fragment file.

    :meth:`add` returns the document's ref ``(fragment id, row)``; :meth:`close` writes the
    last fragment and returns the ids of every fragment written."""

    def __init__(self, work_url: str, rows: int = FRAGMENT_ROWS):
        self.work_url = work_url
        self.limit = rows
        self.rows: list[dict[str, Any]] = []
        self.fragment = _new_id()
        self.written: list[str] = []

    def add(self, row: dict[str, Any]) -> tuple[str, int]:
        ref = (self.fragment, len(self.rows))
        self.rows.append(row)
        if len(self.rows) >= self.limit:
            self._flush()
        return ref

    def _flush(self) -> None:
        if not self.rows:
            return
        rows = pa.Table.from_pylist(self.rows, schema=FRAGMENT_SCHEMA)
        write_transient(fragment_url(self.work_url, self.fragment), rows)
        self.written.append(self.fragment)
        self.rows, self.fragment = [], _new_id()

    def close(self) -> list[str]:
        self._flush()
        written, self.written = self.written, []
        return written


def _new_id() -> str:
    return uuid.uuid4().hex[:FRAGMENT_ID_CHARS]


def fragment_url(work_url: str, fragment: str) -> str:
    return join_url(work_url, "fragments", f"{fragment}.arrows")


def read_fragment(work_url: str, fragment: str) -> Iterator[dict[str, Any]]:
    """The documents of a fragment, in order, a few at a time (:func:`iter_transient`)."""
    return iter_transient(fragment_url(work_url, fragment))


# -- Beam: writing DoFns ----------------------------------------------------------------------
MERGE_BUDGET_BYTES = 4 << 20
"""Arrow bytes a merge holds across its runs' current batches. A merge holds about three times
that (the batches, their sorted slice, the slice the shard writer still buffers): 16 MiB had
52 MiB of Arrow memory at once merging wiki or book runs (measured), 4 MiB has 14-16, for the
same output and about the same CPU (4.4-5.0 s for 22 wiki runs of 163k rows either way; 1 MiB:
5.9 s)."""
MAX_FAN_IN = 16
"""Runs merged at once; more are first merged in groups into longer runs (a merge reads a
row group of every run, so its memory grows with the number of runs, not only the budget)."""
SHARD_ROW_GROUP_ROWS = 512
"""Row-group size of the output shards (what the last merge buffers before it writes)."""
KEYS = "keys"
"""Folder and tagged output of the document key runs: (run URL, rows) at the end of a bundle."""


# -- Beam: decisions, applied per fragment ----------------------------------------------------
class _Pass(beam.DoFn):
    """(partition, [runs]) of one decision pass -> what its function returns, as elements:
    ``(partition, run)`` of the next pass (main), of the drops (tagged "drops")."""

    def __init__(self, work_url: str, config: CorpusConfig, partitions: int):
        self.work_url = join_url(work_url, "decide")
        self.config = config
        self.partitions = partitions

    def setup(self):
        use_lean_memory_pool()

    def process(self, element):
        part, runs = element
        out, drops = self.run(sorted(runs), part)
        release_unused_memory()
        yield from out
        for item in drops:
            yield beam.pvalue.TaggedOutput("drops", item)


class _ExactDocuments(_Pass):
    def run(self, runs, part):
        return exact_documents(runs, self.work_url, self.config, part, self.partitions)


class _OnePerDocId(_Pass):
    def run(self, runs, part):
        return one_per_doc_id(runs, self.work_url, self.config, part, self.partitions)


class _SharedParagraphs(_Pass):
    def run(self, runs, part):
        return [], shared_paragraphs(runs, self.work_url, part, self.partitions)


class _DropFiles(_Pass):
    """(partition, [drop runs]) -> (fragment id, its drops file URL) per fragment with drops."""

    def process(self, element):
        part, runs = element
        yield from drop_files(sorted(runs), self.work_url, part).items()


class _ApplyDrops(Rejecting):
    """(fragment, ["" and its drops file URL, if any]) -> its documents, less what was
    dropped, in runs per source; dropped documents and paragraphs as reject rows."""

    def __init__(self, work_url: str, config: CorpusConfig):
        super().__init__(work_url)
        self.config = config

    def process(self, element):
        fragment, urls = element
        whole: dict[int, tuple[str, str]] = {}
        parts: dict[int, dict[int, str]] = {}
        for drop in (d for url in urls if url for d in read_transient(url)):
            row, paragraph = drop["row"], drop["paragraph"]
            if paragraph < 0:
                whole[row] = (drop["reason"], drop["detail"])
            else:
                parts.setdefault(row, {})[paragraph] = drop["detail"]
        for index, row in enumerate(read_fragment(self.work_url, fragment)):
            source, doc_id, title = row["source"], row["doc_id"], row["title"]
            if index in whole:
                reason, detail = whole[index]
                self.reject(
                    source,
                    reason,
                    record_id=doc_id,
                    title=title,
                    detail=detail,
                    sample=" ".join(s for p in row["paragraphs"] for s in p),
                )
                continue
            dropped = parts.get(index, {})
            for p, detail in sorted(dropped.items()):
                self.reject(
                    source,
                    "duplicate_paragraph_corpus",
                    record_id=doc_id,
                    title=title,
                    detail=detail,
                    sample=" ".join(row["paragraphs"][p]),
                )
            doc, reason = apply_drops(row, dropped, self.config)
            if reason:
                self.reject(
                    source,
                    reason,
                    record_id=doc_id,
                    title=title,
                    detail="after removing paragraphs kept in other documents",
                    sample=" ".join(s for p in row["paragraphs"] for s in p),
                )
                continue
            self.count(f"{source}_documents")
            self.count(f"{source}_sentences", doc["num_sentences"])
            self.count(f"{source}_chars", doc["num_chars"])
            doc[KEY] = sort_key(doc_id)
            self.write(source, doc)
        return ()


class _MergeFolder(beam.DoFn):
    """(folder, [(run URL, rows)]) -> (folder, rows per shard): balanced, key-ordered shards,
    merged at most MAX_FAN_IN runs at a time."""

    def __init__(self, output_url: str, work_url: str, num_shards: int):
        self.output_url = output_url
        self.work_url = work_url
        self.num_shards = num_shards

    def setup(self):
        use_lean_memory_pool()

    def process(self, element):
        folder, runs = element
        runs = sorted(runs)
        schema = REJECT_SCHEMA if folder == REJECTS_FOLDER else DOCUMENT_SCHEMA
        log.info(
            "corpus: %s: merging %d runs of %d rows into %d shards (at most %d runs at once)",
            folder,
            len(runs),
            sum(n for _, n in runs),
            self.num_shards,
            MAX_FAN_IN,
        )
        rows = merge_runs_in_levels(
            runs,
            join_url(self.work_url, "merge", folder),
            join_url(self.output_url, folder),
            schema,
            self.num_shards,
            shard_name,
            row_bytes=_row_bytes(runs),
            max_fan_in=MAX_FAN_IN,
            budget_bytes=MERGE_BUDGET_BYTES,
            level_row_group_rows=ROW_GROUP_ROWS,
            row_group_rows=SHARD_ROW_GROUP_ROWS,
            keep_levels=True,
        )  # the job removes its work folder
        yield folder, rows


def _row_bytes(runs: list[tuple[str, int]]) -> int:
    """Average uncompressed row size of run files, from their footers (sizes the merge reads)."""
    size = rows = 0
    for url, _ in runs:
        fs, path = fsspec.core.url_to_fs(url)
        with fs.open(path, "rb") as f:
            meta = pq.ParquetFile(f).metadata
        rows += meta.num_rows
        size += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    return max(64, size // max(1, rows))


class DedupAndWrite(beam.PTransform):
    """Key runs, fragment ids and runs -> the output folders written from fragments and runs.

    Input: the key runs of every built document (``(partition, (url, rows))``, :data:`KEYS` of
    the cleaning DoFn, partitioned by digest into ``partitions`` key ranges), the fragment ids
    and the runs already written (rejects of reading and cleaning). The decision passes
    (:mod:`pipeline.corpus.decide`) run one element per partition, in parallel, their run URLs
    grouped by partition between passes. Output: (folder, rows per shard) of each folder that
    received rows. The runner holds one element per run and per fragment, never one per
    document.
    """

    def __init__(self, config: CorpusConfig, work_url: str, output_url: str, partitions: int = 1):
        super().__init__()
        self.config = config
        self.work_url = work_url
        self.output_url = output_url
        self.partitions = partitions

    def expand(self, inputs):
        keys, fragments, runs = inputs
        cfg, work, parts = self.config, self.work_url, self.partitions
        exact = (
            keys
            | "KeysByDigest" >> beam.GroupByKey()
            | "ExactDocuments" >> beam.ParDo(_ExactDocuments(work, cfg, parts)).with_outputs("drops", main="next")
        )
        unique = (
            exact.next
            | "SurvivorsById" >> beam.GroupByKey()
            | "OnePerDocId" >> beam.ParDo(_OnePerDocId(work, cfg, parts)).with_outputs("drops", main="next")
        )
        shared = (
            unique.next
            | "ParagraphsByHash" >> beam.GroupByKey()
            | "SharedParagraphs" >> beam.ParDo(_SharedParagraphs(work, cfg, parts)).with_outputs("drops", main="next")
        )
        dropped = (
            (exact.drops, unique.drops, shared.drops)
            | "AllDrops" >> beam.Flatten()
            | "DropsByFragment" >> beam.GroupByKey()
            | "DropFiles" >> beam.ParDo(_DropFiles(work, cfg, parts))
        )
        applied = (
            (fragments | "EveryFragment" >> beam.Map(lambda f: (f, "")), dropped)
            | "FragmentsAndDrops" >> beam.Flatten()
            | "ByFragment" >> beam.GroupByKey()
            | "ApplyDrops" >> beam.ParDo(_ApplyDrops(work, cfg)).with_outputs(RUNS, main="none")
        )
        return (
            (runs, applied[RUNS])
            | "AllRuns" >> beam.Flatten()
            | "GroupByFolder" >> beam.GroupByKey()
            | "MergeFolder" >> beam.ParDo(_MergeFolder(self.output_url, self.work_url, cfg.num_shards))
        )
