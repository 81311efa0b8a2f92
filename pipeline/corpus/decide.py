"""Corpus-wide dedup decisions made by walking sorted key runs: memory bounded, whatever the corpus.

The corpus job used to send one small key per built document (and one per paragraph of a
surviving one) through Beam ``GroupByKey`` s; Beam's local runner buffers every grouped element
in the driver, so its memory grew with the dump (323 MiB at 50 MB of XML, 472 MiB at 500 MB).
Here the keys never become Beam elements:

1. The cleaning workers write each built document's key row (:data:`KEY_SCHEMA`: text digest,
   doc_id, title, fragment ref, paragraph hashes[, MinHash]) to key-sorted *runs*
   (:class:`PartitionedRuns`: sorted by the first 8 bytes of the digest, one writer per key
   range), and only the run URLs (a few per bundle) go on.
2. Every decision is one pass of sort-and-walk over one key range at a time: a streaming merge
   of that range's runs (:func:`pipeline.beam.shards.iter_merged`, at most :data:`MAX_FAN_IN` runs at
   once) whose survivors are written to runs partitioned by the next pass's key: exact
   documents (by digest: smallest ``(doc_id, title)`` kept) -> [near duplicates] -> one row per
   doc_id (by doc_id: smallest ``(digest, title)`` kept) -> paragraphs (by paragraph hash: the
   smallest doc_id keeps it, then its first index). Every row of a group has the same key, so
   the same range: the decisions are those of the former GroupByKey version, and the output is
   byte for byte the same. The Beam job runs the ranges of a pass in parallel (one per worker)
   and groups run URLs by range between passes; :func:`decide_drops` runs them in turn.
3. The drops (``fragment, row, paragraph or -1, reason, detail``) go to runs keyed by fragment
   and are written out as one small drops file per fragment that has any.

What it costs: each key row is written and read once per pass (a few hundred bytes a document,
against the ~10 KiB of its text), ~3 CPU-seconds per 100,000 documents in all (measured on a
random corpus, a third of it duplicates), spread over the ranges. Memory of a pass: one merge's
budget (:data:`KEY_MERGE_BYTES`), the run writers' (:data:`KEY_RUN_BYTES` in all) and one block of
equal keys; no per-document bytes, except with near-duplicate detection on
(``near_dup_threshold > 0``): its MinHash LSH holds every surviving document's signature (~1.1
KiB each) in memory, so that pass runs as one range.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import fsspec
import pyarrow as pa

from pipeline.beam.shards import KEY, MAX_FAN_IN, RunWriter, iter_merged, read_transient, write_transient
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.filters import near_duplicates
from pipeline.schema.storage import join_url, write_atomically

log = logging.getLogger("bertflow.corpus")

HASH_BYTES = 12
"""Bytes of a paragraph hash (:func:`pipeline.corpus.dedup.paragraph_hash`)."""
KEY_RUN_BYTES = 4 << 20
"""Arrow bytes a key, occurrence or drop run writer holds before it writes a run."""
KEY_MERGE_BYTES = 8 << 20
"""Arrow bytes a decision pass's merge holds across its runs' current batches."""
KEY_ROW_GROUP = 1024
"""Row-group size of key runs (a key row is ~100-300 bytes)."""

KEY_SCHEMA = pa.schema(
    [
        pa.field("digest", pa.binary(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("title", pa.string()),
        pa.field("fragment", pa.string(), nullable=False),
        pa.field("row", pa.int32(), nullable=False),
        pa.field("hashes", pa.binary(), nullable=False),  # the paragraph hashes, concatenated
        pa.field("sig", pa.list_(pa.uint64())),  # MinHash values, only with near-dup detection
    ]
)
OCCURRENCE_SCHEMA = pa.schema(
    [
        pa.field("phash", pa.binary(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("fragment", pa.string(), nullable=False),
        pa.field("row", pa.int32(), nullable=False),
        pa.field("index", pa.int32(), nullable=False),
    ]
)
DROP_SCHEMA = pa.schema(
    [
        pa.field("fragment", pa.string(), nullable=False),
        pa.field("row", pa.int32(), nullable=False),
        pa.field("paragraph", pa.int32(), nullable=False),  # -1: the whole document
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
    ]
)


def sort_key(text: str) -> int:
    """64-bit stable order of a row by a string (doc_id, fragment id, a reject row's content)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def prefix_key(data: bytes) -> int:
    """Sort key of a row grouped by a digest or hash: its first 8 bytes (already uniform)."""
    return int.from_bytes(data[:8], "big")


def key_row(
    digest: bytes,
    doc_id: str,
    title: str | None,
    ref: tuple[str, int],
    hashes: list[bytes],
    sig: list[int] | None = None,
) -> dict[str, Any]:
    """A document's key row (:data:`KEY_SCHEMA` plus its sort key)."""
    return {
        "digest": digest,
        "doc_id": doc_id,
        "title": title or "",
        "fragment": ref[0],
        "row": ref[1],
        "hashes": b"".join(hashes),
        "sig": sig,
        KEY: prefix_key(digest),
    }


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


def partition_of(key: int, partitions: int) -> int:
    """The partition of a row by its 64-bit sort key (a key range): equal keys, same partition."""
    return (key * partitions) >> 64


class PartitionedRuns:
    """Keyed rows to key-sorted runs, one writer per partition of the next pass, under
    ``work_url/<name>/p<j>/``; :meth:`close` -> ``[(partition, (run URL, rows))]``. The writers'
    budget is shared: :data:`KEY_RUN_BYTES` of Arrow in all (at least 256 KiB each)."""

    def __init__(self, work_url: str, name: str, schema: pa.Schema, partitions: int = 1):
        self.work_url, self.name, self.schema, self.partitions = work_url, name, schema, partitions
        self.prefix = uuid.uuid4().hex[:16]  # several producers write into one partition folder
        self.writers: dict[int, RunWriter] = {}

    def add(self, row: dict[str, Any]) -> None:
        j = partition_of(row[KEY], self.partitions)
        writer = self.writers.get(j)
        if writer is None:
            folder = join_url(self.work_url, self.name, f"p{j:05d}")
            writer = self.writers[j] = RunWriter(
                self.schema,
                lambda r, folder=folder: join_url(folder, f"{self.prefix}-{r:05d}.parquet"),
                budget_bytes=max(min(256 << 10, KEY_RUN_BYTES), KEY_RUN_BYTES // self.partitions),
                row_group_rows=KEY_ROW_GROUP,
            )
        writer.add(row)

    def close(self) -> list[tuple[int, tuple[str, int]]]:
        runs = [(j, run) for j, writer in sorted(self.writers.items()) for run in writer.close()]
        self.writers = {}
        return runs


class Drops(PartitionedRuns):
    """Drops ``(fragment, row, paragraph or -1, reason, detail)`` to runs by fragment."""

    def __init__(self, work_url: str, name: str, partitions: int = 1):
        super().__init__(work_url, name, DROP_SCHEMA, partitions)

    def drop(self, fragment: str, row: int, paragraph: int, reason: str, detail: str) -> None:
        self.add(
            {
                "fragment": fragment,
                "row": row,
                "paragraph": paragraph,
                "reason": reason,
                "detail": detail,
                KEY: sort_key(fragment),
            }
        )


def walk(runs: list[tuple[str, int]], work_url: str, schema: pa.Schema) -> Iterator[list[dict[str, Any]]]:
    """Blocks of equal key of every row of ``runs``, in key order, in bounded memory."""
    return key_blocks(
        iter_merged(
            sorted(runs),
            work_url,
            schema,
            row_bytes=256,
            max_fan_in=MAX_FAN_IN,
            budget_bytes=KEY_MERGE_BYTES,
            level_row_group_rows=KEY_ROW_GROUP,
            keep_levels=True,
        )
    )  # the job removes its work folder


# -- the decisions: one function per pass, each over one partition of its key -----------------
# Each pass reads the runs of one partition (every row of a group has the same key, so the same
# partition) and writes what goes on to runs partitioned by the next pass's key. Beam groups the
# run URLs by partition between passes (pipeline.corpus.dedup); decide_drops runs them in turn.
def exact_documents(
    runs: list[tuple[str, int]], work_url: str, config: CorpusConfig, part: int, partitions: int
) -> tuple[list, list]:
    """Pass 1, exact documents (key: text digest): of documents with the same digest the
    smallest ``(doc_id, title)`` is kept. -> (survivor runs by doc_id partition, drop runs).
    With near-duplicate detection on (one partition only), the near duplicates among the
    survivors are found here and written to ``work_url/near.json`` for pass 2."""
    survivors = PartitionedRuns(work_url, "survivors", KEY_SCHEMA, partitions)
    drops = Drops(work_url, "drops", partitions)
    near = config.near_dup_threshold > 0
    signatures: list[tuple[str, list[int]]] = []
    for block in walk(runs, join_url(work_url, f"merge-keys-p{part:05d}"), KEY_SCHEMA):
        for group in by_field(block, "digest") if config.dedup_sentences else [[r] for r in block]:
            keeper, others = keep_first(group, lambda r: (r["doc_id"], r["title"]))
            for other in others:
                drops.drop(other["fragment"], other["row"], -1, "duplicate_document", f"same as {keeper['doc_id']}")
            if near:
                signatures.append((keeper["doc_id"], keeper["sig"]))
            keeper[KEY] = sort_key(keeper["doc_id"])
            survivors.add(keeper)
    if near:
        if partitions != 1:
            raise ValueError("near-duplicate detection needs every signature in one partition")
        write_atomically(join_url(work_url, NEAR), json.dumps(near_duplicates(signatures, config.near_dup_threshold)))
    return survivors.close(), drops.close()


NEAR = "near.json"
"""{doc_id: the doc_id it nearly duplicates} of pass 1, read by pass 2 (near-dup on only)."""


def one_per_doc_id(
    runs: list[tuple[str, int]], work_url: str, config: CorpusConfig, part: int, partitions: int
) -> tuple[list, list]:
    """Pass 2 (key: doc_id): near duplicates dropped, then of rows with the same doc_id the
    smallest ``(digest, title)`` is kept, and the keeper's paragraphs go on.
    -> (occurrence runs by paragraph-hash partition, drop runs)."""
    nearly = {}
    if config.near_dup_threshold > 0:
        with fsspec.open(join_url(work_url, NEAR), "r") as f:
            nearly = json.load(f)
    occurrences = PartitionedRuns(work_url, "occurrences", OCCURRENCE_SCHEMA, partitions)
    drops = Drops(work_url, "drops", partitions)
    for block in walk(runs, join_url(work_url, f"merge-survivors-p{part:05d}"), KEY_SCHEMA):
        live = []
        for row in block:
            kept = nearly.get(row["doc_id"])
            if kept is None:
                live.append(row)
            else:
                drops.drop(row["fragment"], row["row"], -1, "near_duplicate_document", f"near duplicate of {kept}")
        for group in by_field(live, "doc_id") if live else []:
            keeper, others = keep_first(group, lambda r: (r["digest"], r["title"]))
            doc_id = keeper["doc_id"]
            if others:
                log.warning("corpus: %d documents share doc_id %s; kept one", len(others) + 1, doc_id)
            for other in others:
                drops.drop(other["fragment"], other["row"], -1, "duplicate_doc_id", f"same as {doc_id}")
            hashes = keeper["hashes"]
            for index in range(len(hashes) // HASH_BYTES):
                phash = hashes[index * HASH_BYTES : (index + 1) * HASH_BYTES]
                occurrences.add(
                    {
                        "phash": phash,
                        "doc_id": doc_id,
                        "fragment": keeper["fragment"],
                        "row": keeper["row"],
                        "index": index,
                        KEY: prefix_key(phash),
                    }
                )
    return occurrences.close(), drops.close()


def shared_paragraphs(runs: list[tuple[str, int]], work_url: str, part: int, partitions: int) -> list:
    """Pass 3 (key: paragraph hash): of the kept documents that hold a paragraph the smallest
    doc_id keeps it (then its first index). -> drop runs."""
    drops = Drops(work_url, "drops", partitions)
    for block in walk(runs, join_url(work_url, f"merge-occurrences-p{part:05d}"), OCCURRENCE_SCHEMA):
        for group in by_field(block, "phash"):
            if len(group) < 2:
                continue
            occurrences_of = [(r["doc_id"], (r["fragment"], r["row"]), r["index"]) for r in group]
            for (_, (fragment, row), index), kept in paragraph_drops(occurrences_of):
                drops.drop(fragment, row, index, "duplicate_paragraph_corpus", f"paragraph {index} same as {kept}")
    return drops.close()


def drop_files(runs: list[tuple[str, int]], work_url: str, part: int) -> dict[str, str]:
    """The drops of one fragment partition, one file per fragment -> {fragment id: URL}."""
    files: dict[str, str] = {}
    for block in walk(runs, join_url(work_url, f"merge-drops-p{part:05d}"), DROP_SCHEMA):
        for group in by_field(block, "fragment"):
            fragment = group[0]["fragment"]
            url = join_url(work_url, "drops-by-fragment", f"{fragment}.arrows")
            write_transient(url, pa.Table.from_pylist(group, schema=DROP_SCHEMA))
            files[fragment] = url
    return files


def decide_drops(key_runs: list, work_url: str, config: CorpusConfig, partitions: int = 1) -> dict[str, str]:
    """Every corpus-wide drop decided on the key runs ``[(partition, (url, rows))]`` (or
    ``[(url, rows)]`` of one partition) -> {fragment id: URL of its drops file}; fragments with
    no drop are left out. A drops file holds :data:`DROP_SCHEMA` rows; ``paragraph == -1``
    drops the whole document. The passes in turn, each over every partition: what the Beam
    job does with a GroupByKey of run URLs between passes."""
    by_part = _by_partition(key_runs)
    survivors, drops = [], []
    for j, runs in by_part.items():
        s, d = exact_documents(runs, work_url, config, j, partitions)
        survivors, drops = survivors + s, drops + d
    occurrences = []
    for j, runs in _by_partition(survivors).items():
        o, d = one_per_doc_id(runs, work_url, config, j, partitions)
        occurrences, drops = occurrences + o, drops + d
    for j, runs in _by_partition(occurrences).items():
        drops += shared_paragraphs(runs, work_url, j, partitions)
    files: dict[str, str] = {}
    for j, runs in _by_partition(drops).items():
        files.update(drop_files(runs, work_url, j))
    return files


def _by_partition(runs: list) -> dict[int, list[tuple[str, int]]]:
    out: dict[int, list[tuple[str, int]]] = {}
    for item in runs:
        j, run = item if isinstance(item[1], tuple) else (0, item)
        out.setdefault(j, []).append(run)
    return dict(sorted(out.items()))


read_drops = read_transient
"""The rows of a drops file written by :func:`decide_drops`."""
