"""The runners of the JSON-lines benchmarks (JGLUE, CLUE): sentence(-pair) classification and
regression, multiple choice, and SQuAD-style span extraction scored by the benchmark's metric.

A family module (``tasks/jglue.py``, ``tasks/clue.py``) reads its official files into the
shapes here and names its metric; these functions do the rest as the GLUE, SWAG and SQuAD
families do (the same encoding, loop, best-epoch keeping, outputs and manifest), so a task is a
registry row plus its reader. Design choices:

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
import time
from collections.abc import Callable

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
from tasks.glue import GlueExample, compute_metrics, encode_examples, format_prediction, predictions_from_logits
from tasks.heads import BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification
from tasks.metrics import accuracy
from tasks.registry import Task

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


def run_classification(
    task: Task, config: FinetuneConfig, data_url: str, model_url: str, output_url: str,
    reader: Reader, files: tuple[tuple[str, ...], tuple[str, ...]], log_fn: LogFn | None = None,
    save_model: bool = True,
) -> Manifest:  # fmt: skip
    """Fine-tune and score one JSON-lines classification or regression task (``task.layout``)."""
    started = time.time()
    spec = task.layout
    inputs, tokenizer = begin_run(config.seed, model_url, data_url, output_url)
    train_split = reader(find_split(data_url, files[0]), task, "train")
    dev_split = reader(find_split(data_url, files[1]), task, "dev")
    check_eval_split(task.name, "dev", dev_split.url, len(dev_split.examples), config.min_eval_examples,
                     {"unlabelled": dev_split.skipped})  # fmt: skip
    logger.info("%s: %d train, %d dev examples", task.name, len(train_split.examples), len(dev_split.examples))

    def encode(split: Split) -> list[Feature]:
        return encode_examples(tokenizer, split.examples, spec, config.max_seq_length)

    train_features, dev_features = encode(train_split), encode(dev_split)
    dev_labels = [f["labels"] for f in dev_features]
    model = BertForSequenceClassification(load_encoder(model_url), spec.num_labels, config.classifier_dropout)
    device = pick_device()
    model.to(device)
    eval_batch = max(config.batch_size, 64)

    def dev_predictions(m) -> list:
        return predictions_from_logits(spec, predict(m, dev_features, eval_batch, ["logits"], device)["logits"])

    def evaluate(m) -> dict[str, float]:
        return {f"eval_{k}": v for k, v in compute_metrics(spec, dev_predictions(m), dev_labels).items()}

    result = train(model, train_features, config, evaluate, "eval_score", log_fn, device)
    rows = [
        json.dumps({"id": ex.index, "prediction": format_prediction(spec, p), "label": ex.label}, ensure_ascii=False)
        for ex, p in zip(dev_split.examples, dev_predictions(model))
    ]
    write_text(join_url(output_url, "predictions.jsonl"), "\n".join(rows) + "\n")
    extra = {
        "num_labels": spec.num_labels,
        "classifier_dropout": config.classifier_dropout,
        "finetuning_task": task.name,
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
    counts = {k: float(v) for k, v in result.best_metrics.items() if k.startswith("eval_")}
    counts.update(
        train_examples=float(len(train_split.examples)),
        train_skipped=float(train_split.skipped),
        dev_examples=float(len(dev_split.examples)),
        dev_skipped=float(dev_split.skipped),
    )
    return _finish(task, config, inputs, counts, result, output_url, started)


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


def run_choice(
    task: Task, config: FinetuneConfig, data_url: str, model_url: str, output_url: str,
    reader: Reader, files: tuple[tuple[str, ...], tuple[str, ...]], log_fn: LogFn | None = None,
    save_model: bool = True,
) -> Manifest:  # fmt: skip
    """Fine-tune and score a multiple-choice task: ``[CLS] question [SEP] choice [SEP]`` per choice."""
    started = time.time()
    inputs, tokenizer = begin_run(config.seed, model_url, data_url, output_url)
    train_split = reader(find_split(data_url, files[0]), task, "train")
    dev_split = reader(find_split(data_url, files[1]), task, "dev")
    check_eval_split(task.name, "dev", dev_split.url, len(dev_split.examples), config.min_eval_examples,
                     {"unlabelled": dev_split.skipped})  # fmt: skip

    def encode(examples: list[ChoiceExample]) -> list[Feature]:
        tokenizer.enable_truncation(config.max_seq_length, strategy="longest_first")
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

    train_features, dev_features = encode(train_split.examples), encode(dev_split.examples)
    dev_labels = [e.label for e in dev_split.examples]
    model = BertForMultipleChoice(load_encoder(model_url), config.classifier_dropout)
    device = pick_device()
    model.to(device)

    def dev_predictions(m) -> list[int]:
        logits = predict(m, dev_features, max(config.batch_size, 32), ["logits"], device)["logits"]
        return [max(range(len(r)), key=r.__getitem__) for r in logits]

    def evaluate(m) -> dict[str, float]:
        return {"eval_accuracy": accuracy(dev_predictions(m), dev_labels)}

    result = train(model, train_features, config, evaluate, "eval_accuracy", log_fn, device)
    rows = [
        json.dumps({"id": e.qid, "prediction": p, "label": e.label})
        for e, p in zip(dev_split.examples, dev_predictions(model))
    ]
    write_text(join_url(output_url, "predictions.jsonl"), "\n".join(rows) + "\n")
    if save_model:
        save_finetuned(
            model, model.config, output_url, "BertForMultipleChoice", {"finetuning_task": task.name}, model_url
        )
    counts = {k: float(v) for k, v in result.best_metrics.items() if k.startswith("eval_")}
    counts.update(train_examples=float(len(train_split.examples)), dev_examples=float(len(dev_split.examples)))
    return _finish(task, config, inputs, counts, result, output_url, started)


# -- span extraction -----------------------------------------------------------------------------
QaMetric = Callable[[dict[str, list[str]], dict[str, str]], dict[str, float]]


def run_span_qa(
    task: Task, config: FinetuneConfig, data_url: str, model_url: str, output_url: str,
    files: tuple[tuple[str, ...], tuple[str, ...]], metric: QaMetric, log_fn: LogFn | None = None,
    save_model: bool = True,
) -> Manifest:  # fmt: skip
    """Fine-tune on a SQuAD-style JSON file and score dev with the benchmark's ``metric``."""
    from tasks.squad import decode_spans, gold_answers, make_features, read_squad

    started = time.time()
    sq = config.squad
    inputs, tokenizer = begin_run(config.seed, model_url, data_url, output_url)
    train_examples = read_squad(find_split(data_url, files[0]), "1.1")
    dev_url = find_split(data_url, files[1])
    dev_examples = read_squad(dev_url, "1.1")
    check_eval_split(task.name, "dev", dev_url, len(dev_examples), config.min_eval_examples)
    window = dict(
        max_seq_length=sq.max_seq_length or config.max_seq_length,
        doc_stride=sq.doc_stride,
        max_query_length=sq.max_query_length,
    )
    train_features, _, skipped = make_features(tokenizer, train_examples, training=True, **window)
    dev_features, dev_windows, _ = make_features(tokenizer, dev_examples, **window)
    gold = gold_answers(dev_examples)
    model = BertForQuestionAnswering(load_encoder(model_url))
    device = pick_device()
    model.to(device)

    def dev_predictions(m) -> tuple[dict[str, str], dict[str, float]]:
        out = predict(m, dev_features, max(config.batch_size, 32), ["start_logits", "end_logits"], device)
        texts, _ = decode_spans(
            dev_examples, dev_windows, out["start_logits"], out["end_logits"], sq.n_best_size, sq.max_answer_length
        )
        return texts, metric(gold, texts)

    def evaluate(m) -> dict[str, float]:
        return {f"eval_{k}": v for k, v in dev_predictions(m)[1].items()}

    result = train(model, train_features, config, evaluate, "eval_f1", log_fn, device)
    texts, scores = dev_predictions(model)
    write_json(join_url(output_url, "predictions.json"), texts)
    if save_model:
        save_finetuned(
            model, model.config, output_url, "BertForQuestionAnswering", {"finetuning_task": task.name}, model_url
        )
    counts = {f"eval_{k}": float(v) for k, v in scores.items()}
    counts.update(
        train_examples=float(len(train_examples)),
        train_features=float(len(train_features)),
        train_skipped=float(skipped),
        dev_examples=float(len(dev_examples)),
        dev_features=float(len(dev_features)),
    )
    return _finish(task, config, inputs, counts, result, output_url, started)


def _finish(task: Task, config: FinetuneConfig, inputs, counts: dict, result, output_url: str, started: float):
    seconds = time.time() - started
    counts.update(best_epoch=float(result.best_epoch), steps=float(result.steps), seconds=seconds)
    write_json(join_url(output_url, "metrics.json"), {"task": task.name, **counts, "history": result.history})
    logger.info(
        "%s done in %.1f s: %s",
        task.name,
        seconds,
        ", ".join(f"{k} {v:.4f}" for k, v in counts.items() if k.startswith("eval_")),
    )
    return write_manifest(
        f"finetune-{task.name}", output_url, {**dataclasses.asdict(config), "task": task.name}, inputs, counts,
        seconds=seconds,
    )  # fmt: skip
