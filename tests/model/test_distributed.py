"""Several training processes through the real launcher (flows.proc.launch -> torchrun -> train_entry):
2 processes with gloo end with identical weights, saw disjoint data, and match 1 process with the
same global batch; SIGTERM to the launcher checkpoints and stops the whole tree."""

import dataclasses
import os
import signal
import threading
import time

import pytest
import torch
from pretrain_shards import train_spec, write_example_stage
from tiny_bert import tiny_bert_config

from flows.proc.launch import build_command, launch_pretrain, training_env
from flows.proc.protocol import EXIT_TERMINATED
from model.checkpoint import find_latest_checkpoint
from model.config import PhaseConfig, PretrainConfig

NO_DROPOUT = tiny_bert_config(dropout=0.0)


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return write_example_stage(tmp_path_factory.mktemp("examples"), lengths=(16,), n=240, shards=2, row_group_size=30)


def spec(examples, out, steps=6, **kw):
    cfg = PretrainConfig(
        phases=(PhaseConfig("p1", 16, steps, 8),),
        learning_rate=2e-3,
        warmup_steps=2,
        log_every=2,
        checkpoint_every=1000,
        seed=5,
        data_parts=2,
        **kw,
    )
    return train_spec(cfg, NO_DROPOUT, examples, out)


def keys(path):
    return [set(line.split()) for line in path.read_text().splitlines()]


def test_command_and_threads():
    assert build_command("spec.json", 1)[1:] == ["-m", "flows.proc.train_entry", "--spec", "spec.json"]
    cmd = build_command("spec.json", 2)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    if "OMP_NUM_THREADS" not in os.environ:
        assert training_env(2, {})["OMP_NUM_THREADS"] == str(max(1, ((os.cpu_count() or 1) - 1) // 2))
    assert training_env(2, {"OMP_NUM_THREADS": "7"})["OMP_NUM_THREADS"] == "7"


def launch(examples, root, name, nproc, steps=6, **kw):
    trace = root / f"trace-{name}"
    trace.mkdir(exist_ok=True)
    with open(root / f"{name}.log", "w") as out:
        code = launch_pretrain(
            spec(examples, root / name, steps, **kw),
            nproc=nproc,
            env={"BERTFLOW_TRACE_DATA": str(trace), "OMP_NUM_THREADS": "1"},
            output=out,
        )
    log = (root / f"{name}.log").read_text()
    assert code == 0, log
    return trace, log


@pytest.fixture(scope="module")
def single(examples, tmp_path_factory):
    """One process, the same 2 data parts: the reference the multi-process runs must match."""
    return launch(examples, tmp_path_factory.mktemp("single"), "run", 1)[0]


def test_two_processes_match_one(examples, single, tmp_path):
    trace1 = single
    trace2, log2 = launch(examples, tmp_path, "ddp", 2)
    w0 = torch.load(trace2 / "rank0.weights.pt")
    w1 = torch.load(trace2 / "rank1.weights.pt")
    single = torch.load(trace1 / "rank0.weights.pt")
    for k in w0:
        assert torch.equal(w0[k], w1[k]), k  # the replicas agree exactly
        torch.testing.assert_close(w0[k], single[k], atol=2e-5, rtol=0, msg=k)
    # each rank loaded only its part: disjoint per step, together the 1-process batch
    for a, b, whole in zip(keys(trace2 / "rank0.txt"), keys(trace2 / "rank1.txt"), keys(trace1 / "rank0.txt")):
        assert not a & b and a | b == whole and len(a) == len(b) == 4
    # only rank 0 logs progress
    assert "step 6/6" in log2 and "[rank 1]" not in log2


@pytest.mark.e2e
def test_sigterm_stops_the_whole_tree_after_a_checkpoint(examples, tmp_path):
    trace = tmp_path / "trace"
    trace.mkdir()
    s = spec(examples, tmp_path / "run", steps=100_000)

    def terminate_when_training():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            lines = (trace / "rank0.txt").read_text().count("\n") if (trace / "rank0.txt").exists() else 0
            if lines >= 3 and (trace / "rank1.pid").exists():
                os.kill(os.getpid(), signal.SIGTERM)  # as a preempted VM / Ctrl-C would
                return
            time.sleep(0.2)

    threading.Thread(target=terminate_when_training, daemon=True).start()
    with open(tmp_path / "out.log", "w") as out:
        code = launch_pretrain(
            s, nproc=2, env={"BERTFLOW_TRACE_DATA": str(trace), "OMP_NUM_THREADS": "1"}, output=out, grace_s=60
        )
    log = (tmp_path / "out.log").read_text()
    assert code == EXIT_TERMINATED, log
    assert find_latest_checkpoint(str(tmp_path / "run")) is not None, log
    for r in (0, 1):
        pid = int((trace / f"rank{r}.pid").read_text())
        with pytest.raises(ProcessLookupError):  # no orphan trainer
            os.kill(pid, 0)
    assert "writing a checkpoint" in log


@pytest.mark.slow
def test_fsdp_matches_one_process_and_resumes(examples, single, tmp_path):
    trace, log = launch(examples, tmp_path, "fsdp", 2, parallel="fsdp")
    w = torch.load(trace / "rank0.weights.pt")
    ref = torch.load(single / "rank0.weights.pt")
    for k in ref:
        torch.testing.assert_close(w[k], ref[k], atol=2e-5, rtol=0, msg=k)
    # more steps: resumes from the sharded run's full checkpoint (optimizer state included)
    _, log = launch(examples, tmp_path, "fsdp", 2, steps=8, parallel="fsdp")
    assert "resuming from" in log and "step 8/8" in log


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["mlm", "sop"])
def test_fsdp_matches_one_process_for_every_objective(objective, tmp_path):
    """FSDP shards the network an objective builds (``BertForMaskedLM`` for mlm: no pooler, no
    NSP head; the NSP head as SOP's for sop) and ends where one process ends."""
    examples = write_example_stage(tmp_path / "examples", lengths=(16,), n=240, shards=2, objective=objective)
    ref, _ = launch(examples, tmp_path, "one", 1)
    trace, log = launch(examples, tmp_path, "fsdp", 2, parallel="fsdp")
    w, one = torch.load(trace / "rank0.weights.pt"), torch.load(ref / "rank0.weights.pt")
    assert set(w) == set(one)
    assert any("cls.seq_relationship" in k for k in w) == (objective == "sop"), sorted(w)
    for k in one:
        torch.testing.assert_close(w[k], one[k], atol=2e-5, rtol=0, msg=k)
    assert "step 6/6" in log and (", sop " in log) == (objective == "sop"), log


@pytest.mark.e2e
def test_a_killed_launcher_leaves_no_orphan_trainer(examples, tmp_path):
    import json
    import subprocess
    import sys

    trace = tmp_path / "trace"
    trace.mkdir()
    code = (
        "import json, sys; from flows.proc.launch import launch_pretrain; from flows.proc.protocol import ProcessSpec; "
        "sys.exit(launch_pretrain(ProcessSpec(**json.loads(sys.argv[1])), 1, {'BERTFLOW_TRACE_DATA': sys.argv[2]}))"
    )
    s = dataclasses.asdict(spec(examples, tmp_path / "run", steps=100_000))
    launcher = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(s), str(trace)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (trace / "rank0.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    trainer = int((trace / "rank0.pid").read_text())
    launcher.kill()  # SIGKILL: no chance to forward anything
    launcher.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(trainer, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(trainer, signal.SIGKILL)
        pytest.fail("the trainer outlived its launcher by 60 s")
    assert find_latest_checkpoint(str(tmp_path / "run")) is not None  # it checkpointed on the way out
