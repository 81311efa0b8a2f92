"""The registered model's signature and input example: a tiny random BERT with its MLM head,
exported in Hugging Face layout, logged by ``flows.mlflow_model.log_bert_model`` into a SQLite
store, then read back as MLflow's UI and ``mlflow models serve`` read it."""

import pandas as pd
import pytest
from tiny_bert import tiny_bert_config

from model.bert import BertForPreTraining
from model.export import save_pretrained
from tests.tasks.conftest import build_tokenizer


@pytest.fixture
def logged(tmp_path, monkeypatch):
    import mlflow
    import torch

    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    tok = build_tokenizer(tmp_path / "vocab")
    config = tiny_bert_config(vocab_size=tok.get_vocab_size())
    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(config), str(tmp_path / "model"), vocab_url=str(tmp_path / "vocab"))
    from flows.mlflow_model import log_bert_model

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    run = mlflow.MlflowClient().create_run(mlflow.MlflowClient().create_experiment("x")).info.run_id
    try:
        yield log_bert_model(run, str(tmp_path / "model"))
    finally:
        mlflow.set_tracking_uri(None)


@pytest.mark.production
@pytest.mark.slow  # ~15 s of CPU, but a new SQLite store's migrations take a minute on a loaded box
def test_the_logged_model_has_a_signature_and_an_input_example_and_takes_every_documented_input(logged):
    import mlflow
    from mlflow.models import Model

    info = mlflow.models.get_model_info(logged.model_uri)
    inputs = info.signature.inputs.to_dict()
    outputs = {c["name"]: c["type"] for c in info.signature.outputs.to_dict()}
    # unnamed: a list and a string fit it too; of any type: a string column made the server cast
    # numbers to text before the model could refuse them
    assert inputs == [{"type": "any", "required": True}]
    assert set(outputs) == {"text", "filled", "cls_embedding", "mean_embedding", "windows"}
    assert outputs["text"] == "string" and outputs["windows"] == "long"
    example = Model.load(logged.model_uri).load_input_example(mlflow.artifacts.download_artifacts(logged.model_uri))
    assert "[MASK]" in str(example)
    model = mlflow.pyfunc.load_model(logged.model_uri)
    text = "the [MASK] of the river"
    answers = [model.predict(x) for x in (pd.DataFrame({"text": [text]}), [text], text)]
    # the three documented inputs pass the signature's check and give the same answer (the test
    # tokenizer has no special [MASK] token, so nothing is filled: the embeddings are compared)
    assert all(list(a["text"]) == [text] for a in answers)
    assert answers[0]["cls_embedding"][0] == answers[1]["cls_embedding"][0] == answers[2]["cls_embedding"][0]
