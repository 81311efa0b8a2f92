"""run_pretrain on synthetic example shards: loss falls, exact resume (crash, SIGTERM, partial and
corrupt checkpoints), resume-or-restart on a changed config, accumulation, held-out evaluation,
initialisation from a Hugging Face folder."""

import logging
import os
import shutil
import signal

import numpy as np
import pytest
import safetensors.torch
import torch
from pretrain_shards import MODEL, MaskRule, write_example_stage
from tiny_bert import tiny_bert_config

from model.bert import BertForPreTraining
from model.callbacks import DataTrace
from model.checkpoint import find_latest_checkpoint, list_checkpoints
from model.config import PhaseConfig, PretrainConfig
from model.export import load_pretrained, save_pretrained
from model.train import Preempted, ResumeError, run_pretrain


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return write_example_stage(tmp_path_factory.mktemp("examples"))


def config(**kw) -> PretrainConfig:
    base = dict(
        phases=(PhaseConfig("p1", 16, 12, 8), PhaseConfig("p2", 32, 8, 6)),
        learning_rate=2e-3,
        warmup_steps=3,
        log_every=2,
        checkpoint_every=5,
        seed=7,
    )
    return PretrainConfig(**{**base, **kw})


def final_weights(run_url):
    # clone: load_file memory-maps, and a rerun rewrites the same file
    return {k: v.clone() for k, v in safetensors.torch.load_file(f"{run_url}/final/model.safetensors").items()}


def assert_same(a, b, atol=0.0):
    assert a.keys() == b.keys()
    for k in a:
        if atol:
            torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)
        else:
            assert torch.equal(a[k], b[k]), k


def test_pretrain_loss_falls_and_writes_stage(examples, tmp_path, caplog):
    cfg = PretrainConfig(
        phases=(PhaseConfig("p1", 16, 150, 16),),
        learning_rate=3e-3,
        warmup_steps=10,
        log_every=25,
        checkpoint_every=100,
        seed=1,
    )
    logged = []
    with caplog.at_level(logging.INFO, logger="bertflow.pretrain"):
        m = run_pretrain(cfg, MODEL, examples, str(tmp_path / "run"), log_fn=lambda d, s: logged.append((s, d)))
    assert [s for s, _ in logged] == [25, 50, 75, 100, 125, 150]
    assert set(logged[0][1]) == {
        "loss",
        "mlm_loss",
        "nsp_loss",
        "mlm_accuracy",
        "nsp_accuracy",
        "lr",
        "grad_norm",
        "examples_per_sec",
        "tokens_per_sec",
        "model_tflops_per_sec",
        "phase_index",
        "epoch",
    }
    assert all(d["grad_norm"] > 0 and d["model_tflops_per_sec"] > 0 for _, d in logged)
    assert m.counts["last_mlm_loss"] < m.counts["first_mlm_loss"] - 0.5
    assert m.counts["first_mlm_loss"] == logged[0][1]["mlm_loss"]
    assert m.counts["steps"] == 150 and m.counts["examples_seen"] == 150 * 16
    assert m.counts["parameters"] == sum(p.numel() for p in BertForPreTraining(MODEL).parameters())
    assert m.stage == "pretrain" and m.config["model"]["hidden_size"] == 32
    assert m.config["phases"][0]["steps"] == 150 and "examples" in m.inputs
    assert {f.path for f in m.files} == {"final/config.json", "final/model.safetensors"}
    assert any("step 150/150" in r.getMessage() for r in caplog.records)
    assert [s for s, _ in list_checkpoints(str(tmp_path / "run"))] == [100, 150]
    assert load_pretrained(str(tmp_path / "run" / "final"), BertForPreTraining).config == MODEL


DROPOUT = tiny_bert_config(hidden_dropout_prob=0.2)  # RNG state matters


class Crash(Exception):
    pass


def crash_at(step):
    def log_fn(metrics, s):
        if s == step:
            raise Crash

    return log_fn


def test_exact_resume_after_crashes_matches_straight_run(examples, tmp_path):
    cfg = config(dynamic_masking=True)
    run_pretrain(cfg, DROPOUT, examples, str(tmp_path / "straight"), mask_fn=MaskRule())
    straight = final_weights(tmp_path / "straight")

    run = str(tmp_path / "resumed")
    with pytest.raises(Crash):  # mid phase 1: latest checkpoint is step 5
        run_pretrain(cfg, DROPOUT, examples, run, log_fn=crash_at(8), mask_fn=MaskRule())
    assert find_latest_checkpoint(run).endswith("p1/step-00000005")
    with pytest.raises(Crash):  # mid phase 2: resumes from 5, dies at 16 (latest: 15)
        run_pretrain(cfg, DROPOUT, examples, run, log_fn=crash_at(16), mask_fn=MaskRule())
    assert find_latest_checkpoint(run).endswith("p2/step-00000015")
    m = run_pretrain(cfg, DROPOUT, examples, run, mask_fn=MaskRule())
    assert_same(final_weights(run), straight)
    assert m.counts["steps"] == 20 and m.counts["examples_seen"] == 12 * 8 + 8 * 6
    # phase-end checkpoint (12) kept, plus the last two periodic ones
    assert [s for s, _ in list_checkpoints(run)] == [12, 15, 20]


@pytest.mark.e2e
def test_sigterm_checkpoints_then_resume_is_exact(examples, tmp_path):
    cfg = config(phases=(PhaseConfig("p1", 16, 10, 8),), checkpoint_every=100)
    run_pretrain(cfg, DROPOUT, examples, str(tmp_path / "straight"))
    run = str(tmp_path / "run")

    def term_at_4(metrics, step):
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Preempted) as info:
        run_pretrain(cfg, DROPOUT, examples, run, log_fn=term_at_4)
    assert info.value.signum == signal.SIGTERM and info.value.step == 4
    assert find_latest_checkpoint(run).endswith("p1/step-00000004")  # not a multiple of checkpoint_every
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    run_pretrain(cfg, DROPOUT, examples, run)
    assert_same(final_weights(run), final_weights(tmp_path / "straight"))


def test_resume_skips_partial_and_corrupt_checkpoints(examples, tmp_path, caplog):
    cfg = config(phases=(PhaseConfig("p1", 16, 6, 8),), checkpoint_every=2, keep_checkpoints=5)
    run = tmp_path / "run"
    run_pretrain(cfg, MODEL, examples, str(run))
    straight = final_weights(run)
    # a half-written newer checkpoint (no _complete marker) is never picked
    (run / "p1" / "step-00000009").mkdir()
    (run / "p1" / "step-00000009" / "state.pt").write_bytes(b"garbage")
    assert find_latest_checkpoint(str(run)).endswith("step-00000006")
    shutil.rmtree(run / "p1" / "step-00000006")
    # a complete but corrupt one is skipped for the previous good one (step 2)
    (run / "p1" / "step-00000004" / "state.pt").write_bytes(b"truncated")
    with caplog.at_level(logging.WARNING):
        m = run_pretrain(cfg, MODEL, examples, str(run))
    assert any(
        "skipping unreadable checkpoint" in r.getMessage() and "step-00000004" in r.getMessage() for r in caplog.records
    )
    assert m.counts["steps"] == 6
    assert_same(final_weights(run), straight)


def test_changed_config_resumes_if_compatible_else_restarts_under_force(examples, tmp_path, caplog):
    cfg = config(phases=(PhaseConfig("p1", 16, 6, 8),), checkpoint_every=3)
    run = str(tmp_path / "run")
    run_pretrain(cfg, MODEL, examples, run)
    # more steps and another learning rate: continue from step 6 under the new schedule
    longer = config(phases=(PhaseConfig("p1", 16, 9, 8),), checkpoint_every=3, learning_rate=1e-3)
    logged = []
    with caplog.at_level(logging.WARNING):
        m = run_pretrain(longer, MODEL, examples, run, log_fn=lambda d, s: logged.append(s))
    assert any("changed settings" in r.getMessage() and "learning_rate" in r.getMessage() for r in caplog.records)
    assert m.counts["steps"] == 9 and logged == [8, 9]
    # another seed cannot continue: a clear error naming the way out, then --force restarts
    other = config(phases=(PhaseConfig("p1", 16, 6, 8),), seed=8)
    with pytest.raises(ResumeError, match=r"pretrain\.seed.*--force pretrain"):
        run_pretrain(other, MODEL, examples, run)
    m = run_pretrain(other, MODEL, examples, run, restart=True)
    assert m.counts["steps"] == 6 and [s for s, _ in list_checkpoints(run)] == [5, 6]


def test_accumulation_matches_the_whole_batch(examples, tmp_path):
    no_dropout = tiny_bert_config(dropout=0.0)
    whole = config(phases=(PhaseConfig("p1", 16, 6, 8),), data_parts=2)
    accum = config(phases=(PhaseConfig("p1", 16, 6, 8, micro_batch_size=2),), data_parts=2)
    run_pretrain(whole, no_dropout, examples, str(tmp_path / "whole"))
    run_pretrain(accum, no_dropout, examples, str(tmp_path / "accum"))
    assert_same(final_weights(tmp_path / "accum"), final_weights(tmp_path / "whole"), atol=2e-5)


def test_held_out_evaluation_uses_the_reserved_shard_only(examples, tmp_path):
    cfg = config(phases=(PhaseConfig("p1", 16, 20, 8),), eval_every=10, eval_batches=2)
    logged = []
    m = run_pretrain(
        cfg,
        MODEL,
        examples,
        str(tmp_path / "run"),
        log_fn=lambda d, s: logged.append((s, d)),
        callbacks=DataTrace(tmp_path),
    )
    evals = [(s, d) for s, d in logged if "eval_mlm_loss" in d]
    assert [s for s, _ in evals] == [10, 20]
    assert evals[1][1]["eval_mlm_loss"] < evals[0][1]["eval_mlm_loss"]
    assert m.counts["eval_mlm_loss"] == evals[1][1]["eval_mlm_loss"]
    shards = {k.split(":")[0] for line in (tmp_path / "rank0.txt").read_text().split("\n") for k in line.split()}
    assert shards == {"0"}  # of two shards, the last is held out


def test_init_from_a_hugging_face_folder(examples, tmp_path):
    torch.manual_seed(3)
    source = BertForPreTraining(MODEL)
    save_pretrained(source, str(tmp_path / "hf"))
    cfg = config(phases=(PhaseConfig("p1", 16, 0, 8),))
    run_pretrain(cfg, MODEL, examples, str(tmp_path / "run"), init_from=str(tmp_path / "hf"))
    assert_same(final_weights(tmp_path / "run"), final_weights_of(source))
    with pytest.raises(ValueError, match="init_from"):
        run_pretrain(
            cfg,
            tiny_bert_config(intermediate_size=40),
            examples,
            str(tmp_path / "run2"),
            init_from=str(tmp_path / "hf"),
        )


def final_weights_of(model):
    from model.export import hf_state_dict

    return hf_state_dict(model)


def test_dynamic_masking_needs_the_rule_and_lamb_trains(examples, tmp_path):
    with pytest.raises(ValueError, match="mask_fn"):
        run_pretrain(config(dynamic_masking=True), MODEL, examples, str(tmp_path / "a"))
    m = run_pretrain(
        config(phases=(PhaseConfig("p1", 16, 40, 16),), optimizer="lamb", learning_rate=1e-2, log_every=10),
        MODEL,
        examples,
        str(tmp_path / "b"),
    )
    assert m.counts["last_mlm_loss"] < m.counts["first_mlm_loss"]


def test_missing_length_is_named(examples, tmp_path):
    cfg = config(phases=(PhaseConfig("p1", 16, 2, 4), PhaseConfig("long", 48, 2, 4)))
    with pytest.raises(FileNotFoundError, match="length 48"):
        run_pretrain(cfg, MODEL, examples, str(tmp_path / "run"))


@pytest.mark.gpu
def test_pretrain_on_cuda(examples, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    m = run_pretrain(config(backend="cuda"), MODEL, examples, str(tmp_path / "run"))
    assert m.counts["steps"] == 20 and np.isfinite(m.counts["last_mlm_loss"])
    assert load_pretrained(str(tmp_path / "run" / "final"), BertForPreTraining).config == MODEL


@pytest.mark.xla
def test_pretrain_on_xla(examples, tmp_path, monkeypatch):
    pytest.importorskip("torch_xla")
    monkeypatch.setenv("PJRT_DEVICE", "CPU")  # the XLA CPU device when no TPU is attached
    m = run_pretrain(config(backend="xla"), MODEL, examples, str(tmp_path / "run"))
    assert m.counts["steps"] == 20 and np.isfinite(m.counts["last_mlm_loss"])


def _poison(path, count=16):
    """``count`` NaN floats written over the first float tensor's data, the file's size unchanged."""
    import json
    import struct

    data = bytearray(path.read_bytes())
    header = json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])
    start = 8 + struct.unpack("<Q", data[:8])[0]
    first = min((v for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32"),
                key=lambda v: v["data_offsets"][0])  # fmt: skip
    at = start + first["data_offsets"][0]
    data[at : at + 4 * count] = struct.pack("<f", float("nan")) * count
    size = path.stat().st_size
    path.write_bytes(bytes(data))
    assert path.stat().st_size == size


def test_a_poisoned_checkpoint_is_named_and_resume_falls_back_to_the_newest_good_one(examples, tmp_path, caplog):
    """Issue 19 point 3: 16 NaN floats written into the latest model.safetensors (same size) were
    loaded on resume: "loss is nan at step 920", four attempts, the checkpoint never named, every
    rerun the same. Its checksum (recorded in the _complete marker) no longer matches: it is
    skipped, named, for the one before, and the run ends with the uninterrupted run's weights.
    A checkpoint of an older version (marker "ok", no checksums) is caught by finiteness."""
    cfg = config(phases=(PhaseConfig("p1", 16, 8, 8),), checkpoint_every=2, keep_checkpoints=5)
    run_pretrain(cfg, MODEL, examples, str(tmp_path / "straight"))
    straight = final_weights(tmp_path / "straight")
    run = tmp_path / "run"
    with pytest.raises(Crash):  # at step 8, before its checkpoint: the latest is step 6
        run_pretrain(cfg, MODEL, examples, str(run), log_fn=crash_at(8))
    assert find_latest_checkpoint(str(run)).endswith("p1/step-00000006")
    _poison(run / "p1" / "step-00000006" / "model.safetensors")
    (run / "p1" / "step-00000004" / "_complete").write_text("ok\n")  # as an older version wrote it
    _poison(run / "p1" / "step-00000004" / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="bertflow.checkpoint"):
        m = run_pretrain(cfg, MODEL, examples, str(run))
    warned = [r.getMessage() for r in caplog.records if "skipping unreadable checkpoint" in r.getMessage()]
    assert len(warned) == 2, warned
    assert "step-00000006" in warned[0] and "sha256 differs" in warned[0]
    assert "step-00000004" in warned[1] and "hold NaN/inf" in warned[1]
    assert m.counts["steps"] == 8
    assert_same(final_weights(run), straight)  # resumed from step 2, exactly


def test_weights_that_are_not_finite_are_never_written_as_a_checkpoint(tmp_path):
    from model.checkpoint import save_checkpoint

    model = BertForPreTraining(MODEL)
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[3, 0] = float("inf")
    with pytest.raises(FloatingPointError, match=r"NaN/inf at step 42 .*not written as checkpoint"):
        save_checkpoint(str(tmp_path / "step-00000042"), model, {"train": {"global_step": 42}})
    assert not (tmp_path / "step-00000042" / "_complete").exists()


def test_checkpoints_of_other_examples_are_set_aside_and_the_run_starts_over(examples, tmp_path, caplog):
    from model.contract import fingerprint_input
    from pipeline.schema.manifest import read_attempt

    cfg = config(phases=(PhaseConfig("p1", 16, 6, 8),), checkpoint_every=2)
    run = tmp_path / "run"
    with pytest.raises(Crash):  # an unfinished run on the old examples
        run_pretrain(cfg, MODEL, examples, str(run), log_fn=crash_at(4))
    assert find_latest_checkpoint(str(run)) is not None
    old_fp = fingerprint_input(examples)
    assert read_attempt(str(run)) == {"examples": old_fp}
    # a new dump went through the earlier stages: other examples under the same config
    new = write_example_stage(tmp_path / "new", seed=1)
    new_fp = fingerprint_input(new)
    aside = run / f"_previous-{old_fp[:16]}"
    seen = []

    def look(metrics, step):  # while the new run trains, the old one is kept aside, not resumed
        seen.append((step, sorted(p.name for p in aside.iterdir()), find_latest_checkpoint(str(run))))

    with caplog.at_level(logging.WARNING):
        m = run_pretrain(cfg, MODEL, new, str(run), log_fn=look)
    assert any("made from other examples" in r.getMessage() for r in caplog.records)
    assert seen[0][0] == 2 and seen[0][1] == ["p1"] and seen[0][2] is None  # from step 1, not from step 4
    assert m.counts["steps"] == 6 and m.inputs == {"examples": new_fp}
    assert read_attempt(str(run)) == {"examples": new_fp}
    assert not aside.exists()  # removed once the new run finished
    run_pretrain(cfg, MODEL, new, str(tmp_path / "straight"))
    assert_same(final_weights(run), final_weights(tmp_path / "straight"))


def test_init_from_a_model_of_another_vocabulary_carries_shared_tokens_over(tmp_path):
    """A refresh retrains the vocabulary: ids move, pieces come and go. The rows of the pieces
    both hold are carried over by their string; the rest of the network is copied."""
    from model.warmstart import init_weights

    small = tiny_bert_config(vocab_size=6)
    old_vocab, new_vocab = ["[PAD]", "a", "b", "c", "d", "e"], ["[PAD]", "c", "x", "a", "y", "e", "b"]
    torch.manual_seed(3)
    source = BertForPreTraining(small)
    save_pretrained(source, str(tmp_path / "hf"))
    (tmp_path / "hf" / "vocab.txt").write_text("\n".join(old_vocab) + "\n")
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "vocab.txt").write_text("\n".join(new_vocab) + "\n")
    model = BertForPreTraining(tiny_bert_config(vocab_size=7))
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    assert init_weights(model, str(tmp_path / "hf"), str(tmp_path / "vocab")) == {"shared_tokens": 5, "new_tokens": 2}
    got, src = model.state_dict(), source.state_dict()
    emb = "bert.embeddings.word_embeddings.weight"
    for i, tok in enumerate(new_vocab):
        for name in (emb, "cls.predictions.bias"):
            want = src[name][old_vocab.index(tok)] if tok in old_vocab else fresh[name][i]
            assert torch.equal(got[name][i], want), (name, tok)
    assert torch.equal(got["cls.predictions.decoder.weight"], got[emb])  # still tied
    assert torch.equal(got["bert.encoder.layer.0.attention.self.query.weight"],
                       src["bert.encoder.layer.0.attention.self.query.weight"])  # fmt: skip
    with pytest.raises(ValueError, match="vocab.txt is missing"):  # no way to match rows
        init_weights(BertForPreTraining(tiny_bert_config(vocab_size=7)), str(tmp_path / "hf"))
