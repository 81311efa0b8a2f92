"""The registered model's code: what ``mlflow.pyfunc.load_model("models:/bert-tiny@champion")`` runs.

MLflow stores this file with the model ("models from code": no pickle) and runs it when the model
is loaded, in whatever environment loads it: ``model/`` and ``pipeline/`` travel with the model
as ``code_paths``, the model's requirements list what they import, and the weights are the
Hugging Face folder (artifact ``hf_model``), stored once. So a fresh environment with MLflow and
those requirements loads and serves it; bertflow need not be installed
(``tests/flows/test_served_model_slow.py`` does exactly that in a separate venv).

Input: a DataFrame's ``text`` column, a list of strings, or one string, in every shape MLflow's
scoring server hands over (``{"inputs": "one text"}`` arrives as a 0-d array). The signature's
check (``flows/mlflow_model.py``) keeps a request's first column only, before the model sees it,
so a lone column named otherwise is refused: a ``dataframe_split`` of columns ``id, text`` would
otherwise be answered for the ids.
Each request is bounded before any text is tokenised: at most ``BERTFLOW_SERVE_MAX_BATCH`` texts
(default 64) of at most ``BERTFLOW_SERVE_MAX_CHARS`` characters each (default 20,000: about 80
windows of the tiny model), both read from the serving process's environment when the model is
loaded. A request beyond them, or holding anything but text (numbers, nested lists, null), is
refused with :class:`RequestRefused` naming the limit or the value, which the scoring server
answers with HTTP 400 (its body's ``stack_trace`` ends with the reason), instead of reading a
20 MB string in 50,000 windows while the client has long given up.
Work within the limits is abandoned when its request is: MLflow's scoring server answers 504 after
``MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT`` seconds (default 60) but leaves the prediction running in
its thread, so the model keeps its own clock, the same number of seconds when it is served (or
``BERTFLOW_SERVE_MAX_SECONDS``; no limit when called in process), and stops between two windows
once it is spent, with :class:`RequestAbandoned`, freeing the worker for the next request.
Output, per text: the top token for each ``[MASK]`` (``filled``), the ``[CLS]`` embedding and the
mean of the token embeddings. A text longer than the model's positions is read in overlapping
windows (half a window apart) instead of being cut: every ``[MASK]`` is filled from the window
where it sits most centrally, the embeddings come from all windows; ``windows`` says how many
were needed, and a warning is issued.
"""

from __future__ import annotations

import os
import reprlib
import sys
import time
import warnings

import mlflow
from mlflow.models import set_model

ENV_MAX_CHARS = "BERTFLOW_SERVE_MAX_CHARS"
ENV_MAX_BATCH = "BERTFLOW_SERVE_MAX_BATCH"
ENV_MAX_SECONDS = "BERTFLOW_SERVE_MAX_SECONDS"
ENV_SERVER_TIMEOUT = "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT"  # MLflow's: when the scoring server answers 504
ENV_SERVING = "_MLFLOW_IS_IN_SERVING_ENVIRONMENT"  # set "true" by MLflow's scoring server before it loads us
SERVER_TIMEOUT = 60
"""MLflow's default ``MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT``."""
MAX_CHARS = 20_000
"""Default longest text of a request, in characters (checked before tokenising)."""
MAX_BATCH = 64
"""Default most texts in one request."""


class RequestRefused(ValueError):
    """A request beyond the served model's limits, or holding something that is not text."""


class RequestAbandoned(TimeoutError):
    """A request whose time is spent: its client has had the scoring server's 504 already."""


class Budget:
    """The seconds one request may take, checked between two pieces of work (``None``: no limit)."""

    def __init__(self, seconds: float | None, clock=time.monotonic):
        self.seconds, self.clock = seconds, clock
        self.start = clock()

    def check(self, done: str) -> None:
        if self.seconds is not None and self.clock() - self.start > self.seconds:
            raise RequestAbandoned(
                f"request abandoned after {self.clock() - self.start:.1f} s, past its {self.seconds:g} s "
                f"({ENV_MAX_SECONDS}, else the scoring server's {ENV_SERVER_TIMEOUT}), with {done}"
            )


def seconds_from_env() -> int | None:
    """A request's time limit: ``BERTFLOW_SERVE_MAX_SECONDS``, else the scoring server's own timeout
    when MLflow serves the model, else none (a batch ``predict`` in process runs to its end)."""
    if os.environ.get(ENV_MAX_SECONDS, "").strip():
        return limit_from_env(ENV_MAX_SECONDS, SERVER_TIMEOUT)
    if os.environ.get(ENV_SERVING, "").lower() == "true":
        return limit_from_env(ENV_SERVER_TIMEOUT, SERVER_TIMEOUT)
    return None


def limit_from_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a positive whole number") from None
    if value < 1:
        raise ValueError(f"{name}={raw!r}: expected a positive whole number")
    return value


def _values(model_input) -> list:
    """The request's values, one per text, whatever shape MLflow gave them."""
    if isinstance(model_input, str):
        return [model_input]
    if hasattr(model_input, "columns"):  # a DataFrame: its text column
        if len(model_input.columns) == 0:
            raise RequestRefused("the request has no column: send a 'text' column")
        if "text" in model_input.columns:
            return model_input["text"]
        if len(model_input.columns) > 1:  # rows of several values ({"inputs": [["a", "b"]]}): which is the text?
            raise RequestRefused(
                f"the request has {len(model_input.columns)} columns and none is 'text': send one text a row"
            )
        (column,) = model_input.columns
        if isinstance(column, str):  # a named column, not 'text': MLflow's check kept only the first one
            raise RequestRefused(
                f"the request's column is {reprlib.repr(column)}, not 'text': the signature's check hands the "
                "model a request's first column only, so name the texts' column 'text' (or send a list)"
            )
        return model_input[column]
    if isinstance(model_input, dict):
        if "text" not in model_input:
            raise RequestRefused(f"the request's keys are {sorted(map(str, model_input))[:5]}: send 'text'")
        return _values(model_input["text"])
    if getattr(model_input, "ndim", None) == 0:  # {"inputs": "one text"}: a 0-d array
        return [model_input.item()]
    if isinstance(model_input, (list, tuple)) or getattr(model_input, "ndim", None) == 1:
        return model_input
    shape = getattr(model_input, "shape", None)
    raise RequestRefused(
        f"the request is {type(model_input).__name__}{f' of shape {shape}' if shape else ''}: send one text, "
        "a list of texts or a 'text' column"
    )


def texts_of(model_input, max_chars: int = MAX_CHARS, max_batch: int = MAX_BATCH) -> list[str]:
    """The texts of a request, each checked to be text within the limits (:class:`RequestRefused`)."""
    values = _values(model_input)
    if len(values) > max_batch:
        raise RequestRefused(
            f"the request holds {len(values):,} texts, more than the limit of {max_batch:,} a request "
            f"({ENV_MAX_BATCH}): send them in several requests"
        )
    if len(values) == 0:
        raise RequestRefused("the request holds no text")
    texts = []
    for i, value in enumerate(values):
        if not isinstance(value, str):  # numpy's str_ is a str; a number, a list, None are not text
            shown = reprlib.repr(value)  # bounded: a nested 20 MB string is not copied to be named
            raise RequestRefused(f"text {i} is {type(value).__name__} {shown}, not a string")
        if len(value) > max_chars:
            raise RequestRefused(
                f"text {i} has {len(value):,} characters, more than the limit of {max_chars:,} ({ENV_MAX_CHARS}): "
                "split it, or serve with a higher limit"
            )
        texts.append(str(value))
    return texts


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
        self.max_chars = limit_from_env(ENV_MAX_CHARS, MAX_CHARS)
        self.max_batch = limit_from_env(ENV_MAX_BATCH, MAX_BATCH)
        seconds_from_env()  # a malformed limit fails the load, not every request
        self.torch = torch

    def predict(self, context, model_input, params=None):
        import pandas as pd

        budget = Budget(seconds_from_env())  # per request: the scoring server says it serves after loading us
        texts = texts_of(model_input, self.max_chars, self.max_batch)  # every text checked before any is read
        try:
            return pd.DataFrame([self._one(text, budget, f"text {i} of {len(texts)}") for i, text in enumerate(texts)])
        except RequestAbandoned as exc:  # its client has had a 504 and will not see this: the server's log will
            print(f"bertflow served model: {exc}", file=sys.stderr, flush=True)
            raise

    def _one(self, text: str, budget: Budget, which: str) -> dict:
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
        for n, (start, end) in enumerate(spans):
            budget.check(f"{which} at window {n} of {len(spans)}")
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
