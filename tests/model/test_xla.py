"""The XLA tier: SPMD data parallelism over the XLA CPU device's 2 devices (torch-xla's own
environment: run with `PJRT_DEVICE=CPU CPU_NUM_DEVICES=2 python -m pytest tests/model/test_xla.py -m xla`).

Each check runs in a fresh process, because SPMD and the device count are fixed when the XLA
runtime starts."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.xla

SCRIPT = r'''
import dataclasses, json, sys
import torch
from model.backend import setup_backend
from model.config import BertConfig, PhaseConfig, PretrainConfig
from model.train import run_pretrain
from pretrain_shards import MODEL
examples, out, backend = sys.argv[1], sys.argv[2], sys.argv[3]
model = BertConfig(**{**MODEL.__dict__, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
cfg = PretrainConfig(phases=(PhaseConfig("p1", 16, 6, 8),), learning_rate=2e-3, warmup_steps=2, log_every=3,
                     checkpoint_every=100, seed=5, backend=backend, precision="fp32")
result = {}
if backend == "xla":
    be = setup_backend("xla", "fp32")
    import torch_xla
    batch = be.put_batch({"input_ids": torch.zeros(8, 16, dtype=torch.long)})
    result["devices"] = be.devices
    result["sharding"] = torch_xla._XLAC._get_xla_sharding_spec(batch["input_ids"])
m = run_pretrain(cfg, model, examples, out)
result["loss"] = m.counts["last_mlm_loss"]
print("RESULT " + json.dumps(result))
'''


def run(examples, out, backend):
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2",
           "PYTHONPATH": os.pathsep.join([os.getcwd(), os.path.dirname(__file__)])}
    p = subprocess.run([sys.executable, "-c", SCRIPT, examples, str(out), backend], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_spmd_splits_the_batch_and_matches_cpu(tmp_path):
    pytest.importorskip("torch_xla")
    import safetensors.torch
    import torch

    from pretrain_shards import write_example_stage

    examples = write_example_stage(tmp_path / "examples", lengths=(16,), n=240, shards=2)
    xla = run(examples, tmp_path / "xla", "xla")
    cpu = run(examples, tmp_path / "cpu", "cpu")
    assert xla["devices"] == 2
    assert xla["sharding"].startswith("{devices=[2,1]"), xla["sharding"]  # the batch axis is split
    a = safetensors.torch.load_file(str(tmp_path / "xla" / "final" / "model.safetensors"))
    b = safetensors.torch.load_file(str(tmp_path / "cpu" / "final" / "model.safetensors"))
    for k in b:
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=0, msg=k)
