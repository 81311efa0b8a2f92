"""The exported model's card: written by the export stage's row, read by huggingface_hub as the Hub
would, completed with the downstream scores by the registry step, and no local path in what leaves
the machine."""

import json

import pytest
import torch
from huggingface_hub import ModelCard
from tiny_bert import tiny_bert_config

from flows.calls import StageCall, StageResult
from flows.card import write_model_card
from flows.presets import load_config
from flows.table import card_sources, get_stage, stage_inputs, stage_url
from model.bert import BertForPreTraining
from model.export import save_pretrained
from pipeline.schema.manifest import read_manifest, write_manifest
from pipeline.schema.objectives import derive_max_predictions, get_objective
from pipeline.schema.outputs import ExampleLength, VocabOutput, lengths_record, vocab_record


@pytest.fixture
def exported(tmp_path, request):
    """A root whose corpus, vocab, examples and pretrain stages finished (small stand-ins), exported
    by the export row as a run does (``objective``: the examples' objective and masking rate)."""
    objective, rate = getattr(request, "param", ("mlm+nsp", 0.15))
    cfg = load_config("tiny")
    root = str(tmp_path / "root")
    write_manifest("corpus", f"{root}/corpus", {}, {}, {"wiki_documents": 12.0, "wiki_sentences": 340.0,
                                                         "books_documents": 3.0, "books_sentences": 99.0})  # fmt: skip
    vocab = tmp_path / "root" / "vocab"
    vocab.mkdir(parents=True)
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghij"]
    (vocab / "vocab.txt").write_text("\n".join(pieces) + "\n")
    outputs = vocab_record(VocabOutput.of(pieces, lowercase=False, word_tokenizer="none", subword="wordpiece"))
    write_manifest("vocab", str(vocab), {}, {}, {"vocab_size": 15.0}, outputs=outputs)
    lengths = [ExampleLength(64, derive_max_predictions(64, rate), "static", rate, False, objective)]
    write_manifest("examples", stage_url(root, "examples"), {}, {}, {}, files=[], outputs=lengths_record(lengths))
    torch.manual_seed(0)
    net = tiny_bert_config(
        vocab_size=15, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24
    )
    pretrain = stage_url(root, "pretrain")
    save_pretrained(BertForPreTraining(net), f"{pretrain}/final")
    losses = {f"last_{loss}_loss": value for loss, value in (("mlm", 5.0), ("nsp", 0.6), ("sop", 0.69))}
    losses = {k: v for k, v in losses.items() if k[len("last_") : -len("_loss")] in get_objective(objective).losses}
    write_manifest("pretrain", pretrain, {}, {}, {"steps": 900.0, **losses})
    url = stage_url(root, "export")
    manifest = get_stage("export").run(StageCall("export", cfg, root, url, stage_inputs("export", cfg, root)))
    return cfg, root, url, manifest


def test_the_export_writes_a_card_the_hub_reads_and_no_local_path(exported, tmp_path):
    cfg, root, url, manifest = exported
    card = ModelCard.load(f"{url}/README.md")
    assert card.data.language == ["en"] and card.data.license == "apache-2.0"
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "fill-mask"
    assert "bertflow" in card.data.tags and "synthetic-data" in card.data.tags
    assert card.data.eval_results is None  # no score before fine-tuning
    text = card.text
    for part in ("## Training data", "## Configuration", "## Downstream results", "## How to load", "## Limits"):
        assert part in text
    assert "synthwiki-0-pages-articles.xml.bz2" in text and "12 documents, 340 sentences kept" in text
    assert "Not evaluated yet" in text and "| layers | 1 |" in text and "900 steps done" in text
    # what the vocab and examples stages recorded, not the run's config (whose tiny vocab lower-cases)
    assert "WordPiece, 15 entries, cased." in text and "keeps case" in text
    assert "BERT (masked language model + next sentence prediction) pretrained" in text
    assert "Pretraining (MLM + NSP, 15% of tokens masked," in text
    assert "final MLM loss 5.000" in text and "final NSP loss 0.600" in text
    # the card is not one of the export's files: rewriting it never makes the export stale
    assert "README.md" not in {f.path for f in manifest.files}
    config = json.loads(open(f"{url}/config.json").read())
    transformers = pytest.importorskip("transformers")
    assert config["dtype"] == "float32" and "torch_dtype" not in config
    assert config["transformers_version"] == transformers.__version__  # the test extra's pin
    # what an upload_folder would publish names nothing of this machine
    for path in sorted((tmp_path / "root" / "model").rglob("*")):
        if path.is_file():
            assert str(tmp_path) not in path.read_bytes().decode("utf-8", "replace"), path.name
    assert read_manifest(url).url == url  # the manifest holds no path, and still reads as its folder's


def test_the_registry_step_completes_the_card_with_the_scores(exported):
    cfg, root, url, manifest = exported
    downstream = [
        ("sst2", StageResult("finetune/sst2", "done", 1.0, f"{root}/finetune/sst2",
                             {"eval_accuracy": 0.765, "dev_median": 76.5, "dev_min": 70.0, "dev_max": 78.0,
                              "seeds": 3.0, "model_kept": 1.0})),
        ("squad1", StageResult("finetune/squad1", "done", 1.0, f"{root}/finetune/squad1",
                               {"eval_f1": 25.36, "dev_median": 25.36, "seeds": 1.0})),
        ("cola", StageResult("finetune/cola", "done", 1.0, f"{root}/finetune/cola", {"units_failed": 1.0})),
    ]  # fmt: skip
    write_model_card(cfg, url, card_sources(cfg, root), downstream)
    card = ModelCard.load(f"{url}/README.md")
    results = {(r.dataset_type, r.dataset_config, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert results == {("glue", "sst2", "accuracy"): 76.5, ("squad", "plain_text", "f1"): 25.36}
    assert {r.task_type for r in card.data.eval_results} == {"text-classification", "question-answering"}
    assert "| sst2 | GLUE SST-2 | accuracy | 76.50 | 70.00 | 78.00 | 3 | `finetune/sst2/model` |" in card.text
    assert "bundled synthetic samples" in card.text and "Not evaluated yet" not in card.text
    assert "AutoModelForSequenceClassification" in card.text
    # the export is the same export: same fingerprint, every file it lists as it was
    assert read_manifest(url).fingerprint == manifest.fingerprint
    assert read_manifest(url).missing_files(checksums=True) == []


@pytest.mark.parametrize("exported", [("mlm", 0.3), ("sop", 0.15)], indirect=True)
def test_the_card_names_the_examples_objective_and_masking_rate(exported):
    cfg, root, url, manifest = exported  # the run's config says mlm+nsp: the examples' manifest decides
    text = ModelCard.load(f"{url}/README.md").text
    objective = read_manifest(stage_url(root, "examples")).outputs["lengths"]["seq64"]["objective"]
    if objective == "mlm":
        assert "BERT (masked language model only, over full sentences" in text
        assert "Pretraining (MLM, 30% of tokens masked," in text and "NSP" not in text
        assert "AutoModel (no pooler was trained)" in text and "BertForPreTraining" not in text
    else:
        assert "BERT (masked language model + sentence-order prediction, as ALBERT)" in text
        assert "Pretraining (MLM + SOP, 15% of tokens masked," in text and "final SOP loss 0.690" in text


def test_a_language_preset_says_its_language():
    cfg = load_config("tiny-ja")
    assert cfg.card.language == ("ja",)


def test_the_reevaluation_rescores_the_export_it_evaluated(exported, tmp_path):
    """stage-finetune (the weekly re-evaluation) runs no export stage: the registry step takes the
    export its tasks read, so the version made from it is rescored; a released model (no
    manifest) or tasks that read different models are not a version to score."""
    from flows.chain import evaluated_export

    cfg, root, url, manifest = exported

    def result(task, model):
        return StageResult(f"finetune/{task}", "done", 1.0, f"{root}/finetune/{task}", {"dev_median": 70.0}, None,
                           {"model": model, "data": "/data"})  # fmt: skip

    found = evaluated_export([result("sst2", url), result("squad1", url)])
    assert found.stage == "export" and found.url == url and found.manifest.fingerprint == manifest.fingerprint
    released = tmp_path / "released"
    released.mkdir()
    assert evaluated_export([result("sst2", str(released))]) is None
    assert evaluated_export([result("sst2", url), result("squad1", str(released))]) is None
    assert evaluated_export([]) is None
