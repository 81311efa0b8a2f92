"""GLUE: the nine tasks' TSV layouts and metrics, a strict reader, and the family's steps (``Unit``).

A task folder is laid out as the GLUE download script leaves it (``train.tsv``, ``dev.tsv`` or
MNLI's ``dev_matched.tsv``/``dev_mismatched.tsv``, optional ``test*.tsv``). Columns are found by
their header names (MNLI's label column sits at a different position in train and dev), except
CoLA's train/dev files, which have no header and are read by position.

Design choices:
1. A malformed row (too few fields, a label outside the task's label set, a score that is not a
   number) stops the run with ``file:line: column ...``. QQP's train file is known to hold a
   few broken rows; its policy is ``skip_malformed``: they are skipped, counted
   (``train_skipped`` in the manifest) and the first few logged, as the reference reader does.
2. Each task is scored with its official GLUE metrics (CoLA MCC, MRPC/QQP F1 and accuracy,
   STS-B Pearson and Spearman, the rest accuracy); the best epoch is the one with the highest
   mean of them, the task's GLUE score. MNLI is scored on matched dev (``eval_*``) and also
   reports mismatched dev (``eval_mm_*``).
3. Outputs: ``metrics.json`` (best epoch's dev metrics + history), ``predictions.tsv`` (dev
   index, prediction, label; MNLI adds ``predictions_mm.tsv``; STS-B scores at full precision),
   ``submission/<Task>.tsv`` in GLUE's ``index\\tprediction`` format for each test file present
   (MNLI's model also predicts GLUE's diagnostic set, ``diagnostic.tsv`` copied into the MNLI
   folder, as ``AX.tsv``), the best model (``model.safetensors`` + ``config.json``, HF names
   ``bert.*``/``classifier.*``, and the tokenizer) unless ``save_model`` is off, then
   ``_manifest.json`` last.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import fsspec

from model.contract import join_url
from tasks import metrics as M
from tasks.config import FinetuneConfig
from tasks.driver import Family
from tasks.finetune import Feature, check_eval_split, predict, write_text
from tasks.heads import BertForSequenceClassification
from tasks.registry import GlueLayout

logger = logging.getLogger("bertflow.finetune")


class GlueDataError(ValueError):
    """A malformed GLUE file; the message names the file, the line and the column."""


# Prefixes of the dev sets' metric names: the first dev file selects the best epoch.
DEV_PREFIXES = ("eval_", "eval_mm_")


# -- reading --------------------------------------------------------------------------------------
@dataclasses.dataclass
class GlueExample:
    index: str  # dev/train: the data row number (0-based); test: the file's index/id column
    text_a: str
    text_b: str | None
    label: str | float | None  # None in test files


@dataclasses.dataclass
class GlueSplit:
    url: str
    examples: list[GlueExample]
    skipped: int = 0


def _lines(url: str):
    """(line number, fields) of a TSV file; split on '\\n' only, so a stray '\\r' stays in a field."""
    with fsspec.open(url, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise GlueDataError(f"{url}:{lineno}: not valid UTF-8 ({exc})") from exc
            text = text.rstrip("\n").removesuffix("\r")
            if text.strip():
                yield lineno, text.split("\t")


def read_split(url: str, task: GlueLayout, split: str = "train") -> GlueSplit:
    """Read one GLUE TSV file of the task's layout (``Task.layout``). ``split`` is "train", "dev"
    or "test" (test: no labels)."""
    if split not in ("train", "dev", "test"):
        raise ValueError(f"split must be train, dev or test, got {split!r}")
    lines = _lines(url)
    if task.positional_columns and split != "test":
        header = list(task.positional_columns)
        first_data = None
    else:
        try:
            first_data, header = next(lines)
        except StopIteration:
            raise GlueDataError(f"{url}: empty file, expected a header line") from None
    wanted = {"text_a": task.text_a}
    if task.text_b:
        wanted["text_b"] = task.text_b
    if split == "test":
        wanted["index"] = task.index_column
    else:
        wanted["label"] = task.label
    columns = {}
    for role, name in wanted.items():
        if name not in header:
            raise GlueDataError(f"{url}:1: column {name!r} missing from the header {header} ({task.folder} {split})")
        columns[role] = header.index(name)
    needed = max(columns.values()) + 1

    examples: list[GlueExample] = []
    skipped = 0
    for lineno, fields in lines:
        try:
            examples.append(_parse_row(task, split, columns, needed, header, fields, len(examples)))
        except ValueError as exc:
            message = f"{url}:{lineno}: {exc}"
            if not task.skip_malformed or split == "test":
                raise GlueDataError(message) from None
            skipped += 1
            if skipped <= 5:
                logger.warning("skipping malformed row %s", message)
    if skipped:
        logger.warning("%s: skipped %d malformed rows (%s policy)", url, skipped, task.folder)
    return GlueSplit(url, examples, skipped)


def _parse_row(task, split, columns, needed, header, fields, row_number) -> GlueExample:
    if len(fields) < needed:
        missing = [header[i] for i in range(len(fields), needed) if i in columns.values()]
        raise ValueError(
            f"column {missing[0]!r} (#{header.index(missing[0]) + 1}) missing: the row has "
            f"{len(fields)} fields, {needed} needed"
        )
    text_b = fields[columns["text_b"]] if "text_b" in columns else None
    if split == "test":
        return GlueExample(fields[columns["index"]], fields[columns["text_a"]], text_b, None)
    raw = fields[columns["label"]].strip()
    if task.is_regression:
        try:
            label: str | float = float(raw)
        except ValueError:
            raise ValueError(f"column {task.label!r}: {raw!r} is not a number") from None
    else:
        if raw not in task.labels:
            raise ValueError(f"column {task.label!r}: {raw!r} is not one of {list(task.labels)}")
        label = raw
    return GlueExample(str(row_number), fields[columns["text_a"]], text_b, label)


# -- features and metrics -------------------------------------------------------------------------
def encode_examples(tokenizer, examples: list[GlueExample], task: GlueLayout, max_seq_length: int) -> list[Feature]:
    """[CLS] A [SEP] (B [SEP]) token ids, longest-first truncated; labels as ids or floats."""
    tokenizer.enable_truncation(max_seq_length, strategy="longest_first")
    try:
        if task.text_b:
            encodings = tokenizer.encode_batch([(e.text_a, e.text_b or "") for e in examples])
        else:
            encodings = tokenizer.encode_batch([e.text_a for e in examples])
    finally:
        tokenizer.no_truncation()
    features = []
    for e, enc in zip(examples, encodings):
        feature: Feature = {"input_ids": enc.ids, "token_type_ids": enc.type_ids}
        if e.label is not None:
            feature["labels"] = float(e.label) if task.is_regression else task.labels.index(e.label)
        features.append(feature)
    return features


def compute_metrics(task: GlueLayout, preds: list, labels: list) -> dict[str, float]:
    """The task's official metrics plus ``score``, their mean (the task's GLUE score)."""
    fns: dict[str, Callable] = {
        "accuracy": M.accuracy,
        "f1": M.f1_binary,
        "mcc": M.matthews_corrcoef,
        "pearson": M.pearson,
        "spearman": M.spearman,
    }
    out = {name: float(fns[name](preds, labels)) for name in task.metrics}
    out["score"] = sum(out.values()) / len(out)
    return out


def predictions_from_logits(task: GlueLayout, logits: list[list[float]]) -> list:
    if task.is_regression:
        return [row[0] for row in logits]
    return [max(range(len(row)), key=row.__getitem__) for row in logits]


def format_prediction(task: GlueLayout, pred, clip: bool = False) -> str:
    """A label string, or a regression score at full precision (``repr``: it reads back to the
    same float, so the reported correlations can be recomputed from the file). ``clip``: into
    STS-B's [0, 5], as the GLUE server takes it."""
    if task.is_regression:
        return repr(float(min(5.0, max(0.0, pred)) if clip else pred))
    return task.labels[pred]


# -- the family's steps (tasks.driver.run_unit runs them) -----------------------------------------
class Unit(Family):
    """A GLUE task's unit: its TSV splits, sentence(-pair) encoding, the classification head, the
    task's official metrics (the best epoch: the highest ``eval_score``, their mean)."""

    select = "eval_score"

    def read(self) -> None:
        spec, data_url, config = self.task.layout, self.data_url, self.config
        fs, data_root = fsspec.core.url_to_fs(data_url)
        self.train_split = read_split(join_url(data_url, "train.tsv"), spec, "train")
        self.dev_splits = [read_split(join_url(data_url, name), spec, "dev") for name in spec.dev_files]
        self.test_names = [n for n in spec.test_files if fs.exists(f"{data_root.rstrip('/')}/{n}")]
        self.test_splits = [read_split(join_url(data_url, n), spec, "test") for n in self.test_names]
        for kind, splits in (("dev", self.dev_splits), ("test", self.test_splits)):
            for s in splits:
                skipped = {"malformed": s.skipped}
                check_eval_split(self.task.name, kind, s.url, len(s.examples), config.min_eval_examples, skipped)
        logger.info(
            "%s: %d train, %s dev, %s test examples",
            spec.folder,
            len(self.train_split.examples),
            [len(s.examples) for s in self.dev_splits],
            [len(s.examples) for s in self.test_splits],
        )

    def _encode(self, split: GlueSplit) -> list[Feature]:
        return encode_examples(self.tokenizer, split.examples, self.task.layout, self.config.max_seq_length)

    def encode(self) -> list[Feature]:
        train_features = self._encode(self.train_split)
        self.dev_features = [self._encode(s) for s in self.dev_splits]
        self.dev_labels = [[f["labels"] for f in feats] for feats in self.dev_features]
        return train_features

    def head(self, encoder):
        return BertForSequenceClassification(encoder, self.task.layout.num_labels, self.config.classifier_dropout)

    def predict(self, model, device) -> list[list]:
        spec = self.task.layout
        return [
            predictions_from_logits(spec, predict(model, feats, self.eval_batch, ["logits"], device)["logits"])
            for feats in self.dev_features
        ]

    def score(self, predictions: list[list]) -> dict[str, float]:
        out = {}
        for prefix, preds, labels in zip(DEV_PREFIXES, predictions, self.dev_labels):
            out.update({prefix + k: v for k, v in compute_metrics(self.task.layout, preds, labels).items()})
        return out

    def write(self, model, predictions, result, device) -> dict[str, float]:
        spec, output_url = self.task.layout, self.output_url
        for i, (split, preds) in enumerate(zip(self.dev_splits, predictions)):
            rows = ["index\tprediction\tlabel"]
            for ex, pred in zip(split.examples, preds):
                label = repr(ex.label) if spec.is_regression else ex.label
                rows.append(f"{ex.index}\t{format_prediction(spec, pred)}\t{label}")
            name = "predictions.tsv" if i == 0 else "predictions_mm.tsv"
            write_text(join_url(output_url, name), "\n".join(rows) + "\n")
        for name, split in zip(self.test_names, self.test_splits):
            logits = predict(model, self._encode(split), self.eval_batch, ["logits"], device)["logits"]
            write_submission(spec, output_url, name, split.examples, predictions_from_logits(spec, logits))
        counts = {k: float(v) for k, v in result.best_metrics.items() if k.startswith("eval_")}
        counts.update(
            train_examples=float(len(self.train_split.examples)),
            train_skipped=float(self.train_split.skipped),
            dev_skipped=float(sum(s.skipped for s in self.dev_splits)),
            dev_examples=float(len(self.dev_splits[0].examples)),
            test_examples=float(sum(len(s.examples) for s in self.test_splits)),
        )
        if len(self.dev_splits) > 1:
            counts["dev_mm_examples"] = float(len(self.dev_splits[1].examples))
        return counts

    def saved(self):
        return "BertForSequenceClassification", classifier_config(self.task.layout, self.config, self.task.name)

    def header(self):
        return {"task": self.task.layout.folder}


def classifier_config(spec: GlueLayout, config: FinetuneConfig, name: str) -> dict:
    """The config.json extras of a fine-tuned sequence classifier (labels, problem type)."""
    extra = {"num_labels": spec.num_labels, "classifier_dropout": config.classifier_dropout, "finetuning_task": name}
    if spec.is_regression:
        extra.update(problem_type="regression", id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    else:
        extra.update(
            problem_type="single_label_classification",
            id2label={str(i): label for i, label in enumerate(spec.labels)},
            label2id={label: i for i, label in enumerate(spec.labels)},
        )
    return extra


def write_submission(
    spec: GlueLayout, output_url: str, test_file: str, examples: list[GlueExample], predictions: list
) -> str:
    """GLUE's ``index\tprediction`` file for one test file (``submission/CoLA.tsv``, MNLI's
    ``MNLI-m.tsv`` ...); returns its URL."""
    stem = (spec.submissions or (spec.folder,))[spec.test_files.index(test_file)]
    rows = ["index\tprediction"] + [
        f"{ex.index}\t{format_prediction(spec, p, clip=True)}" for ex, p in zip(examples, predictions)
    ]
    url = join_url(output_url, "submission", f"{stem}.tsv")
    write_text(url, "\n".join(rows) + "\n")
    return url
