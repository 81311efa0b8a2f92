"""Evaluation metrics of the downstream tasks: GLUE's and the official SQuAD v1.1 / v2.0 scores.

Design choice: plain Python over sequences, no scipy/sklearn. The metrics are small and their
exact definitions matter (GLUE's leaderboard and the official SQuAD scripts), so they are
written out here against those definitions and tested on hand-computed values:

1. ``matthews_corrcoef``, ``f1_binary`` return 0.0 where the denominator is 0 (sklearn's
   convention, with no warning).
2. ``spearman`` ranks ties by their average rank (scipy's ``rankdata(method="average")``).
3. SQuAD v1.1 follows ``evaluate-v1.1.py``: normalise (lower case, drop punctuation, the articles
   a/an/the, collapse whitespace), exact match and token F1, the max over the ground truths,
   percentages over all questions; a question with no prediction scores 0.
4. SQuAD v2.0 follows ``evaluate-v2.0.py``: a question with no (non-empty) answer has the gold
   answer "" so only an empty prediction is right; F1 is 1/0 when either side is empty; the
   ``HasAns_*``/``NoAns_*`` breakdown. Unlike that script a missing prediction scores 0 rather
   than being dropped from the denominator, so every question counts, as in v1.1.
"""

from __future__ import annotations

import collections
import math
import re
import string
from typing import Iterable, Mapping, Sequence


# -- classification and regression ----------------------------------------------------------------
def accuracy(preds: Sequence, labels: Sequence) -> float:
    _check_lengths(preds, labels)
    return sum(int(p == y) for p, y in zip(preds, labels)) / len(labels) if labels else 0.0


def f1_binary(preds: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class: 2·TP / (2·TP + FP + FN)."""
    _check_lengths(preds, labels)
    tp = sum(1 for p, y in zip(preds, labels) if p == positive and y == positive)
    fp = sum(1 for p, y in zip(preds, labels) if p == positive and y != positive)
    fn = sum(1 for p, y in zip(preds, labels) if p != positive and y == positive)
    denom = 2 * tp + fp + fn
    return 2 * tp / denom if denom else 0.0


def matthews_corrcoef(preds: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation of two label sequences (multi-class form, = binary MCC for 2)."""
    _check_lengths(preds, labels)
    n = len(labels)
    if n == 0:
        return 0.0
    classes = sorted(set(preds) | set(labels))
    pred_count = collections.Counter(preds)
    true_count = collections.Counter(labels)
    correct = sum(1 for p, y in zip(preds, labels) if p == y)
    cov_py = correct * n - sum(pred_count[k] * true_count[k] for k in classes)
    cov_pp = n * n - sum(pred_count[k] ** 2 for k in classes)
    cov_yy = n * n - sum(true_count[k] ** 2 for k in classes)
    denom = math.sqrt(cov_pp * cov_yy)
    return cov_py / denom if denom else 0.0


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    _check_lengths(xs, ys)
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    denom = math.sqrt(sxx * syy)
    return sxy / denom if denom else 0.0


def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks; tied values share the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        mean_rank = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[order[k]] = mean_rank
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    _check_lengths(xs, ys)
    return pearson(average_ranks(xs), average_ranks(ys))


def _check_lengths(a: Sequence, b: Sequence) -> None:
    if len(a) != len(b):
        raise ValueError(f"predictions ({len(a)}) and labels ({len(b)}) differ in length")


# -- SQuAD ----------------------------------------------------------------------------------------
_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (the official order)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match_score(prediction: str, ground_truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str) -> float:
    """v1.1 token F1: 0 when nothing is shared (so an empty prediction scores 0)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score_v2(prediction: str, ground_truth: str) -> float:
    """v2.0 token F1: when either side is empty, 1 if both are, else 0."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    return f1_score(prediction, ground_truth)


def squad_v1_evaluate(
    gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str]
) -> dict[str, float]:
    """Official v1.1 scores: ``gold`` maps question id -> its ground-truth answer texts."""
    total = len(gold)
    em = f1 = 0.0
    for qid, answers in gold.items():
        if qid not in predictions:
            continue  # scores 0, still counted in the denominator
        pred = predictions[qid]
        em += max(exact_match_score(pred, a) for a in answers)
        f1 += max(f1_score(pred, a) for a in answers)
    return {
        "exact_match": 100.0 * em / total if total else 0.0,
        "f1": 100.0 * f1 / total if total else 0.0,
        "total": float(total),
    }


def squad_v2_evaluate(
    gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str]
) -> dict[str, float]:
    """Official v2.0 scores with the HasAns/NoAns breakdown (no-answer threshold not applied)."""
    exact: dict[str, float] = {}
    f1: dict[str, float] = {}
    has_ans: list[str] = []
    no_ans: list[str] = []
    for qid, answers in gold.items():
        golds = [a for a in answers if normalize_answer(a)]
        (has_ans if golds else no_ans).append(qid)
        golds = golds or [""]
        if qid not in predictions:
            exact[qid] = f1[qid] = 0.0
            continue
        pred = predictions[qid]
        exact[qid] = max(float(normalize_answer(pred) == normalize_answer(a)) for a in golds)
        f1[qid] = max(f1_score_v2(pred, a) for a in golds)
    out = _percentages(exact, f1, list(gold), "")
    if has_ans:
        out.update(_percentages(exact, f1, has_ans, "HasAns_"))
    if no_ans:
        out.update(_percentages(exact, f1, no_ans, "NoAns_"))
    return out


def _percentages(
    exact: Mapping[str, float], f1: Mapping[str, float], qids: Iterable[str], prefix: str
) -> dict[str, float]:
    qids = list(qids)
    total = len(qids)
    return {
        f"{prefix}exact_match": 100.0 * sum(exact[q] for q in qids) / total if total else 0.0,
        f"{prefix}f1": 100.0 * sum(f1[q] for q in qids) / total if total else 0.0,
        f"{prefix}total": float(total),
    }


def squad_evaluate(
    gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str], version: str = "1.1"
) -> dict[str, float]:
    if version == "1.1":
        return squad_v1_evaluate(gold, predictions)
    if version == "2.0":
        return squad_v2_evaluate(gold, predictions)
    raise ValueError(f"SQuAD version must be '1.1' or '2.0', got {version!r}")
