"""torch-xla, imported lazily: the runtime calls the XLA backend (``model/backend.py``) makes.

Only ``pretrain.backend = "xla"`` reaches this module's functions, so CPU and CUDA runs never
need torch-xla (it pins torch 2.9; see pyproject's ``xla`` extra). Every function is a seam the
tests replace to play a host of a TPU pod slice without torch-xla (``tests/model/test_pod_hosts.py``).
"""

from __future__ import annotations

import logging

import torch


def torch_xla_modules():
    """(torch_xla, torch_xla.core.xla_model), or a RuntimeError that says how to install them."""
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


def device() -> torch.device:
    torch_xla, _ = torch_xla_modules()
    return torch_xla.device()


def process() -> tuple[int, int]:
    """(process index, process count) of this host in the XLA runtime: (0, 1) on one host."""
    torch_xla_modules()
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


def persistent_cache(folder: str) -> None:
    """Keep compiled graphs in ``folder`` across runs (each padding bucket compiles once, ever);
    must run before any XLA computation. Empty: no cache."""
    if not folder:
        return
    import os

    torch_xla_modules()
    import torch_xla.runtime as xr

    path = os.path.expanduser(folder)
    os.makedirs(path, exist_ok=True)
    try:
        xr.initialize_cache(path, readonly=False)
    except (AssertionError, RuntimeError) as exc:  # XLA already computed in this process (a second run)
        logging.getLogger("bertflow.pretrain").warning("XLA persistent cache %s not set up: %s", path, exc)


def spmd_mesh():
    """A 1-D ``data`` mesh over every XLA device of this host, or None with a single device.

    ``xr.use_spmd()`` must run before any XLA tensor exists, so this is called before the model
    is built; with one device SPMD is left off (plain single-device XLA).
    """
    torch_xla_modules()
    import numpy as np
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    n = xr.global_runtime_device_count()
    if n <= 1:
        return None
    xr.use_spmd()
    return xs.Mesh(np.arange(n), (n,), ("data",))


def input_sharding(mesh, dims: dict[str, int]) -> dict[str, object]:
    """Per key (its tensor's number of dimensions), the SPMD sharding of a host-local batch:
    split along the batch axis over the mesh; ``minibatch=True`` makes each host's tensor its
    slice of the global batch."""
    import torch_xla.distributed.spmd as xs

    return {k: xs.ShardingSpec(mesh, ("data",) + (None,) * (n - 1), minibatch=True) for k, n in dims.items()}


def send_to_device(batch: dict[str, torch.Tensor], dev: torch.device, specs: dict[str, object]):
    """A host-local batch as the sharded global batch on the devices."""
    _, xm = torch_xla_modules()
    return {k: xm.send_cpu_data_to_device(v, dev, specs[k])[0] for k, v in batch.items()}


def sync() -> None:
    """Cut the lazy graph of this step and run it."""
    torch_xla, _ = torch_xla_modules()
    torch_xla.sync()


def wait() -> None:
    _, xm = torch_xla_modules()
    xm.wait_device_ops()


def get_rng_state() -> int:
    _, xm = torch_xla_modules()
    return int(xm.get_rng_state())


def set_rng_state(state: int) -> None:
    _, xm = torch_xla_modules()
    xm.set_rng_state(int(state))
