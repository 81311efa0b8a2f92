"""Export/import in Hugging Face layout: round trips, prefixes, tokenizer files, the export stage."""

import json
import logging

import pytest
import safetensors.torch
import torch
from tiny_bert import tiny_bert_config

from model.bert import BertForPreTraining, BertModel
from model.export import load_bert_config, load_pretrained, run_export, save_pretrained
from pipeline.schema.manifest import read_manifest, write_manifest

CFG = tiny_bert_config(max_position_embeddings=40)


def inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 99, (3, 19), generator=g)
    types = (torch.arange(19) > 9).long().expand(3, 19)
    mask = torch.ones(3, 19, dtype=torch.long)
    mask[2, 12:] = 0
    return ids, types, mask


def trained_model() -> BertForPreTraining:
    torch.manual_seed(3)
    m = BertForPreTraining(CFG)
    with torch.no_grad():  # move every weight off its init so a skipped key would show
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m.eval()


def write_vocab(folder):
    folder.mkdir()
    (folder / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(94)]) + "\n"
    )
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    write_manifest("vocab", str(folder), {"vocab_size": 99}, {}, {"tokens": 99})


def test_round_trip_gives_identical_outputs(tmp_path):
    m = trained_model()
    save_pretrained(m, str(tmp_path / "out"))
    back = load_pretrained(str(tmp_path / "out"), BertForPreTraining).eval()
    ids, types, mask = inputs()
    a, b = m(ids, types, mask), back(ids, types, mask)
    assert torch.equal(a.prediction_logits, b.prediction_logits)
    assert torch.equal(a.seq_relationship_logits, b.seq_relationship_logits)
    assert back.cls.predictions.decoder.weight is back.bert.embeddings.word_embeddings.weight
    assert load_bert_config(str(tmp_path / "out")) == CFG


def test_files_have_hf_layout_and_tied_weight_once(tmp_path):
    save_pretrained(trained_model(), str(tmp_path / "out"))
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["model_type"] == "bert" and cfg["architectures"] == ["BertForPreTraining"]
    assert cfg["hidden_size"] == 32 and cfg["intermediate_size"] == 37 and cfg["vocab_size"] == 99
    tensors = safetensors.torch.load_file(str(tmp_path / "out" / "model.safetensors"))
    assert "bert.embeddings.word_embeddings.weight" in tensors
    assert "cls.predictions.decoder.weight" not in tensors
    assert "cls.predictions.bias" in tensors and "cls.seq_relationship.weight" in tensors
    assert all(k.startswith(("bert.", "cls.")) for k in tensors)


def test_bert_model_from_pretraining_export_and_bare_export(tmp_path, caplog):
    m = trained_model()
    save_pretrained(m, str(tmp_path / "pre"))
    with caplog.at_level(logging.DEBUG, logger="bertflow"):
        backbone = load_pretrained(str(tmp_path / "pre"), BertModel).eval()
    # the pretraining heads a backbone drops are expected: said at DEBUG only (--verbose), in
    # sorted order, not once per fine-tuning unit at INFO
    dropped = [r for r in caplog.records if "ignoring weights this model does not have" in r.getMessage()]
    assert [r.levelno for r in dropped] == [logging.DEBUG]
    assert "'cls.predictions.bias', 'cls.predictions.transform.LayerNorm.bias'" in dropped[0].getMessage()
    ids, types, mask = inputs()
    ref = m.bert(ids, types, mask)
    out = backbone(ids, types, mask)
    assert torch.equal(out.last_hidden_state, ref.last_hidden_state)
    assert torch.equal(out.pooler_output, ref.pooler_output)
    # a bare BertModel is saved with the "bert." prefix and loads back
    save_pretrained(backbone, str(tmp_path / "bare"))
    keys = safetensors.torch.load_file(str(tmp_path / "bare" / "model.safetensors")).keys()
    assert all(k.startswith("bert.") for k in keys)
    assert json.loads((tmp_path / "bare" / "config.json").read_text())["architectures"] == ["BertModel"]
    again = load_pretrained(str(tmp_path / "bare"), BertModel).eval()
    assert torch.equal(again(ids, types, mask).last_hidden_state, ref.last_hidden_state)
    # heads from a backbone-only file: backbone loaded, heads left at init (warned, not an error)
    pre = load_pretrained(str(tmp_path / "bare"), BertForPreTraining).eval()
    assert torch.equal(pre.bert(ids, types, mask).pooler_output, ref.pooler_output)


def test_loads_unprefixed_hf_bertmodel_keys_and_refuses_missing_backbone(tmp_path):
    m = trained_model()
    save_pretrained(m.bert, str(tmp_path / "hf"))
    path = tmp_path / "hf" / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    unprefixed = {k[len("bert.") :]: v for k, v in tensors.items()}
    unprefixed["embeddings.position_ids"] = torch.arange(40)[None]  # old HF files carry this buffer
    safetensors.torch.save_file(unprefixed, str(path))
    back = load_pretrained(str(tmp_path / "hf"), BertModel).eval()
    ids, types, mask = inputs()
    assert torch.equal(back(ids, types, mask).pooler_output, m.bert(ids, types, mask).pooler_output)
    del unprefixed["encoder.layer.1.output.dense.weight"]
    safetensors.torch.save_file(unprefixed, str(path))
    with pytest.raises(KeyError, match="encoder.layer.1.output.dense.weight"):
        load_pretrained(str(tmp_path / "hf"), BertModel)


def test_tokenizer_files_copied(tmp_path):
    write_vocab(tmp_path / "vocab")
    save_pretrained(trained_model(), str(tmp_path / "out"), str(tmp_path / "vocab"))
    out = tmp_path / "out"
    assert (out / "vocab.txt").read_text() == (tmp_path / "vocab" / "vocab.txt").read_text()
    assert (out / "tokenizer.json").exists()
    tc = json.loads((out / "tokenizer_config.json").read_text())
    assert tc["do_lower_case"] is True and tc["model_max_length"] == 40
    assert tc["tokenizer_class"] == "BertTokenizer"
    assert json.loads((out / "special_tokens_map.json").read_text())["mask_token"] == "[MASK]"


def test_run_export_reads_final_weights_and_writes_manifest(tmp_path):
    m = trained_model()
    pretrain = tmp_path / "pretrain"
    save_pretrained(m, str(pretrain / "final"))
    write_vocab(tmp_path / "vocab")
    with pytest.raises(Exception, match="manifest"):  # an unfinished pretraining run
        run_export(str(pretrain), str(tmp_path / "vocab"), str(tmp_path / "model"))
    write_manifest("pretrain", str(pretrain), {}, {}, {"steps": 1})
    manifest = run_export(str(pretrain), str(tmp_path / "vocab"), str(tmp_path / "model"))
    assert manifest.stage == "export"
    assert read_manifest(str(tmp_path / "model")).fingerprint == manifest.fingerprint
    paths = {f.path for f in manifest.files}
    assert {
        "config.json",
        "model.safetensors",
        "vocab.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    } <= paths
    assert manifest.counts["parameters"] == sum(p.numel() for p in m.parameters())
    back = load_pretrained(str(tmp_path / "model"), BertForPreTraining).eval()
    ids, types, mask = inputs()
    assert torch.equal(back(ids, types, mask).prediction_logits, m(ids, types, mask).prediction_logits)


def test_transformers_interop(tmp_path):
    transformers = pytest.importorskip("transformers")
    m = trained_model()
    save_pretrained(m, str(tmp_path / "out"))
    hf = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "out")).eval()
    ids, types, mask = inputs()
    ours = m(ids, types, mask)
    theirs = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    keep = mask.bool()
    torch.testing.assert_close(theirs.prediction_logits[keep], ours.prediction_logits[keep], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(theirs.seq_relationship_logits, ours.seq_relationship_logits, atol=1e-4, rtol=1e-4)
