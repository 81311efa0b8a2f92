"""Where the training loop runs: CPU, CUDA (optionally DDP under torchrun) or XLA (TPU).

The loop in ``model/train.py`` stays backend-neutral; everything that differs between backends
goes through one :class:`Backend` object: the device, a step-synchronisation hook (XLA builds
a lazy graph per step and runs it at ``torch_xla.sync()``), a timing barrier, mixed precision,
device RNG state for exact resume, and the data-parallel seam (rank / world size from the
environment ``torchrun`` sets; rank 0 alone logs and saves).

Design choices: ``torch_xla`` is imported lazily, only for ``"xla"``, so CPU and CUDA runs never
need it (it pins torch 2.9; see pyproject's ``xla`` extra). On XLA one process drives all the
devices of its host through SPMD: ``xr.use_spmd()``, a 1-D ``data`` mesh over the devices, and
every batch tensor sharded along its batch axis (``xs.mark_sharding``), so the loader serves
the host's whole batch and XLA splits it (the weights stay replicated, the gradient all-reduce
is compiled in). Multi-replica XLA (one process per device) is not used: on the CPU device its
all-reduce hangs, and SPMD is torch-xla's recommended path on TPU pods. Several CPU/CUDA processes (torchrun) share the
model through DDP, or FSDP (``fully_shard`` per encoder layer and the root) for large models.

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

import torch
from torch import nn

BACKENDS = ("cpu", "cuda", "xla")


def _torch_xla():
    try:
        import torch_xla
        import torch_xla.core.xla_model as xm
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "pretrain.backend='xla' needs torch-xla, which is not installed here. It only works "
            "with torch 2.9.x: install it in its own environment with "
            "`pip install torch==2.9.0 torch-xla==2.9.0` (add [tpu] on a TPU VM)"
        ) from exc
    return torch_xla, xm


def select_device(backend: str) -> torch.device:
    """The torch device for ``backend`` ("cpu" | "cuda" | "xla"); a clear error if unavailable."""
    if backend == "cpu":
        return torch.device("cpu")
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("pretrain.backend='cuda' but torch sees no CUDA device")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if backend == "xla":
        torch_xla, _ = _torch_xla()
        return torch_xla.device()
    raise ValueError(f"pretrain.backend: unknown backend {backend!r}, expected one of {BACKENDS}")


@dataclass
class Backend:
    name: str
    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    precision: str = "fp32"
    """The resolved precision: fp32 | bf16 (autocast; parameters and optimizer stay fp32)."""
    parallel: str = "ddp"
    mesh: object = None
    """XLA SPMD: the device mesh batches are sharded over (None: one device, no sharding)."""
    data_rank: int | None = None
    """Which share of the data this process reads (default ``rank``; XLA: the host's process index)."""
    data_world: int | None = None
    """Processes the data is split between (default ``world_size``; XLA: the hosts of the slice)."""

    def __post_init__(self):
        if self.data_rank is None:
            self.data_rank = self.rank
        if self.data_world is None:
            self.data_world = self.world_size

    @property
    def devices(self) -> int:
        """Devices the model's step runs on (XLA SPMD: every device of the slice, all hosts)."""
        return len(self.mesh.device_ids) if self.mesh is not None else 1

    @property
    def local_devices(self) -> int:
        """Devices this process feeds: its share of the host-local batch goes to each."""
        return max(1, self.devices // self.data_world) if self.mesh is not None else 1

    @property
    def multihost(self) -> bool:
        """XLA on several hosts (a pod slice): one SPMD program, one process per host."""
        return self.name == "xla" and self.data_world > 1

    def input_sharding(self, dims: dict[str, int]) -> dict[str, object]:
        """Per key (its tensor's number of dimensions), the SPMD sharding of a host-local batch:
        split along the batch axis over the mesh; ``minibatch=True`` makes each host's tensor its
        slice of the global batch."""
        import torch_xla.distributed.spmd as xs

        return {k: xs.ShardingSpec(self.mesh, ("data",) + (None,) * (n - 1), minibatch=True) for k, n in dims.items()}

    def put_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Move a (host-local) batch to the device; under SPMD as the sharded global batch."""
        if self.mesh is None:
            return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        _, xm = _torch_xla()
        specs = self.input_sharding({k: v.dim() for k, v in batch.items()})
        return {k: xm.send_cpu_data_to_device(v, self.device, specs[k])[0] for k, v in batch.items()}

    @property
    def is_main(self) -> bool:
        """Rank 0 (XLA: host 0): the only process that logs, checkpoints and writes outputs."""
        return self.rank == 0 and self.data_rank == 0

    def step_done(self) -> None:
        """Call after each optimizer step: on XLA this cuts and runs the step's graph."""
        if self.name == "xla":
            torch_xla, _ = _torch_xla()
            torch_xla.sync()

    def wait(self) -> None:
        """Block until queued device work is done (for honest timings)."""
        if self.name == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.name == "xla":
            _, xm = _torch_xla()
            xm.wait_device_ops()

    def autocast(self):
        if self.precision != "bf16":
            return contextlib.nullcontext()
        return torch.autocast({"cuda": "cuda", "xla": "xla"}.get(self.name, "cpu"), dtype=torch.bfloat16)

    def rng_state(self) -> dict:
        """Device RNG state (dropout on the accelerator); the CPU generator is saved separately."""
        if self.name == "cuda":
            return {"cuda": torch.cuda.get_rng_state(self.device)}
        if self.name == "xla":
            _, xm = _torch_xla()
            return {"xla": int(xm.get_rng_state())}
        return {}

    def set_rng_state(self, state: dict) -> None:
        if self.name == "cuda" and "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"], self.device)
        elif self.name == "xla" and "xla" in state:
            _, xm = _torch_xla()
            xm.set_rng_state(int(state["xla"]))

    def wrap(self, model: nn.Module) -> nn.Module:
        """DDP (or FSDP) when running under torchrun with more than one process."""
        if self.world_size > 1 and self.name in ("cpu", "cuda") and self.parallel == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for layer in model.bert.encoder.layer:
                fully_shard(layer)
            fully_shard(model)
            return model
        if self.world_size > 1 and self.name in ("cpu", "cuda"):
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.name == "cuda" else None
            return DistributedDataParallel(model, device_ids=ids)
        return model

    def barrier(self) -> None:
        """Wait for every process (torchrun ranks, or the hosts of an XLA pod slice)."""
        if (self.world_size > 1 or self.multihost) and torch.distributed.is_initialized():
            torch.distributed.barrier()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a metric tensor over DDP/FSDP ranks (identity on one process, and on XLA, where
        SPMD already computed it over the global batch)."""
        if self.world_size > 1 and torch.distributed.is_initialized():
            t = t.clone()
            torch.distributed.all_reduce(t)
        return t

    def any_rank(self, flag: bool) -> bool:
        """True on every process when ``flag`` is true on any (e.g. a stop signal reached one host)."""
        if (self.world_size > 1 or self.multihost) and torch.distributed.is_initialized():
            t = torch.tensor([1.0 if flag else 0.0], device=self.device if self.name == "cuda" else "cpu")
            torch.distributed.all_reduce(t)
            return bool(t.item() > 0)
        return flag

    def same_everywhere(self, value: int) -> bool:
        """Whether every host of an XLA pod slice holds the same ``value`` (True elsewhere: DDP
        broadcasts rank 0's state). SPMD needs the hosts in lockstep, e.g. resuming the same step."""
        if not (self.multihost and torch.distributed.is_initialized()):
            return True
        t = torch.tensor([value, -value], dtype=torch.int64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t[0]) == -int(t[1])


def resolve_precision(backend: str, precision: str) -> str:
    """ "auto" -> bf16 on cuda/xla, fp32 on cpu; explicit values pass through."""
    if precision == "auto":
        return "bf16" if backend in ("cuda", "xla") else "fp32"
    return precision


def setup_backend(name: str, precision: str = "auto", parallel: str = "ddp") -> Backend:
    """The backend for this process; joins the process group when torchrun started several.

    ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` are read from the environment (torchrun sets them);
    with none set this is a single process of rank 0. On XLA the data rank / world are the host's
    process index / count (:func:`xla_process`), and several hosts join a gloo group (:func:`join_hosts`).
    """
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if name == "xla" and world_size > 1:
        raise NotImplementedError(
            "several XLA processes per host (torchrun) are not used: run one process per host, which "
            "drives all devices through SPMD (on a pod slice: the same command on every host)"
        )
    mesh = None
    data_rank, data_world = rank, world_size
    if name == "xla":
        mesh = _spmd_mesh()
        data_rank, data_world = xla_process()
        if data_world > 1:
            join_hosts()
    device = select_device(name)
    if name == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if world_size > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if name == "cuda" else "gloo")
    return Backend(
        name,
        device,
        rank,
        world_size,
        local_rank,
        resolve_precision(name, precision),
        parallel,
        mesh,
        data_rank,
        data_world,
    )


def xla_process() -> tuple[int, int]:
    """(process index, process count) of this host in the XLA runtime: (0, 1) on one host.
    A seam: tests replace it to play host 1 of 2 without a pod."""
    _torch_xla()
    import torch_xla.runtime as xr

    return xr.process_index(), xr.process_count()


def join_hosts() -> None:
    """Join the hosts of a pod slice in a CPU (gloo) process group for host-side agreement.

    torch-xla's ``xla://`` rendezvous takes rank and world size from the SPMD runtime (process
    index / count) and the master address from the TPU metadata (or ``MASTER_ADDR``).
    """
    import torch_xla.distributed.xla_backend  # noqa: F401 - registers the xla:// rendezvous

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", init_method="xla://")


def _spmd_mesh():
    """A 1-D ``data`` mesh over every XLA device of this host, or None with a single device.

    ``xr.use_spmd()`` must run before any XLA tensor exists, so this is called before the model
    is built; with one device SPMD is left off (plain single-device XLA).
    """
    _torch_xla()
    import numpy as np
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    n = xr.global_runtime_device_count()
    if n <= 1:
        return None
    xr.use_spmd()
    return xs.Mesh(np.arange(n), (n,), ("data",))


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (for saving and for attributes like ``sparse_prediction``)."""
    return model.module if hasattr(model, "module") else model
