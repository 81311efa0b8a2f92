"""Corpus-wide dedup decisions made by walking sorted key runs: memory bounded, whatever the corpus.

The corpus job used to send one small key per built document (and one per paragraph of a
surviving one) through Beam ``GroupByKey`` s; Beam's local runner buffers every grouped element
in the driver, so its memory grew with the dump (323 MiB at 50 MB of XML, 472 MiB at 500 MB).
Here the keys never become Beam elements:

1. The cleaning workers write each built document's key row (:data:`KEY_SCHEMA`: text digest,
   doc_id, title, fragment ref, paragraph hashes[, MinHash]) to key-sorted *runs*
   (:class:`pipeline.shards.RunWriter`, sorted by the first 8 bytes of the digest), and only
   the run URLs (one per bundle) go on.
2. One step (:func:`decide_drops`) makes every decision as a sequence of sort-and-walk passes,
   each a streaming merge of runs (:func:`pipeline.shards.iter_merged`, at most
   :data:`MAX_FAN_IN` runs at once) whose survivors are written to new runs keyed for the next
   pass: exact documents (by digest: smallest ``(doc_id, title)`` kept) -> [near duplicates]
   -> one row per doc_id (by doc_id: smallest ``(digest, title)`` kept) -> paragraphs (by
   paragraph hash: the smallest doc_id keeps it, then its first index). The decisions are those
   of the former GroupByKey version, so the output is byte for byte the same.
3. The drops (``fragment, row, paragraph or -1, reason, detail``) go to runs keyed by fragment
   and are written out as one small drops file per fragment that has any; the step emits one
   element per fragment (its id and its drops file), so the workers apply the drops in parallel.

What it costs: each key row is written and read once per pass (a few hundred bytes a document,
against the ~10 KiB of its text); the decisions run in one process, a sequential walk of ~3
CPU-seconds per 100,000 documents (measured on a random corpus, a third of it duplicates): ~4
minutes for the English Wikipedia's articles, a serial step that a many-worker Dataflow job
waits for (partitioning the passes by key range is the way to spread it). Memory: the merges' budget, the open run writers' budget (each flushes
at :data:`KEY_RUN_BYTES`) and one block of equal keys; no per-document bytes, except with
near-duplicate detection on (``near_dup_threshold > 0``), whose MinHash LSH holds every
surviving document's signature (~1.1 KiB each) in memory.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Callable, Iterable, Iterator

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import CorpusConfig
from pipeline.filters import near_duplicates
from pipeline.schema import join_url
from pipeline.shards import KEY, RunWriter, iter_merged

log = logging.getLogger("bertflow.corpus")

HASH_BYTES = 12
"""Bytes of a paragraph hash (:func:`pipeline.corpus_dedup.paragraph_hash`)."""
KEY_RUN_BYTES = 4 << 20
"""Arrow bytes a key, occurrence or drop run writer holds before it writes a run."""
KEY_MERGE_BYTES = 8 << 20
"""Arrow bytes a decision pass's merge holds across its runs' current batches."""
KEY_ROW_GROUP = 1024
"""Row-group size of key runs (a key row is ~100-300 bytes)."""
MAX_FAN_IN = 16
"""Runs one merge reads at once (more are merged in groups first)."""

KEY_SCHEMA = pa.schema([
    pa.field("digest", pa.binary(), nullable=False),
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("title", pa.string()),
    pa.field("fragment", pa.string(), nullable=False),
    pa.field("row", pa.int32(), nullable=False),
    pa.field("hashes", pa.binary(), nullable=False),  # the paragraph hashes, concatenated
    pa.field("sig", pa.list_(pa.uint64())),  # MinHash values, only with near-dup detection
])
OCCURRENCE_SCHEMA = pa.schema([
    pa.field("phash", pa.binary(), nullable=False),
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("fragment", pa.string(), nullable=False),
    pa.field("row", pa.int32(), nullable=False),
    pa.field("index", pa.int32(), nullable=False),
])
DROP_SCHEMA = pa.schema([
    pa.field("fragment", pa.string(), nullable=False),
    pa.field("row", pa.int32(), nullable=False),
    pa.field("paragraph", pa.int32(), nullable=False),  # -1: the whole document
    pa.field("reason", pa.string(), nullable=False),
    pa.field("detail", pa.string(), nullable=False),
])


def sort_key(text: str) -> int:
    """64-bit stable order of a row by a string (doc_id, fragment id, a reject row's content)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def prefix_key(data: bytes) -> int:
    """Sort key of a row grouped by a digest or hash: its first 8 bytes (already uniform)."""
    return int.from_bytes(data[:8], "big")


def key_row(digest: bytes, doc_id: str, title: str | None, ref: tuple[str, int],
            hashes: list[bytes], sig: list[int] | None = None) -> dict[str, Any]:
    """A document's key row (:data:`KEY_SCHEMA` plus its sort key)."""
    return {"digest": digest, "doc_id": doc_id, "title": title or "", "fragment": ref[0], "row": ref[1],
            "hashes": b"".join(hashes), "sig": sig, KEY: prefix_key(digest)}


# -- walking sorted runs ----------------------------------------------------------------------
def key_blocks(tables: Iterable[pa.Table]) -> Iterator[list[dict[str, Any]]]:
    """Rows of key-ordered tables in blocks of equal :data:`KEY` (a block may span tables)."""
    block: list[dict[str, Any]] = []
    for table in tables:
        for row in table.to_pylist():
            if block and row[KEY] != block[0][KEY]:
                yield block
                block = []
            block.append(row)
    if block:
        yield block


def by_field(rows: list[dict[str, Any]], field: str) -> list[list[dict[str, Any]]]:
    """Rows of one key block split by the exact value of ``field`` (64-bit keys may collide)."""
    if len(rows) == 1:
        return [rows]
    groups: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row[field], []).append(row)
    return list(groups.values())


def keep_first(values: Iterable, order: Callable) -> tuple[Any, list]:
    """(the value with the smallest ``order(value)``, the others in that order)."""
    ranked = sorted(values, key=order)
    return ranked[0], ranked[1:]


def paragraph_drops(occurrences: Iterable[tuple]) -> list[tuple[tuple, str]]:
    """Occurrences ``(doc_id, ref, index)`` of one paragraph in kept documents ->
    [(occurrence, the doc_id that keeps it)] to drop: the smallest doc_id keeps it (then the
    first index, when a document holds it twice)."""
    ranked = sorted(occurrences)
    return [(o, ranked[0][0]) for o in ranked[1:]]


class _Pass:
    """Runs of one pass: written by a RunWriter under ``work/<name>/``, merged under ``work/merge-<name>/``."""

    def __init__(self, work_url: str, name: str, schema: pa.Schema):
        self.work_url, self.name, self.schema = work_url, name, schema
        self.writer = RunWriter(schema, lambda r: join_url(work_url, name, f"run-{r:05d}.parquet"),
                                budget_bytes=KEY_RUN_BYTES, row_group_rows=KEY_ROW_GROUP)

    def add(self, row: dict[str, Any]) -> None:
        self.writer.add(row)

    def blocks(self) -> Iterator[list[dict[str, Any]]]:
        return walk(self.writer.close(), join_url(self.work_url, f"merge-{self.name}"), self.schema)


def walk(runs: list[tuple[str, int]], work_url: str, schema: pa.Schema) -> Iterator[list[dict[str, Any]]]:
    """Blocks of equal key of every row of ``runs``, in key order, in bounded memory."""
    return key_blocks(iter_merged(runs, work_url, schema, row_bytes=256, max_fan_in=MAX_FAN_IN,
                                  budget_bytes=KEY_MERGE_BYTES, level_row_group_rows=KEY_ROW_GROUP,
                                  keep_levels=True))  # the job removes its work folder


# -- the decisions ----------------------------------------------------------------------------
def decide_drops(key_runs: list[tuple[str, int]], work_url: str, config: CorpusConfig) -> dict[str, str]:
    """Every corpus-wide drop decided on the key rows in ``key_runs`` -> {fragment id: URL of
    its drops file} (fragments with no drop are left out). A drops file holds
    :data:`DROP_SCHEMA` rows; ``paragraph == -1`` drops the whole document."""
    drops = _Pass(work_url, "drops", DROP_SCHEMA)

    def drop(row: dict[str, Any], paragraph: int, reason: str, detail: str) -> None:
        drops.add({"fragment": row["fragment"], "row": row["row"], "paragraph": paragraph,
                   "reason": reason, "detail": detail, KEY: sort_key(row["fragment"])})

    # 1. exact documents, by text digest.
    survivors = _Pass(work_url, "survivors", KEY_SCHEMA)
    near = config.near_dup_threshold > 0
    signatures: list[tuple[str, list[int]]] = []
    for block in walk(key_runs, join_url(work_url, "merge-keys"), KEY_SCHEMA):
        for group in by_field(block, "digest") if config.dedup_sentences else [[r] for r in block]:
            keeper, others = keep_first(group, lambda r: (r["doc_id"], r["title"]))
            for other in others:
                drop(other, -1, "duplicate_document", f"same as {keeper['doc_id']}")
            if near:
                signatures.append((keeper["doc_id"], keeper["sig"]))
            keeper[KEY] = sort_key(keeper["doc_id"])
            survivors.add(keeper)
    nearly = near_duplicates(signatures, config.near_dup_threshold) if near else {}
    del signatures

    # 2. [near duplicates,] one row per doc_id.
    occurrences = _Pass(work_url, "occurrences", OCCURRENCE_SCHEMA)
    for block in survivors.blocks():
        live = []
        for row in block:
            kept = nearly.get(row["doc_id"])
            if kept is None:
                live.append(row)
            else:
                drop(row, -1, "near_duplicate_document", f"near duplicate of {kept}")
        for group in by_field(live, "doc_id") if live else []:
            keeper, others = keep_first(group, lambda r: (r["digest"], r["title"]))
            doc_id = keeper["doc_id"]
            if others:
                log.warning("corpus: %d documents share doc_id %s; kept one", len(others) + 1, doc_id)
            for other in others:
                drop(other, -1, "duplicate_doc_id", f"same as {doc_id}")
            hashes = keeper["hashes"]
            for index in range(len(hashes) // HASH_BYTES):
                phash = hashes[index * HASH_BYTES : (index + 1) * HASH_BYTES]
                occurrences.add({"phash": phash, "doc_id": doc_id, "fragment": keeper["fragment"],
                                 "row": keeper["row"], "index": index, KEY: prefix_key(phash)})

    # 3. paragraphs across the corpus: the smallest doc_id keeps one (then its first index).
    for block in occurrences.blocks():
        for group in by_field(block, "phash"):
            if len(group) < 2:
                continue
            occurrences_of = [(r["doc_id"], (r["fragment"], r["row"]), r["index"]) for r in group]
            for (_, (fragment, row), index), kept in paragraph_drops(occurrences_of):
                drop({"fragment": fragment, "row": row}, index, "duplicate_paragraph_corpus",
                     f"paragraph {index} same as {kept}")

    # The drops, one file per fragment.
    files: dict[str, str] = {}
    for block in drops.blocks():
        for group in by_field(block, "fragment"):
            fragment = group[0]["fragment"]
            url = join_url(work_url, "drops-by-fragment", f"{fragment}.parquet")
            _write(url, pa.Table.from_pylist(group, schema=DROP_SCHEMA))
            files[fragment] = url
    return files


def read_drops(url: str) -> list[dict[str, Any]]:
    """The rows of a drops file written by :func:`decide_drops`."""
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as f:
        return pq.read_table(f).to_pylist()


def _write(url: str, table: pa.Table) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(fs._parent(path), exist_ok=True)
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, compression="zstd")
