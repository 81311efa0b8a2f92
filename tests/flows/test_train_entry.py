"""The training process's entry point: the spec reaches run_pretrain, the masking rule and the
[PAD] id come from the vocabulary, and a refused resume exits with a code the stage can name."""

import dataclasses
import random
import re
import sys
from pathlib import Path

import pytest

from flows.proc.protocol import EXIT_BAD_INPUT, EXIT_RESUME_REFUSED, write_spec
from flows.proc.train_entry import main, masking_from, training_setup
from model.config import PhaseConfig, PretrainConfig
from pipeline.schema.manifest import write_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "model"))
from pretrain_shards import MODEL, VOCAB, train_spec, write_example_stage

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny model; a loaded 2-core box makes OpenMP spin


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage")
    examples = write_example_stage(root / "examples", lengths=(16,), n=120)
    write_vocab_stage(root / "vocab")
    return root, examples


def write_vocab_stage(folder):
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    write_manifest("vocab", str(folder), {}, {}, {"vocab_size": len(VOCAB)})


def spec(root, examples, out=None, model=MODEL, restart=False, **pretrain):
    cfg = PretrainConfig(**{"phases": (PhaseConfig("p1", 16, 4, 8),), "log_every": 2, "checkpoint_every": 100,
                            **pretrain})  # fmt: skip
    return train_spec(cfg, model, examples, out or root / "pretrain", root / "vocab", restart=restart)


def run_main(spec_, folder):
    """``python -m flows.proc.train_entry --spec FILE`` in this process, as the launcher starts it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"spec-{len(list(folder.iterdir()))}.json"
    write_spec(str(path), spec_)
    return main(["--spec", str(path)])


def test_masking_rule_and_pad_from_the_vocabulary(stage):
    root, examples = stage
    rule, pad = masking_from(str(root / "vocab"), examples)
    assert pad == VOCAB.index("[PAD]")
    tokens = [VOCAB.index("[CLS]")] + list(range(10, 30)) + [VOCAB.index("[SEP]")]
    out, positions, labels = rule(tokens, 3, random.Random(0))
    assert len(positions) == 3 and labels == [tokens[p] for p in positions]
    assert masking_from("", examples) == (None, None)


def test_the_spec_is_a_stage_call_and_the_run_follows_the_vocabulary(stage, tmp_path):
    """One spec shape for every child: the training process reads the stage process's spec and
    derives the run as the pretrain row does (the network sized by the trained vocabulary)."""
    root, examples = stage
    s = spec(root, examples, model=dataclasses.replace(MODEL, vocab_size=None))
    assert (s.stage, s.inputs) == ("pretrain", {"examples": examples, "vocab": str(root / "vocab")})
    run = training_setup(s)
    assert run.model.vocab_size == len(VOCAB) and run.pretrain.phases[0].steps == 4
    assert (run.examples_url, run.output_url, run.vocab_url) == (examples, str(root / "pretrain"), str(root / "vocab"))
    small = spec(root, examples, model=dataclasses.replace(MODEL, vocab_size=50))
    with pytest.raises(ValueError, match="model.vocab_size: 50 is smaller than the trained vocabulary"):
        training_setup(small)
    assert run_main(small, tmp_path / "specs") == EXIT_BAD_INPUT  # a config the data cannot serve: not retried


def test_spec_runs_dynamic_masking_then_refuses_another_seed_until_restart(stage, tmp_path):
    root, examples = stage
    assert run_main(spec(root, examples, dynamic_masking=True), tmp_path) == 0
    assert (root / "pretrain" / "_manifest.json").exists()
    assert run_main(spec(root, examples, dynamic_masking=True, seed=1), tmp_path) == EXIT_RESUME_REFUSED
    assert run_main(spec(root, examples, dynamic_masking=True, seed=1, restart=True), tmp_path) == 0


def test_a_divergence_exits_with_its_own_code_naming_the_step_and_the_checkpoint(stage, tmp_path, caplog):
    """Issue 19 point 3: a NaN loss raised FloatingPointError, exited 1 and was retried three times,
    every rerun diverging the same way. Now the process exits EXIT_DIVERGED (never retried), naming
    the step and the newest good checkpoint a rerun resumes from."""
    import logging

    from flows.proc.protocol import EXIT_DIVERGED, StageProcessError

    root, examples = stage
    # weights past float32 after a few steps: NaN
    s = spec(root, examples, tmp_path / "diverged", checkpoint_every=2, phases=(PhaseConfig("p1", 16, 8, 8),),
             learning_rate=1e30)  # fmt: skip
    with caplog.at_level(logging.ERROR, logger="bertflow.pretrain"):
        assert run_main(s, tmp_path / "specs") == EXIT_DIVERGED
    message = next(r.getMessage() for r in caplog.records if "training diverged" in r.getMessage())
    assert re.search(r"loss is (nan|inf) at step \d+|NaN/inf at step \d+", message), message
    assert "a rerun resumes from" in message or "a rerun starts over" in message
    assert "Not retried" in message
    assert not StageProcessError("pretrain", EXIT_DIVERGED).retryable


def test_a_damaged_shard_exits_as_bad_input_naming_the_file(tmp_path, caplog):
    """Issue 19 point 4: a flip that broke decoding crashed pretraining with pyarrow's "Unexpected
    end of stream", no file named, "exited with code 1" (and a retry)."""
    import logging

    examples = write_example_stage(tmp_path / "examples", lengths=(16,), n=120)
    write_vocab_stage(tmp_path / "vocab")
    shard = sorted((tmp_path / "examples" / "seq16").glob("*.parquet"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x10  # inside a data page
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, logger="bertflow.pretrain"):
        assert run_main(spec(tmp_path, examples), tmp_path / "specs") == EXIT_BAD_INPUT
    assert any(str(shard) in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records)
