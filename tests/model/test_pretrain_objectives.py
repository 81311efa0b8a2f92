"""Pretraining with each objective: the heads built, the losses trained and reported, the batches
(padded and packed), and an MLM-only export as transformers loads it (BertForMaskedLM)."""

import logging
import os
import signal

import pytest
import safetensors.torch
import torch
from pretrain_shards import MODEL, VOCAB, MaskRule, write_example_stage

from model.bert import BertForMaskedLM, BertForPreTraining, BertModel
from model.config import BertConfig, PhaseConfig, PretrainConfig
from model.export import load_pretrained, run_export
from model.train import Preempted, run_pretrain


def config(**kw) -> PretrainConfig:
    base = dict(
        phases=(PhaseConfig("p1", 16, 60, 16),),
        learning_rate=3e-3,
        warmup_steps=5,
        log_every=20,
        checkpoint_every=100,
        seed=3,
    )
    return PretrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    out = {}
    for name in ("mlm+nsp", "mlm", "sop"):
        out[name] = write_example_stage(tmp_path_factory.mktemp(name.replace("+", "_")), lengths=(16,), objective=name)
    return out


def train(stages, name, tmp_path, **kw):
    logged = []
    url = str(tmp_path / f"run-{name.replace('+', '_')}")
    m = run_pretrain(config(**kw), MODEL, stages[name], url, log_fn=lambda d, s: logged.append(d), mask_fn=MaskRule())
    return url, m, logged


@pytest.mark.parametrize(
    "name, losses",
    [("mlm", ("mlm",)), ("sop", ("mlm", "sop"))],
)
def test_each_objective_trains_its_losses_only(stages, tmp_path, caplog, name, losses):
    with caplog.at_level(logging.INFO, logger="bertflow.pretrain"):
        url, m, logged = train(stages, name, tmp_path)
    metric_losses = {k for k in logged[0] if k.endswith("_loss")} - {"loss"}
    assert metric_losses == {f"{x}_loss" for x in losses}
    assert {k for k in logged[0] if k.endswith("_accuracy")} == {f"{x}_accuracy" for x in losses}
    assert {k for k in m.counts if k.startswith("last_") and k.endswith("_loss")} == {f"last_{x}_loss" for x in losses}
    assert logged[-1]["mlm_loss"] < logged[0]["mlm_loss"]
    if "sop" in losses:
        assert logged[0]["loss"] == pytest.approx(logged[0]["mlm_loss"] + logged[0]["sop_loss"], rel=1e-6)
    else:
        assert logged[0]["loss"] == pytest.approx(logged[0]["mlm_loss"], rel=1e-9)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("phase p1 step")]
    assert lines and all(("nsp" in line) is False and ("sop" in line) is ("sop" in losses) for line in lines)
    keys = set(safetensors.torch.load_file(f"{url}/final/model.safetensors"))
    has_sentence_head = "sop" in losses
    assert ("cls.seq_relationship.weight" in keys) is has_sentence_head  # SOP reuses NSP's head
    assert ("bert.pooler.dense.weight" in keys) is has_sentence_head
    final = load_pretrained(f"{url}/final", BertForPreTraining)
    assert type(final) is (BertForPreTraining if has_sentence_head else BertForMaskedLM)


@pytest.mark.parametrize("name", ["mlm", "sop"])
def test_packed_and_padded_batches_train_alike_with_held_out_evaluation(stages, tmp_path, name):
    model = BertConfig(**{**MODEL.__dict__, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    base = dict(phases=(PhaseConfig("p1", 16, 8, 8, micro_batch_size=4),), learning_rate=2e-3, warmup_steps=2)
    runs = {}
    for unpad in ("off", "on"):
        cfg = PretrainConfig(**base, log_every=4, eval_every=4, eval_batches=1, seed=3, unpad=unpad)
        logged: list = []
        m = run_pretrain(cfg, model, stages[name], str(tmp_path / unpad), log_fn=lambda d, s, out=logged: out.append(d))
        runs[unpad] = (m, safetensors.torch.load_file(str(tmp_path / unpad / "final" / "model.safetensors")), logged)
    (m0, w0, log0), (m1, w1, log1) = runs["off"], runs["on"]
    for k in w0:
        torch.testing.assert_close(w1[k], w0[k], atol=1e-5, rtol=1e-4, msg=k)
    evals = {k for k in m0.counts if k.startswith("eval_")}
    sentence = {"mlm": set(), "sop": {"eval_sop_loss", "eval_sop_accuracy"}}[name]
    assert evals == {"eval_loss", "eval_mlm_loss", "eval_mlm_accuracy"} | sentence
    for key in evals:
        assert m1.counts[key] == pytest.approx(m0.counts[key], rel=1e-4, abs=1e-5), key
    assert [sorted(d) for d in log1] == [sorted(d) for d in log0]


def test_dynamic_masking_with_mlm(stages, tmp_path):
    _, m, logged = train(stages, "mlm", tmp_path, dynamic_masking=True)
    assert "nsp_loss" not in logged[0] and m.counts["steps"] == 60


def test_mlm_export_loads_as_transformers_masked_lm_and_fills_masks(stages, tmp_path):
    transformers = pytest.importorskip("transformers")
    url, _, _ = train(stages, "mlm", tmp_path)
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    export = tmp_path / "model"
    from pipeline.schema.manifest import write_manifest

    write_manifest("vocab", str(vocab), {}, {}, {})
    run_export(url, str(vocab), str(export))
    assert (export / "config.json").read_text().count('"BertForMaskedLM"') == 1
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(str(export), output_loading_info=True)
    assert type(model).__name__ == "BertForMaskedLM"
    assert info["missing_keys"] == set() or info["missing_keys"] == []
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = load_pretrained(str(export), BertForPreTraining).eval()
    ids = torch.tensor([[2, 10, 11, 4, 13, 14, 3]])
    with torch.no_grad():
        theirs = model(input_ids=ids).logits
        mine = ours(ids, attention_mask=torch.ones_like(ids)).prediction_logits
    torch.testing.assert_close(theirs, mine, atol=1e-4, rtol=1e-4)  # the same network in transformers
    fill = transformers.pipeline("fill-mask", model=str(export), tokenizer=str(export))
    out = fill("w10 w11 [MASK] w13 w14")
    assert len(out) == 5 and all(o["token_str"] for o in out)
    backbone = load_pretrained(str(export), BertModel)  # fine-tuning: the pooler starts untrained
    assert backbone.pooler is not None


@pytest.mark.parametrize("name", ["mlm", "sop"])
def test_sigterm_then_resume_is_exact_with_each_objective(stages, tmp_path, name):
    cfg = config(phases=(PhaseConfig("p1", 16, 10, 8),), checkpoint_every=100, log_every=2)
    run_pretrain(cfg, MODEL, stages[name], str(tmp_path / "straight"))
    run = str(tmp_path / "run")

    def term_at_4(metrics, step):
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Preempted):
        run_pretrain(cfg, MODEL, stages[name], run, log_fn=term_at_4)
    run_pretrain(cfg, MODEL, stages[name], run)
    a = safetensors.torch.load_file(f"{run}/final/model.safetensors")
    b = safetensors.torch.load_file(f"{tmp_path}/straight/final/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_pretraining_on_examples_of_another_objective_shape_is_refused_naming_shard_and_row(stages, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(stages["mlm"], bad)
    manifest = (bad / "_manifest.json").read_text().replace('"objective": "mlm"', '"objective": "sop"')
    (bad / "_manifest.json").write_text(manifest)  # says sop; its shards have no len_a, no is_swapped
    with pytest.raises(
        ValueError, match=r"part-0000[01]-of-00002.parquet missing example columns \['len_a', 'is_swapped'\]"
    ):
        run_pretrain(config(), MODEL, str(bad), str(tmp_path / "run"))


@pytest.mark.parametrize("source_cls, target", [(BertForPreTraining, "mlm"), (BertForMaskedLM, "sop")])
def test_warm_start_across_objectives_carries_every_shared_weight(stages, tmp_path, caplog, source_cls, target):
    """``pretrain.init_from`` a model of another objective: an MLM-only run from a BERT with NSP
    (its pooler and NSP head left behind), a sentence-order run from an MLM-only model (the
    sentence head and pooler start from their init, said in the log); every shared weight carried."""
    from model.export import hf_state_dict, save_pretrained

    torch.manual_seed(11)
    source = source_cls(MODEL)
    save_pretrained(source, str(tmp_path / "hf"))
    with caplog.at_level(logging.INFO, logger="bertflow"):
        run_pretrain(config(phases=(PhaseConfig("p1", 16, 0, 16),)), MODEL, stages[target], str(tmp_path / "run"),
                     init_from=str(tmp_path / "hf"), mask_fn=MaskRule())  # fmt: skip
    got = safetensors.torch.load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    want = hf_state_dict(source)
    shared = set(got) & set(want)
    assert shared and all(
        k.startswith(("bert.embeddings", "bert.encoder", "cls.predictions"))
        for k in shared - {k for k in got if k.startswith(("bert.pooler", "cls.seq_relationship"))}
    )
    for k in shared:
        torch.testing.assert_close(got[k], want[k], atol=0, rtol=0, msg=k)
    left = sorted(set(got) ^ set(want))
    assert left and all(k.startswith(("bert.pooler", "cls.seq_relationship")) for k in left), left
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "initialised from" in message and ("start from their init" in message or "left behind" in message)
