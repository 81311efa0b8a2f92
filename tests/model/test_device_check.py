"""benchmarks/device_check.py in its --smoke mode on the CPU: every step of the GPU check runs
(the GPU tier, each row of the step table, compiled ones included, the small pretraining run)
and writes its JSON and markdown; rows without transformers or past the budget say so."""

import importlib.util
import json
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device_check.py"
HAS_HF = importlib.util.find_spec("transformers") is not None


@pytest.fixture(scope="module")
def device_check():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_runs_every_part_and_writes_the_report(device_check, tmp_path):
    result = device_check.main(["--smoke", "--device", "cpu", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "device_check.json").read_text())
    assert saved["environment"]["device"] == "cpu" and saved["steps"] == json.loads(json.dumps(result["steps"]))
    assert result["pytest"]["returncode"] == 0 and "skipped" in result["pytest"]["summary"], result["pytest"]  # no CUDA
    rows = {r["implementation"]: r for r in result["steps"]}
    assert set(rows) == set(device_check.IMPLEMENTATIONS)
    for name, row in rows.items():
        if name.startswith("transformers") and not HAS_HF:
            assert row["skipped"] == "transformers is not installed"
            continue
        assert "error" not in row, row
        assert row["seq_per_s"] > 0 and row["tokens_per_s"] == pytest.approx(row["seq_per_s"] * row["real_tokens"] / 4)
        assert row["mfu"] is None  # no known peak on a CPU
    if HAS_HF:
        assert rows["transformers sdpa"]["vs_transformers_sdpa"] == 1.0
        assert rows["ours unpadded compiled"]["vs_transformers_sdpa"] > 0
    curve = result["pretrain"]["curve"]
    assert [p["step"] for p in curve if "mlm_accuracy" in p][:2] == [2, 4]
    assert any("eval_mlm_accuracy" in p for p in curve)
    md = (tmp_path / "device_check.md").read_text()
    assert "| model | seq | batch | implementation |" in md and "held-out MLM accuracy" in md
    assert all(name in md for name in device_check.IMPLEMENTATIONS)


def test_rows_past_the_budget_or_without_transformers_are_listed_as_skipped(device_check):
    args = device_check.parse(["--smoke", "--device", "cpu"])
    rows = device_check.step_table(args, 0.0, hf=False, deadline=time.perf_counter() - 1)
    assert len(rows) == len(device_check.IMPLEMENTATIONS)
    for row in rows:
        want = "transformers is not installed" if row["implementation"].startswith("transformers") else "time budget"
        assert row["skipped"] == want


@pytest.mark.parametrize("objective", ["mlm", "sop"])
def test_the_small_pretraining_runs_on_each_objective(device_check, objective):
    """``--objective``: the check's pretraining on MLM-only or sentence-order shards (written in
    that objective's Parquet columns) reports that objective's accuracies, held-out ones too."""
    from pipeline.schema.objectives import get_objective

    args = device_check.parse(["--smoke", "--device", "cpu", "--objective", objective])
    run = device_check.pretrain_small(args, args.objective[0])
    sentence = get_objective(objective).sentence_loss
    want = {"mlm_accuracy", "eval_mlm_accuracy"} | (
        {f"{sentence}_accuracy", f"eval_{sentence}_accuracy"} if sentence else set()
    )
    assert {k for point in run["curve"] for k in point if k.endswith("_accuracy")} == want
    assert run["objective"] == objective and run["last_eval_mlm_accuracy"] is not None
    env = {"device": "cpu", "torch": "x", "transformers": None, "peak_bf16_tflops": None}
    result = {"environment": env, "pytest": {"summary": "-"}, "steps": [], "pretrain_by_objective": {objective: run}}
    md = device_check.markdown(result)
    assert f"Pretraining ({objective})" in md


def test_an_unknown_objective_is_refused_naming_the_flag(device_check):
    from pipeline.schema.config import ConfigError

    with pytest.raises(ConfigError, match="--objective: unknown objective 'electra'"):
        device_check.parse(["--smoke", "--objective", "electra"])
