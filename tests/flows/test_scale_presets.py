"""base/large mean it: the paper's data (URLs the user sets), the backend of the host, bf16,
FSDP for large; a preset that cannot run where it is launched fails in seconds saying why.
And the node layout the multi-node launcher reads."""

import subprocess
import sys
from pathlib import Path

import pytest

from flows.hooks import BackendUnavailableError, check_backend, check_data
from flows.presets import accelerator_backend, load_config
from flows.proc.cluster import host_index
from flows.proc.launch import Nodes, build_command, nodes_from_env
from pipeline.schema.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample"


def test_paper_presets_pick_the_backend_of_the_host_and_bf16(monkeypatch):
    assert accelerator_backend({}) == "cuda"
    assert accelerator_backend({"PJRT_DEVICE": "TPU"}) == "xla"
    assert accelerator_backend({"TPU_ACCELERATOR_TYPE": "v4-32"}) == "xla"
    assert accelerator_backend({"BERTFLOW_BACKEND": "cpu", "PJRT_DEVICE": "TPU"}) == "cpu"  # the pool's word wins
    with pytest.raises(ConfigError, match="BERTFLOW_BACKEND='gpu'"):
        accelerator_backend({"BERTFLOW_BACKEND": "gpu"})
    monkeypatch.setenv("BERTFLOW_BACKEND", "xla")
    large, base, tiny = load_config("large"), load_config("base"), load_config("tiny")
    assert (large.pretrain.backend, large.pretrain.precision, large.pretrain.parallel) == ("xla", "bf16", "fsdp")
    assert (base.pretrain.backend, base.pretrain.parallel) == ("xla", "ddp")
    assert large.data.required and base.data.required and not tiny.data.required
    assert tiny.pretrain.backend == "cpu"  # the laptop preset is not touched


def test_unset_or_placeholder_data_is_named():
    cfg = load_config("base")
    with pytest.raises(
        ValueError, match=r"data\.wiki: the base preset runs on the paper's data and data\.wiki is not set"
    ):
        check_data(cfg)
    cfg = load_config(
        "large", {"data.wiki": "gs://b/enwiki-20261101-pages-articles.xml.bz2", "data.books": "gs://CHANGE-ME/books"}
    )
    with pytest.raises(ValueError, match=r"data\.books .*still the placeholder gs://CHANGE-ME/books"):
        check_data(cfg)
    check_data(load_config("tiny"))  # the sample is fine where it is meant


def test_a_backend_missing_here_is_refused_naming_it(monkeypatch):
    import importlib.util

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailableError, match=r"pretrain\.backend=cuda .* sees no CUDA device"):
        check_backend(load_config("large", {"pretrain.backend": "cuda"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    with pytest.raises(BackendUnavailableError, match=r"pretrain\.nproc=8 processes but this host has 4 CUDA"):
        check_backend(load_config("large", {"pretrain.backend": "cuda", "pretrain.nproc": 8}))
    check_backend(load_config("large", {"pretrain.backend": "cuda", "pretrain.nproc": 4}))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch_xla" else real(name, *a))
    with pytest.raises(BackendUnavailableError, match=r"torch_xla is not importable here"):
        check_backend(load_config("large", {"pretrain.backend": "xla"}))
    check_backend(load_config("tiny"))


def bertflow(*args: str, **env: str) -> subprocess.CompletedProcess:
    import os

    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    for name in ("BERTFLOW_BACKEND", "PJRT_DEVICE", "TPU_NAME", "TPU_ACCELERATOR_TYPE", "MLFLOW_TRACKING_URI"):
        if name not in env:
            full.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, env=full, timeout=60
    )


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this host has a GPU: large can run here")
def test_bertflow_run_large_on_a_cpu_host_fails_at_once_saying_why(tmp_path):
    out = bertflow("run", "--preset", "large", "--root", str(tmp_path / "r"))
    assert out.returncode == 2
    assert "data.wiki: the large preset runs on the paper's data and data.wiki is not set" in out.stderr
    data = ["--set", f"data.wiki={SAMPLE / 'wiki'}", "--set", f"data.books={SAMPLE / 'books'}"]
    out = bertflow("run", "--preset", "large", "--root", str(tmp_path / "r"), *data)
    assert out.returncode == 2
    assert "pretrain.backend=cuda (preset large" in out.stderr and "sees no CUDA device on this host" in out.stderr
    out = bertflow("run", "--preset", "large", "--root", str(tmp_path / "r"), *data, BERTFLOW_BACKEND="xla")
    if not __import__("importlib").util.find_spec("torch_xla"):
        assert out.returncode == 2 and "torch_xla is not importable here" in out.stderr
    assert not (tmp_path / "r").exists()  # refused before anything was written
    # a stage that does not train does not need the accelerator
    out = bertflow(
        "stage",
        "corpus",
        "--preset",
        "large",
        "--root",
        str(tmp_path / "r2"),
        "--set",
        "data.wiki=/nonexistent/enwiki.xml.bz2",
        "--set",
        f"data.books={SAMPLE / 'books'}",
    )
    assert out.returncode == 2 and "/nonexistent/enwiki.xml.bz2" in out.stderr and "CUDA" not in out.stderr


def test_node_layout_from_the_environment():
    assert nodes_from_env({}) == Nodes()
    n = nodes_from_env({"BERTFLOW_NNODES": "4", "JOB_COMPLETION_INDEX": "3", "BERTFLOW_RDZV_ENDPOINT": "h0:29500"})
    assert (n.nnodes, n.node_rank, n.rdzv_endpoint) == (4, 3, "h0:29500")
    with pytest.raises(ValueError, match="BERTFLOW_RDZV_ENDPOINT: 2 nodes need node 0's HOST:PORT"):
        nodes_from_env({"BERTFLOW_NNODES": "2"})
    with pytest.raises(ValueError, match=r"BERTFLOW_NODE_RANK: must lie in \[0, 2\)"):
        nodes_from_env({"BERTFLOW_NNODES": "2", "BERTFLOW_NODE_RANK": "2", "BERTFLOW_RDZV_ENDPOINT": "h:1"})
    assert build_command({"a": 1}, 2)[3:5] == ["--standalone", "--nproc_per_node=2"]  # one node: as before
    assert build_command({"a": 1}, 1)[1:3] == ["-m", "flows.proc.train_entry"]
    cmd = build_command({"a": 1}, 1, Nodes(2, 1, "h0:29500", "job7"))  # 1 GPU per node still needs torchrun
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert cmd[3:9] == [
        "--nnodes=2",
        "--node_rank=1",
        "--rdzv_backend=static",
        "--rdzv_endpoint=h0:29500",
        "--rdzv_id=job7",
        "--nproc_per_node=1",
    ]
    assert host_index({"TPU_WORKER_ID": "3"}) == 3 and host_index({}) == 0
    assert host_index({"BERTFLOW_NODE_RANK": "1", "JOB_COMPLETION_INDEX": "5"}) == 1


def test_a_second_xla_host_runs_the_trainer(capsys, monkeypatch):
    """A pod slice's host >= 1 trains (model/ confines writes to process index 0): it launches the
    same XLA training spec as host 0's flow, never the flow itself."""
    import flows.proc.cluster
    import flows.proc.launch
    from flows.proc.cluster import main

    monkeypatch.setenv("BERTFLOW_BACKEND", "xla")
    monkeypatch.setenv("TPU_WORKER_ID", "1")  # what infra/tpu/launch.sh sets from the TPU metadata
    for name in ("BERTFLOW_NODE_RANK", "BERTFLOW_NNODES", "JOB_COMPLETION_INDEX"):
        monkeypatch.delenv(name, raising=False)
    from flows.proc.protocol import ProcessSpec

    launched, seen = [], []
    spec = ProcessSpec("pretrain", "gs://b/large", "gs://b/large/pretrain", {"examples": "gs://b/large/examples"}, {})
    monkeypatch.setattr(flows.proc.cluster, "trainer_spec", lambda args: seen.append((args.preset, args.root)) or spec)
    monkeypatch.setattr(flows.proc.launch, "launch_pretrain", lambda spec: launched.append(spec) or 0)
    assert main(["--preset", "large", "--root", "gs://b/large"]) == 0, capsys.readouterr().err
    assert seen == [("large", "gs://b/large")] and launched == [spec]  # the trainer, not the flow
    assert "host 1 of 1: trainer" in capsys.readouterr().out
