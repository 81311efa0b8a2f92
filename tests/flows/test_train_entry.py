"""The training process's entry point: the spec reaches run_pretrain, the masking rule and the
[PAD] id come from the vocabulary, and a refused resume exits with a code the stage can name."""

import dataclasses
import json
import random
import sys
from pathlib import Path

import pytest

from flows.proc.protocol import EXIT_RESUME_REFUSED
from flows.proc.train_entry import main, masking_from
from model.config import PhaseConfig, PretrainConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "model"))
from pretrain_shards import MODEL, VOCAB, write_example_stage


@pytest.fixture(autouse=True)
def one_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model; a loaded 2-core box makes OpenMP spin
    yield
    torch.set_num_threads(n)


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
