"""Sizes checked before work (issue 19 point 9): bounds every host needs at load, the host's memory
and the root's disk estimated in the stage rows' preflight, and an OOM kill reported as such.

Measured before: model.vocab_size=3e7 was OOM-killed four times ("exited with code -9");
dupe_factor=1e6, max_position_embeddings=1e6, corpus.num_shards=1e8, finetune.batch_size=1e9 and
pretrain.loader_buffer=1e9 were accepted; a dupe_factor=1e6 run filled the disk at 0.8 MB/s."""

import dataclasses
import signal
import sys

import pytest

from flows.checks import preflight
from flows.cli import main
from flows.presets import load_config
from flows.proc.protocol import StageProcessError, is_deterministic
from flows.sizes import available_memory, bert_parameters, free_disk
from pipeline.schema.config import ConfigError
from pipeline.schema.manifest import write_manifest

MEASURED = [
    ("model.vocab_size", 3e7, "embedding rows"),
    ("examples.dupe_factor", 1e6, "copies of the corpus"),
    ("model.max_position_embeddings", 1e6, "positions"),
    ("corpus.num_shards", 1e8, "files per source"),
    ("finetune.batch_size", 1e9, "sequences per step"),
    ("pretrain.loader_buffer", 1e9, "examples held in memory"),
]


@pytest.mark.parametrize("field,value,what", MEASURED)
def test_sizes_past_their_bound_are_refused_at_load(field, value, what):
    with pytest.raises(ConfigError, match=rf"^{field}: [\d,]+ is past the bound of [\d,]+ \({what}"):
        load_config("tiny", {field: int(value)})


def test_the_cli_refuses_a_size_past_its_bound_before_any_work(tmp_path, capsys):
    assert main(["run", "--root", str(tmp_path / "r"), "--set", "model.vocab_size=3e7"]) == 2
    err = capsys.readouterr().err
    assert "model.vocab_size: 30,000,000 is past the bound" in err
    assert not (tmp_path / "r").exists()  # nothing started


def test_the_parameter_estimate_is_the_models_count():
    from model.bert import BertForMaskedLM, BertForPreTraining, count_parameters

    cfg = dataclasses.replace(load_config("tiny").model, vocab_size=3451)  # the tiny run's trained vocabulary
    for m in (cfg, dataclasses.replace(cfg, vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=3)):
        assert bert_parameters(m) == count_parameters(BertForPreTraining(m))
        # the one-segment objective's network (examples.objective=mlm): no pooler, no sentence head
        assert bert_parameters(m, sentence_head=False) == count_parameters(BertForMaskedLM(m))


def test_a_model_too_large_for_this_hosts_memory_is_refused_with_the_estimate(tmp_path, capsys):
    """Within every bound, but ~39 billion parameters: more memory than this host has."""
    big = {
        "model.hidden_size": "8192",
        "model.num_attention_heads": "64",
        "model.num_hidden_layers": "48",
        "model.intermediate_size": "32768",
    }
    cfg = load_config("tiny", {k: int(v) for k, v in big.items()})
    need = bert_parameters(dataclasses.replace(cfg.model, vocab_size=cfg.vocab.vocab_size)) * 16  # at most 4096 rows
    assert available_memory() is not None and need > available_memory()
    argv = ["run", "--root", str(tmp_path / "r")] + [a for k, v in big.items() for a in ("--set", f"{k}={v}")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "pretrain: needs at least" in err and "GiB available" in err and "38,828,724,226 parameters" in err


def test_an_examples_stage_too_large_for_the_disk_is_refused_with_the_estimate(tmp_path):
    """A corpus (its manifest written here) of ten times as many characters as the root's disk
    has free bytes: the estimate of the examples stage's output is past the free space."""
    root = tmp_path / "run"
    free = free_disk(str(root))
    write_manifest("corpus", str(root / "corpus"), {}, {}, {"chars": float(free * 10)}, files=[])
    cfg = load_config("tiny")
    with pytest.raises(OSError, match=r"examples: would write about [\d,.]+ [GM]B of shards .* free under") as info:
        preflight(cfg, str(root), ["examples"], None)
    assert is_deterministic(info.value)  # a retry on this host meets it again
    assert f"{free * 10:,.0f} corpus characters" in str(info.value)
    # the same root with a corpus that fits passes
    write_manifest("corpus", str(root / "corpus"), {}, {}, {"chars": 1e6}, files=[])
    preflight(cfg, str(root), ["examples"], None)


@pytest.mark.e2e
def test_a_stage_process_killed_by_sigkill_is_reported_as_out_of_memory():
    """The kernel's OOM killer sends SIGKILL: the stage's error says so (and keeps the code that
    tests/flows/test_fanout.py reads), and no retry is spent on it."""
    import logging

    from flows.proc.launch import _run_streaming

    code = _run_streaming(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
        None,
        logging.getLogger("bertflow.test"),
        None,
        30,
        "stage finetune/sst2 unit u",
    )
    assert code == -signal.SIGKILL
    err = StageProcessError("stage finetune/sst2 unit u", code)
    assert str(err) == (
        "stage finetune/sst2 unit u: its process exited with code -9: killed by signal 9 "
        "(SIGKILL: out of memory? (the kernel's OOM killer sends it))"
    )
    assert not err.retryable and is_deterministic(err)
    assert StageProcessError("x", 1).retryable


def test_a_full_disk_is_named_as_the_disk_and_never_retried(tmp_path):
    """A real ENOSPC (``/dev/full``), and the forms torch/safetensors/SQLite wrap it in: the stage
    process exits 5 naming the file's filesystem and its free space, and no retry follows (a retry
    filled the disk again, and its MLflow calls then reported SQLite's "database or disk is full")."""
    from flows.proc.protocol import (
        EXIT_DISK_FULL,
        NOT_RETRIED,
        describe_disk_full,
        disk_full,
        exit_code_for,
        worth_retrying,
    )

    try:
        with open("/dev/full", "wb") as f:
            f.write(b"x" * 10)
            f.flush()
    except OSError as exc:
        full = exc
    assert full.errno == 28
    try:
        try:
            raise full
        except OSError:
            raise RuntimeError("checkpoint step-300: write failed") from None  # torch's wrapping keeps the context
    except RuntimeError as exc:
        wrapped = exc
    words = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    for exc in (full, wrapped, words):
        assert disk_full(exc) is not None
        assert exit_code_for(exc) == EXIT_DISK_FULL and not worth_retrying(exc)
    assert disk_full(ValueError("a bad row")) is None
    assert EXIT_DISK_FULL in NOT_RETRIED
    assert not is_deterministic(StageProcessError("pretrain", 1)) and is_deterministic(StageProcessError("p", 5))
    line = describe_disk_full(full, str(tmp_path / "checkpoints"))
    assert f"no space left on the disk writing {tmp_path}/checkpoints (the filesystem mounted at /" in line
    assert "MB free of" in line
