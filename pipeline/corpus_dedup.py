"""Corpus-wide exact dedup decided on small keys; document text moves through files, not shuffles.

The corpus job used to group whole documents (exact dedup, unique doc ids, output shards,
rejects with their samples): Beam's local runner holds every grouped element in memory, so the
stage grew by ~3.5 MiB per MB of XML. Here:

1. Workers write the documents they build to **fragments** (Parquet files of at most
   :data:`FRAGMENT_ROWS` documents, paragraphs kept as lists of sentences) and rejects to
   key-sorted runs (:class:`pipeline.shards.RunWriter`); only small keys go on, each packed
   into one ``bytes`` (the local runner holds grouped values as Python objects: a tuple of
   strings cost ~650 bytes a document, the packed form ~170): a document key
   ``(16-byte text digest, pack_doc(doc_id, title, ref, paragraph hashes[, minhash]))`` with
   ``ref = (fragment, row)``.
2. The decisions are made on those keys (:func:`keep_first`, :func:`paragraph_drops`):
   exact documents (smallest ``(doc_id, title)`` kept), near duplicates (optional), one row per
   doc_id (smallest ``(digest, title)`` kept), then paragraphs across the corpus: the keeper of
   each doc_id passes on one key per paragraph ``(12-byte hash, pack_occurrence(doc_id, ref,
   index))``, and of the documents that hold a paragraph the smallest doc_id keeps it. Only
   survivors take part, so no text is lost to a dropped document.
3. The drops are grouped by fragment (a handful of small tuples), each fragment is read once and
   its kept documents go to key-sorted runs (:func:`apply_drops`), and every output folder is a
   streaming merge of its runs (:func:`pipeline.shards.merge_runs_in_levels`, at most
   :data:`MAX_FAN_IN` at once): balanced shards in the order of a 64-bit digest of doc_id
   (rejects: of the whole row).

What it costs: every document is written and read twice more (a fragment, then a run), and
the local runner still holds the keys (~190 bytes per built document, ~60 per paragraph of a
surviving one) instead of the text. Output does not depend on the worker count: every decision sorts by stable keys, and
equal run keys mean equal rows.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import uuid
from typing import Any, Iterable

import apache_beam as beam
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from pipeline.beam_io import shard_name
from pipeline.config import CorpusConfig
from pipeline.filters import REJECT_SCHEMA, near_duplicates, normalise, reject_row, text_digest
from pipeline.schema import DOCUMENT_SCHEMA, join_url
from pipeline.shards import KEY, RunWriter, merge_runs_in_levels, use_lean_memory_pool

log = logging.getLogger("bertflow.corpus")

DIGEST_BYTES = 16
"""Raw bytes of a document text digest (:func:`pipeline.filters.text_digest`, hex there)."""
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


HASH_BYTES = 12
FRAGMENT_ID_CHARS = 16


def paragraph_hash(sentences: list[str]) -> bytes:
    """Stable 12-byte hash of a paragraph's kept sentences, case- and whitespace-normalised."""
    text = normalise(" ".join(sentences))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=HASH_BYTES).digest()


def sort_key(text: str) -> int:
    """64-bit stable order of an output row (doc_id, or a reject row's content)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def doc_digest(paragraphs: list[list[str]]) -> str:
    """The exact-dedup digest of a document: its sentences, paragraph breaks ignored."""
    return text_digest([s for p in paragraphs for s in p])


# -- small keys, packed -----------------------------------------------------------------------
# Beam's local runner holds a grouped value as a Python object: a tuple of strings and a list of
# hashes costs ~650 bytes a document, one bytes object ~170. Keys are raw digests for the same
# reason. The layouts: struct header, then the variable fields in order.
_DOC = struct.Struct("<HHIHH")  # len(doc_id), len(title), row, paragraphs, minhash values


def pack_doc(doc_id: str, title: str, ref: tuple[str, int], hashes: list[bytes],
             sig: list[int] | None = None) -> bytes:
    """A document's key value: doc_id, title, ref, paragraph hashes[, MinHash signature]."""
    i, t, f = doc_id.encode(), (title or "").encode(), ref[0].encode("ascii")
    sig = sig or []
    return b"".join([_DOC.pack(len(i), len(t), ref[1], len(hashes), len(sig)), i, t, f, *hashes,
                     struct.pack(f"<{len(sig)}Q", *sig)])


def unpack_doc(data: bytes) -> tuple[str, str, tuple[str, int], list[bytes], list[int] | None]:
    ni, nt, row, nh, ns = _DOC.unpack_from(data)
    at = _DOC.size
    doc_id = data[at : at + ni].decode()
    at += ni
    title = data[at : at + nt].decode()
    at += nt
    frag = data[at : at + FRAGMENT_ID_CHARS].decode("ascii")
    at += FRAGMENT_ID_CHARS
    hashes = [data[at + k * HASH_BYTES : at + (k + 1) * HASH_BYTES] for k in range(nh)]
    at += nh * HASH_BYTES
    sig = list(struct.unpack_from(f"<{ns}Q", data, at)) if ns else None
    return doc_id, title, (frag, row), hashes, sig


_OCC = struct.Struct("<IH")  # row, paragraph index; then the fragment id and the doc_id


def pack_occurrence(doc_id: str, ref: tuple[str, int], index: int) -> bytes:
    return _OCC.pack(ref[1], index) + ref[0].encode("ascii") + doc_id.encode()


def unpack_occurrence(data: bytes) -> tuple[str, tuple[str, int], int]:
    row, index = _OCC.unpack_from(data)
    at = _OCC.size + FRAGMENT_ID_CHARS
    return data[at:].decode(), (data[_OCC.size : at].decode("ascii"), row), index


# -- decisions on small keys ------------------------------------------------------------------
def keep_first(values: Iterable[tuple], order) -> tuple[tuple, list[tuple]]:
    """(the value with the smallest ``order(value)``, the others in that order)."""
    ranked = sorted(values, key=order)
    return ranked[0], ranked[1:]


def paragraph_drops(occurrences: Iterable[tuple]) -> list[tuple[tuple, str]]:
    """Occurrences ``(doc_id, ref, index)`` of one paragraph in kept documents ->
    [(occurrence, the doc_id that keeps it)] to drop: the smallest doc_id keeps it (then the
    first index, when a document holds it twice)."""
    ranked = sorted(occurrences)
    return [(o, ranked[0][0]) for o in ranked[1:]]


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
        write_table(fragment_url(self.work_url, self.fragment),
                    pa.Table.from_pylist(self.rows, schema=FRAGMENT_SCHEMA))
        self.written.append(self.fragment)
        self.rows, self.fragment = [], _new_id()

    def close(self) -> list[str]:
        self._flush()
        written, self.written = self.written, []
        return written


def _new_id() -> str:
    return uuid.uuid4().hex[:FRAGMENT_ID_CHARS]


def fragment_url(work_url: str, fragment: str) -> str:
    return join_url(work_url, "fragments", f"{fragment}.parquet")


def write_table(url: str, table: pa.Table) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(fs._parent(path), exist_ok=True)
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, compression="zstd")


def read_fragment(work_url: str, fragment: str) -> list[dict[str, Any]]:
    fs, path = fsspec.core.url_to_fs(fragment_url(work_url, fragment))
    with fs.open(path, "rb") as f:
        return pq.read_table(f).to_pylist()


# -- Beam: writing DoFns ----------------------------------------------------------------------
NAMESPACE = "corpus"
REJECTS_FOLDER = "rejects"
MERGE_BUDGET_BYTES = 16 << 20
"""Arrow bytes a merge holds across its runs' current batches."""
MAX_FAN_IN = 16
"""Runs merged at once; more are first merged in groups into longer runs (a merge reads a
row group of every run, so its memory grows with the number of runs, not only the budget)."""
ROW_GROUP_ROWS = 128
"""Row-group size of runs (a document row is up to a few KiB): what a merge reads per run."""
SHARD_ROW_GROUP_ROWS = 512
"""Row-group size of the output shards (what the last merge buffers before it writes)."""
RUNS = "runs"
"""Tagged output of every writing DoFn: (output folder, (run URL, rows)) at the end of a bundle."""


def windowed(value):
    return WindowedValue(value, GlobalWindow().max_timestamp(), [GlobalWindow()])


class Counted(beam.DoFn):
    """A DoFn that counts under namespace "corpus", creating each counter once."""

    def setup(self):
        self._counters = {}

    def count(self, name: str, value: int = 1) -> None:
        if name not in self._counters:
            self._counters[name] = Metrics.counter(NAMESPACE, name)
        self._counters[name].inc(value)


class Writing(Counted):
    """A counting DoFn that writes rows (rejects, documents) to key-sorted runs under
    ``work_url/runs/<folder>/`` and announces them on the tagged output :data:`RUNS` when its
    bundle ends, so rows never cross a shuffle."""

    def __init__(self, work_url: str):
        self.work_url = work_url

    def setup(self):
        super().setup()
        use_lean_memory_pool()

    def start_bundle(self):
        self._writers: dict[str, RunWriter] = {}

    def write(self, folder: str, row: dict[str, Any]) -> None:
        writer = self._writers.get(folder)
        if writer is None:
            schema = REJECT_SCHEMA if folder == REJECTS_FOLDER else DOCUMENT_SCHEMA
            prefix = _new_id()
            writer = self._writers[folder] = RunWriter(
                schema, lambda r: join_url(self.work_url, RUNS, folder, f"{prefix}-{r:04d}.parquet"),
                row_group_rows=ROW_GROUP_ROWS)
        writer.add(row)

    def reject(self, source: str, reason: str, **fields) -> None:
        """Count ``reason`` and write a reject row (ordered by a digest of its whole content)."""
        self.count(reason)
        row = reject_row(source, reason, **fields)
        row[KEY] = sort_key("\x1f".join((row["reject_id"], row["title"] or "", row["sample"])))
        self.write(REJECTS_FOLDER, row)

    def finish_bundle(self):
        for folder, writer in sorted(self._writers.items()):
            for run in writer.close():
                yield beam.pvalue.TaggedOutput(RUNS, windowed((folder, run)))
        self._writers = {}


# -- Beam: decisions on small keys ------------------------------------------------------------
def _drop(ref, paragraph: int, reason: str, detail: str):
    """A drop, keyed by fragment: (fragment, (row, paragraph index or -1 for the document,
    reason, detail))."""
    return ref[0], (ref[1], paragraph, reason, detail)


def _dedup_documents(element):
    """(digest, [packed document]) -> survivors (doc_id, digest + packed); drops of the rest."""
    digest, values = element
    docs = [(unpack_doc(v), v) for v in values]
    (keeper, packed), others = keep_first(docs, lambda d: (d[0][0], d[0][1]))
    for (_, _, ref, _, _), _ in others:
        yield beam.pvalue.TaggedOutput("drops", _drop(ref, -1, "duplicate_document", f"same as {keeper[0]}"))
    yield keeper[0], digest + packed


def _as_survivor(element):
    digest, packed = element
    return unpack_doc(packed)[0], digest + packed


def _signature(element):
    doc_id, value = element
    return 0, (doc_id, unpack_doc(value[DIGEST_BYTES:])[4])


class _DropNear(beam.DoFn):
    def process(self, element, dropped):
        doc_id, value = element
        kept = dropped.get(doc_id)
        if kept is None:
            yield element
        else:
            ref = unpack_doc(value[DIGEST_BYTES:])[2]
            yield beam.pvalue.TaggedOutput(
                "drops", _drop(ref, -1, "near_duplicate_document", f"near duplicate of {kept}"))


def _unique_doc_ids(element):
    """(doc_id, [digest + packed]) -> the paragraph keys of the one kept; drops of the rest."""
    doc_id, values = element
    docs = [(v[:DIGEST_BYTES], unpack_doc(v[DIGEST_BYTES:])) for v in values]
    (_, keeper), others = keep_first(docs, lambda d: (d[0], d[1][1]))
    if others:
        log.warning("corpus: %d documents share doc_id %s; kept one", len(others) + 1, doc_id)
    for _, (_, _, ref, _, _) in others:
        yield beam.pvalue.TaggedOutput("drops", _drop(ref, -1, "duplicate_doc_id", f"same as {doc_id}"))
    _, _, ref, hashes, _ = keeper
    for index, phash in enumerate(hashes):
        yield phash, pack_occurrence(doc_id, ref, index)


def _paragraph_drops(element):
    _phash, occurrences = element
    for (_doc_id, ref, index), kept in paragraph_drops(map(unpack_occurrence, occurrences)):
        yield _drop(ref, index, "duplicate_paragraph_corpus", f"paragraph {index} same as {kept}")


class _ApplyDrops(Writing):
    """(fragment, [None | drop]) -> its documents, less what was dropped, in runs per source;
    dropped documents and paragraphs as reject rows."""

    def __init__(self, work_url: str, config: CorpusConfig):
        super().__init__(work_url)
        self.config = config

    def process(self, element):
        fragment, items = element
        whole: dict[int, tuple[str, str]] = {}
        parts: dict[int, dict[int, str]] = {}
        for item in items:
            if item is None:
                continue
            row, paragraph, reason, detail = item
            if paragraph < 0:
                whole[row] = (reason, detail)
            else:
                parts.setdefault(row, {})[paragraph] = detail
        for index, row in enumerate(read_fragment(self.work_url, fragment)):
            source, doc_id, title = row["source"], row["doc_id"], row["title"]
            if index in whole:
                reason, detail = whole[index]
                self.reject(source, reason, record_id=doc_id, title=title, detail=detail,
                            sample=" ".join(s for p in row["paragraphs"] for s in p))
                continue
            dropped = parts.get(index, {})
            for p, detail in sorted(dropped.items()):
                self.reject(source, "duplicate_paragraph_corpus", record_id=doc_id, title=title,
                            detail=detail, sample=" ".join(row["paragraphs"][p]))
            doc, reason = apply_drops(row, dropped, self.config)
            if reason:
                self.reject(source, reason, record_id=doc_id, title=title,
                            detail="after removing paragraphs kept in other documents",
                            sample=" ".join(s for p in row["paragraphs"] for s in p))
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
        rows = merge_runs_in_levels(
            runs, join_url(self.work_url, "merge", folder), join_url(self.output_url, folder), schema,
            self.num_shards, shard_name, row_bytes=_row_bytes(runs), max_fan_in=MAX_FAN_IN,
            budget_bytes=MERGE_BUDGET_BYTES, level_row_group_rows=ROW_GROUP_ROWS,
            row_group_rows=SHARD_ROW_GROUP_ROWS, keep_levels=True)  # the job removes its work folder
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
    """Document keys -> the output folders written from fragments and runs.

    Input: the document keys ``(digest, (doc_id, title, ref, paragraph hashes, minhash))`` of
    every built document, the fragment ids and the runs already written (rejects of reading
    and cleaning). Output: (folder, rows per shard) of each folder that received rows.
    """

    def __init__(self, config: CorpusConfig, work_url: str, output_url: str):
        super().__init__()
        self.config = config
        self.work_url = work_url
        self.output_url = output_url

    def expand(self, inputs):
        keys, fragments, runs = inputs
        cfg = self.config
        drops = []
        if cfg.dedup_sentences:
            exact = (
                keys
                | "GroupByText" >> beam.GroupByKey()
                | "KeepSmallestId" >> beam.FlatMap(_dedup_documents).with_output_types(Any).with_outputs("drops", main="kept")
            )
            survivors = exact.kept
            drops.append(exact.drops)
        else:
            survivors = keys | "ById" >> beam.Map(_as_survivor)
        if cfg.near_dup_threshold > 0:
            t = cfg.near_dup_threshold
            dropped = (
                survivors
                | "Sign" >> beam.Map(_signature)
                | "AllSignatures" >> beam.GroupByKey()
                | "Cluster" >> beam.Map(lambda kv: near_duplicates(list(kv[1]), t))
            )
            near = survivors | "DropNear" >> beam.ParDo(
                _DropNear(), beam.pvalue.AsSingleton(dropped)).with_output_types(Any).with_outputs("drops", main="kept")
            survivors = near.kept
            drops.append(near.drops)
        unique = (
            survivors
            | "GroupById" >> beam.GroupByKey()
            | "KeepOnePerId" >> beam.FlatMap(_unique_doc_ids).with_output_types(Any).with_outputs("drops", main="paragraphs")
        )
        drops.append(unique.drops)
        if cfg.dedup_paragraphs:
            drops.append(
                unique.paragraphs
                | "GroupByParagraph" >> beam.GroupByKey()
                | "KeepFirstParagraph" >> beam.FlatMap(_paragraph_drops).with_output_types(Any)
            )
        applied = (
            [fragments | "EveryFragment" >> beam.Map(lambda f: (f, None))] + drops
            | "AllDrops" >> beam.Flatten()
            | "GroupByFragment" >> beam.GroupByKey()
            | "ApplyDrops" >> beam.ParDo(_ApplyDrops(self.work_url, cfg)).with_outputs(RUNS, main="none")
        )
        return (
            (runs, applied[RUNS])
            | "AllRuns" >> beam.Flatten()
            | "GroupByFolder" >> beam.GroupByKey()
            | "MergeFolder" >> beam.ParDo(_MergeFolder(self.output_url, self.work_url, cfg.num_shards))
        )
