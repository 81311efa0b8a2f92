"""tiny-ja and tiny-zh, the whole chain through the real command line on the bundled Japanese and
Chinese samples (a few minutes each here): every stage done, the export loads in transformers
with AutoTokenizer/AutoModelForMaskedLM, the JGLUE/CLUE units scored, a model registered."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("fugashi")
transformers = pytest.importorskip("transformers")


@pytest.mark.slow
@pytest.mark.parametrize("preset, tasks", [("tiny-ja", ("jnli", "jsquad", "marc_ja")),
                                           ("tiny-zh", ("tnews", "afqmc", "cmrc2018"))])  # fmt: skip
def test_language_preset_runs_end_to_end(tmp_path, preset, tasks):
    root = tmp_path / preset
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--preset", preset, "--root", str(root)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    from pipeline.schema.manifest import read_manifest

    pretrain = read_manifest(str(root / "checkpoints")).counts
    assert pretrain["last_mlm_loss"] < pretrain["first_mlm_loss"] - 1.0
    for task in tasks:
        result = json.loads((root / "finetune" / task / "results.json").read_text())
        assert 0.0 <= result["dev_median"] <= 100.0, task
    tok = transformers.AutoTokenizer.from_pretrained(str(root / "model"))
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(str(root / "model"))
    assert type(tok).__name__ == ("BertJapaneseTokenizer" if preset == "tiny-ja" else "BertTokenizer")
    text = "南野村の名産はりんごである。" if preset == "tiny-ja" else "河金县的特产是茶叶。"
    assert mlm(**tok(text, return_tensors="pt")).logits.shape[-1] == mlm.config.vocab_size
    assert "registered model: bert-" + preset in run.stdout
