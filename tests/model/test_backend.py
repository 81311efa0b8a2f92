"""The backend seam: device selection, clear errors, single-process defaults."""

import contextlib
import importlib.util

import pytest
import torch

from model.backend import XlaBackend, select_device, setup_backend, unwrap


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
        XlaBackend(torch.device("cpu")).step_done()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_device_is_clear():
    with pytest.raises(RuntimeError, match="no CUDA device"):
        select_device("cuda")


def test_the_loop_never_asks_which_backend_runs():
    """model/train.py asks the Backend; it names no backend, parallel mode or their APIs."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[2] / "model" / "train.py").read_text())
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    words = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            words.add(n.id)
        elif isinstance(n, ast.Attribute):
            words.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings:
            words.update(n.value.replace(".", " ").split())
    forbidden = {"xla", "cuda", "ddp", "fsdp", "multihost", "no_sync", "full_tensor", "hasattr", "environ"}
    assert not words & forbidden, sorted(words & forbidden)


class _Stub(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = []

    def no_sync(self):
        self.calls.append("no_sync")
        return contextlib.nullcontext()

    def set_requires_gradient_sync(self, flag):
        self.calls.append(flag)


def test_parallel_strategies_sync_gradients_on_the_last_micro_batch_only():
    from model.parallel import OneProcess, Replicated, Sharded

    cpu = torch.device("cpu")
    for strategy, want in ((OneProcess(cpu), []), (Replicated(cpu, 2), ["no_sync"]), (Sharded(cpu, 2), [False, True])):
        stub = _Stub()
        for last in (False, True):
            with strategy.grad_sync(stub, last):
                pass
        assert stub.calls == want, type(strategy).__name__


def test_loss_weights_make_the_global_batch_mean():
    from types import SimpleNamespace

    from model.data import IGNORE_INDEX

    micro = [(None, SimpleNamespace(masked=3)), (None, SimpleNamespace(masked=1))]
    weights = setup_backend("cpu").loss_weights(micro)
    assert [float(w) for w in weights] == [0.75, 0.25]
    labels = torch.full((2, 4), IGNORE_INDEX)
    labels[0, :3], labels[1, 0] = 1, 1  # XLA counts on the device: the same weights
    xla_micro = [({"labels": labels[:1]}, None), ({"labels": labels[1:]}, None)]
    assert [float(w) for w in XlaBackend(torch.device("cpu")).loss_weights(xla_micro)] == [0.75, 0.25]
