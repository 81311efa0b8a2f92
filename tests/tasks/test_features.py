"""Feature-based NER: layer mixes, a frozen encoder, the results listing each mix; and loading any
BERT folder in Hugging Face layout (a released one: pytorch_model.bin, vocab.txt only)."""

import json
import shutil

import pytest
import torch
from tiny_bert import tiny_bert_config

from model.bert import BertModel
from tasks.config import FeatureConfig, FinetuneConfig, GridConfig
from tasks.features import FeatureBasedTagger, hidden_states, mix_states, mix_width
from tasks.finetune import load_encoder, load_tokenizer
from tasks.registry import get_task
from tasks.results import summarize
from tasks.units import run_downstream

CONFIG = tiny_bert_config()


def test_mixes_and_frozen_encoder():
    torch.manual_seed(0)
    bert = BertModel(CONFIG).eval()
    ids = torch.randint(1, 99, (3, 7))
    states = hidden_states(bert, ids, None, None)
    assert len(states) == 3  # embeddings + 2 layers
    assert torch.allclose(states[-1], bert(ids).last_hidden_state)
    assert torch.equal(mix_states(states, "sum_last4"), states[0] + states[1] + states[2])  # only 3 exist
    assert mix_states(states, "concat_last4").shape == (3, 7, 96) == (3, 7, mix_width("concat_last4", 32, 2))
    assert torch.equal(mix_states(states, "second_to_last"), states[1])
    tagger = FeatureBasedTagger(bert, num_labels=5, mix="concat_last4", lstm_hidden=8)
    before = {k: v.clone() for k, v in bert.state_dict().items()}
    opt = torch.optim.SGD([p for p in tagger.parameters() if p.requires_grad], lr=0.5)
    tagger.train()
    assert not tagger.bert.training  # no dropout in the frozen extractor
    labels = torch.randint(0, 5, (3, 7))
    loss = tagger(ids, attention_mask=torch.ones_like(ids), labels=labels).loss
    loss.backward()
    opt.step()
    assert all(torch.equal(before[k], v) for k, v in bert.state_dict().items())
    assert tagger.lstm.num_layers == 2 and tagger.lstm.bidirectional


CONLL = (
    "-DOCSTART- -X- -X- O\n\n"
    + "\n\n".join(
        f"the O O O\n{city} NNP I-NP I-LOC\nriver NN I-NP O\n{person} NNP I-NP I-PER"
        for city, person in [("paris", "rome"), ("berlin", "oslo"), ("madrid", "lisbon"), ("rome", "paris")] * 3
    )
    + "\n"
)


def test_feature_based_run_lists_each_mix(tmp_path, tiny_model_url):
    data = tmp_path / "conll2003"
    data.mkdir()
    for name in ("eng.train", "eng.testa"):
        (data / name).write_text(CONLL)
    config = FinetuneConfig(
        learning_rate=1e-2,
        batch_size=4,
        epochs=1,
        max_seq_length=32,
        grid=GridConfig(seeds=(1,)),
        features=FeatureConfig(layer_mixes=("last", "sum_all"), lstm_hidden=8),
    )
    manifest = run_downstream(
        get_task("conll2003_features"), config, str(tmp_path), tiny_model_url, str(tmp_path / "out")
    )
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(results["mixes"]) == {"last", "sum_all"} and manifest.counts["units"] == 2
    summary = summarize({"conll2003_features": str(tmp_path / "out")}, str(tmp_path / "all"))
    assert set(summary["tasks"][0]["mixes"]) == {"last", "sum_all"}
    table = (tmp_path / "all" / "results.md").read_text()
    assert "| conll2003_features [last] |" in table and "| conll2003_features [sum_all] |" in table
    lines = (tmp_path / "out" / "predictions.txt").read_text().splitlines()
    assert lines[0].split()[:2] == ["the", "O"] and lines[1].split()[:2] == ["paris", "B-LOC"]  # IOB1 -> IOB2
    assert all(len(line.split()) in (0, 3) for line in lines)  # conlleval input: word gold guess


def test_any_hf_bert_folder_released_layout(tmp_path, tiny_model_url):
    """A folder as Google's/HF's releases ship it: pytorch_model.bin with bare key names, vocab.txt."""
    released = tmp_path / "bert-tiny-uncased"
    released.mkdir()
    ours = load_encoder(tiny_model_url)
    torch.save({k: v.clone() for k, v in ours.state_dict().items()}, released / "pytorch_model.bin")
    for name in ("config.json", "vocab.txt"):
        shutil.copy(f"{tiny_model_url}/{name}", released / name)
    loaded = load_encoder(str(released))
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in ours.state_dict().items())
    tok = load_tokenizer(str(released))
    reference = load_tokenizer(tiny_model_url)
    text = "The Paris river, café!"
    assert tok.encode(text).ids == reference.encode(text).ids
    with pytest.raises(FileNotFoundError, match="no model.safetensors or pytorch_model.bin"):
        load_encoder(str(tmp_path))


@pytest.mark.parametrize("layout", ["vocab.txt", "tokenizer.json"])
def test_a_folder_whose_vocabulary_does_not_fit_its_weights_is_named(tmp_path, tiny_model_url, layout):
    """A vocabulary without [CLS], or with ids past config.json's vocab_size: refused naming the
    file and the mismatch (it was ``KeyError: '[CLS]'`` / ``IndexError: index out of range``)."""
    folder = tmp_path / "m"
    shutil.copytree(tiny_model_url, folder)
    if layout == "vocab.txt":
        (folder / "tokenizer.json").unlink()
    vocab = (folder / "vocab.txt").read_text().split("\n")
    rows = json.loads((folder / "config.json").read_text())["vocab_size"]

    def write(tokens):
        (folder / "vocab.txt").write_text("\n".join(tokens))
        if layout == "tokenizer.json":
            tok = json.loads((tmp_path / "tok.json").read_text())
            tok["model"]["vocab"] = {t: i for i, t in enumerate(tokens) if t}
            (folder / "tokenizer.json").write_text(json.dumps(tok))

    if layout == "tokenizer.json":
        shutil.copy(folder / "tokenizer.json", tmp_path / "tok.json")
    write([t if t != "[CLS]" else "[NOT-CLS]" for t in vocab])
    with pytest.raises(ValueError, match=rf"m/{layout}: no \[CLS\] token"):
        load_tokenizer(str(folder))
    write([t for t in vocab if t] + ["extra1", "extra2"])
    with pytest.raises(
        ValueError, match=rf"m/{layout}: token 'extra2' has id {rows + 1}, past .*config.json's vocab_size {rows}"
    ):
        load_tokenizer(str(folder))
