"""Pretraining examples as numpy arrays, and the one way they become a batch of tensors.

The streaming loader (``model/stream.py``) reads example shards (``pipeline.schema``'s
``example_schema``) a row group at a time; this module holds what it does with the rows:

- :class:`ExampleArrays`: examples as flat numpy arrays plus row offsets (Arrow's list layout),
  with ``keys`` naming each example's shard and row (stable across worker and rank counts);
- :func:`arrays_from_table` and :func:`validate_examples`: bad input (an example longer than
  the phase, a segment boundary or masked position outside the example, masked positions out of
  order, on [CLS]/[SEP] or more than the cap, a token id outside the vocabulary) fails with the
  shard and row named (:class:`ShardError`, as does a shard that does not read back or whose size
  is not the one its manifest lists);
- :func:`apply_dynamic_masking`: undo the shard's static mask (``masked_ids`` are the original
  tokens) and re-mask through the injected masking rule (``mask_fn``; the one rule lives in
  ``pipeline.examples.masking``, which ``model/`` may not import: ``flows/proc/train_entry.py`` passes it in);
- :func:`collate`: pad to the longest example of the batch rounded up to a multiple of 8, or to
  the smallest of a fixed set of bucket lengths (XLA compiles one graph per shape);
  :func:`collate_packed`: no padding at all, the real tokens packed (``pretrain.unpad``).

Design choice, at what cost: padding per batch instead of to the phase's full length saves the
attention and feed-forward work on padding (BERT's phase 1 has ~10% short examples), at the
price of a few distinct shapes per phase (one per multiple of 8) on backends that compile.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

import fsspec
import numpy as np
import pyarrow as pa
import torch

from model.contract import DEFAULT_OBJECTIVE, Manifest, Objective, get_objective, seq_folder
from model.packing import pack

IGNORE_INDEX = -100

MaskFn = Callable[[list[int], int, random.Random], tuple[list[int], list[int], list[int]]]
"""``mask_fn(tokens, max_predictions, rng) -> (masked tokens, sorted positions, original ids)``."""


def stable_seed(*parts) -> int:
    """A 64-bit seed from a stable digest of ``parts`` (never the per-process builtin hash())."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class ShardError(ValueError):
    """An example shard that is damaged or breaks the contract; the message names the file."""

    @classmethod
    def of(cls, url: str, exc: BaseException, where: str = "") -> ShardError:
        return cls(
            f"{url}{' ' + where if where else ''}: cannot be read ({type(exc).__name__}: {exc}): the shard is "
            "damaged; `bertflow status --verify` lists the damaged files and `bertflow run --force examples` "
            "(a deployment run: --param force='[\"examples\"]') writes them again"
        )


def shard_urls(manifest: Manifest, max_seq_length: int, check_sizes: bool = True) -> list[str]:
    """The Parquet shards of one sequence length listed in the example stage's manifest; each
    must have the size the manifest lists (``check_sizes``: one ``info`` per shard, no read)."""
    prefix = seq_folder(max_seq_length) + "/"
    listed = sorted(
        ((u, f) for f, u in zip(manifest.files, manifest.file_urls()) if f.path.startswith(prefix)),
        key=lambda uf: uf[0],
    )
    listed = [(u, f) for u, f in listed if f.path.endswith(".parquet")]
    urls = [u for u, _ in listed]
    for url, f in listed if check_sizes else ():
        fs, path = fsspec.core.url_to_fs(url)
        try:
            size = int(fs.size(path))
        except FileNotFoundError:
            raise ShardError(
                f"{url}: listed in {manifest.url}'s manifest but missing: rerun the examples stage"
            ) from None
        if size != f.size:
            raise ShardError(
                f"{url}: {size} bytes, its manifest lists {f.size}: the shard is damaged or was replaced; "
                "`bertflow run --force examples` (a deployment run: --param force='[\"examples\"]') writes it again"
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
    """Examples as flat numpy arrays plus row offsets (Arrow list layout)."""

    ids: np.ndarray  # all input_ids, concatenated
    ids_offsets: np.ndarray  # (n + 1,)
    len_a: np.ndarray  # (n,)
    pos: np.ndarray  # all masked_positions, concatenated
    pos_offsets: np.ndarray  # (n + 1,)
    masked_ids: np.ndarray  # aligned with pos: the ORIGINAL tokens
    sentence_label: np.ndarray  # (n,) bool: the objective's sentence-level label (all False without one)
    keys: np.ndarray  # (n, 2) int64: (shard index, row in shard)

    def __len__(self) -> int:
        return len(self.len_a)

    def take(self, rows: np.ndarray) -> ExampleArrays:
        """The examples at ``rows`` (any order, repeats allowed), as a new compact set."""
        rows = np.asarray(rows, dtype=np.int64)
        ids, ids_off = _take_ragged(self.ids, self.ids_offsets, rows)
        pos, pos_off = _take_ragged(self.pos, self.pos_offsets, rows)
        mids, _ = _take_ragged(self.masked_ids, self.pos_offsets, rows)
        return ExampleArrays(
            ids, ids_off, self.len_a[rows], pos, pos_off, mids, self.sentence_label[rows], self.keys[rows]
        )

    @staticmethod
    def concat(parts: list[ExampleArrays]) -> ExampleArrays:
        if len(parts) == 1:
            return parts[0]

        def offsets(name):
            out, base = [np.zeros(1, dtype=np.int64)], 0
            for p in parts:
                o = getattr(p, name)
                out.append(o[1:] + base)
                base += int(o[-1])
            return np.concatenate(out)

        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])
        return ExampleArrays(
            cat("ids"),
            offsets("ids_offsets"),
            cat("len_a"),
            cat("pos"),
            offsets("pos_offsets"),
            cat("masked_ids"),
            cat("sentence_label"),
            cat("keys"),
        )


def _take_ragged(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray):
    starts, ends = offsets[rows], offsets[rows + 1]
    lengths = ends - starts
    new_off = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_off[1:])
    # index of every kept value: start of its row + its place within the row
    idx = np.repeat(starts - new_off[:-1], lengths) + np.arange(int(new_off[-1]))
    return values[idx], new_off


def _flat(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)
    return values[offsets[0] : offsets[-1]], offsets - offsets[0]


def arrays_from_table(
    table: pa.Table, shard_index: int, first_row: int, objective: Objective | None = None
) -> ExampleArrays:
    """Rows of an example shard of ``objective`` (``first_row`` = the row in its shard of the
    table's row 0). One-segment examples get ``len_a`` = their length (token type 0 throughout);
    without a sentence-level label, ``sentence_label`` is all False (and no batch carries it)."""
    objective = objective or get_objective(DEFAULT_OBJECTIVE)
    missing = [c for c in objective.columns if c not in table.column_names]
    if missing:
        raise ValueError(f"missing example columns {missing} (objective {objective.name})")
    kinds = {"input_ids": "list", "masked_positions": "list", "masked_ids": "list", "len_a": "int"}
    if objective.sentence_label:
        kinds[objective.sentence_label] = "bool"
    for name, kind in kinds.items():
        if name not in objective.columns:
            continue
        t = table.schema.field(name).type
        ok = {"list": pa.types.is_list(t) and pa.types.is_integer(t.value_type), "int": pa.types.is_integer(t),
              "bool": pa.types.is_boolean(t)}[kind]  # fmt: skip
        if not ok:
            raise ValueError(
                f"column {name} has type {t}, the example schema's is a{'n' if kind == 'int' else ''} {kind}"
            )
    ids, ids_off = _flat(table.column("input_ids"))
    pos, pos_off = _flat(table.column("masked_positions"))
    mids, mids_off = _flat(table.column("masked_ids"))
    n = table.num_rows
    if not np.array_equal(pos_off, mids_off):
        r = int(np.flatnonzero(np.diff(pos_off) != np.diff(mids_off))[0])
        raise ValueError(f"row {first_row + r}: masked_positions and masked_ids differ in length")
    keys = np.stack([np.full(n, shard_index, dtype=np.int64), first_row + np.arange(n, dtype=np.int64)], 1)
    if objective.segments:
        len_a = table.column("len_a").to_numpy().astype(np.int64)
    else:
        len_a = np.diff(ids_off).astype(np.int64)
    if objective.sentence_label:
        label = table.column(objective.sentence_label).to_numpy(zero_copy_only=False).astype(bool)
    else:
        label = np.zeros(n, dtype=bool)
    return ExampleArrays(
        ids=ids,
        ids_offsets=ids_off,
        len_a=len_a,
        pos=pos.astype(np.int64),
        pos_offsets=pos_off,
        masked_ids=mids,
        sentence_label=label,
        keys=keys,
    )


def validate_examples(
    data: ExampleArrays,
    max_seq_length: int,
    vocab_size: int | None,
    where: Callable[[int], str],
    max_predictions: int | None = None,
    segments: bool = True,
) -> None:
    """Raise ValueError naming ``where(row)`` for the first example that breaks the contract:
    "[CLS] A [SEP] B [SEP]" of at most ``max_seq_length`` tokens with ``2 <= len_a < length``
    (``segments``; else one segment, ``len_a`` = length);
    masked positions strictly increasing, never on [CLS] (0) or either [SEP] (``len_a - 1``,
    ``length - 1``), at most ``max_predictions`` of them; every id below ``vocab_size``."""
    lengths = np.diff(data.ids_offsets)
    if (bad := np.flatnonzero(lengths > max_seq_length)).size:
        r = int(bad[0])
        raise ValueError(f"{where(r)}: input_ids has {lengths[r]} tokens > max_seq_length {max_seq_length}")
    if segments and (bad := np.flatnonzero((data.len_a < 2) | (data.len_a >= lengths))).size:
        r = int(bad[0])
        raise ValueError(f"{where(r)}: len_a={data.len_a[r]} outside [2, {lengths[r]})")
    counts = np.diff(data.pos_offsets)
    if max_predictions is not None and (bad := np.flatnonzero(counts > max_predictions)).size:
        r = int(bad[0])
        raise ValueError(f"{where(r)}: {counts[r]} masked positions > the cap of {max_predictions}")
    if data.pos.size:
        row_of = np.repeat(np.arange(len(lengths)), counts)
        pos = data.pos.astype(np.int64)
        if (bad := np.flatnonzero(pos >= lengths[row_of])).size:
            r = int(row_of[bad[0]])
            raise ValueError(f"{where(r)}: masked position {data.pos[bad[0]]} >= length {lengths[r]}")
        special = (pos == 0) | (pos == data.len_a[row_of] - 1) | (pos == lengths[row_of] - 1)
        if (bad := np.flatnonzero(special)).size:
            r = int(row_of[bad[0]])
            raise ValueError(f"{where(r)}: masked position {data.pos[bad[0]]} is [CLS] or [SEP]")
        # strictly increasing within a row: each position after the first of its row beats the one before
        follows = np.ones(pos.size, dtype=bool)
        follows[data.pos_offsets[:-1][counts > 0]] = False
        if (bad := np.flatnonzero(follows & (np.diff(pos, prepend=-1) <= 0))).size:
            r = int(row_of[bad[0]])
            raise ValueError(f"{where(r)}: masked positions out of order ({data.pos[bad[0] - 1]}, {data.pos[bad[0]]})")
    if vocab_size is not None:
        for name, values, offsets in (
            ("input_ids", data.ids, data.ids_offsets),
            ("masked_ids", data.masked_ids, data.pos_offsets),
        ):
            if values.size and (bad := np.flatnonzero(values >= vocab_size)).size:
                r = int(np.searchsorted(offsets, bad[0], side="right") - 1)
                raise ValueError(f"{where(r)}: {name} holds id {values[bad[0]]} >= vocab_size {vocab_size}")


def apply_dynamic_masking(
    data: ExampleArrays, mask_fn: MaskFn, max_predictions: int, seed: int, key: str, epochs: np.ndarray
) -> ExampleArrays:
    """Re-mask every example through ``mask_fn``, seeded per (seed, key, shard, row, epoch).

    The static mask, if the shard has one, is undone first. The seed does not depend on which
    rank or loader worker meets the example, so the masks are the same for any world size.
    """
    ids_out, ids_off = [], [0]
    pos_out, lab_out, pos_off = [], [], [0]
    for i in range(len(data)):
        lo, hi = int(data.ids_offsets[i]), int(data.ids_offsets[i + 1])
        tokens = data.ids[lo:hi].astype(np.int64)
        plo, phi = int(data.pos_offsets[i]), int(data.pos_offsets[i + 1])
        tokens[data.pos[plo:phi]] = data.masked_ids[plo:phi]  # undo the static mask
        shard, row = data.keys[i]
        rng = random.Random(stable_seed("mask", seed, key, int(shard), int(row), int(epochs[i])))
        masked, positions, labels = mask_fn(tokens.tolist(), max_predictions, rng)
        ids_out.append(np.asarray(masked, dtype=np.int64))
        pos_out.append(np.asarray(positions, dtype=np.int64))
        lab_out.append(np.asarray(labels, dtype=np.int64))
        ids_off.append(ids_off[-1] + len(masked))
        pos_off.append(pos_off[-1] + len(positions))
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64)
    return ExampleArrays(
        cat(ids_out),
        np.asarray(ids_off, dtype=np.int64),
        data.len_a,
        cat(pos_out),
        np.asarray(pos_off, dtype=np.int64),
        cat(lab_out),
        data.sentence_label,
        data.keys,
    )


def padded_length(longest: int, max_seq_length: int, buckets: tuple[int, ...] = (), multiple: int = 8) -> int:
    """The batch width: the smallest bucket >= ``longest``, or ``longest`` rounded up to ``multiple``."""
    if buckets:
        for b in sorted(buckets):
            if b >= longest:
                return b
        raise ValueError(f"an example of {longest} tokens is longer than every bucket {sorted(buckets)}")
    return min(max_seq_length, -(-longest // multiple) * multiple) if longest else multiple


def _gather(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int, fill: int):
    """Rows ``values[starts[i] : starts[i] + lengths[i]]`` padded to ``(len(starts), width)``."""
    cols = np.arange(width)
    valid = cols[None, :] < lengths[:, None]  # (B, width)
    src = np.minimum(starts[:, None] + cols[None, :], max(len(values) - 1, 0))
    out = np.where(valid, values[src] if len(values) else fill, fill)
    return out, valid


def collate_packed(data: ExampleArrays, sentence: bool = True) -> dict:
    """The unpadded batch of ``data``: real tokens only, laid out for the packed path (``model/packing.py``);
    ``sentence``: with the sentence-level label (``next_sentence_label``)."""
    d = data
    label = d.sentence_label if sentence else None
    return pack(d.ids, d.ids_offsets, d.len_a, d.pos, d.pos_offsets, d.masked_ids, label)


def collate(data: ExampleArrays, width: int, pad_id: int = 0, sentence: bool = True) -> dict[str, torch.Tensor]:
    """Tensors of shape (B, width): ids, segments, attention, labels (-100 unmasked), and with
    ``sentence`` the sentence-level label (B,) (``next_sentence_label``: NSP's or SOP's)."""
    n = len(data)
    starts = data.ids_offsets[:-1]
    lengths = data.ids_offsets[1:] - starts
    input_ids, attention = _gather(data.ids, starts, lengths, width, pad_id)  # (B, T)
    cols = np.arange(width)[None, :]
    token_type = (cols >= data.len_a[:, None]) & attention  # B segment: after len_a
    labels = np.full((n, width), IGNORE_INDEX, dtype=np.int64)
    plengths = np.diff(data.pos_offsets)
    if plengths.sum():
        rows = np.repeat(np.arange(n), plengths)
        labels[rows, data.pos] = data.masked_ids
    batch = {
        "input_ids": torch.from_numpy(input_ids.astype(np.int64)),
        "token_type_ids": torch.from_numpy(token_type.astype(np.int64)),
        "attention_mask": torch.from_numpy(attention.astype(np.int64)),
        "labels": torch.from_numpy(labels),
    }
    if sentence:
        batch["next_sentence_label"] = torch.from_numpy(data.sentence_label.astype(np.int64))
    return batch
