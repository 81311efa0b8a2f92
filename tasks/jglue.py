"""JGLUE: MARC-ja, JSTS, JNLI, JSQuAD and JCommonsenseQA in the files the JGLUE repository
publishes (``datasets/<task>-v1.x/{train,valid}-v1.x.json``), with JGLUE's metrics.

Files are JSON lines (one object a line, keys as published: ``sentence``/``label`` for MARC-ja,
``sentence1``/``sentence2``/``label`` for JSTS and JNLI, ``question``/``choice0..4``/``label`` for
JCommonsenseQA), except JSQuAD, which is SQuAD v1.1 JSON with ``title [SEP] text`` contexts.
The newest version in a folder is read (``train-v1.3.json`` over ``train-v1.1.json``).

Metrics, as JGLUE's fine-tuning scripts compute them: accuracy (MARC-ja, JNLI,
JCommonsenseQA), Pearson and Spearman (JSTS), and for JSQuAD the exact match and F1 of JGLUE's
patched ``squad_metrics.py``: the answer is lower-cased, a trailing "。" is removed and
whitespace runs become one space (no punctuation or article removal), and F1 counts
*characters* (whitespace included) rather than words (:func:`jsquad_evaluate`).
"""

from __future__ import annotations

import collections

from tasks.jsonl import (
    ChoiceExample,
    JsonlDataError,
    Split,
    classification_example,
    field,
    read_jsonl,
)
from tasks.registry import Task

FILES = (("train-v*.json",), ("valid-v*.json",))
"""Train and dev file names of every JGLUE task folder (dev is JGLUE's ``valid``)."""
NUM_CHOICES = 5


def read_jglue(url: str, task: Task, split: str = "train") -> Split:
    """One split of a JGLUE classification, regression or multiple-choice task."""
    rows = read_jsonl(url)
    if not rows:
        raise JsonlDataError(f"{url}: no examples")
    if task.options.get("kind") == "choice":
        return Split(url, [_choice(url, n, obj) for n, obj in rows])
    spec = task.layout
    examples = []
    for i, (n, obj) in enumerate(rows):
        text_b = field(url, n, obj, spec.text_b) if spec.text_b else None
        index = str(obj.get("sentence_pair_id", obj.get("review_id", i)))
        examples.append(classification_example(url, n, obj, task, index, field(url, n, obj, spec.text_a), text_b))
    return Split(url, examples)


def _choice(url: str, lineno: int, obj: dict) -> ChoiceExample:
    choices = [str(field(url, lineno, obj, f"choice{k}")) for k in range(NUM_CHOICES)]
    label = field(url, lineno, obj, "label")
    if not isinstance(label, int) or not 0 <= label < NUM_CHOICES:
        raise JsonlDataError(f"{url}:{lineno}: 'label': {label!r} is not a choice index 0-{NUM_CHOICES - 1}")
    return ChoiceExample(str(obj.get("q_id", lineno)), str(field(url, lineno, obj, "question")), choices, label)


# -- JSQuAD's metric -----------------------------------------------------------------------------
def normalize_jsquad(s: str) -> str:
    """JGLUE's ``normalize_answer``: lower-case, no punctuation removal, a trailing 。 removed
    (where the English script removed articles), whitespace runs to one space."""
    return " ".join(s.lower().rstrip("。").split())


def jsquad_exact(gold: str, pred: str) -> int:
    return int(normalize_jsquad(gold) == normalize_jsquad(pred))


def jsquad_f1(gold: str, pred: str) -> float:
    """Character-level F1 of the normalised strings (JGLUE's ``compute_f1``)."""
    gold_chars, pred_chars = list(normalize_jsquad(gold)), list(normalize_jsquad(pred))
    if not gold_chars or not pred_chars:
        return float(gold_chars == pred_chars)
    common = collections.Counter(gold_chars) & collections.Counter(pred_chars)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_chars), same / len(gold_chars)
    return 2 * precision * recall / (precision + recall)


def jsquad_evaluate(gold: dict[str, list[str]], predictions: dict[str, str]) -> dict[str, float]:
    """``exact_match`` and ``f1`` in percent, each the best over the question's gold answers
    (those that normalise to "" ignored), averaged as ``squad_evaluate`` of the patched
    squad_metrics does: over the questions that have a prediction (it skips the others)."""
    em, f1, n = 0.0, 0.0, 0
    for qid, answers in gold.items():
        if qid not in predictions:
            continue
        answers = [a for a in answers if normalize_jsquad(a)] or [""]
        pred = predictions[qid]
        em += max(jsquad_exact(a, pred) for a in answers)
        f1 += max(jsquad_f1(a, pred) for a in answers)
        n += 1
    if n == 0:
        raise ValueError("jsquad_evaluate: no gold question has a prediction")
    return {"exact_match": 100.0 * em / n, "f1": 100.0 * f1 / n}
