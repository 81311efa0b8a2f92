"""Where the training loop runs: CPU, CUDA (optionally DDP/FSDP under torchrun) or XLA (TPU).

The loop in ``model/train.py`` never asks which backend runs: it asks one :class:`Backend`
object each question whose answer differs, and this module and ``model/parallel.py`` answer:

- the device, mixed precision, device RNG state, a timing barrier: ``Backend`` (CPU),
  ``CudaBackend``, ``XlaBackend``;
- the MLM loss weight of each micro-batch (the global-batch mean): host counts all-reduced over
  the ranks; on XLA counted on the device from the global batch's labels;
- gradient sync during accumulation, the global gradient norm, the whole model and optimizer
  state for checkpoints and the export: the data-parallel strategy (``model/parallel.py``: one
  process, DDP ``no_sync``, FSDP ``set_requires_gradient_sync``, DTensor ``full_tensor``, full
  state dicts); on a TPU pod slice every host moves them to the CPU and host 0 keeps them;
- batch widths and the MLM head: the longest example rounded up to 8 and the sparse head; on XLA
  fixed buckets and the dense head (static shapes);
- the end of a step: nothing; on XLA ``torch_xla.sync()`` runs the step's graph.

Design choices: ``torch_xla`` is imported lazily, only for ``"xla"`` (``model/xla.py``), so CPU
and CUDA runs never need it. On XLA one process drives all the devices of its host through
SPMD: ``xr.use_spmd()``, a 1-D ``data`` mesh over the devices, and every batch tensor sharded
along its batch axis, so the loader serves the host's whole batch and XLA splits it (the weights
stay replicated, the gradient all-reduce is compiled in). Multi-replica XLA (one process per
device) is not used: on the CPU device its all-reduce hangs, and SPMD is torch-xla's recommended
path on TPU pods. Several CPU/CUDA processes (torchrun) share the model through DDP, or FSDP
(``fully_shard`` per encoder layer and the root) for large models.

Two notions of "rank", kept apart: ``rank`` / ``world_size`` are the torch.distributed processes
that DDP/FSDP and the metric all-reduces span (torchrun; always 0 / 1 on XLA, where SPMD compiles
the gradient all-reduce in), and ``data_rank`` / ``data_world`` split the data (the loader's
parts) and decide who writes. On CPU/CUDA they are equal. On a multi-host TPU pod slice every
host runs one process that SPMD-drives all devices of the slice; its ``data_rank`` /
``data_world`` are ``xr.process_index()`` / ``xr.process_count()``, so each host streams a
disjoint part of the shards and feeds its host-local slice of the global batch (assembled by
``xs.ShardingSpec(..., minibatch=True)``), and host 0 alone logs and writes. The hosts also join a
CPU (gloo) process group through torch-xla's ``xla://`` rendezvous, used only for host-side
agreement (barriers, "did any host get SIGTERM"), never for tensors of the model.
Precision "auto" is bfloat16 autocast on CUDA and XLA (the loss in float32, master weights
float32) and float32 on CPU, where bf16 autocast made the L=4/H=256 step 20x slower here.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from model import xla
from model.bert import pretraining_class
from model.checkpoint import to_cpu
from model.config import BertConfig
from model.data import IGNORE_INDEX
from model.parallel import STRATEGIES, OneProcess, unwrap

BACKENDS = ("cpu", "cuda", "xla")

__all__ = ["BACKENDS", "Backend", "CudaBackend", "XlaBackend", "select_device", "setup_backend", "unwrap"]


def select_device(backend: str) -> torch.device:
    """The torch device for ``backend`` ("cpu" | "cuda" | "xla"); a clear error if unavailable."""
    if backend == "cpu":
        return torch.device("cpu")
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("pretrain.backend='cuda' but torch sees no CUDA device")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if backend == "xla":
        return xla.device()
    raise ValueError(f"pretrain.backend: unknown backend {backend!r}, expected one of {BACKENDS}")


@dataclass
class Backend:
    """One or several CPU processes: the answers every other backend refines."""

    device: torch.device
    precision: str = "fp32"
    """The resolved precision: fp32 | bf16 (autocast; parameters and optimizer stay fp32)."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    data_rank: int | None = None
    """Which share of the data this process reads (default ``rank``; XLA: the host's process index)."""
    data_world: int | None = None
    """Processes the data is split between (default ``world_size``; XLA: the hosts of the slice)."""
    parallel: OneProcess = None  # type: ignore[assignment]
    """How the processes share the model (``model/parallel.py``); default: one process."""

    name: ClassVar[str] = "cpu"
    sparse_head: ClassVar[bool] = True
    """Project only the masked positions in the MLM head (data-dependent shapes)."""
    unpad_default: ClassVar[bool] = False
    """``pretrain.unpad=auto``: on CPU the padded step measured faster (docs/pretraining.md)."""
    compile_default: ClassVar[bool] = False
    """``pretrain.compile=auto``: on CPU the explicit oneDNN path is the fast one (model/kernels.py)."""
    feed_ahead: ClassVar[bool] = False
    """Copy each step's batches to the device one step ahead (no copy on the CPU: nothing to gain)."""
    mesh: ClassVar[object] = None
    """XLA SPMD: the device mesh batches are sharded over (None: one device, no sharding)."""

    def __post_init__(self):
        if self.data_rank is None:
            self.data_rank = self.rank
        if self.data_world is None:
            self.data_world = self.world_size
        if self.parallel is None:
            self.parallel = OneProcess(self.device, self.world_size)

    @property
    def devices(self) -> int:
        """Devices the model's step runs on (XLA SPMD: every device of the slice, all hosts)."""
        return 1

    @property
    def local_devices(self) -> int:
        """Devices this process feeds: its share of the host-local batch goes to each."""
        return 1

    @property
    def multihost(self) -> bool:
        """Several hosts drive one SPMD program (XLA pod slices only)."""
        return False

    @property
    def is_main(self) -> bool:
        """Rank 0 (XLA: host 0): the only process that logs, checkpoints and writes outputs."""
        return self.rank == 0 and self.data_rank == 0

    # -- device ------------------------------------------------------------------------------
    def put_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Move a (host-local) batch to the device (a packed batch's ``Packing`` too; its ints stay)."""
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def prefetch(self, batch: dict[str, torch.Tensor]):
        """Start moving ``batch`` to the device; :meth:`ready` hands it over when the step uses it."""
        return self.put_batch(batch)

    def ready(self, prefetched) -> dict[str, torch.Tensor]:
        return prefetched

    def compile(self, model: nn.Module) -> nn.Module:
        """``pretrain.compile``: the model's regions through ``torch.compile`` (model/compile.py)."""
        from model.compile import compile_regions

        return compile_regions(model)

    def _scalar(self, value: float) -> torch.Tensor:
        """A float32 scalar on the device, from a host value."""
        return torch.tensor(value, device=self.device)

    def step_done(self) -> None:
        """Call after each optimizer step (XLA cuts and runs the step's graph here)."""

    def wait(self) -> None:
        """Block until queued device work is done (for honest timings)."""

    def autocast(self):
        if self.precision != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def rng_state(self) -> dict:
        """Device RNG state (dropout on the accelerator); the CPU generator is saved separately."""
        return {}

    def set_rng_state(self, state: dict) -> None:
        pass

    # -- batches -------------------------------------------------------------------------------
    def buckets(self, length: int) -> tuple[int, ...]:
        """Fixed pad lengths for a phase of ``length``; empty: the longest example rounded up to 8."""
        return ()

    def loss_weights(self, micro: list) -> list[torch.Tensor]:
        """Per micro-batch ``(batch, info)``, the weight of its MLM mean in the global-batch mean:
        its masked tokens over those of the whole global batch (host counts, all-reduced), times
        the processes, as DDP averages gradients over ranks."""
        total = self.all_reduce_sum(self._scalar(float(sum(info.masked for _, info in micro))))
        total = torch.clamp(total, min=1.0)
        return [self._scalar(float(info.masked * self.world_size)) / total for _, info in micro]

    # -- the model across processes (model/parallel.py) ---------------------------------------
    def wrap(self, model: nn.Module) -> nn.Module:
        """DDP (or FSDP) when running under torchrun with more than one process."""
        return self.parallel.wrap(model)

    def grad_sync(self, train_model: nn.Module, last: bool):
        """Context of one micro-batch's forward and backward: gradients reduced on the last only."""
        return self.parallel.grad_sync(train_model, last)

    def grad_norm(self, norm: torch.Tensor) -> torch.Tensor:
        return self.parallel.grad_norm(norm)

    def full_model(self, model: nn.Module, config: BertConfig) -> nn.Module | None:
        """A model with all weights on the main process (None elsewhere), for checkpoints and the
        export; every process must call it (a collective under FSDP)."""
        return self.parallel.full_model(model, config, self.is_main)

    def replica(self, model: nn.Module, config: BertConfig) -> nn.Module | None:
        """This process's whole model (every process must call it; FSDP gathers to rank 0)."""
        return self.parallel.replica(model, config, self.is_main)

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        return self.parallel.optimizer_state(model, optimizer)

    def load_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        self.parallel.load_optimizer_state(model, optimizer, state)

    # -- agreement between processes -------------------------------------------------------------
    def barrier(self) -> None:
        """Wait for every process (torchrun ranks, or the hosts of an XLA pod slice)."""
        self.parallel.barrier()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a metric tensor over DDP/FSDP ranks (identity on one process, and on XLA, where
        SPMD already computed it over the global batch)."""
        return self.parallel.all_reduce_sum(t)

    def any_rank(self, flag: bool) -> bool:
        """True on every process when ``flag`` is true on any (e.g. a stop signal reached one host)."""
        return self.parallel.any_rank(flag)

    def same_everywhere(self, value: int) -> bool:
        """Whether every host of an XLA pod slice holds the same ``value`` (True elsewhere: DDP
        broadcasts rank 0's state). SPMD needs the hosts in lockstep, e.g. resuming the same step."""
        return True


@dataclass
class CudaBackend(Backend):
    """One GPU per process (``LOCAL_RANK``); NCCL between processes. A step without host syncs:
    batches from pinned memory copied on a side stream one step ahead, host scalars as fill
    kernels, the unpadded path (its indices from the loader) compiled by default."""

    name: ClassVar[str] = "cuda"
    unpad_default: ClassVar[bool] = True
    compile_default: ClassVar[bool] = True
    feed_ahead: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        self._copies = None  # the side stream of host-to-device copies, made on first use

    def _scalar(self, value: float) -> torch.Tensor:
        # a fill kernel: ``torch.tensor(x, device="cuda")`` copies from pageable memory and syncs
        return torch.full((), value, dtype=torch.float32, device=self.device)

    def prefetch(self, batch: dict[str, torch.Tensor]):
        if self._copies is None:
            self._copies = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._copies):
            out = {k: v.pin_memory().to(self.device, non_blocking=True) for k, v in batch.items()}
        return out, self._copies.record_event()

    def ready(self, prefetched) -> dict[str, torch.Tensor]:
        batch, copied = prefetched
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(copied)
        for v in batch.values():  # the compute stream uses memory the copy stream allocated
            for t in vars(v).values() if not torch.is_tensor(v) else (v,):
                if torch.is_tensor(t):
                    t.record_stream(stream)
        return batch

    def wait(self) -> None:
        torch.cuda.synchronize(self.device)

    def rng_state(self) -> dict:
        return {"cuda": torch.cuda.get_rng_state(self.device)}

    def set_rng_state(self, state: dict) -> None:
        if "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"], self.device)


@dataclass
class XlaBackend(Backend):
    """torch-xla: one process per host SPMD-drives every device of the slice (``model/xla.py``)."""

    mesh: object = None  # type: ignore[misc]
    name: ClassVar[str] = "xla"
    sparse_head: ClassVar[bool] = False  # XLA wants static shapes: the dense MLM head

    @property
    def devices(self) -> int:
        return len(self.mesh.device_ids) if self.mesh is not None else 1

    @property
    def local_devices(self) -> int:
        return max(1, self.devices // self.data_world) if self.mesh is not None else 1

    def compile(self, model: nn.Module) -> nn.Module:
        raise ValueError("pretrain.compile: XLA compiles each bucket's graph by itself (pretrain.xla_cache)")

    @property
    def multihost(self) -> bool:
        """Several hosts (a pod slice): one SPMD program, one process per host."""
        return self.data_world > 1

    def input_sharding(self, dims: dict[str, int]) -> dict[str, object]:
        """Per key (its tensor's number of dimensions), the SPMD sharding of a host-local batch."""
        return xla.input_sharding(self.mesh, dims)

    def put_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Move a (host-local) batch to the device; under SPMD as the sharded global batch."""
        if self.mesh is None:
            return super().put_batch(batch)
        return xla.send_to_device(batch, self.device, self.input_sharding({k: v.dim() for k, v in batch.items()}))

    def step_done(self) -> None:
        xla.sync()

    def wait(self) -> None:
        xla.wait()

    def autocast(self):
        if self.precision != "bf16":
            return contextlib.nullcontext()
        return torch.autocast("xla", dtype=torch.bfloat16)

    def rng_state(self) -> dict:
        return {"xla": xla.get_rng_state()}

    def set_rng_state(self, state: dict) -> None:
        if "xla" in state:
            xla.set_rng_state(state["xla"])

    def buckets(self, length: int) -> tuple[int, ...]:
        """Three fixed widths (a compiled graph each); on several hosts only the phase's length:
        every host's slice of a global batch must have the same width, and a host sees only its
        own examples."""
        if self.multihost:
            return (length,)
        return tuple(sorted({max(16, -(-length // 4 // 8) * 8), max(16, -(-length // 2 // 8) * 8), length}))

    def loss_weights(self, micro: list) -> list[torch.Tensor]:
        """SPMD: the device batch is the global one, its labels give global counts."""
        counts = [(batch["labels"] != IGNORE_INDEX).sum().to(torch.float32) for batch, _ in micro]
        total = torch.clamp(torch.stack(counts).sum(), min=1.0)
        return [c / total for c in counts]

    def full_model(self, model: nn.Module, config: BertConfig) -> nn.Module | None:
        """On a pod slice every host fetches the weights (a transfer of SPMD data may run a
        program on all hosts) and host 0 keeps them."""
        if not self.multihost:
            return super().full_model(model, config)
        weights = to_cpu(unwrap(model).state_dict())
        if not self.is_main:
            return None
        whole = pretraining_class(unwrap(model).cls.seq_relationship is not None)(config)  # the same heads
        whole.load_state_dict(weights)
        whole.tie_weights()
        return whole

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        if self.multihost:  # every host fetches (see full_model)
            return to_cpu(optimizer.state_dict())
        return super().optimizer_state(model, optimizer)

    def _hosts_agree(self) -> bool:
        return self.multihost and torch.distributed.is_initialized()

    def barrier(self) -> None:
        if self._hosts_agree():
            torch.distributed.barrier()

    def any_rank(self, flag: bool) -> bool:
        if self._hosts_agree():
            t = torch.tensor([1.0 if flag else 0.0])
            torch.distributed.all_reduce(t)
            return bool(t.item() > 0)
        return flag

    def same_everywhere(self, value: int) -> bool:
        if not self._hosts_agree():
            return True
        t = torch.tensor([value, -value], dtype=torch.int64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t[0]) == -int(t[1])


def resolve_precision(backend: str, precision: str) -> str:
    """ "auto" -> bf16 on cuda/xla, fp32 on cpu; explicit values pass through."""
    if precision == "auto":
        return "bf16" if backend in ("cuda", "xla") else "fp32"
    return precision


def setup_backend(name: str, precision: str = "auto", parallel: str = "ddp", xla_cache: str = "") -> Backend:
    """The backend for this process; joins the process group when torchrun started several.

    ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` are read from the environment (torchrun sets them);
    with none set this is a single process of rank 0. On XLA the data rank / world are the host's
    process index / count (``model.xla.process``), several hosts join a gloo group
    (``model.xla.join_hosts``), and ``xla_cache`` (a folder) holds the persistent compilation cache.
    """
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    precision = resolve_precision(name, precision)
    if name == "xla":
        if world_size > 1:
            raise NotImplementedError(
                "several XLA processes per host (torchrun) are not used: run one process per host, which "
                "drives all devices through SPMD (on a pod slice: the same command on every host)"
            )
        xla.persistent_cache(xla_cache)
        mesh = xla.spmd_mesh()
        data_rank, data_world = xla.process()
        if data_world > 1:
            xla.join_hosts()
        return XlaBackend(select_device(name), precision, data_rank=data_rank, data_world=data_world, mesh=mesh)
    device = select_device(name)
    if name == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if world_size > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if name == "cuda" else "gloo")
    strategy = (STRATEGIES[parallel] if world_size > 1 else OneProcess)(device, world_size, precision)
    cls = CudaBackend if name == "cuda" else Backend
    return cls(device, precision, rank, world_size, local_rank, parallel=strategy)


def choose(setting: str, default: bool) -> bool:
    """An ``auto | on | off`` option (``model.config.SWITCH``): ``default`` for auto."""
    return default if setting == "auto" else setting == "on"
