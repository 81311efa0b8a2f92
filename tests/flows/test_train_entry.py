"""The training process's entry point: the spec reaches run_pretrain, the masking rule and the
[PAD] id come from the vocabulary, and a refused resume exits with a code the stage can name."""

import dataclasses
import json
import random
import re
import sys
from pathlib import Path

import pytest

from flows.proc.protocol import EXIT_RESUME_REFUSED
from flows.proc.train_entry import main, masking_from
from model.config import PhaseConfig, PretrainConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "model"))
from pretrain_shards import MODEL, VOCAB, write_example_stage

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny model; a loaded 2-core box makes OpenMP spin


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage")
    examples = write_example_stage(root / "examples", lengths=(16,), n=120)
    (root / "vocab").mkdir()
    (root / "vocab" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return root, examples


def spec(root, examples, **pretrain):
    cfg = PretrainConfig(phases=(PhaseConfig("p1", 16, 4, 8),), log_every=2, checkpoint_every=100, **pretrain)
    return {
        "pretrain": dataclasses.asdict(cfg),
        "model": dataclasses.asdict(MODEL),
        "examples_url": examples,
        "output_url": str(root / "pretrain"),
        "vocab_url": str(root / "vocab"),
    }


def test_masking_rule_and_pad_from_the_vocabulary(stage):
    root, examples = stage
    rule, pad = masking_from(spec(root, examples))
    assert pad == VOCAB.index("[PAD]")
    tokens = [VOCAB.index("[CLS]")] + list(range(10, 30)) + [VOCAB.index("[SEP]")]
    out, positions, labels = rule(tokens, 3, random.Random(0))
    assert len(positions) == 3 and labels == [tokens[p] for p in positions]
    assert masking_from({**spec(root, examples), "vocab_url": ""}) == (None, None)


def test_spec_runs_dynamic_masking_then_refuses_another_seed_until_restart(stage):
    root, examples = stage
    assert main(["--spec", json.dumps(spec(root, examples, dynamic_masking=True))]) == 0
    assert (root / "pretrain" / "_manifest.json").exists()
    other = spec(root, examples, dynamic_masking=True, seed=1)
    assert main(["--spec", json.dumps(other)]) == EXIT_RESUME_REFUSED
    assert main(["--spec", json.dumps({**other, "restart": True})]) == 0


def test_a_divergence_exits_with_its_own_code_naming_the_step_and_the_checkpoint(stage, tmp_path, caplog):
    """Issue 19 point 3: a NaN loss raised FloatingPointError, exited 1 and was retried three times,
    every rerun diverging the same way. Now the process exits EXIT_DIVERGED (never retried), naming
    the step and the newest good checkpoint a rerun resumes from."""
    import logging

    from flows.proc.protocol import EXIT_DIVERGED, StageProcessError

    root, examples = stage
    s = spec(root, examples)
    s["output_url"] = str(tmp_path / "diverged")
    s["pretrain"]["checkpoint_every"] = 2
    s["pretrain"]["phases"][0]["steps"] = 8
    s["pretrain"]["learning_rate"] = 1e30  # weights past float32 after a few steps: NaN
    with caplog.at_level(logging.ERROR, logger="bertflow.pretrain"):
        assert main(["--spec", json.dumps(s)]) == EXIT_DIVERGED
    message = next(r.getMessage() for r in caplog.records if "training diverged" in r.getMessage())
    assert re.search(r"loss is (nan|inf) at step \d+|NaN/inf at step \d+", message), message
    assert "a rerun resumes from" in message or "a rerun starts over" in message
    assert "Not retried" in message
    assert not StageProcessError("pretrain", EXIT_DIVERGED).retryable


def test_a_damaged_shard_exits_as_bad_input_naming_the_file(tmp_path, caplog):
    """Issue 19 point 4: a flip that broke decoding crashed pretraining with pyarrow's "Unexpected
    end of stream", no file named, "exited with code 1" (and a retry)."""
    import logging

    from flows.proc.protocol import EXIT_BAD_INPUT

    examples = write_example_stage(tmp_path / "examples", lengths=(16,), n=120)
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    shard = sorted((tmp_path / "examples" / "seq16").glob("*.parquet"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x10  # inside a data page
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, logger="bertflow.pretrain"):
        assert main(["--spec", json.dumps(spec(tmp_path, examples))]) == EXIT_BAD_INPUT
    assert any(str(shard) in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records)
