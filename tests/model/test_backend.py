"""The backend seam: device selection, clear errors, single-process defaults."""

import importlib.util

import pytest
import torch

from model.backend import Backend, select_device, setup_backend, unwrap


def test_cpu_backend_is_single_process_rank0(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    b = setup_backend("cpu")
    assert b.device == torch.device("cpu") and b.rank == 0 and b.world_size == 1 and b.is_main
    b.step_done()
    b.wait()
    b.barrier()  # no-ops on CPU
    assert b.rng_state() == {}
    t = torch.ones(3)
    assert b.all_reduce_sum(t) is t
    model = torch.nn.Linear(2, 2)
    assert b.wrap(model) is model and unwrap(model) is model
    with b.autocast():
        assert model(torch.ones(1, 2)).dtype == torch.float32


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="'tpu'"):
        select_device("tpu")


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla installed")
def test_xla_without_torch_xla_says_how_to_install():
    with pytest.raises(RuntimeError, match="torch-xla"):
        select_device("xla")
    with pytest.raises(RuntimeError, match="torch-xla"):
        Backend("xla", torch.device("cpu")).step_done()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_device_is_clear():
    with pytest.raises(RuntimeError, match="no CUDA device"):
        select_device("cuda")
