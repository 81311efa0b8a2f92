"""How several processes share one model: one process, DDP, or FSDP2 (torchrun on CPU or CUDA).

A :class:`model.backend.Backend` holds one of these strategies and hands the training loop's
questions about data parallelism to it, so the loop never asks which one runs:

- :class:`OneProcess`: nothing to share; every collective is the identity.
- :class:`Replicated` (DDP): the model replicated on every rank, gradients all-reduced in
  buckets during the backward pass, ``no_sync`` on every accumulation micro-batch but the last.
- :class:`Sharded` (FSDP2, ``fully_shard`` on every encoder layer and the root; under bf16 a
  ``MixedPrecisionPolicy`` of bf16 parameters and fp32 gradient reduction): parameters,
  gradients and optimizer state sharded over the ranks (DTensors); gradients reduce-scattered
  on the last micro-batch only (``set_requires_gradient_sync``); the gradient norm is a DTensor
  whose ``full_tensor()`` is the global norm; checkpoints and the export gather a full state
  dict (``torch.distributed.checkpoint.state_dict``), so they are the same files as under DDP.

Design choice: the metric and agreement collectives (``all_reduce_sum``, ``any_rank``,
``barrier``) live here too, because they span exactly the processes that share the model; the
stop-signal agreement asked every step goes over a CPU (gloo) group, never through the GPUs.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from model.bert import pretraining_class
from model.config import BertConfig


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (for saving and for attributes like ``sparse_prediction``)."""
    return model.module if hasattr(model, "module") else model


class OneProcess:
    """A single process holds the whole model (also XLA SPMD: the compiler reduces gradients)."""

    name = "none"

    def __init__(self, device: torch.device, world_size: int = 1, precision: str = "fp32"):
        self.device, self.world_size, self.precision = device, world_size, precision
        self._hosts = None

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def grad_sync(self, train_model: nn.Module, last: bool):
        """The context of one micro-batch's backward pass: reduce gradients only on the last."""
        return contextlib.nullcontext()

    def grad_norm(self, norm: torch.Tensor) -> torch.Tensor:
        """``clip_grad_norm_``'s result as the global norm."""
        return norm

    def full_model(self, model: nn.Module, config: BertConfig, is_main: bool) -> nn.Module | None:
        """The whole model with every weight on the main process (None elsewhere)."""
        return unwrap(model) if is_main else None

    def replica(self, model: nn.Module, config: BertConfig, is_main: bool) -> nn.Module | None:
        """This process's copy of the whole model (to check that replicas agree)."""
        return unwrap(model)

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        return optimizer.state_dict()

    def load_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)

    # -- collectives over the processes that share the model ------------------------------------
    def _spans(self) -> bool:
        return self.world_size > 1 and torch.distributed.is_initialized()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over the ranks (identity on one process)."""
        if self._spans():
            t = t.clone()
            torch.distributed.all_reduce(t)
        return t

    def any_rank(self, flag: bool) -> bool:
        """Over a CPU (gloo) group: asked every step, it must not wait for the GPUs' queue."""
        if self._spans():
            t = torch.tensor([1.0 if flag else 0.0])
            torch.distributed.all_reduce(t, group=self._host_group())
            return bool(t.item() > 0)
        return flag

    def _host_group(self):
        """The default group when it is gloo (CPU); beside NCCL a gloo group of the same ranks,
        made on first use (every rank asks at the same step)."""
        if self.device.type != "cuda":
            return None
        if self._hosts is None:
            self._hosts = torch.distributed.new_group(backend="gloo")
        return self._hosts

    def barrier(self) -> None:
        if self._spans():
            torch.distributed.barrier()


class Replicated(OneProcess):
    """DDP: one replica per rank, gradient buckets all-reduced during the backward pass."""

    name = "ddp"

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def grad_sync(self, train_model: nn.Module, last: bool):
        return contextlib.nullcontext() if last else train_model.no_sync()


class Sharded(Replicated):
    """FSDP2: ``fully_shard`` per encoder layer and on the root; full state dicts for files."""

    name = "fsdp"

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        kw = {"mp_policy": self.mixed_precision()} if self.precision == "bf16" else {}
        for layer in model.bert.encoder.layer:
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        return model

    def mixed_precision(self):
        """bf16: parameters all-gathered and computed in bf16, gradients reduce-scattered in fp32 onto
        the fp32 shards (the master weights the optimizer steps); autocast still keeps the ops that
        need fp32 (softmax, LayerNorm, the losses) in fp32."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    def grad_sync(self, train_model: nn.Module, last: bool):
        train_model.set_requires_gradient_sync(last)  # reduce-scatter on the last micro-batch only
        return contextlib.nullcontext()

    def grad_norm(self, norm: torch.Tensor) -> torch.Tensor:
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def full_model(self, model: nn.Module, config: BertConfig, is_main: bool) -> nn.Module | None:
        """A collective: every rank takes part; rank 0 gets a CPU model with all weights."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not is_main:
            return None
        whole = pretraining_class(unwrap(model).cls.seq_relationship is not None)(config)  # the same heads
        whole.load_state_dict(full, strict=False)  # the tied decoder weight comes with the embeddings
        whole.tie_weights()
        return whole

    def replica(self, model: nn.Module, config: BertConfig, is_main: bool) -> nn.Module | None:
        return self.full_model(model, config, is_main)

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


STRATEGIES = {"ddp": Replicated, "fsdp": Sharded}
"""``pretrain.parallel`` -> the strategy used when torchrun starts more than one process."""
