"""The registered model's code: what ``mlflow.pyfunc.load_model("models:/bert-tiny@champion")`` runs.

MLflow stores this file with the model ("models from code": no pickle) and runs it when the model
is loaded, in whatever environment loads it: ``model/`` and ``pipeline/`` travel with the model
as ``code_paths``, the model's requirements list what they import, and the weights are the
Hugging Face folder (artifact ``hf_model``), stored once. So a fresh environment with MLflow and
those requirements loads and serves it; bertflow need not be installed
(``tests/flows/test_served_model_slow.py`` does exactly that in a separate venv).

Input: a DataFrame (its ``text`` column, else its first), a list of strings, or one string.
Output, per text: the top token for each ``[MASK]`` (``filled``), the ``[CLS]`` embedding and the
mean of the token embeddings. A text longer than the model's positions is read in overlapping
windows (half a window apart) instead of being cut: every ``[MASK]`` is filled from the window
where it sits most centrally, the embeddings come from all windows; ``windows`` says how many
were needed, and a warning is issued.
"""

from __future__ import annotations

import warnings

import mlflow
from mlflow.models import set_model


def texts_of(model_input) -> list[str]:
    """The texts of a DataFrame (``text`` column, else the first), a list, or one string."""
    if isinstance(model_input, str):
        return [model_input]
    if hasattr(model_input, "columns"):
        column = "text" if "text" in model_input.columns else model_input.columns[0]
        return [str(t) for t in model_input[column]]
    if isinstance(model_input, dict) and "text" in model_input:
        return texts_of(model_input["text"])
    return [str(t) for t in model_input]


def windows(n: int, size: int) -> list[tuple[int, int]]:
    """Token ranges [start, end) of at most ``size`` tokens covering ``n``, half a window apart."""
    if n <= size:
        return [(0, n)]
    step = max(1, size // 2)
    starts = list(range(0, n - size, step)) + [n - size]
    return [(s, s + size) for s in starts]


class BertModel(mlflow.pyfunc.PythonModel):
    """Fill masks and embed text with a bertflow export (its Hugging Face folder)."""

    # MLflow checks ``predict`` for a type hint when the class is made (at logging and at every
    # load) and, finding none, warns "Add type hints to the `predict` method ..." under its own
    # warnings filter, which ours cannot override. There is no hint to add: ``predict`` takes a
    # DataFrame, a list or one string on purpose, and a hint would make MLflow convert or refuse
    # them. This attribute (MLflow's own, for its ChatModel) skips that check; without a hint the
    # check would only have wrapped ``predict`` in a pass-through.
    _skip_type_hint_validation = True

    def load_context(self, context) -> None:
        import torch
        from tokenizers import Tokenizer

        from model.bert import BertForPreTraining
        from model.contract import WordTokenizer, word_tokenizer_of
        from model.export import load_pretrained, read_tokenizer_config

        folder = context.artifacts["hf_model"]
        segmented = word_tokenizer_of(read_tokenizer_config(folder))  # MeCab or jieba before WordPiece
        if segmented is not None:
            with open(f"{folder}/vocab.txt", encoding="utf-8", newline="") as f:
                self.tokenizer = WordTokenizer(f.read().rstrip("\n").split("\n"), *segmented)
        else:
            self.tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.model = load_pretrained(folder, BertForPreTraining).eval()
        self.model.sparse_prediction = False
        self.cls_id = self.tokenizer.token_to_id("[CLS]")
        self.sep_id = self.tokenizer.token_to_id("[SEP]")
        self.mask_id = self.tokenizer.token_to_id("[MASK]")
        self.max_length = self.model.config.max_position_embeddings
        self.torch = torch

    def predict(self, context, model_input, params=None):
        import pandas as pd

        return pd.DataFrame([self._one(text) for text in texts_of(model_input)])

    def _one(self, text: str) -> dict:
        torch = self.torch
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        spans = windows(len(ids), self.max_length - 2)
        if len(spans) > 1:
            warnings.warn(
                f"text of {len(ids)} tokens is longer than the model's {self.max_length} positions: read in "
                f"{len(spans)} overlapping windows",
                stacklevel=2,
            )
        fills: dict[int, tuple[float, str]] = {}  # position -> (distance from its window's centre, token)
        total, count, cls = None, 0, None
        for start, end in spans:
            window = torch.tensor([[self.cls_id, *ids[start:end], self.sep_id]])
            with torch.no_grad():
                out = self.model(window, attention_mask=torch.ones_like(window))
                hidden = self.model.bert(window).last_hidden_state[0]  # (T, H)
            logits = out.prediction_logits[0]  # (T, V)
            for i in range(start, end):
                if ids[i] == self.mask_id:
                    off = abs(i - (start + end) / 2)
                    if i not in fills or off < fills[i][0]:
                        token = self.tokenizer.id_to_token(int(logits[i - start + 1].argmax()))
                        fills[i] = (off, token)
            cls = hidden[0] if cls is None else cls
            total = hidden.sum(0) if total is None else total + hidden.sum(0)
            count += hidden.shape[0]
        return {
            "text": text,
            "filled": [fills[i][1] for i in sorted(fills)],
            "cls_embedding": cls.tolist(),
            "mean_embedding": (total / count).tolist(),
            "windows": len(spans),
        }


set_model(BertModel())
