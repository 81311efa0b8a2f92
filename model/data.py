"""The pretraining data loader: example shards (Parquet) -> padded batches of tensors.

One loader serves one phase (one sequence length). It reads every shard of
``{examples}/seq{N}/`` into memory as Arrow-backed numpy arrays (uint16 ids: a million
128-token examples take ~260 MB), shuffles the example order per epoch from a permutation
seeded by ``blake2b(seed, key, epoch)``, and cuts batches of a fixed ``[B, T]`` shape
(``T = max_seq_length``, [PAD] = 0): static shapes never trigger an XLA recompile. The last
partial batch of an epoch is dropped; epochs repeat for as long as the phase needs steps.

Resume is exact because a batch is a pure function of ``(seed, key, epoch, batch index)``:
the loader's whole state is its :class:`LoaderPosition`. Under data parallelism, global batch
``b`` of an epoch is split into ``world_size`` slices and rank ``r`` takes slice ``r``.

Design choice, at what cost: holding a phase's examples in memory keeps shuffling global and
resume trivial, at the price of RAM proportional to the data (no streaming shuffle buffer).
Bad input (an example longer than the phase, a masked position outside the example, a token
id outside the vocabulary) fails at load with the shard and row named.

Dynamic masking (``DynamicMasking``) re-masks each example at load time instead of using the
shard's static mask: the static mask is undone (``masked_ids`` are the original tokens), then
as many positions as the shard chose (so the shard's 15% and ``max_predictions_per_seq`` cap
carry over) are re-drawn among the non-special positions with an RNG seeded from
``(seed, key, epoch, example index)``, with the 80% [MASK] / 10% random / 10% kept rule.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline.schema import EXAMPLE_COLUMNS, Manifest

IGNORE_INDEX = -100


def stable_seed(*parts) -> int:
    """A 64-bit seed from a stable digest of ``parts`` (never the per-process builtin hash())."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def shard_urls(manifest: Manifest, max_seq_length: int) -> list[str]:
    """The Parquet shards of one sequence length listed in the example stage's manifest."""
    prefix = f"seq{max_seq_length}/"
    urls = sorted(
        u for f, u in zip(manifest.files, manifest.file_urls()) if f.path.startswith(prefix)
        and f.path.endswith(".parquet")
    )
    if not urls:
        have = sorted({f.path.split("/", 1)[0] for f in manifest.files if "/" in f.path})
        raise FileNotFoundError(
            f"{manifest.url} has no examples of length {max_seq_length} (no {prefix}*.parquet); "
            f"it holds {have or 'nothing'}: add {max_seq_length} to examples.max_seq_lengths"
        )
    return urls


@dataclass
class ExampleArrays:
    """A phase's examples as flat numpy arrays plus row offsets (Arrow list layout)."""

    ids: np.ndarray  # all input_ids, concatenated
    ids_offsets: np.ndarray  # (n + 1,)
    len_a: np.ndarray  # (n,)
    pos: np.ndarray  # all masked_positions, concatenated
    pos_offsets: np.ndarray  # (n + 1,)
    masked_ids: np.ndarray  # aligned with pos
    is_random_next: np.ndarray  # (n,) bool

    def __len__(self) -> int:
        return len(self.len_a)


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    arr = column.combine_chunks()
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)
    return values[offsets[0] :], offsets - offsets[0]


def read_examples(urls: list[str], max_seq_length: int, vocab_size: int | None = None) -> ExampleArrays:
    """Read and validate the shards (in the given order) of one phase."""
    tables, starts = [], []
    for url in urls:
        fs, path = fsspec.core.url_to_fs(url)
        with fs.open(path, "rb") as f:
            table = pq.read_table(f, columns=list(EXAMPLE_COLUMNS))
        starts.append((url, sum(t.num_rows for t in tables)))
        tables.append(table)
    if not tables:
        raise FileNotFoundError("no example shards given")
    table = pa.concat_tables(tables)
    ids, ids_off = _flat(table.column("input_ids"))
    pos, pos_off = _flat(table.column("masked_positions"))
    mids, mids_off = _flat(table.column("masked_ids"))
    data = ExampleArrays(
        ids=ids,
        ids_offsets=ids_off,
        len_a=table.column("len_a").to_numpy().astype(np.int64),
        pos=pos.astype(np.int64),
        pos_offsets=pos_off,
        masked_ids=mids,
        is_random_next=table.column("is_random_next").to_numpy(zero_copy_only=False).astype(bool),
    )

    def where(row: int) -> str:
        url, start = max((s for s in starts if s[1] <= row), key=lambda s: s[1])
        return f"{url} row {row - start}"

    lengths = np.diff(ids_off)
    if (bad := np.flatnonzero(lengths > max_seq_length)).size:
        r = int(bad[0])
        raise ValueError(f"{where(r)}: input_ids has {lengths[r]} tokens > max_seq_length {max_seq_length}")
    if (bad := np.flatnonzero((data.len_a < 2) | (data.len_a >= lengths))).size:
        r = int(bad[0])
        raise ValueError(f"{where(r)}: len_a={data.len_a[r]} outside [2, {lengths[r]})")
    if not np.array_equal(pos_off, mids_off):
        r = int(np.flatnonzero(np.diff(pos_off) != np.diff(mids_off))[0])
        raise ValueError(f"{where(r)}: masked_positions and masked_ids differ in length")
    if pos.size:
        row_of = np.repeat(np.arange(len(lengths)), np.diff(pos_off))
        if (bad := np.flatnonzero(data.pos >= lengths[row_of])).size:
            r = int(row_of[bad[0]])
            raise ValueError(f"{where(r)}: masked position {data.pos[bad[0]]} >= length {lengths[r]}")
    if vocab_size is not None:
        for name, values, offsets in (("input_ids", ids, ids_off), ("masked_ids", mids, mids_off)):
            if values.size and (bad := np.flatnonzero(values >= vocab_size)).size:
                r = int(np.searchsorted(offsets, bad[0], side="right") - 1)
                raise ValueError(f"{where(r)}: {name} holds id {values[bad[0]]} >= vocab_size {vocab_size}")
    return data


def infer_mask_token_id(data: ExampleArrays, sample: int = 20_000) -> int:
    """The [MASK] id, read off static masks: the most common input token at masked positions.

    80% of masked positions hold [MASK]; the rest are spread over the vocabulary.
    """
    end = int(data.pos_offsets[min(sample, len(data))])
    if end == 0:
        raise ValueError("no masked positions to infer the [MASK] id from: pass mask_token_id")
    row_of = np.repeat(np.arange(len(data)), np.diff(data.pos_offsets))[:end]
    tokens = data.ids[data.ids_offsets[row_of] + data.pos[:end]]
    return int(np.bincount(tokens.astype(np.int64)).argmax())


@dataclass(frozen=True)
class DynamicMasking:
    mask_token_id: int
    vocab_size: int


@dataclass(frozen=True)
class LoaderPosition:
    """The next batch to produce: all the state a resumed loader needs."""

    epoch: int = 0
    batch: int = 0


def _gather(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int, fill: int):
    """Rows ``values[starts[i] : starts[i] + lengths[i]]`` padded to ``(len(starts), width)``."""
    cols = np.arange(width)
    valid = cols[None, :] < lengths[:, None]  # (B, width)
    src = np.minimum(starts[:, None] + cols[None, :], max(len(values) - 1, 0))
    out = np.where(valid, values[src] if len(values) else fill, fill)
    return out, valid


class ExampleLoader:
    """Fixed-shape MLM+NSP batches from one phase's examples, in a deterministic shuffled order."""

    def __init__(
        self,
        data: ExampleArrays,
        batch_size: int,
        max_seq_length: int,
        seed: int,
        key: str = "",
        rank: int = 0,
        world_size: int = 1,
        dynamic_masking: DynamicMasking | None = None,
    ):
        if batch_size % world_size:
            raise ValueError(f"batch_size {batch_size} is not divisible by world_size {world_size}")
        self.data = data
        self.batch_size = batch_size  # global, over all ranks
        self.local_batch_size = batch_size // world_size
        self.max_seq_length = max_seq_length
        self.seed, self.key = seed, key
        self.rank, self.world_size = rank, world_size
        self.dynamic_masking = dynamic_masking
        self.batches_per_epoch = len(data) // batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"phase {key!r}: {len(data)} examples of length {max_seq_length} are fewer than "
                f"one batch of {batch_size}"
            )
        self.position = LoaderPosition()
        self._perm_epoch, self._perm = -1, None

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            rng = np.random.Generator(np.random.PCG64(stable_seed("shuffle", self.seed, self.key, epoch)))
            self._perm, self._perm_epoch = rng.permutation(len(self.data)), epoch
        return self._perm

    def set_position(self, position: LoaderPosition) -> None:
        self.position = LoaderPosition(position.epoch, position.batch)

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        batch = self.batch_at(self.position.epoch, self.position.batch)
        nxt = self.position.batch + 1
        self.position = (
            LoaderPosition(self.position.epoch + 1, 0)
            if nxt >= self.batches_per_epoch
            else LoaderPosition(self.position.epoch, nxt)
        )
        return batch

    def batch_at(self, epoch: int, index: int) -> dict[str, torch.Tensor]:
        """This rank's slice of global batch ``index`` of ``epoch``."""
        start = index * self.batch_size + self.rank * self.local_batch_size
        rows = self.permutation(epoch)[start : start + self.local_batch_size]
        return self.make_batch(rows, epoch)

    def make_batch(self, rows: np.ndarray, epoch: int = 0) -> dict[str, torch.Tensor]:
        d, T = self.data, self.max_seq_length
        starts = d.ids_offsets[rows]
        lengths = d.ids_offsets[rows + 1] - starts
        input_ids, attention = _gather(d.ids, starts, lengths, T, 0)  # (B, T)
        input_ids = input_ids.astype(np.int64)
        cols = np.arange(T)[None, :]
        token_type = (cols >= d.len_a[rows][:, None]) & attention  # B segment: after len_a
        labels = np.full((len(rows), T), IGNORE_INDEX, dtype=np.int64)

        pstarts = d.pos_offsets[rows]
        plengths = d.pos_offsets[rows + 1] - pstarts
        width = int(plengths.max()) if len(rows) else 0
        if width:
            pos, pvalid = _gather(d.pos, pstarts, plengths, width, 0)  # (B, P)
            orig, _ = _gather(d.masked_ids, pstarts, plengths, width, 0)
            r = np.broadcast_to(np.arange(len(rows))[:, None], pos.shape)
            if self.dynamic_masking is None:
                labels[r[pvalid], pos[pvalid]] = orig[pvalid]
            else:
                input_ids[r[pvalid], pos[pvalid]] = orig[pvalid]  # undo the static mask
                for i, row in enumerate(rows):
                    self._remask(input_ids[i], labels[i], int(lengths[i]), int(d.len_a[row]),
                                 int(plengths[i]), epoch, int(row))
        return {
            "input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.from_numpy(token_type.astype(np.int64)),
            "attention_mask": torch.from_numpy(attention.astype(np.int64)),
            "labels": torch.from_numpy(labels),
            "next_sentence_label": torch.from_numpy(d.is_random_next[rows].astype(np.int64)),
        }

    def _remask(self, ids: np.ndarray, labels: np.ndarray, length: int, len_a: int,
                count: int, epoch: int, row: int) -> None:
        """Re-draw ``count`` masked positions of one example in place (80/10/10)."""
        m = self.dynamic_masking
        rng = np.random.Generator(np.random.PCG64(stable_seed("mask", self.seed, self.key, epoch, row)))
        special = {0, len_a - 1, length - 1}  # [CLS], the [SEP] after A, the final [SEP]
        candidates = np.array([p for p in range(length) if p not in special], dtype=np.int64)
        chosen = np.sort(rng.choice(candidates, size=min(count, len(candidates)), replace=False))
        labels[chosen] = ids[chosen]
        for p in chosen:
            u = rng.random()
            if u < 0.8:
                ids[p] = m.mask_token_id  # 80%: [MASK]
            elif u < 0.9:
                ids[p] = rng.integers(m.vocab_size)  # 10%: a random token
            # else 10%: keep the original token
