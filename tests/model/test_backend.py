"""The backend seam: device selection, clear errors, single-process defaults."""

import contextlib
import importlib.util

import pytest
import torch
from tiny_bert import tiny_bert_config

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


def test_the_feed_one_step_ahead_serves_the_same_steps(tmp_path):
    """CUDA's feed builds and copies the next step's batches early; on the CPU the same code path
    (prefetch, ready) serves exactly the plain feed's batches, keys and resume position."""
    import numpy as np
    from pretrain_shards import write_example_stage

    from model.contract import read_manifest
    from model.data import shard_urls
    from model.feed import StepFeed
    from model.stream import LoaderSpec, StreamingLoader

    examples = write_example_stage(tmp_path, lengths=(16,), n=80, shards=2)
    spec = LoaderSpec(urls=tuple(shard_urls(read_manifest(examples), 16)), batch_size=8, max_seq_length=16, seed=1)
    be = setup_backend("cpu")
    plain, ahead = (StepFeed(StreamingLoader(spec, micro_batches=2), be, ahead=a) for a in (False, True))
    for _ in range(5):
        a, b = plain.next_step(), ahead.next_step()
        assert np.array_equal(plain.last_keys, ahead.last_keys) and len(a) == len(b) == 2
        for (x, i), (y, j) in zip(a, b):
            assert i == j and all(torch.equal(x[k], y[k]) for k in x)
    assert plain.position == ahead.position == 5 and ahead.loader.position == 6  # read one step ahead


def test_fsdp_under_bf16_shards_with_a_bf16_mixed_precision_policy(monkeypatch):
    import torch.distributed.fsdp as fsdp

    from model.bert import BertForPreTraining
    from model.parallel import Sharded

    calls = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kw: calls.append((module, kw)))
    cfg = tiny_bert_config(
        vocab_size=50, hidden_size=16, num_attention_heads=2, intermediate_size=20, max_position_embeddings=512
    )
    model = BertForPreTraining(cfg)
    Sharded(torch.device("cpu"), 2, "bf16").wrap(model)
    assert [m for m, _ in calls] == [*model.bert.encoder.layer, model]
    policy = calls[0][1]["mp_policy"]
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
    calls.clear()
    Sharded(torch.device("cpu"), 2, "fp32").wrap(model)
    assert all(kw == {} for _, kw in calls)
