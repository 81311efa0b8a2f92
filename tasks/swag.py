"""SWAG: the CSV reader, four-way multiple choice, and the family's steps (``Unit``).

As in the paper: each of the four endings makes one input ``[CLS] sent1 [SEP] sent2 ending
[SEP]``; the pooled [CLS] vector of each gets one score from a shared vector, and a softmax
over the four is the loss (:class:`tasks.heads.BertForMultipleChoice`). Columns are found by
their header names (SWAG's ``train.csv``/``val.csv``, and ``test.csv`` with no ``label``); a
row with a missing or empty ending (or context), or a label outside 0-3, stops the run with
``file:line``; a dev or test file with no row fails the task (``finetune.min_eval_examples``). Outputs:
``metrics.json``, ``predictions.csv`` (dev row id, predicted ending, label, and the four
softmax probabilities at full precision), ``test_predictions.csv`` when a test file is present.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import math

import fsspec

from model.contract import join_url
from tasks.driver import Family
from tasks.finetune import Feature, check_eval_split, predict, write_text
from tasks.heads import BertForMultipleChoice
from tasks.metrics import accuracy

logger = logging.getLogger("bertflow.finetune")
ENDINGS = ("ending0", "ending1", "ending2", "ending3")


class SwagDataError(ValueError):
    """A malformed SWAG file; the message names the file and the line."""


@dataclasses.dataclass
class SwagExample:
    row_id: str
    context: str  # sent1
    start: str  # sent2, the start of the sentence each ending completes
    endings: list[str]
    label: int | None


def read_swag(url: str, labelled: bool = True) -> list[SwagExample]:
    with fsspec.open(url, "r", encoding="utf-8-sig", newline="") as f:
        text = f.read()
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise SwagDataError(f"{url}: empty file, expected SWAG's CSV header") from None
    wanted = ["sent1", "sent2", *ENDINGS] + (["label"] if labelled else [])
    missing = [c for c in wanted if c not in header]
    if missing:
        raise SwagDataError(f"{url}:1: columns {missing} missing from the header {header}")
    col = {c: header.index(c) for c in wanted}
    id_col = 0 if header[0] in ("", "id") else None
    examples = []
    for row in reader:
        lineno = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise SwagDataError(f"{url}:{lineno}: {len(row)} fields, the header has {len(header)}")
        empty = [c for c in ("sent1", *ENDINGS) if not row[col[c]].strip()]
        if empty:
            raise SwagDataError(f"{url}:{lineno}: column(s) {empty} empty: every row needs a context and four endings")
        label = None
        if labelled:
            raw = row[col["label"]].strip()
            if raw not in ("0", "1", "2", "3"):
                raise SwagDataError(f"{url}:{lineno}: column 'label': {raw!r} is not 0, 1, 2 or 3")
            label = int(raw)
        row_id = row[id_col] if id_col is not None and row[id_col] else str(len(examples))
        examples.append(
            SwagExample(row_id, row[col["sent1"]], row[col["sent2"]], [row[col[e]] for e in ENDINGS], label)
        )
    return examples


def encode_swag(tokenizer, examples: list[SwagExample], max_seq_length: int) -> list[Feature]:
    tokenizer.enable_truncation(max_seq_length, strategy="longest_first")
    try:
        pairs = [(e.context, f"{e.start} {ending}".strip()) for e in examples for ending in e.endings]
        encodings = tokenizer.encode_batch(pairs)
    finally:
        tokenizer.no_truncation()
    features = []
    for i, e in enumerate(examples):
        encs = encodings[4 * i : 4 * i + 4]
        feature: Feature = {"input_ids": [enc.ids for enc in encs], "token_type_ids": [enc.type_ids for enc in encs]}
        if e.label is not None:
            feature["labels"] = e.label
        features.append(feature)
    return features


def softmax(row: list[float]) -> list[float]:
    top = max(row)
    exps = [math.exp(x - top) for x in row]
    total = sum(exps)
    return [x / total for x in exps]


# -- the family's steps (tasks.driver.run_unit runs them) -----------------------------------------
def _argmax(rows: list[list[float]]) -> list[int]:
    return [max(range(4), key=r.__getitem__) for r in rows]


class Unit(Family):
    """SWAG's unit: four [CLS] context [SEP] ending [SEP] rows per example, multiple choice, accuracy."""

    select = "eval_accuracy"
    eval_batch_floor = 32

    def read(self) -> None:
        opts, data_url, config = self.config.swag, self.data_url, self.config
        self.train_ex = read_swag(join_url(data_url, opts.train_file))
        self.dev_ex = read_swag(join_url(data_url, opts.dev_file))
        fs, root = fsspec.core.url_to_fs(data_url)
        has_test = fs.exists(f"{root.rstrip('/')}/{opts.test_file}")
        self.test_ex = read_swag(join_url(data_url, opts.test_file), labelled=False) if has_test else []
        floor = config.min_eval_examples
        check_eval_split(self.task.name, "dev", join_url(data_url, opts.dev_file), len(self.dev_ex), floor)
        if has_test:
            check_eval_split(self.task.name, "test", join_url(data_url, opts.test_file), len(self.test_ex), floor)

    def encode(self):
        train_features = encode_swag(self.tokenizer, self.train_ex, self.config.max_seq_length)
        self.dev_features = encode_swag(self.tokenizer, self.dev_ex, self.config.max_seq_length)
        self.dev_labels = [e.label for e in self.dev_ex]
        return train_features

    def head(self, encoder):
        return BertForMultipleChoice(encoder, self.config.classifier_dropout)

    def _logits(self, model, device, features):
        return predict(model, features, self.eval_batch, ["logits"], device)["logits"]

    def predict(self, model, device):
        return self._logits(model, device, self.dev_features)

    def score(self, predictions) -> dict[str, float]:
        return {"eval_accuracy": accuracy(_argmax(predictions), self.dev_labels)}

    def _write_rows(self, name, examples, logits, labelled):
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["id", "prediction"] + (["label"] if labelled else []) + [f"prob{k}" for k in range(4)])
        for e, row, p in zip(examples, logits, _argmax(logits)):
            w.writerow([e.row_id, p] + ([e.label] if labelled else []) + [repr(x) for x in softmax(row)])
        write_text(join_url(self.output_url, name), buf.getvalue())

    def write(self, model, predictions, result, device) -> dict[str, float]:
        acc = accuracy(_argmax(predictions), self.dev_labels)
        self._write_rows("predictions.csv", self.dev_ex, predictions, True)
        if self.test_ex:
            features = encode_swag(self.tokenizer, self.test_ex, self.config.max_seq_length)
            self._write_rows("test_predictions.csv", self.test_ex, self._logits(model, device, features), False)
        return {
            "eval_accuracy": float(acc),
            "train_examples": float(len(self.train_ex)),
            "dev_examples": float(len(self.dev_ex)),
            "test_examples": float(len(self.test_ex)),
        }

    def saved(self):
        return "BertForMultipleChoice", {"finetuning_task": "swag"}

    def header(self):
        return {}
