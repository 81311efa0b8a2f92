"""SWAG: the CSV reader, four-way multiple choice, and ``run_swag``.

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
import time

import fsspec

from model.contract import Manifest, join_url, write_manifest
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
from tasks.heads import BertForMultipleChoice
from tasks.metrics import accuracy
from tasks.registry import Task

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


def run_swag(
    config: FinetuneConfig,
    data_url: str,
    model_url: str,
    output_url: str,
    log_fn: LogFn | None = None,
    save_model: bool = True,
) -> Manifest:
    started = time.time()
    opts = config.swag
    inputs, tokenizer = begin_run(config.seed, model_url, data_url, output_url)
    train_ex = read_swag(join_url(data_url, opts.train_file))
    dev_ex = read_swag(join_url(data_url, opts.dev_file))
    fs, root = fsspec.core.url_to_fs(data_url)
    has_test = fs.exists(f"{root.rstrip('/')}/{opts.test_file}")
    test_ex = read_swag(join_url(data_url, opts.test_file), labelled=False) if has_test else []
    check_eval_split("swag", "dev", join_url(data_url, opts.dev_file), len(dev_ex), config.min_eval_examples)
    if has_test:
        check_eval_split("swag", "test", join_url(data_url, opts.test_file), len(test_ex), config.min_eval_examples)
    train_features = encode_swag(tokenizer, train_ex, config.max_seq_length)
    dev_features = encode_swag(tokenizer, dev_ex, config.max_seq_length)
    dev_labels = [e.label for e in dev_ex]

    model = BertForMultipleChoice(load_encoder(model_url), config.classifier_dropout)
    device = pick_device()
    model.to(device)
    eval_batch = max(config.batch_size, 32)

    def scores(m, features):
        return predict(m, features, eval_batch, ["logits"], device)["logits"]

    def argmax(rows):
        return [max(range(4), key=r.__getitem__) for r in rows]

    def evaluate(m) -> dict[str, float]:
        return {"eval_accuracy": accuracy(argmax(scores(m, dev_features)), dev_labels)}

    result = train(model, train_features, config, evaluate, "eval_accuracy", log_fn, device)

    def write_rows(name, examples, logits, labelled):
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["id", "prediction"] + (["label"] if labelled else []) + [f"prob{k}" for k in range(4)])
        for e, row, p in zip(examples, logits, argmax(logits)):
            w.writerow([e.row_id, p] + ([e.label] if labelled else []) + [repr(x) for x in softmax(row)])
        write_text(join_url(output_url, name), buf.getvalue())

    dev_logits = scores(model, dev_features)
    acc = accuracy(argmax(dev_logits), dev_labels)
    write_rows("predictions.csv", dev_ex, dev_logits, True)
    if test_ex:
        write_rows(
            "test_predictions.csv",
            test_ex,
            scores(model, encode_swag(tokenizer, test_ex, config.max_seq_length)),
            False,
        )
    if save_model:
        save_finetuned(model, model.config, output_url, "BertForMultipleChoice", {"finetuning_task": "swag"}, model_url)
    seconds = time.time() - started
    counts = {
        "eval_accuracy": float(acc),
        "train_examples": float(len(train_ex)),
        "dev_examples": float(len(dev_ex)),
        "test_examples": float(len(test_ex)),
        "best_epoch": float(result.best_epoch),
        "steps": float(result.steps),
        "seconds": seconds,
    }
    write_json(join_url(output_url, "metrics.json"), {**counts, "history": result.history})
    logger.info("SWAG done in %.1f s: accuracy %.4f", seconds, acc)
    return write_manifest(
        "finetune-swag", output_url, {**dataclasses.asdict(config), "task": "swag"}, inputs, counts, seconds=seconds
    )


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
    """The registry's entry point (``Task.run``)."""
    return run_swag(config, data_url, model_url, output_url, log_fn=log_fn, save_model=save_model)
