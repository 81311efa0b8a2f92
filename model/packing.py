"""Unpadded ("packed") batches: where the real tokens and the heads' rows are, computed on the host.

A packed batch holds only real tokens: the examples' ``input_ids`` concatenated, ``(N,)`` with
``N`` = the batch's real tokens, no ``[PAD]`` and no attention mask. The encoder runs every
linear layer and LayerNorm over ``(N, H)`` and attention over the packed sequences with
cumulative lengths (``model.kernels.varlen_attend``: flash ``varlen_attn`` on CUDA, a reference
elsewhere). Everything that depends on where the tokens are is computed here, in numpy, by the
loader — so the step never asks the device (no ``nonzero``, no boolean indexing, no host sync):

- ``cu_seqlens`` (B + 1,) int32: sequence ``b`` is tokens ``cu[b] .. cu[b+1]-1``; ``max_seqlen``;
- ``position_ids`` (N,): each token's position in its sequence;
- ``rows`` (R,): the tokens the pretraining heads read — each sequence's ``[CLS]`` and masked
  tokens, in sequence order, ascending; the last encoder layer computes only these (keys and
  values still from every token), as the padded path's ``head_rows`` does; ``cu_rows`` (B + 1,)
  int32 and ``max_rows`` delimit them per sequence;
- ``mlm_slots`` (M,): which of the rows are masked, row-major (the order of the padded path's
  sparse ``labels != -100``), so ``labels`` is ``(M,)``: the masked tokens' originals only, and
  ``M`` is known on the host;
- ``cls_slots`` (B,): which row is each sequence's ``[CLS]``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch


@dataclasses.dataclass
class Packing:
    """The host-computed layout of a packed batch (see the module docstring); ints stay on the host."""

    position_ids: torch.Tensor  # (N,)
    cu_seqlens: torch.Tensor  # (B + 1,) int32
    max_seqlen: int
    rows: torch.Tensor  # (R,) token indices: [CLS] and masked tokens of every sequence
    cu_rows: torch.Tensor  # (B + 1,) int32
    max_rows: int
    mlm_slots: torch.Tensor  # (M,) indices into rows
    cls_slots: torch.Tensor  # (B,) indices into rows

    def _map(self, fn) -> Packing:
        tensors = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{k: fn(v) for k, v in tensors.items() if torch.is_tensor(v)})

    def to(self, device, non_blocking: bool = False) -> Packing:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Packing:
        return self._map(lambda t: t.pin_memory())

    @property
    def lengths(self) -> torch.Tensor:
        return self.cu_seqlens[1:] - self.cu_seqlens[:-1]


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def pack(
    ids: np.ndarray,
    ids_offsets: np.ndarray,
    len_a: np.ndarray,
    pos: np.ndarray,
    pos_offsets: np.ndarray,
    masked_ids: np.ndarray,
    sentence_label: np.ndarray | None,
) -> dict[str, torch.Tensor | Packing]:
    """A packed MLM + NSP batch from examples in Arrow list layout (``model.data.ExampleArrays``).

    ``ids`` are the examples' tokens concatenated (compact: ``ids_offsets[0] == 0``), ``pos`` and
    ``masked_ids`` their masked positions (within each example) and original tokens.
    """
    lengths = np.diff(ids_offsets)
    B, N = len(lengths), int(ids_offsets[-1])
    starts = ids_offsets[:-1]
    seq_of = np.repeat(np.arange(B), lengths)
    position = np.arange(N, dtype=np.int64) - starts[seq_of]
    token_type = (position >= len_a[seq_of]).astype(np.int64)  # B segment: from len_a on
    # masked tokens as indices into the packed tokens, row-major (sorted: rows ascend, and so do offsets)
    flat = starts[np.repeat(np.arange(B), np.diff(pos_offsets))] + pos
    order = np.argsort(flat, kind="stable")
    flat, labels = flat[order], masked_ids[order].astype(np.int64)
    rows = np.union1d(starts, flat).astype(np.int64)  # [CLS] and masked tokens, sorted and unique
    cu_rows = np.searchsorted(rows, ids_offsets)  # rows before each sequence's first token
    packing = Packing(
        position_ids=torch.from_numpy(position),
        cu_seqlens=torch.from_numpy(ids_offsets.astype(np.int32)),
        max_seqlen=int(lengths.max()) if B else 0,
        rows=torch.from_numpy(rows),
        cu_rows=torch.from_numpy(cu_rows.astype(np.int32)),
        max_rows=int(np.diff(cu_rows).max()) if B else 0,
        mlm_slots=torch.from_numpy(np.searchsorted(rows, flat).astype(np.int64)),
        cls_slots=torch.from_numpy(cu_rows[:-1].astype(np.int64)),
    )
    batch = {
        "input_ids": torch.from_numpy(np.asarray(ids, dtype=np.int64)),
        "token_type_ids": torch.from_numpy(token_type),
        "labels": torch.from_numpy(labels),
    }
    if sentence_label is not None:  # the objective's sentence-level label (NSP, SOP)
        batch["next_sentence_label"] = torch.from_numpy(sentence_label.astype(np.int64))
    batch["packing"] = packing
    return batch


def pack_padded(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | Packing]:
    """The packed form of a padded batch (``model.data.collate``'s layout): the same examples."""
    mask = batch["attention_mask"].bool().numpy()
    lengths = mask.sum(1)
    labels = batch["labels"].numpy()
    rows_, cols = np.nonzero(labels != -100)  # row-major
    return pack(
        batch["input_ids"].numpy()[mask],
        _offsets(lengths),
        np.argmax(batch["token_type_ids"].numpy() * mask > 0, axis=1).astype(np.int64)
        + (~(batch["token_type_ids"].numpy() * mask).any(1)) * lengths,
        cols.astype(np.int64),
        _offsets(np.bincount(rows_, minlength=len(lengths))),
        labels[rows_, cols],
        batch["next_sentence_label"].numpy().astype(bool) if "next_sentence_label" in batch else None,
    )
