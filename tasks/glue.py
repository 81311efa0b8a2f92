"""GLUE: the nine tasks' TSV layouts and metrics, a strict reader, and ``run_glue``.

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
import time
from collections.abc import Callable

import fsspec

from model.contract import Manifest, join_url, write_manifest
from tasks import metrics as M
from tasks.config import FinetuneConfig
from tasks.finetune import (
    Feature,
    LogFn,
    begin_run,
    check_eval_split,
    load_encoder,
    pick_device,
    predict,
    save_finetuned,
    train,
    write_json,
    write_text,
)
from tasks.heads import BertForSequenceClassification
from tasks.registry import GlueLayout, Task, family_tasks

logger = logging.getLogger("bertflow.finetune")


class GlueDataError(ValueError):
    """A malformed GLUE file; the message names the file, the line and the column."""


TASKS: dict[str, GlueLayout] = {name: t.layout for name, t in family_tasks("glue").items()}
"""The GLUE tasks' layouts, from the registry (``tasks.registry``)."""

# Prefixes of the dev sets' metric names: the first dev file selects the best epoch.
DEV_PREFIXES = ("eval_", "eval_mm_")


def get_task(task: str) -> GlueLayout:
    """A task by its canonical or GLUE name, case and '-'/'_' ignored: "SST-2", "sst2", "sts_b"."""
    key = task.lower().replace("-", "").replace("_", "")
    if key not in TASKS:
        raise ValueError(f"unknown GLUE task {task!r}; known: {', '.join(t.folder for t in TASKS.values())}")
    return TASKS[key]


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


def read_split(url: str, task: GlueLayout | str, split: str = "train") -> GlueSplit:
    """Read one GLUE TSV file. ``split`` is "train", "dev" or "test" (test: no labels)."""
    task = get_task(task) if isinstance(task, str) else task
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


# -- the stage ------------------------------------------------------------------------------------
def run_glue(
    config: FinetuneConfig,
    task: str,
    data_url: str,
    model_url: str,
    output_url: str,
    log_fn: LogFn | None = None,
    save_model: bool = True,
) -> Manifest:
    """Fine-tune the exported model at ``model_url`` on one GLUE task folder; write the outputs."""
    started = time.time()
    spec = get_task(task)
    inputs, tokenizer = begin_run(config.seed, model_url, data_url, output_url)

    fs, data_root = fsspec.core.url_to_fs(data_url)
    train_split = read_split(join_url(data_url, "train.tsv"), spec, "train")
    dev_splits = [read_split(join_url(data_url, name), spec, "dev") for name in spec.dev_files]
    test_names = [n for n in spec.test_files if fs.exists(f"{data_root.rstrip('/')}/{n}")]
    test_splits = [read_split(join_url(data_url, n), spec, "test") for n in test_names]
    for kind, splits in (("dev", dev_splits), ("test", test_splits)):
        for s in splits:
            check_eval_split(task, kind, s.url, len(s.examples), config.min_eval_examples, {"malformed": s.skipped})
    logger.info(
        "%s: %d train, %s dev, %s test examples",
        spec.folder,
        len(train_split.examples),
        [len(s.examples) for s in dev_splits],
        [len(s.examples) for s in test_splits],
    )

    def encode(split: GlueSplit) -> list[Feature]:
        return encode_examples(tokenizer, split.examples, spec, config.max_seq_length)

    train_features = encode(train_split)
    dev_features = [encode(s) for s in dev_splits]
    dev_labels = [[f["labels"] for f in feats] for feats in dev_features]

    bert = load_encoder(model_url)
    model = BertForSequenceClassification(bert, spec.num_labels, config.classifier_dropout)
    device = pick_device()
    model.to(device)
    eval_batch = max(config.batch_size, 64)

    def dev_predictions(m) -> list[list]:
        return [
            predictions_from_logits(spec, predict(m, feats, eval_batch, ["logits"], device)["logits"])
            for feats in dev_features
        ]

    def evaluate(m) -> dict[str, float]:
        out = {}
        for prefix, preds, labels in zip(DEV_PREFIXES, dev_predictions(m), dev_labels):
            out.update({prefix + k: v for k, v in compute_metrics(spec, preds, labels).items()})
        return out

    result = train(model, train_features, config, evaluate, "eval_score", log_fn, device)

    # Outputs of the best epoch (its weights are loaded).
    best_preds = dev_predictions(model)
    for i, (split, preds) in enumerate(zip(dev_splits, best_preds)):
        rows = ["index\tprediction\tlabel"]
        for ex, pred in zip(split.examples, preds):
            label = repr(ex.label) if spec.is_regression else ex.label
            rows.append(f"{ex.index}\t{format_prediction(spec, pred)}\t{label}")
        name = "predictions.tsv" if i == 0 else "predictions_mm.tsv"
        write_text(join_url(output_url, name), "\n".join(rows) + "\n")
    for name, split in zip(test_names, test_splits):
        logits = predict(model, encode(split), eval_batch, ["logits"], device)["logits"]
        write_submission(spec, output_url, name, split.examples, predictions_from_logits(spec, logits))

    extra = {
        "num_labels": spec.num_labels,
        "classifier_dropout": config.classifier_dropout,
        "finetuning_task": spec.name,
    }
    if spec.is_regression:
        extra.update(problem_type="regression", id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    else:
        extra.update(
            problem_type="single_label_classification",
            id2label={str(i): name for i, name in enumerate(spec.labels)},
            label2id={name: i for i, name in enumerate(spec.labels)},
        )
    if save_model:
        save_finetuned(model, model.config, output_url, "BertForSequenceClassification", extra, model_url)

    seconds = time.time() - started
    counts = {k: float(v) for k, v in result.best_metrics.items() if k.startswith("eval_")}
    counts.update(
        train_examples=float(len(train_split.examples)),
        train_skipped=float(train_split.skipped),
        dev_skipped=float(sum(s.skipped for s in dev_splits)),
        dev_examples=float(len(dev_splits[0].examples)),
        test_examples=float(sum(len(s.examples) for s in test_splits)),
        best_epoch=float(result.best_epoch),
        steps=float(result.steps),
        seconds=seconds,
    )
    if len(dev_splits) > 1:
        counts["dev_mm_examples"] = float(len(dev_splits[1].examples))
    write_json(
        join_url(output_url, "metrics.json"),
        {
            "task": spec.folder,
            **counts,
            "history": result.history,
        },
    )
    logger.info(
        "%s done in %.1f s: %s",
        spec.folder,
        seconds,
        ", ".join(f"{k} {v:.4f}" for k, v in counts.items() if k.startswith("eval_")),
    )
    return write_manifest(
        f"finetune-{task}", output_url, manifest_config(config, task), inputs, counts, seconds=seconds
    )


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


def manifest_config(config: FinetuneConfig, task: str) -> dict:
    """The config run_glue records in its manifest (the flow compares it to skip a finished run)."""
    return {**dataclasses.asdict(config), "task": get_task(task).name}


def run_task(
    task: Task,
    config: FinetuneConfig,
    data_url: str,
    model_url: str,
    output_url: str,
    log_fn: LogFn | None = None,
    save_model: bool = True,
    unit: dict | None = None,
) -> Manifest:
    """The registry's entry point (``Task.run``): :func:`run_glue` for the task's layout."""
    return run_glue(config, task.name, data_url, model_url, output_url, log_fn=log_fn, save_model=save_model)
