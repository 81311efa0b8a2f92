"""The family steps of the JSON-lines benchmarks (JGLUE, CLUE): sentence(-pair) classification and
regression, multiple choice, and SQuAD-style span extraction scored by the benchmark's metric.

A family module (``tasks/jglue.py``, ``tasks/clue.py``) reads its official files into the
shapes here and names its metric and files (the row's ``reader``, ``files``, ``scorer``); the
classes here (:class:`Classification`, :class:`Choice`, :class:`SpanQa`, the row's ``unit``) give
the steps and :func:`tasks.driver.run_unit` runs them as it runs GLUE's, SWAG's and SQuAD's, so a
task is a registry row plus its reader. Design choices:

1. Classification reuses GLUE's encoding and metrics through the row's ``layout``
   (:class:`tasks.registry.GlueLayout`): its ``text_a``/``text_b``/``label`` name JSON keys.
   A row whose label is not in the task's set stops the run with ``file:line``, except a label
   the benchmark itself marks as unlabelled (OCNLI/CMNLI's ``"-"``), which is skipped and
   counted (``train_skipped``/``dev_skipped``), as the official baselines drop them.
2. Span QA reuses SQuAD's reader, windows and decoding (``tasks.squad``); only the scoring is the
   benchmark's own (``metric``: question id -> gold texts, predictions -> {"exact_match", "f1"}).
3. Outputs: ``metrics.json``, ``predictions.jsonl`` (dev id, prediction, label) or, for QA,
   ``predictions.json`` (the official prediction file: id -> answer), the model unless
   ``save_model`` is off, then ``_manifest.json``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable

import fsspec

from model.contract import join_url
from tasks import squad
from tasks.driver import Family
from tasks.finetune import Feature, check_eval_split, predict, write_json, write_text
from tasks.glue import (
    GlueExample,
    classifier_config,
    compute_metrics,
    encode_examples,
    format_prediction,
    predictions_from_logits,
)
from tasks.heads import BertForMultipleChoice, BertForSequenceClassification
from tasks.metrics import accuracy
from tasks.registry import Task, resolve

logger = logging.getLogger("bertflow.finetune")


class JsonlDataError(ValueError):
    """A malformed task file; the message names the file and the line."""


def read_jsonl(url: str) -> list[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a JSON-lines file."""
    rows = []
    with fsspec.open(url, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8").strip()
            except UnicodeDecodeError as exc:
                raise JsonlDataError(f"{url}:{lineno}: not valid UTF-8 ({exc})") from exc
            if not text:
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise JsonlDataError(f"{url}:{lineno}: not a JSON object ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise JsonlDataError(f"{url}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            rows.append((lineno, obj))
    return rows


def field(url: str, lineno: int, obj: dict, key: str):
    if key not in obj:
        raise JsonlDataError(f"{url}:{lineno}: key {key!r} missing (keys: {sorted(obj)})")
    return obj[key]


_VERSION = re.compile(r"(\d+(?:\.\d+)*)")


def find_split(data_url: str, names: tuple[str, ...]) -> str:
    """The URL of the first of ``names`` (glob patterns, e.g. ``valid-v*.json``) in ``data_url``;
    among a pattern's matches the highest version (JGLUE ships v1.0 to v1.3 side by side)."""
    fs, root = fsspec.core.url_to_fs(data_url)
    root = root.rstrip("/")
    for name in names:
        found = sorted(fs.glob(f"{root}/{name}"))
        if found:
            best = max(
                found, key=lambda p: [int(x) for x in (_VERSION.findall(p.rsplit("/", 1)[-1]) or ["0"])[-1].split(".")]
            )
            return join_url(data_url, best.rsplit("/", 1)[-1])
    raise FileNotFoundError(f"{data_url}: none of {list(names)}")


# -- classification and regression ---------------------------------------------------------------
@dataclasses.dataclass
class Split:
    url: str
    examples: list
    skipped: int = 0


Reader = Callable[[str, Task, str], Split]


def _files(task: Task) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(train name patterns, dev name patterns) of a row (``Task.files``)."""
    return resolve(task.files)


def read_splits(unit: Family) -> None:
    """A JSON-lines unit's train and dev splits (``task.reader`` over ``task.files``); a dev split too
    small to judge by is refused (``check_eval_split``)."""
    task, reader, files = unit.task, resolve(unit.task.reader), _files(unit.task)
    unit.train_split = reader(find_split(unit.data_url, files[0]), task, "train")
    unit.dev_split = reader(find_split(unit.data_url, files[1]), task, "dev")
    check_eval_split(task.name, "dev", unit.dev_split.url, len(unit.dev_split.examples),
                     unit.config.min_eval_examples, {"unlabelled": unit.dev_split.skipped})  # fmt: skip


class Classification(Family):
    """A JSON-lines classification or regression unit (``task.layout``), GLUE's encoding and metrics."""

    select = "eval_score"

    def read(self) -> None:
        read_splits(self)
        logger.info("%s: %d train, %d dev examples", self.task.name, len(self.train_split.examples),
                    len(self.dev_split.examples))  # fmt: skip

    def _encode(self, split: Split) -> list[Feature]:
        return encode_examples(self.tokenizer, split.examples, self.task.layout, self.config.max_seq_length)

    def encode(self) -> list[Feature]:
        train_features, self.dev_features = self._encode(self.train_split), self._encode(self.dev_split)
        self.dev_labels = [f["labels"] for f in self.dev_features]
        return train_features

    def head(self, encoder):
        return BertForSequenceClassification(encoder, self.task.layout.num_labels, self.config.classifier_dropout)

    def predict(self, model, device) -> list:
        logits = predict(model, self.dev_features, self.eval_batch, ["logits"], device)["logits"]
        return predictions_from_logits(self.task.layout, logits)

    def score(self, predictions) -> dict[str, float]:
        return {f"eval_{k}": v for k, v in compute_metrics(self.task.layout, predictions, self.dev_labels).items()}

    def write(self, model, predictions, result, device) -> dict[str, float]:
        spec = self.task.layout
        rows = [
            json.dumps(
                {"id": ex.index, "prediction": format_prediction(spec, p), "label": ex.label}, ensure_ascii=False
            )
            for ex, p in zip(self.dev_split.examples, predictions)
        ]
        write_text(join_url(self.output_url, "predictions.jsonl"), "\n".join(rows) + "\n")
        counts = {k: float(v) for k, v in result.best_metrics.items() if k.startswith("eval_")}
        counts.update(
            train_examples=float(len(self.train_split.examples)),
            train_skipped=float(self.train_split.skipped),
            dev_examples=float(len(self.dev_split.examples)),
            dev_skipped=float(self.dev_split.skipped),
        )
        return counts

    def saved(self):
        return "BertForSequenceClassification", classifier_config(self.task.layout, self.config, self.task.name)


def classification_example(
    url: str, lineno: int, obj: dict, task: Task, index: str, text_a: str, text_b: str | None
) -> GlueExample:
    """A labelled example with the row's label checked against the task's label set."""
    spec = task.layout
    raw = field(url, lineno, obj, spec.label)
    if spec.is_regression:
        try:
            label: str | float = float(raw)
        except (TypeError, ValueError):
            raise JsonlDataError(f"{url}:{lineno}: {spec.label!r}: {raw!r} is not a number") from None
    else:
        label = str(raw).lower() if isinstance(raw, bool) else str(raw)
        if label not in spec.labels:
            raise JsonlDataError(f"{url}:{lineno}: {spec.label!r}: {raw!r} is not one of {list(spec.labels)}")
    return GlueExample(index, text_a, text_b, label)


# -- multiple choice -----------------------------------------------------------------------------
@dataclasses.dataclass
class ChoiceExample:
    qid: str
    question: str
    choices: list[str]
    label: int


class Choice(Family):
    """A multiple-choice unit: ``[CLS] question [SEP] choice [SEP]`` per choice, accuracy."""

    select = "eval_accuracy"
    eval_batch_floor = 32

    def read(self) -> None:
        read_splits(self)

    def _encode(self, examples: list[ChoiceExample]) -> list[Feature]:
        tokenizer = self.tokenizer
        tokenizer.enable_truncation(self.config.max_seq_length, strategy="longest_first")
        try:
            encs = tokenizer.encode_batch([(e.question, c) for e in examples for c in e.choices])
        finally:
            tokenizer.no_truncation()
        out, at = [], 0
        for e in examples:
            group = encs[at : at + len(e.choices)]
            at += len(e.choices)
            out.append({"input_ids": [g.ids for g in group], "token_type_ids": [g.type_ids for g in group],
                        "labels": e.label})  # fmt: skip
        return out

    def encode(self) -> list[Feature]:
        train_features, self.dev_features = (
            self._encode(self.train_split.examples),
            self._encode(self.dev_split.examples),
        )
        self.dev_labels = [e.label for e in self.dev_split.examples]
        return train_features

    def head(self, encoder):
        return BertForMultipleChoice(encoder, self.config.classifier_dropout)

    def predict(self, model, device) -> list[int]:
        logits = predict(model, self.dev_features, self.eval_batch, ["logits"], device)["logits"]
        return [max(range(len(r)), key=r.__getitem__) for r in logits]

    def score(self, predictions) -> dict[str, float]:
        return {"eval_accuracy": accuracy(predictions, self.dev_labels)}

    def write(self, model, predictions, result, device) -> dict[str, float]:
        rows = [
            json.dumps({"id": e.qid, "prediction": p, "label": e.label})
            for e, p in zip(self.dev_split.examples, predictions)
        ]
        write_text(join_url(self.output_url, "predictions.jsonl"), "\n".join(rows) + "\n")
        counts = {k: float(v) for k, v in result.best_metrics.items() if k.startswith("eval_")}
        counts.update(
            train_examples=float(len(self.train_split.examples)), dev_examples=float(len(self.dev_split.examples))
        )
        return counts

    def saved(self):
        return "BertForMultipleChoice", {"finetuning_task": self.task.name}


# -- span extraction -----------------------------------------------------------------------------
QaMetric = Callable[[dict[str, list[str]], dict[str, str]], dict[str, float]]


class SpanQa(squad.Unit):
    """A SQuAD-style span QA unit (SQuAD's reader, windows and decoding) scored by the row's own
    scorer (``Task.scorer``: question id -> gold texts, predictions -> {"exact_match", "f1", ...})."""

    @property
    def version(self) -> str:
        return "1.1"

    def check(self) -> None:
        """Nothing before the run (the run config checks the window for every QA row)."""

    def split_urls(self) -> tuple[str, str]:
        files = _files(self.task)
        return find_split(self.data_url, files[0]), find_split(self.data_url, files[1])

    def encode(self):
        features = super().encode()
        self.gold = squad.gold_answers(self.dev_examples)
        return features

    def dev_scores(self, texts: dict[str, str], null_odds: dict[str, float]):
        metric: QaMetric = resolve(self.task.scorer)
        return texts, metric(self.gold, texts)

    def score(self, predictions) -> dict[str, float]:
        return {f"eval_{k}": v for k, v in self.dev_scores(*predictions)[1].items()}

    def write(self, model, predictions, result, device) -> dict[str, float]:
        texts, self.scores = self.dev_scores(*predictions)
        write_json(join_url(self.output_url, "predictions.json"), texts)
        counts = {f"eval_{k}": float(v) for k, v in self.scores.items()}
        return {**counts, **self.feature_counts()}

    def saved(self):
        return "BertForQuestionAnswering", {"finetuning_task": self.task.name}

    def header(self):
        return {"task": self.task.name}
