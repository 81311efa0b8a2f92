"""The quick tier (``python3 -m pytest -m quick``, a few minutes): the whole chain once, in-process
on a small config (``quick_chain``: corpus -> vocab -> examples -> 24 pretraining steps -> export ->
one SST-2 unit, each stage a Python call through the runner), a second in-process pass that skips
every stage, and ONE run of the real CLI (Prefect's temporary server, MLflow on SQLite) on the same
root, which must agree that nothing is left to do. The full tiny chain through the CLI, its
reruns, kills and signals are the ``e2e`` tests of the default tier."""

import math
import os
import subprocess
import sys

import pytest
from in_process import quick_cli_args, run_chain_in_process

from pipeline.schema.manifest import read_manifest

pytestmark = pytest.mark.quick


def test_every_stage_runs_in_process_and_writes_its_outputs(quick_chain):
    cfg, root, results = quick_chain
    assert list(results) == ["corpus", "vocab", "examples", "pretrain", "export", "finetune/sst2"]
    assert {r.status for r in results.values()} == {"done"}
    for stage, result in results.items():
        manifest = read_manifest(result.url)
        assert manifest.code_version, stage  # stamped as the chain stamps it: a rerun can skip
        assert all(os.path.getsize(os.path.join(result.url, f.path)) == f.size for f in manifest.files), stage
    counts = {s: r.counts for s, r in results.items()}
    # the data stages are the tiny preset's (README): the overrides only shorten what follows them
    assert counts["corpus"]["documents"] == 397 and counts["vocab"]["vocab_size"] == 3451
    assert counts["examples"]["seq64.examples"] > 0 and counts["examples"]["seq128.examples"] > 0
    assert counts["pretrain"]["steps"] == 24
    assert abs(counts["pretrain"]["first_mlm_loss"] - math.log(3451)) < 0.5  # a random start: ln V
    assert counts["export"]["parameters"] > 0
    assert 0.0 <= counts["finetune/sst2"]["eval_accuracy"] <= 1.0


def test_the_export_loads_as_an_encoder_of_the_trained_vocabulary(quick_chain):
    from tasks.finetune import load_encoder, load_tokenizer

    _, root, results = quick_chain
    encoder = load_encoder(results["export"].url)
    tokenizer = load_tokenizer(results["export"].url)
    assert encoder.config.vocab_size == tokenizer.get_vocab_size() == 3451
    assert sum(p.numel() for p in encoder.parameters()) <= results["export"].counts["parameters"]


def test_a_second_in_process_pass_skips_every_stage(quick_chain):
    cfg, root, _ = quick_chain
    again = run_chain_in_process(cfg, str(root))
    assert {s: r.status for s, r in again.items()} == {s: "skipped" for s in again}


def test_the_cli_on_the_same_root_finds_nothing_to_do(quick_chain, tmp_path):
    """The quick tier's one CLI run: the real command line, Prefect flow and MLflow store on the
    in-process root; the code versions, configs and fingerprints the runner stamped agree with it."""
    cfg, root, _ = quick_chain
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    cmd = [sys.executable, "-m", "flows.cli", "run", "--preset", "tiny", "--root", str(root), *quick_cli_args()]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    for stage in ("corpus", "vocab", "examples", "pretrain", "export", "finetune/sst2"):
        assert f"stage {stage}: up to date, skipped" in out.stderr, stage + "\n" + out.stderr[-6000:]
