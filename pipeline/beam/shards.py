"""Balanced, key-ordered Parquet shards built in bounded memory: sorted runs, then a streaming merge.

The examples job used to group each shard's rows (``GroupByKey``) and sort them in memory, so a
worker — and Beam's local runner, which buffers every grouped element — held the whole output at
once (~4.5 KiB per example). Here no step ever holds more than a bounded amount of rows:

1. Producers hand rows (dicts with a ``uint64`` sort key in :data:`KEY`) to a :class:`RunWriter`,
   which converts them to Arrow record batches and, every :data:`RUN_BUDGET_BYTES`, sorts what it
   holds by key and writes it as one *run* file (small row groups, key column kept).
2. :func:`merge_runs` merges every run of one output with a vectorised k-way merge (each round
   takes, from every run, the rows up to the smallest "last key" among the runs' current
   batches, sorts that slice stably and emits it), and streams the result into ``num_shards``
   files: shard ``j`` holds global ranks ``[j*N//k, (j+1)*N//k)``, so row counts differ by at
   most one and each shard is a contiguous range of the global key order.

The choice, at what cost: every example is written twice (run, then shard) and read once more;
the merge of one output runs in one process (a sequential pass, I/O bound: it is not what limits
the job here), and holds ``num_runs x batch_rows`` rows. Ties between equal keys (64-bit digests
of unique ids: practically never) are broken by run order, then row order, both deterministic.
Byte-identical output follows from the runs' contents being deterministic and every size
constant below being independent of the worker count.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc  # noqa: F401 (pa.ipc)
import pyarrow.parquet as pq

from pipeline.schema.parquet import READ_OPTIONS, WRITE_OPTIONS
from pipeline.schema.storage import is_local_fs

KEY = "sort_key"
"""Transient uint64 column: picks the order (and so the shard) of a row; dropped on write."""
RUN_BUDGET_BYTES = 8 << 20
"""Arrow bytes a RunWriter holds before it sorts and writes a run."""
CONVERT_ROWS = 512
"""Most Python row dicts a RunWriter holds before it converts them to one Arrow record batch."""
CONVERT_BYTES = 1 << 20
"""About the most Arrow bytes of rows it holds as Python objects, by the size of the rows it has
converted so far: 512 book documents (20-100 KB each) at a time kept ~10-50 MB of Python objects
in a corpus worker applying the drops (a replay of 80 fragments: peak RSS 328 -> 311 MiB with
it). Small rows (keys, examples) are still converted 512 at a time."""
FIRST_CONVERT_ROWS = 16
"""Rows a RunWriter converts first, alone, to learn their size."""
RUN_ROW_GROUP = 1024
"""Row-group size of run files: the unit the merge reads, so what it holds per run."""
RUN_ROW_GROUP_BYTES = 1 << 20
"""Most Arrow bytes in a row group of a run file (fewer rows than RUN_ROW_GROUP when rows are
large): a merge holds one row group of every run it reads, decompressed whole, so with whole
books as rows (~100 KB each) a 1,024-row group held ~100 MB per run, and a merge's memory grew
with its number of runs up to MAX_FAN_IN, i.e. with the corpus (docs/scale.md)."""
SHARD_ROW_GROUP = 4096
"""Row-group size of the final shards."""
MERGE_BUDGET_BYTES = 64 << 20
"""Arrow bytes the merge may hold across all runs' current batches."""


def use_lean_memory_pool() -> None:
    """Make Arrow allocate with jemalloc (else the system allocator) in this process.

    The default mimalloc pool keeps freed pages of every thread's heap: reading a bucket's
    token files grew the resident size by ~85 MB for 2 MB of live Arrow data (measured), and a
    worker's peak is what the job's memory bound is made of."""
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:
        pool = pa.system_memory_pool()
    if pa.default_memory_pool().backend_name != pool.backend_name:
        pa.set_memory_pool(pool)


def with_key(schema: pa.Schema) -> pa.Schema:
    return schema.append(pa.field(KEY, pa.uint64(), nullable=False))


def _open_write(url: str):
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(fs._parent(path), exist_ok=True)
    return fs.open(path, "wb")


def write_table(url: str, table: pa.Table) -> None:
    """One Parquet file (zstd) holding ``table``; parent folders made as needed."""
    with _open_write(url) as f:
        pq.write_table(table, f, **WRITE_OPTIONS)


TRANSIENT_ROWS = 64
"""Rows of a record batch in a work file (:func:`write_transient`): what a reader holds at a time."""


def write_transient(url: str, table: pa.Table) -> None:
    """One work file of a job, written and read back by the same job (never an output):
    an Arrow IPC stream, uncompressed on a local filesystem, zstd on any other (an object store,
    where the bytes moved cost more than the CPU). Read with :func:`read_transient`.

    Not Parquet: a handing-off reader writes every page it reads once more and every worker
    reads it back; 5.7 MB of wikitext (the real enwiki dump's 206 pages) took 29.6 ms of CPU
    to write and read back as Parquet with zstd (the outputs' options), 14.3 ms uncompressed,
    6.2 ms as an uncompressed Arrow stream (22.5 ms with zstd buffers): Parquet's encodings are
    for data that is kept and scanned, a transient file needs neither. The price: a local work
    folder holds ~2.5x the bytes of zstd (5.76 against 2.30 MB there) until its job removes it."""
    local = is_local_fs(fsspec.core.url_to_fs(url)[0])
    options = pa.ipc.IpcWriteOptions(compression=None if local else "zstd")
    with _open_write(url) as f, pa.ipc.new_stream(f, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=TRANSIENT_ROWS)


def read_transient(url: str) -> list[dict[str, Any]]:
    """Every row of a file :func:`write_transient` wrote, as dicts."""
    return list(iter_transient(url))


def iter_transient(url: str) -> Iterator[dict[str, Any]]:
    """The rows of a file :func:`write_transient` wrote, as dicts, one record batch
    (:data:`TRANSIENT_ROWS` rows) read at a time: a corpus fragment (1,000 documents) written as
    one batch and read whole held up to ~35 MB of bytes for book documents (``tracemalloc``),
    then all its rows as Python lists of sentences, in every worker of the job's last phase."""
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as f:
        for batch in pa.ipc.open_stream(f):
            yield from batch.to_pylist()


def release_unused_memory() -> None:
    """Hand the pages Arrow's pool has freed back to the system. jemalloc returns freed pages
    only as later allocations in the same arena pass its decay time: a worker that ends a merge
    kept ~40-80 MB of them (measured) into whatever it did next. Called where a unit of work ends
    (a run written, a merge, a decision pass), never per row: each call re-faults what it gives back."""
    pa.default_memory_pool().release_unused()


def read_rows(url: str) -> list[dict[str, Any]]:
    """Every row of one Parquet file, as dicts."""
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as f:
        return pq.read_table(f, **READ_OPTIONS).to_pylist()


class RunWriter:
    """Collect keyed rows; write them as key-sorted run files of bounded size.

    ``url_for(run_index)`` names each run file. :meth:`close` writes the last run and returns
    ``[(url, rows), ...]``.
    """

    def __init__(
        self, schema: pa.Schema, url_for, budget_bytes: int = RUN_BUDGET_BYTES, row_group_rows: int = RUN_ROW_GROUP
    ):
        self.schema = with_key(schema)
        self.url_for = url_for
        self.budget = budget_bytes
        self.row_group_rows = row_group_rows
        self.rows: list[dict[str, Any]] = []
        self.convert_rows = FIRST_CONVERT_ROWS
        self.batches: list[pa.RecordBatch] = []
        self.held = 0
        self.written: list[tuple[str, int]] = []

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.convert_rows:
            self._convert()

    def _convert(self) -> None:
        if not self.rows:
            return
        batch = pa.RecordBatch.from_pylist(self.rows, schema=self.schema)
        self.convert_rows = max(1, min(CONVERT_ROWS, CONVERT_BYTES * batch.num_rows // max(1, batch.nbytes)))
        self.rows = []
        self.batches.append(batch)
        self.held += batch.nbytes
        if self.held >= self.budget:
            self._flush()

    def _flush(self) -> None:
        if not self.batches:
            return
        table = pa.Table.from_batches(self.batches, schema=self.schema)
        self.batches, self.held = [], 0
        table = table.take(pc.sort_indices(table, sort_keys=[(KEY, "ascending")]))
        url = self.url_for(len(self.written))
        rows = bounded_row_group(self.row_group_rows, table.nbytes // max(1, table.num_rows))
        with _open_write(url) as f:
            pq.write_table(table, f, row_group_size=rows, **WRITE_OPTIONS)
        self.written.append((url, table.num_rows))
        del table
        release_unused_memory()

    def close(self) -> list[tuple[str, int]]:
        self._convert()
        self._flush()
        return self.written


class _Run:
    """One run file, read batch by batch; ``pos`` is the next unread row of ``batch``."""

    def __init__(self, url: str, batch_rows: int):
        fs, path = fsspec.core.url_to_fs(url)
        self.file = fs.open(path, "rb")
        pf = pq.ParquetFile(self.file, pre_buffer=False, buffer_size=1 << 16, **READ_OPTIONS)
        self.batches = pf.iter_batches(batch_size=batch_rows)
        self.batch: pa.RecordBatch | None = None
        self.keys: np.ndarray | None = None
        self.pos = 0
        self.done = False
        self.refill()

    def refill(self) -> None:
        while self.batch is None or self.pos >= self.batch.num_rows:
            try:
                self.batch = next(self.batches)
            except StopIteration:
                self.batch, self.done = None, True
                self.file.close()
                return
            self.keys = self.batch.column(KEY).to_numpy()
            self.pos = 0


class _ShardSink:
    """Streams rows in global order into shard files at exact rank boundaries."""

    def __init__(
        self,
        output_url: str,
        schema: pa.Schema,
        num_shards: int,
        total: int,
        name_for,
        row_group_rows: int = SHARD_ROW_GROUP,
    ):
        self.output_url, self.schema, self.k = output_url, schema, num_shards
        self.row_group_rows = row_group_rows
        self.bounds = [j * total // num_shards for j in range(num_shards + 1)]
        self.name_for = name_for
        self.shard = -1
        self.written = 0  # global rows written so far
        self.buffer: list[pa.Table] = []
        self.buffered = 0
        self.file = self.writer = None
        self.rows_per_shard: list[int] = []
        self._next_shard()

    def _next_shard(self) -> None:
        self._close_shard()
        self.shard += 1
        if self.shard < self.k:
            url = f"{self.output_url.rstrip('/')}/{self.name_for(self.shard, self.k)}"
            self.file = _open_write(url)
            self.writer = pq.ParquetWriter(self.file, self.schema, **WRITE_OPTIONS)
            self.rows_per_shard.append(0)

    def _close_shard(self) -> None:
        if self.writer is not None:
            self._write_buffer(final=True)
            self.writer.close()
            self.file.close()
            self.writer = self.file = None

    def _write_buffer(self, final: bool) -> None:
        if not self.buffer:
            return
        table = pa.concat_tables(self.buffer)
        cut = table.num_rows if final else table.num_rows - table.num_rows % self.row_group_rows
        if cut:
            self.writer.write_table(table.slice(0, cut), row_group_size=self.row_group_rows)
        rest = table.slice(cut)
        self.buffer, self.buffered = ([rest], rest.num_rows) if rest.num_rows else ([], 0)

    def emit(self, table: pa.Table) -> None:
        table = table.select(self.schema.names).cast(self.schema)
        while table.num_rows:
            # Empty shards (fewer rows than shards) are passed over.
            while self.written >= self.bounds[self.shard + 1]:
                self._next_shard()
            room = self.bounds[self.shard + 1] - self.written
            part, table = table.slice(0, room), table.slice(room)
            self.buffer.append(part)
            self.buffered += part.num_rows
            self.rows_per_shard[-1] += part.num_rows
            self.written += part.num_rows
            if self.buffered >= self.row_group_rows:
                self._write_buffer(final=False)

    def close(self) -> list[int]:
        while self.shard < self.k:
            self._next_shard()  # writes the remaining (possibly empty) shards
        return self.rows_per_shard


def bounded_row_group(most: int, row_bytes: int) -> int:
    """Rows in a row group of a run file: at most ``most``, and at most
    :data:`RUN_ROW_GROUP_BYTES` of rows of ``row_bytes`` (at least one)."""
    return max(1, min(most, RUN_ROW_GROUP_BYTES // max(1, row_bytes)))


def merge_batch_rows(num_runs: int, row_bytes: int, budget_bytes: int = MERGE_BUDGET_BYTES) -> int:
    """Rows the merge reads per run at a time: the budget shared by all runs, within limits
    (at least one row: a floor of 16 rows let 16 runs of 100 KB rows hold 26 MB past a 16 MB
    budget).

    Depends only on the number of runs and the row size, never on the worker count."""
    return int(max(1, min(RUN_ROW_GROUP, budget_bytes // max(1, num_runs * row_bytes))))


def merge_runs(
    runs: Iterable[tuple[str, int]],
    output_url: str,
    schema: pa.Schema,
    num_shards: int,
    name_for,
    row_bytes: int = 512,
    budget_bytes: int = MERGE_BUDGET_BYTES,
    row_group_rows: int = SHARD_ROW_GROUP,
) -> list[int]:
    """Merge key-sorted run files into ``num_shards`` balanced shards; rows per shard.

    ``runs`` is ``[(url, rows), ...]``; their order is the tie-break between equal keys, so pass
    them in a deterministic order. ``row_bytes`` (a rough row size) sizes the read batches, so
    that all runs' current batches hold about ``budget_bytes``; shards are written in row groups
    of ``row_group_rows``.
    """
    runs = list(runs)
    total = sum(n for _, n in runs)
    sink = _ShardSink(output_url, schema, num_shards, total, name_for, row_group_rows)
    for table in _merged_tables(runs, merge_batch_rows(len(runs), row_bytes, budget_bytes)):
        sink.emit(table)
    rows = sink.close()
    release_unused_memory()
    return rows


def _merged_tables(runs: list[tuple[str, int]], batch_rows: int) -> Iterator[pa.Table]:
    """The rows of key-sorted runs in key order (ties: run order, then row order), as tables
    of at most ``len(runs) * batch_rows`` rows, key column kept."""
    live = [r for r in (_Run(url, batch_rows) for url, n in runs if n) if not r.done]
    while live:
        pivot = min(r.keys[-1] for r in live)
        pieces = []
        for r in live:
            end = int(np.searchsorted(r.keys, pivot, side="right"))
            if end > r.pos:
                pieces.append(r.batch.slice(r.pos, end - r.pos))
                r.pos = end
        table = pa.Table.from_batches(pieces)
        yield table.take(pc.sort_indices(table, sort_keys=[(KEY, "ascending")]))
        for r in live:
            r.refill()
        live = [r for r in live if not r.done]


MAX_FAN_IN = 16
"""Runs one merge reads at once. A merge holds a row group of every run it reads (Parquet
decompresses a column chunk whole), so with thousands of runs its memory grew with the corpus;
more runs are first merged in consecutive groups into longer runs."""


def merge_runs_in_levels(
    runs: Iterable[tuple[str, int]],
    work_url: str,
    output_url: str,
    schema: pa.Schema,
    num_shards: int,
    name_for,
    row_bytes: int = 512,
    max_fan_in: int = MAX_FAN_IN,
    budget_bytes: int = MERGE_BUDGET_BYTES,
    level_row_group_rows: int = RUN_ROW_GROUP,
    row_group_rows: int = SHARD_ROW_GROUP,
    keep_levels: bool = False,
) -> list[int]:
    """:func:`merge_runs` reading at most ``max_fan_in`` runs at a time, so its memory is bounded
    whatever the number of runs; the output is byte for byte that of one merge of all runs.

    Groups are consecutive in run order and the merge breaks ties by run order, then row order,
    so merging groups first keeps every tie where one merge would put it. Intermediate runs go to
    ``work_url/level<L>-<i>.parquet`` (key column kept) and are deleted once merged (unless
    ``keep_levels``: the caller removes ``work_url`` itself). The cost:
    every row is written and read once more per level (``ceil(log_fan_in(runs)) - 1`` levels).
    """
    runs = _reduce_runs(runs, work_url, schema, row_bytes, max_fan_in, budget_bytes, level_row_group_rows, keep_levels)
    return merge_runs(
        runs,
        output_url,
        schema,
        num_shards,
        name_for,
        row_bytes=row_bytes,
        budget_bytes=budget_bytes,
        row_group_rows=row_group_rows,
    )


def iter_merged(
    runs: Iterable[tuple[str, int]],
    work_url: str,
    schema: pa.Schema,
    row_bytes: int = 512,
    max_fan_in: int = MAX_FAN_IN,
    budget_bytes: int = MERGE_BUDGET_BYTES,
    level_row_group_rows: int = RUN_ROW_GROUP,
    keep_levels: bool = False,
) -> Iterator[pa.Table]:
    """The rows of key-sorted runs (``schema`` plus :data:`KEY`) in key order, as a stream of
    Arrow tables (key column kept), in the memory of one merge of at most ``max_fan_in`` runs
    (more are first merged in groups, as in :func:`merge_runs_in_levels`): the bounded-memory
    "sort everything, then walk it in order" that corpus-wide dedup decisions are made on."""
    runs = _reduce_runs(runs, work_url, schema, row_bytes, max_fan_in, budget_bytes, level_row_group_rows, keep_levels)
    yield from _merged_tables(runs, merge_batch_rows(len(runs), row_bytes, budget_bytes))


def _reduce_runs(
    runs, work_url, schema, row_bytes, max_fan_in, budget_bytes, level_row_group_rows, keep_levels
) -> list[tuple[str, int]]:
    """Runs merged in consecutive groups of ``max_fan_in``, level after level, until at most
    ``max_fan_in`` are left (see :func:`merge_runs_in_levels`)."""
    runs = [r for r in runs if r[1]]
    level = 0
    while len(runs) > max_fan_in:
        merged = []
        for start in range(0, len(runs), max_fan_in):
            group = runs[start : start + max_fan_in]
            name = f"level{level}-{start // max_fan_in:06d}.parquet"
            rows = merge_runs(
                group,
                work_url,
                with_key(schema),
                1,
                lambda _j, _k, name=name: name,
                row_bytes=row_bytes,
                budget_bytes=budget_bytes,
                row_group_rows=bounded_row_group(level_row_group_rows, row_bytes),
            )
            merged.append((f"{work_url.rstrip('/')}/{name}", rows[0]))
            if (
                level > 0 and not keep_levels
            ):  # the first level's inputs are the producers' runs: their owner removes them
                for url, _ in group:
                    fs, path = fsspec.core.url_to_fs(url)
                    fs.rm(path)
        runs, level = merged, level + 1
    return runs
