"""``bertflow run --preset tiny --set examples.objective=...``: the whole chain through the real
command line with RoBERTa's MLM over full sentences (at ModernBERT's 30% masking rate) and with
ALBERT's sentence order: the shards carry their objective's columns, the losses are the
objective's, a model is registered, SST-2 is fine-tuned from it, and the MLM-only export loads in
transformers as AutoModelForMaskedLM with no missing or unexpected keys and fills masks. A few
minutes each here (shorter schedules than the preset, as the shared tiny run's)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
transformers = pytest.importorskip("transformers")

SHORT = [
    "pretrain.phases.0.steps=300",
    "pretrain.phases.1.steps=30",
    "pretrain.warmup_steps=20",
    "pretrain.checkpoint_every=100",
    "examples.dupe_factor=2",
    "finetune.epochs=2",
    'finetune_tasks=["sst2"]',
    "finetune.grid.learning_rates=[1e-3]",
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "objective, extra, columns, losses",
    [
        ("mlm", ["examples.masked_lm_prob=0.3"], ["input_ids", "masked_positions", "masked_ids"], {"mlm"}),
        ("sop", [], ["input_ids", "len_a", "masked_positions", "masked_ids", "is_swapped"], {"mlm", "sop"}),
    ],
)
def test_tiny_chain_with_each_objective(tmp_path, objective, extra, columns, losses):
    from pipeline.schema.manifest import read_manifest
    from pipeline.schema.outputs import example_lengths

    root = tmp_path / objective
    sets = [x for o in (*SHORT, f"examples.objective={objective}", *extra) for x in ("--set", o)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp_path / "prefect-home")}
    run = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--preset", "tiny", "--root", str(root), *sets],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    examples = read_manifest(str(root / "examples"))
    for n in (64, 128):
        assert pq.read_schema(next((root / "examples" / f"seq{n}").glob("*.parquet"))).names == columns
        x = example_lengths(examples)[n]
        caps = {64: 20, 128: 40} if extra else {64: 10, 128: 20}  # derived from the masking rate
        assert (x.objective, x.max_predictions) == (objective, caps[n])
    pretrain = read_manifest(str(root / "checkpoints")).counts
    assert {
        k[len("last_") : -len("_loss")] for k in pretrain if k.startswith("last_") and k.endswith("_loss")
    } == losses
    assert pretrain["last_mlm_loss"] < pretrain["first_mlm_loss"] - 1.0
    sst2 = json.loads((root / "finetune" / "sst2" / "results.json").read_text())
    assert 50.0 <= sst2["dev_median"] <= 100.0
    assert "registered model: bert-tiny" in run.stdout
    config = json.loads((root / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM" if objective == "mlm" else "BertForPreTraining"]
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(str(root / "model"), output_loading_info=True)
    if objective == "mlm":  # the export is exactly transformers' BertForMaskedLM
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    fill = transformers.pipeline("fill-mask", model=str(root / "model"))
    assert len(fill("the river [MASK] the town.")) == 5
