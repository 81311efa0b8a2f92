"""The training loop's input path: a phase's loader -> each step's micro-batches on the device.

:class:`StepFeed` hands the loop, per optimizer step, the micro-batches of this process's share
of the global batch, already on the device, with the host-side facts the loop needs (rows, width,
masked and real tokens of each micro-batch: counted on the CPU tensors, before any transfer).

Two paths, one interface:

- CPU, CUDA, and XLA on one device: the loader's batches are copied with ``Backend.prefetch``
  (CUDA: from pinned memory on a side stream, non-blocking) and handed over by
  ``Backend.ready``; with ``ahead`` (CUDA) the next step's batches are built and their copy
  started when the step before is handed out, so the copy overlaps the queued compute and the
  step never waits for it (on the CPU there is nothing to copy: the same code path, tested).
- XLA SPMD (several devices, one or several hosts): ``torch_xla``'s ``MpDeviceLoader`` runs the
  loader in a background thread and uploads ahead of the step, every tensor with
  ``xs.ShardingSpec(mesh, ("data", None...), minibatch=True)``: each host gives its host-local
  slice and the runtime assembles the global batch sharded along its batch axis over every
  device of the slice (``Backend.input_sharding``).

Design choice: the resume position is counted here, by steps *consumed* (``position``), never
read from the loader, which runs ahead by the prefetch depth; since every batch of the
streaming loader is a pure function of its index, prefetching changes nothing a checkpoint
records. A loader error in the background thread is re-raised by the next ``next_step`` (the
parallel loader would otherwise end the stream as if the data ran out).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np
import torch

from model.backend import Backend
from model.contract import get_objective
from model.data import IGNORE_INDEX
from model.stream import StreamingLoader

BATCH_DIMS = {"input_ids": 2, "token_type_ids": 2, "attention_mask": 2, "labels": 2, "next_sentence_label": 1}
"""The tensors of a batch (``model.data.collate``) and their number of dimensions."""


def batch_dims(objective: str) -> dict[str, int]:
    """:data:`BATCH_DIMS` of an objective's batches (no ``next_sentence_label`` without a sentence-level label)."""
    if get_objective(objective).sentence_label:
        return dict(BATCH_DIMS)
    return {k: v for k, v in BATCH_DIMS.items() if k != "next_sentence_label"}


@dataclass(frozen=True)
class MicroInfo:
    """Host-side facts of one host-local micro-batch."""

    rows: int
    width: int  # padded: the batch's width; packed: its longest sequence
    masked: int  # positions with an MLM label
    tokens: int  # real (attention-masked) tokens
    packed_tokens: int | None = None  # packed: the tokens the encoder computes (= tokens)
    pairs: int | None = None  # packed: the sum of the sequences' squared lengths (attention's work)


def micro_info(batch: dict) -> MicroInfo:
    """Counted on the host tensors, before any transfer: never a device sync."""
    packing = batch.get("packing")
    if packing is not None:
        lengths = packing.lengths.long()
        n = int(batch["input_ids"].numel())
        rows = int(packing.cu_seqlens.numel()) - 1
        masked = int(batch["labels"].numel())
        return MicroInfo(rows, packing.max_seqlen, masked, n, n, int((lengths * lengths).sum()))
    rows, width = batch["input_ids"].shape
    return MicroInfo(
        int(rows), int(width), int((batch["labels"] != IGNORE_INDEX).sum()), int(batch["attention_mask"].sum())
    )


class StepFeed:
    """Each step's micro-batches on the device (see the module docstring)."""

    def __init__(
        self,
        loader: StreamingLoader,
        backend: Backend,
        loader_prefetch: int = 4,
        device_prefetch: int = 2,
        ahead: bool = False,
    ):
        self.loader, self.backend, self.ahead = loader, backend, ahead
        self._dims = batch_dims(loader.spec.objective)
        self._next = None  # (keys, [(prefetched batch, info)]) of the step after the one handed out
        self.position = loader.position
        self.last_keys: np.ndarray | None = None
        self._pending: collections.deque = collections.deque()
        self._error: BaseException | None = None
        self._device_iter = None
        self._mp = None
        if backend.mesh is not None:
            import torch_xla.distributed.parallel_loader as pl

            self._mp = pl.MpDeviceLoader(
                self._host_batches(),
                backend.device,
                input_sharding=backend.input_sharding(self._dims),
                loader_prefetch_size=loader_prefetch,
                device_prefetch_size=device_prefetch,
            )
            self._device_iter = iter(self._mp)

    def _host_batches(self):
        """Host-local micro-batches in order; each step's facts are queued before its first one."""
        try:
            while True:
                micro = self.loader.next_step()
                for b in micro:
                    if {k: v.dim() for k, v in b.items()} != self._dims:
                        raise ValueError(f"a batch has tensors {sorted(b)} of ranks other than {self._dims}")
                self._pending.append((self.loader.last_keys, [micro_info(b) for b in micro]))
                yield from micro
        except Exception as exc:  # handed to the loop by next_step
            self._error = exc

    def next_step(self) -> list[tuple[dict[str, torch.Tensor], MicroInfo]]:
        """The next step's micro-batches (on the device) with their host-side facts."""
        if self._device_iter is None:
            current = self._next if self._next is not None else self._fetch()
            self._next = self._fetch() if self.ahead else None
            self.last_keys, micro = current
            out = [(self.backend.ready(b), info) for b, info in micro]
        else:
            batches = []
            for _ in range(self.loader.micro_batches):
                try:
                    batches.append(next(self._device_iter))
                except StopIteration:
                    raise RuntimeError("the training data stream stopped") from self._error
            self.last_keys, infos = self._pending.popleft()
            out = list(zip(batches, infos))
        self.position += 1
        return out

    def _fetch(self):
        micro = self.loader.next_step()
        return self.loader.last_keys, [(self.backend.prefetch(b), micro_info(b)) for b in micro]

    @property
    def epoch(self) -> float:
        """Epochs of this process's data consumed so far (for logs)."""
        mine = sum(u.rows for p in self.loader.parts for u in self.loader.units[p])
        return self.position * self.loader.local_batch_size / max(mine, 1)

    def close(self) -> None:
        """Stop the background loader (if any) and release its threads."""
        if self._mp is not None and self._mp._parallel_loader is not None:
            self._mp._parallel_loader.close()
        self._mp = self._device_iter = None
