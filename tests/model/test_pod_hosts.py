"""A TPU pod slice's hosts, played on the CPU without torch_xla: the XLA backend's data rank and
world come from the runtime's process index / count (faked through the ``model.xla.process`` seam), so
each host's loader reads a disjoint part of the shards and together they read all of it, the
hosts' local batches add up to exactly the global batch one process sees, and only host 0 writes.

What this cannot show (no pod here): that the hosts' slices are assembled into one sharded global
batch and the gradient all-reduce spans the hosts; the XLA tier (test_xla.py) shows the SPMD
half of that on one host's 2 CPU devices."""

import multiprocessing as mp
import os
import socket
import types
from collections import Counter

import pytest
import torch
from pretrain_shards import write_example_stage
from tiny_bert import tiny_bert_config

import model.xla as xla_mod
from model.backend import Backend, XlaBackend, setup_backend
from model.callbacks import DataTrace
from model.config import PhaseConfig, PretrainConfig
from model.train import run_pretrain

N, BATCH, LENGTH = 240, 16, 16
STEPS = N // BATCH  # one epoch of the global data


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return write_example_stage(tmp_path_factory.mktemp("examples"), lengths=(LENGTH,), n=N, shards=2, row_group_size=20)


def fake_host(monkeypatch, index: int, count: int) -> list:
    """The XLA backend as host ``index`` of ``count`` would set it up, on the CPU device."""
    joined = []
    fake_xla = types.SimpleNamespace(sync=lambda: None, device=lambda: torch.device("cpu"))
    fake_xm = types.SimpleNamespace(wait_device_ops=lambda: None, get_rng_state=lambda: 0, set_rng_state=lambda s: None)
    monkeypatch.setattr(xla_mod, "torch_xla_modules", lambda: (fake_xla, fake_xm))
    monkeypatch.setattr(xla_mod, "spmd_mesh", lambda: None)
    monkeypatch.setattr(xla_mod, "persistent_cache", lambda folder: None)
    monkeypatch.setattr(xla_mod, "process", lambda: (index, count))
    monkeypatch.setattr(xla_mod, "join_hosts", lambda: joined.append(index))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    return joined


@pytest.mark.parametrize("index", [0, 1])
def test_xla_host_is_data_rank_without_ddp(monkeypatch, index):
    joined = fake_host(monkeypatch, index, 2)
    be = setup_backend("xla", "fp32")
    assert (be.data_rank, be.data_world) == (index, 2) and be.multihost
    assert (be.rank, be.world_size) == (0, 1)  # no torch.distributed data parallelism on XLA
    assert be.is_main == (index == 0)
    assert joined == [index]  # the hosts' gloo group (barriers, stop signals)
    model = torch.nn.Linear(2, 2)
    assert be.wrap(model) is model  # never DDP/FSDP on XLA, whatever the host count
    t = torch.ones(2)
    assert be.all_reduce_sum(t) is t  # SPMD sums over the global batch already
    assert be.any_rank(True) and not be.any_rank(False)  # no process group here: this host's flag


def test_one_host_is_main_and_joins_nobody(monkeypatch):
    joined = fake_host(monkeypatch, 0, 1)
    be = setup_backend("xla", "fp32")
    assert be.is_main and not be.multihost and joined == []


def test_cpu_and_cuda_data_rank_is_the_ddp_rank():
    be = Backend(torch.device("cpu"), rank=1, world_size=2)
    assert (be.data_rank, be.data_world) == (1, 2) and not be.is_main and not be.multihost


def _config(**kw) -> PretrainConfig:
    return PretrainConfig(
        phases=(PhaseConfig("p1", LENGTH, STEPS, BATCH),),
        learning_rate=2e-3,
        warmup_steps=2,
        log_every=5,
        checkpoint_every=5,
        seed=3,
        precision="fp32",
        data_parts=4,
        **kw,
    )


def _trace(folder, name):
    return [line.split() for line in (folder / name).read_text().splitlines()]


@pytest.mark.parametrize("workers", [0, 2])
def test_pod_hosts_read_disjoint_complete_parts_and_only_host0_writes(examples, tmp_path, monkeypatch, workers):
    model = tiny_bert_config(dropout=0.0)
    cfg = _config(loader_workers=workers, backend="xla")
    hosts = {}
    for index in (0, 1):
        fake_host(monkeypatch, index, 2)
        trace = tmp_path / f"trace{index}"
        trace.mkdir()
        m = run_pretrain(cfg, model, examples, str(tmp_path / f"host{index}"), callbacks=DataTrace(trace))
        assert m.counts["steps"] == STEPS
        hosts[index] = _trace(trace, f"rank{index}.txt")
        assert len(hosts[index]) == STEPS and all(len(step) == BATCH // 2 for step in hosts[index])
    seen = Counter(k for index in (0, 1) for step in hosts[index] for k in step)
    assert len(seen) == N and set(seen.values()) == {1}  # one epoch: every example once, on one host
    assert not {k for s in hosts[0] for k in s} & {k for s in hosts[1] for k in s}
    # host 0 owns the stage's outputs; host 1 trained but wrote nothing
    assert (tmp_path / "host0" / "_manifest.json").exists() and (tmp_path / "host0" / "final").is_dir()
    assert (tmp_path / "host0" / "p1").is_dir()  # checkpoints
    assert not (tmp_path / "host1").exists() or not any((tmp_path / "host1").rglob("*"))

    # the two hosts' local batches are, step by step, the global batch of one process
    monkeypatch.undo()
    trace = tmp_path / "trace-cpu"
    trace.mkdir()
    cfg = _config(loader_workers=workers, backend="cpu")
    run_pretrain(cfg, model, examples, str(tmp_path / "cpu"), callbacks=DataTrace(trace))
    one = _trace(trace, "rank0.txt")
    assert [a + b for a, b in zip(hosts[0], hosts[1])] == one


CASES = [((7, 7), (False, True)), ((7, 6), (False, False))]  # (resume steps, stop flags) per host


def _host_group(index, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=index, world_size=2)  # what join_hosts sets up
    try:
        be = XlaBackend(torch.device("cpu"), data_rank=index, data_world=2)
        be.barrier()
        out.put((index, [(be.same_everywhere(values[index]), be.any_rank(flags[index])) for values, flags in CASES]))
    finally:
        torch.distributed.destroy_process_group()


def test_hosts_agree_over_their_process_group():
    """Two hosts' gloo group: "did any host get SIGTERM" reaches both, and differing resume steps
    are caught (SPMD hosts must run the same step)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_host_group, args=(i, port, out)) for i in (0, 1)]
    for p in procs:
        p.start()
    got = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    want = [(values[0] == values[1], any(flags)) for values, flags in CASES]
    assert got == [(0, want), (1, want)] and want == [(True, True), (False, False)]
