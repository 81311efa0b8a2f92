"""The streaming pretraining loader: Parquet example shards -> batches, memory bounded by a buffer.

How data flows:

1. **Units.** Every shard of a phase (local or ``gs://``, through fsspec) is listed by its row
   groups from the Parquet footer alone; a unit is one row group (split into row ranges only
   when there are fewer row groups than parts).
2. **Parts.** The units are dealt round-robin into ``num_parts`` disjoint parts: together they
   hold every unit once (no overlap, no gap). Rank ``r`` of ``R`` owns the ``num_parts / R``
   parts ``r*K .. r*K+K-1``; loader worker processes split a rank's parts between them.
3. **A part's stream.** A part is an endless stream of examples: epoch ``e`` visits its units in
   an order seeded by ``(seed, key, part, e)``, and shuffles the rows in consecutive windows of
   ``buffer_size`` examples (a block shuffle buffer, seeded per window). Example ``i`` of the
   stream is a pure function of ``i``, so the loader's whole state is one integer.
4. **Batches.** Global batch ``b`` is, for every part in order, that part's examples
   ``[b*s, (b+1)*s)`` with ``s = batch / num_parts``. A rank's local batch is its parts' slices;
   so the global batch is the same for any number of ranks and workers as long as ``num_parts``
   is (that is what lets a 2-process run match a 1-process run). Dynamic masking runs through
   the injected ``mask_fn`` seeded per (shard, row, epoch). Padding: see ``model.data.collate``.

Resume: :attr:`StreamingLoader.position` is the number of local batches served; a loader set to
position ``p`` serves exactly the batch an uninterrupted one would serve next.

Design choice, at what cost: a block shuffle buffer (permute each window of ``buffer_size``
consecutive rows, visit units in a shuffled order) instead of a reservoir makes every example's
place a pure function of its index, so resume needs no saved buffer contents; the price is a
shuffle that is global over units but only local (within a window) over rows, which is the usual
trade of streaming loaders (and the examples stage already writes rows in a hashed order).
Memory: one window (``buffer_size`` examples) plus the row group being read, per part.

Damaged shards: every page's CRC32 is verified as it is read (``model.contract.PARQUET_READ_OPTIONS``),
every example is checked against the contract (``model.data.validate_examples``), and a shard that
does not read back raises :class:`model.data.ShardError` naming the file (pyarrow's own message,
``Unexpected end of stream``, names none).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from model.contract import DEFAULT_OBJECTIVE, PARQUET_READ_OPTIONS, get_objective
from model.data import (
    ExampleArrays,
    MaskFn,
    ShardError,
    apply_dynamic_masking,
    arrays_from_table,
    collate,
    collate_packed,
    padded_length,
    stable_seed,
    validate_examples,
)

log = logging.getLogger("bertflow.stream")


@dataclass(frozen=True)
class Unit:
    """Rows ``[start, stop)`` of row group ``row_group`` of shard ``shard`` (an index into urls)."""

    shard: int
    row_group: int
    start: int
    stop: int
    shard_row: int  # the row in its shard of this unit's first row

    @property
    def rows(self) -> int:
        return self.stop - self.start


def plan_units(urls: list[str], min_units: int = 1) -> list[Unit]:
    """Row groups of every shard, read from the Parquet footers; split until ``min_units``."""
    units: list[Unit] = []
    for s, url in enumerate(urls):
        fs, path = fsspec.core.url_to_fs(url)
        try:
            with fs.open(path, "rb") as f:
                meta = pq.ParquetFile(f).metadata
        except (OSError, ValueError, pa.ArrowException) as exc:  # pyarrow's errors name no file
            raise ShardError.of(url, exc) from exc
        first = 0
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            if n:
                units.append(Unit(s, g, 0, n, first))
            first += n
    total = sum(u.rows for u in units)
    if total < min_units:
        raise ValueError(
            f"{len(urls)} shard(s) hold {total} examples, fewer than the {min_units} "
            "data parts (ranks x loader parts) that must each get some"
        )
    while len(units) < min_units:  # halve the largest unit (deterministic: first largest)
        i = max(range(len(units)), key=lambda k: units[k].rows)
        u = units[i]
        mid = u.start + u.rows // 2
        units[i : i + 1] = [
            Unit(u.shard, u.row_group, u.start, mid, u.shard_row),
            Unit(u.shard, u.row_group, mid, u.stop, u.shard_row + mid - u.start),
        ]
    return units


def split_units(units: list[Unit], num_parts: int) -> list[list[Unit]]:
    """Deal units round-robin into ``num_parts`` disjoint parts covering them all."""
    return [units[p::num_parts] for p in range(num_parts)]


class PartStream:
    """One part's endless, seeded stream of examples (see the module docstring, point 3)."""

    def __init__(
        self,
        urls: list[str],
        units: list[Unit],
        part: int,
        seed: int,
        key: str,
        buffer_size: int,
        max_seq_length: int,
        vocab_size: int | None = None,
        shuffle: bool = True,
        max_predictions: int | None = None,
        objective: str = DEFAULT_OBJECTIVE,
    ):
        if not units:
            raise ValueError(f"data part {part} has no examples")
        self.urls, self.units, self.part = urls, units, part
        self.seed, self.key, self.shuffle = seed, key, shuffle
        self.max_seq_length, self.vocab_size, self.max_predictions = max_seq_length, vocab_size, max_predictions
        self.objective = get_objective(objective)
        self.epoch_rows = sum(u.rows for u in units)
        self.buffer_size = max(1, min(buffer_size, self.epoch_rows))
        self._window_key: tuple[int, int] | None = None
        self._window: ExampleArrays | None = None
        self._unit_cache: tuple[Unit, ExampleArrays] | None = None
        self._files: dict[int, pq.ParquetFile] = {}

    # -- order ---------------------------------------------------------------------------------
    def unit_order(self, epoch: int) -> list[Unit]:
        if not self.shuffle:
            return self.units
        rng = np.random.Generator(np.random.PCG64(stable_seed("units", self.seed, self.key, self.part, epoch)))
        return [self.units[i] for i in rng.permutation(len(self.units))]

    def _window_at(self, epoch: int, w: int) -> ExampleArrays:
        if self._window_key == (epoch, w):
            return self._window
        lo, hi = w * self.buffer_size, min((w + 1) * self.buffer_size, self.epoch_rows)
        pieces, at = [], 0
        for u in self.unit_order(epoch):
            if at >= hi:
                break
            if at + u.rows > lo:
                rows = self._read_unit(u)
                a, b = max(lo - at, 0), min(hi - at, u.rows)
                pieces.append(rows.take(np.arange(a, b)))
            at += u.rows
        window = ExampleArrays.concat(pieces)
        if self.shuffle:
            rng = np.random.Generator(np.random.PCG64(stable_seed("window", self.seed, self.key, self.part, epoch, w)))
            window = window.take(rng.permutation(len(window)))
        self._window_key, self._window = (epoch, w), window
        return window

    def _read_unit(self, u: Unit) -> ExampleArrays:
        if self._unit_cache is not None and self._unit_cache[0] == u:
            return self._unit_cache[1]
        url = self.urls[u.shard]
        if u.shard not in self._files:
            if len(self._files) >= 4:  # keep a few open files (a footer fetch each on gs://)
                self._files.pop(next(iter(self._files)))
            fs, path = fsspec.core.url_to_fs(url)
            try:
                self._files[u.shard] = pq.ParquetFile(fs.open(path, "rb"), **PARQUET_READ_OPTIONS)
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise ShardError.of(url, exc) from exc
        try:
            table = self._files[u.shard].read_row_group(u.row_group, columns=list(self.objective.columns))
        except (OSError, ValueError, pa.ArrowException) as exc:  # a failed page checksum, a garbled page
            raise ShardError.of(url, exc, f"row group {u.row_group}") from exc
        table = table.slice(u.start, u.rows)
        try:
            arrays = arrays_from_table(table, u.shard, u.shard_row, self.objective)
            validate_examples(
                arrays,
                self.max_seq_length,
                self.vocab_size,
                lambda r: f"row {u.shard_row + r}",
                max_predictions=self.max_predictions,
                segments=self.objective.segments,
            )
        except ValueError as exc:
            raise ShardError(f"{url} {exc}") from None
        self._unit_cache = (u, arrays)
        return arrays

    # -- examples --------------------------------------------------------------------------------
    def examples(self, start: int, count: int) -> tuple[ExampleArrays, np.ndarray]:
        """Examples ``start .. start+count-1`` of the endless stream, and the epoch of each."""
        pieces, epochs = [], []
        i, end = start, start + count
        while i < end:
            epoch, j = divmod(i, self.epoch_rows)
            w, k = divmod(j, self.buffer_size)
            window = self._window_at(epoch, w)
            take = min(end - i, len(window) - k)
            pieces.append(window.take(np.arange(k, k + take)))
            epochs.append(np.full(take, epoch, dtype=np.int64))
            i += take
        return ExampleArrays.concat(pieces), np.concatenate(epochs)


@dataclass(frozen=True)
class LoaderSpec:
    """Everything that fixes a phase's batches (the same on every rank and worker)."""

    urls: tuple[str, ...]
    batch_size: int
    """Global batch: examples per optimizer step over all ranks (and accumulation micro-batches)."""
    max_seq_length: int
    seed: int
    key: str = ""
    num_parts: int = 1
    buffer_size: int = 10_000
    vocab_size: int | None = None
    pad_id: int = 0
    buckets: tuple[int, ...] = ()
    """Fixed pad lengths (XLA); empty: the longest example rounded up to a multiple of 8."""
    unpad: bool = False
    """Packed batches of real tokens only (``model.data.collate_packed``) instead of padded ones."""
    shuffle: bool = True
    max_predictions: int = 20
    """Masked positions per example under dynamic masking (the examples stage's cap)."""
    objective: str = DEFAULT_OBJECTIVE
    """The examples' objective (``pipeline.schema.objectives``): their columns, and whether a batch
    carries a sentence-level label."""

    def __post_init__(self):
        if self.batch_size % self.num_parts:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by the {self.num_parts} data parts")


def _part_slices(
    spec: LoaderSpec, streams: dict[int, PartStream], batch: int, mask_fn: MaskFn | None
) -> dict[int, ExampleArrays]:
    s = spec.batch_size // spec.num_parts
    out = {}
    for p, stream in streams.items():
        data, epochs = stream.examples(batch * s, s)
        if mask_fn is not None:
            data = apply_dynamic_masking(data, mask_fn, spec.max_predictions, spec.seed, spec.key, epochs)
        out[p] = data
    return out


class _WorkerDataset(torch.utils.data.IterableDataset):
    """Loader worker ``w`` of ``W`` builds its share of parts' slices for every batch from ``start``."""

    def __init__(self, spec: LoaderSpec, units: list[list[Unit]], parts: list[int], start: int, mask_fn: MaskFn | None):
        self.spec, self.units, self.parts, self.start, self.mask_fn = spec, units, parts, start, mask_fn

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, n = (info.id, info.num_workers) if info else (0, 1)
        mine = self.parts[w::n]
        streams = {p: _stream(self.spec, self.units, p) for p in mine}
        b = self.start
        while True:
            yield b, _part_slices(self.spec, streams, b, self.mask_fn)
            b += 1


def _stream(spec: LoaderSpec, units: list[list[Unit]], p: int) -> PartStream:
    return PartStream(
        list(spec.urls),
        units[p],
        p,
        spec.seed,
        spec.key,
        spec.buffer_size,
        spec.max_seq_length,
        spec.vocab_size,
        spec.shuffle,
        spec.max_predictions,
        spec.objective,
    )


class StreamingLoader:
    """This rank's batches of a phase: an iterator of tensor dicts with a resumable position.

    ``micro_batches`` > 1 cuts each local batch into that many equal micro-batches (gradient
    accumulation); ``next_step()`` returns the list. ``num_workers`` > 0 builds batches in
    worker processes (each owning some of this rank's parts); the batches are identical.
    """

    def __init__(
        self,
        spec: LoaderSpec,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        mask_fn: MaskFn | None = None,
        micro_batches: int = 1,
    ):
        if spec.num_parts % world_size:
            raise ValueError(f"the {spec.num_parts} data parts do not divide among {world_size} ranks")
        k = spec.num_parts // world_size
        if num_workers > k:
            raise ValueError(f"loader workers {num_workers} > data parts per rank {k}: raise the parts")
        self.spec, self.mask_fn = spec, mask_fn
        self.rank, self.world_size, self.num_workers = rank, world_size, num_workers
        self.parts = list(range(rank * k, rank * k + k))
        self.local_batch_size = spec.batch_size // world_size
        if self.local_batch_size % micro_batches:
            raise ValueError(f"local batch {self.local_batch_size} is not divisible into {micro_batches} micro-batches")
        self.micro_batches = micro_batches
        self.units = split_units(plan_units(list(spec.urls), spec.num_parts), spec.num_parts)
        self.examples_per_epoch = sum(u.rows for part in self.units for u in part)
        self.position = 0
        self.last_keys: np.ndarray | None = None
        """(shard, row) of every example of the last local batch (tests, data tracing)."""
        self._iter = None
        self._streams = None

    def set_position(self, position: int) -> None:
        self.position = int(position)
        self._close()

    def _close(self) -> None:
        self._iter = None  # a DataLoader iterator shuts its workers down when dropped

    def _slices(self, b: int) -> dict[int, ExampleArrays]:
        if self.num_workers == 0:
            if self._streams is None:
                self._streams = {p: _stream(self.spec, self.units, p) for p in self.parts}
            return _part_slices(self.spec, self._streams, b, self.mask_fn)
        if self._iter is None:
            ds = _WorkerDataset(self.spec, self.units, self.parts, self.position, self.mask_fn)
            self._iter = iter(
                torch.utils.data.DataLoader(
                    ds,
                    batch_size=None,
                    num_workers=self.num_workers,
                    prefetch_factor=4,
                    persistent_workers=False,
                    multiprocessing_context="fork" if os.name == "posix" else None,
                )
            )
        out: dict[int, ExampleArrays] = {}
        for _ in range(self.num_workers):  # DataLoader deals items round-robin over workers
            got, slices = next(self._iter)
            assert got == b, (got, b)
            out.update(slices)
        return out

    def next_examples(self) -> ExampleArrays:
        slices = self._slices(self.position)
        self.position += 1
        data = ExampleArrays.concat([slices[p] for p in self.parts])
        self.last_keys = data.keys
        return data

    def to_batch(self, data: ExampleArrays) -> dict[str, torch.Tensor]:
        sentence = bool(get_objective(self.spec.objective).sentence_label)
        if self.spec.unpad:
            return collate_packed(data, sentence)
        longest = int(np.diff(data.ids_offsets).max()) if len(data) else 0
        width = padded_length(longest, self.spec.max_seq_length, self.spec.buckets)
        return collate(data, width, self.spec.pad_id, sentence)

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        """The micro-batches of the next optimizer step (one when not accumulating)."""
        data = self.next_examples()
        m = self.local_batch_size // self.micro_batches
        return [self.to_batch(data.take(np.arange(i * m, (i + 1) * m))) for i in range(self.micro_batches)]

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        return self.to_batch(self.next_examples())

    @property
    def epoch(self) -> float:
        """Epochs of this rank's data served so far (for logs)."""
        mine = sum(u.rows for p in self.parts for u in self.units[p])
        return self.position * self.local_batch_size / max(mine, 1)
