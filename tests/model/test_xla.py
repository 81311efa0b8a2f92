"""The XLA tier: SPMD data parallelism over the XLA CPU device's 2 devices (torch-xla's own
environment: run with `PJRT_DEVICE=CPU CPU_NUM_DEVICES=2 python -m pytest tests/model/test_xla.py -m xla`).

Each check runs in a fresh process, because SPMD and the device count are fixed when the XLA
runtime starts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xla

SCRIPT = r"""
import dataclasses, json, sys
import numpy as np
import torch
from model.backend import setup_backend
from model.config import BertConfig, PhaseConfig, PretrainConfig
from model.train import run_pretrain
from pretrain_shards import MODEL
from tiny_bert import tiny_bert_config
examples, out, backend, micro, crash_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
model = tiny_bert_config(dropout=0.0)
cfg = PretrainConfig(phases=(PhaseConfig("p1", 16, 6, 8, micro),), learning_rate=2e-3, warmup_steps=2, log_every=1,
                     checkpoint_every=3, seed=5, backend=backend, precision="fp32")
result = {}
if backend == "xla":
    be = setup_backend("xla", "fp32")
    import torch_xla
    from model.data import shard_urls
    from model.feed import StepFeed
    from model.stream import LoaderSpec, StreamingLoader
    from model.contract import objective_of, read_manifest
    batch = be.put_batch({"input_ids": torch.zeros(8, 16, dtype=torch.long)})
    result["devices"] = be.devices
    result["sharding"] = torch_xla._XLAC._get_xla_sharding_spec(batch["input_ids"])
    # the training input path: MpDeviceLoader, every tensor split along its batch axis
    spec = LoaderSpec(urls=tuple(shard_urls(read_manifest(examples), 16)), batch_size=8, max_seq_length=16, seed=1,
                      num_parts=2, buckets=(16,), objective=objective_of(read_manifest(examples)).name)
    feed, plain = StepFeed(StreamingLoader(spec), be), StreamingLoader(spec)
    result["feed"] = type(feed._mp).__name__
    result["feed_shardings"], result["feed_equal"] = [], []
    for _ in range(3):
        [(got, info)] = feed.next_step()
        want = plain.next_step()[0]
        result["feed_shardings"].append({k: torch_xla._XLAC._get_xla_sharding_spec(v) for k, v in got.items()})
        result["feed_equal"].append(all(torch.equal(got[k].cpu(), want[k]) for k in want))
        result["feed_rows"] = info.rows
    result["feed_position"], result["loader_position"] = feed.position, feed.loader.position
    feed.close()

class Crash(Exception):
    pass

def log_fn(metrics, step):
    if step == crash_at:
        raise Crash()

if crash_at:
    try:
        run_pretrain(cfg, model, examples, out, log_fn=log_fn)
        raise SystemExit("did not crash")
    except Crash:
        pass
m = run_pretrain(cfg, model, examples, out)
result["loss"] = m.counts["last_mlm_loss"]
print("RESULT " + json.dumps(result))
"""


def run(examples, out, backend, micro=0, crash_at=0):
    env = {
        **os.environ,
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": "2",
        "PYTHONPATH": os.pathsep.join([os.getcwd(), os.path.dirname(__file__), str(Path(__file__).parents[1])]),
    }
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, examples, str(out), backend, str(micro), str(crash_at)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def weights(folder):
    import safetensors.torch

    return safetensors.torch.load_file(str(folder / "final" / "model.safetensors"))


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    pytest.importorskip("torch_xla")
    from pretrain_shards import write_example_stage

    return write_example_stage(tmp_path_factory.mktemp("examples"), lengths=(16,), n=240, shards=2)


def test_spmd_splits_the_batch_and_matches_cpu(examples, tmp_path):
    import torch

    xla = run(examples, tmp_path / "xla", "xla")
    run(examples, tmp_path / "cpu", "cpu")  # its weights, compared below
    assert xla["devices"] == 2
    assert xla["sharding"].startswith("{devices=[2,1]"), xla["sharding"]  # the batch axis is split
    # the loop's input: MpDeviceLoader uploads each batch split along its batch axis, values intact
    assert xla["feed"] == "MpDeviceLoader" and xla["feed_equal"] == [True] * 3 and xla["feed_rows"] == 8
    for shardings in xla["feed_shardings"]:
        for k, spec in shardings.items():
            assert spec.startswith("{devices=[2]" if k == "next_sentence_label" else "{devices=[2,1]"), (k, spec)
    # resume counts consumed steps, not the background loader's read-ahead
    assert xla["feed_position"] == 3 and xla["loader_position"] >= 3
    a, b = weights(tmp_path / "xla"), weights(tmp_path / "cpu")
    for k in b:
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=0, msg=k)


def test_spmd_accumulation_and_resume_match(examples, tmp_path):
    """Two micro-batches per step (the global-batch MLM weights counted on the device) match the
    CPU; a run killed after step 4 and resumed from its step-3 checkpoint (the feed's consumed
    position, not the loader's read-ahead) ends with the straight run's weights."""
    import torch

    run(examples, tmp_path / "xla", "xla", micro=4)
    run(examples, tmp_path / "xla-resumed", "xla", micro=4, crash_at=4)
    run(examples, tmp_path / "cpu", "cpu", micro=4)
    a, r, b = weights(tmp_path / "xla"), weights(tmp_path / "xla-resumed"), weights(tmp_path / "cpu")
    for k in b:
        torch.testing.assert_close(r[k], a[k], atol=1e-6, rtol=0, msg=k)
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=0, msg=k)


@pytest.mark.parametrize("objective", ["mlm", "sop"])
def test_spmd_trains_every_objective_as_the_cpu_does(tmp_path, objective):
    """MLM over full sentences (one segment, no sentence head) and sentence order (the NSP head's
    weights, the `is_swapped` label): the XLA run's heads and weights are the CPU run's, and a run
    killed after step 4 resumes to the same weights."""
    pytest.importorskip("torch_xla")
    import torch
    from pretrain_shards import write_example_stage

    from pipeline.schema.objectives import get_objective

    examples = write_example_stage(tmp_path / "examples", lengths=(16,), n=240, shards=2, objective=objective)
    xla = run(examples, tmp_path / "xla", "xla", micro=4)
    run(examples, tmp_path / "xla-resumed", "xla", micro=4, crash_at=4)
    run(examples, tmp_path / "cpu", "cpu", micro=4)
    # the feed uploads the objective's tensors, each split along its batch axis
    assert xla["feed_equal"] == [True] * 3
    for shardings in xla["feed_shardings"]:
        assert ("next_sentence_label" in shardings) is bool(get_objective(objective).sentence_label)
        assert all(spec.startswith("{devices=[2") for spec in shardings.values()), shardings
    a, r, b = weights(tmp_path / "xla"), weights(tmp_path / "xla-resumed"), weights(tmp_path / "cpu")
    assert set(a) == set(b)
    # the sentence-level head exists exactly when the objective has a sentence label
    assert any(k.startswith("cls.seq_relationship") for k in a) == bool(get_objective(objective).sentence_label)
    for k in b:
        torch.testing.assert_close(r[k], a[k], atol=1e-6, rtol=0, msg=k)
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=0, msg=k)
