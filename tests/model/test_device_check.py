"""benchmarks/device_check.py in its --smoke mode on the CPU: every step of the GPU check runs
(the GPU tier, each row of the step table, compiled ones included, the small pretraining run)
and writes its JSON and markdown; rows without transformers or past the budget say so."""

import importlib.util
import json
import os
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


def test_the_target_rows_are_measured_first_and_reported_in_the_tables_order(device_check):
    args = device_check.parse(["--smoke", "--device", "cpu"])
    args.shapes, args.seqs, args.batch = ["large", "base"], [128, 512], [128, 32]
    order = device_check.row_order(args)
    targets = device_check.IMPLEMENTATIONS[: device_check.TARGET_ROWS]
    first = [(s, q, b, i) for s, (q, b) in (("large", (128, 128)), ("large", (512, 32))) for i in targets]
    assert order[:6] == first and len(order) == len(set(order)) == 24
    assert all(shape == "base" for shape, *_ in order[12:])
    seen: list[list[dict]] = []
    rows = device_check.step_table(args, 0.0, hf=True, deadline=time.perf_counter() - 1, on_row=seen.append)
    assert len(seen) == 24 and [len(r) for r in seen] == list(range(1, 25))  # the report after every row
    assert [(r["model"], r["seq"], r["implementation"]) for r in rows] == [
        (s, q, i) for s in ("large", "base") for q in (128, 512) for i in device_check.IMPLEMENTATIONS
    ]


def test_implementations_pick_rows_by_index_and_a_bad_index_is_refused(device_check, capsys):
    args = device_check.parse(["--smoke", "--device", "cpu", "--implementations", "0,1,5"])
    assert args.implementations == [device_check.IMPLEMENTATIONS[i] for i in (0, 1, 5)]
    for bad in ("6", "x", "0,,1", "-1"):
        with pytest.raises(SystemExit):
            device_check.parse(["--smoke", "--implementations", bad])
        assert "indices from 0 to 5 (0: ours unpadded compiled;" in capsys.readouterr().err


def test_the_report_is_on_disk_after_every_step(device_check, tmp_path, monkeypatch):
    """A check stopped at the device's time limit keeps what it measured: the JSON and markdown
    are rewritten after the GPU tier, every row and every held-out evaluation."""
    saved: list[dict] = []
    real_save = device_check.save

    def spy(result, out):
        real_save(result, out)
        saved.append(json.loads((Path(out) / "device_check.json").read_text()))

    monkeypatch.setattr(device_check, "save", spy)
    device_check.main(["--smoke", "--device", "cpu", "--out", str(tmp_path), "--no-pytest"])
    steps = [len([r for r in s["steps"] if "seq_per_s" in r or "skipped" in r]) for s in saved]
    assert steps[:8] == [0, 1, 2, 3, 4, 5, 6, 6]
    curves = [len(s["pretrain_by_objective"].get("mlm+nsp", {}).get("curve", [])) for s in saved]
    assert curves[6] == 0 and 0 < curves[7] < curves[-1]  # a partial curve before the whole one
    assert not list(tmp_path.glob("*.tmp"))


BLOCKER = """import sys
class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("apache_beam", "prefect", "mlflow"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Absent())
"""


@pytest.mark.parametrize("stack", ["absent", "installed"])
def test_the_gpu_tier_collects_where_the_data_stack_is_not_installed(tmp_path, stack):
    """The device's image has no Beam, Prefect or MLflow (nor zstandard): there a test file that
    needs a package not installed is reported skipped, naming it, and the tier runs; a missing
    module of the project's own still fails, and where the stack is installed nothing changes."""
    import shutil
    import subprocess
    import sys

    shutil.copy(SCRIPT.parents[1] / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_needs_beam.py").write_text("import apache_beam\n\ndef test_beam():\n    pass\n")
    (tmp_path / "test_needs_a_package.py").write_text("import no_such_package_anywhere\n")
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    pass\n")
    (tmp_path / "test_broken.py").write_text("import model.no_such_module_of_ours\n")
    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "block")} if stack == "absent" else dict(os.environ)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--continue-on-collection-errors"]
    p = subprocess.run([*cmd, str(tmp_path)], capture_output=True, text=True, env=env, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert "ERROR collecting test_broken.py" in out and p.returncode != 0, out
    if stack == "absent":
        assert "test_needs_beam.py:0: needs apache_beam, which is not installed here" in out, out
        assert "test_needs_a_package.py:0: needs no_such_package_anywhere, which is not installed here" in out, out
        assert "1 passed, 2 skipped, 1 error" in out, out
    else:
        assert "ERROR collecting test_needs_a_package.py" in out and "2 passed, 2 errors" in out, out
