"""The exported BERT as an MLflow pyfunc model, so the registry entry loads back.

``mlflow.pyfunc.load_model("models:/bert-tiny@champion")`` gives a model whose ``predict`` takes
a DataFrame with a ``text`` column (or a list of strings) and returns, per text, its ``[CLS]``
embedding, its mean-pooled embedding and, for each ``[MASK]`` in the text, the top predicted
token. The Hugging Face folder travels as the model's artifact (``hf_model``), so the same files
also load with ``transformers``. ``model/`` and the tokenizer do the work; this module only
adapts them to MLflow's interface (and is the only place that does).
"""

from __future__ import annotations

from typing import Any

import mlflow.pyfunc


class BertPyfunc(mlflow.pyfunc.PythonModel):
    """Fill masks and embed text with a bertflow export."""

    def load_context(self, context) -> None:
        import torch

        from model.bert import BertForPreTraining
        from model.export import load_pretrained
        from tasks.finetune import load_tokenizer  # tokenizer.json, or MeCab/jieba before WordPiece

        folder = context.artifacts["hf_model"]
        self.tokenizer = load_tokenizer(folder)
        self.model = load_pretrained(folder, BertForPreTraining).eval()
        self.model.sparse_prediction = False
        self.mask_id = self.tokenizer.token_to_id("[MASK]")
        self.max_length = self.model.config.max_position_embeddings
        self.torch = torch

    def predict(self, context, model_input, params: dict[str, Any] | None = None):
        import pandas as pd

        texts = _texts(model_input)
        rows = []
        for text in texts:
            enc = self.tokenizer.encode(text)
            ids = enc.ids[: self.max_length]
            input_ids = self.torch.tensor([ids])
            with self.torch.no_grad():
                out = self.model(input_ids, attention_mask=self.torch.ones_like(input_ids))
                hidden = self.model.bert(input_ids).last_hidden_state[0]  # (T, H)
            logits = out.prediction_logits[0]  # (T, V)
            fills = [
                self.tokenizer.id_to_token(int(logits[i].argmax())) for i, t in enumerate(ids) if t == self.mask_id
            ]
            rows.append(
                {
                    "text": text,
                    "filled": fills,
                    "cls_embedding": hidden[0].tolist(),
                    "mean_embedding": hidden.mean(0).tolist(),
                }
            )
        return pd.DataFrame(rows)


def _texts(model_input) -> list[str]:
    if isinstance(model_input, str):
        return [model_input]
    if hasattr(model_input, "columns"):
        column = "text" if "text" in model_input.columns else model_input.columns[0]
        return [str(t) for t in model_input[column]]
    return [str(t) for t in model_input]


def log_bert_model(run_id: str, hf_folder: str, registered_name: str | None = None):
    """Log ``hf_folder`` as a pyfunc model under ``run_id``; returns MLflow's ModelInfo."""
    import pandas as pd

    example = pd.DataFrame({"text": ["the [MASK] of the river"]})
    with mlflow.start_run(run_id=run_id, nested=True):
        return mlflow.pyfunc.log_model(
            name="model",
            python_model=BertPyfunc(),
            artifacts={"hf_model": hf_folder},
            input_example=example,
            registered_model_name=registered_name,
            pip_requirements=["torch", "tokenizers", "pandas", "safetensors", "fsspec", "pyarrow"],
            code_paths=[_package_dir("model"), _package_dir("pipeline")],
        )


def _package_dir(name: str) -> str:
    import importlib.util
    import os

    return os.path.dirname(importlib.util.find_spec(name).origin)
