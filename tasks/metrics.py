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
   ``HasAns_*``/``NoAns_*`` breakdown; names as that script prints them (``exact``, ``f1``,
   ``total``, ``HasAns_exact`` ...; v1.1 keeps its own script's ``exact_match``). With null odds,
   ``best_exact``/``best_f1`` and their thresholds, computed as its ``find_best_thresh``. Unlike
   that script a missing prediction scores 0 rather than being dropped from the denominator, so
   every question counts, as in v1.1.
5. NER is scored as ``conlleval`` (the CoNLL-2000 Perl script) counts: its chunk start/end rules
   (so IOB1, IOB2 and I- tags after O all make chunks), a chunk is correct when both its
   boundaries and its type agree, precision/recall/FB1 in percent, 0 on empty denominators.
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Iterable, Mapping, Sequence


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


def squad_v1_evaluate(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str]) -> dict[str, float]:
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
    gold: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
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
    if na_probs is not None:
        has = {q: bool(q in has_ans) for q in gold}
        for name, scores in (("exact", exact), ("f1", f1)):
            best, thresh = find_best_thresh(predictions, scores, na_probs, has)
            out[f"best_{name}"], out[f"best_{name}_thresh"] = best, thresh
    return out


def find_best_thresh(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
    """The official ``find_best_thresh``: the score (percent) when every question whose null odds
    exceed the threshold is answered "", at the best threshold among the null odds (or 0.0)."""
    num_no_ans = sum(1 for q in has_answer if not has_answer[q])
    cur = best = float(num_no_ans)
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            diff = scores[qid]
        else:
            diff = -1 if predictions.get(qid) else 0
        cur += diff
        if cur > best:
            best, best_thresh = cur, na_probs[qid]
    return 100.0 * best / len(scores) if scores else 0.0, float(best_thresh)


def _percentages(
    exact: Mapping[str, float], f1: Mapping[str, float], qids: Iterable[str], prefix: str
) -> dict[str, float]:
    qids = list(qids)
    total = len(qids)
    return {
        f"{prefix}exact": 100.0 * sum(exact[q] for q in qids) / total if total else 0.0,
        f"{prefix}f1": 100.0 * sum(f1[q] for q in qids) / total if total else 0.0,
        f"{prefix}total": float(total),
    }


def squad_evaluate(
    gold: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    version: str = "1.1",
    na_probs: Mapping[str, float] | None = None,
) -> dict[str, float]:
    if version == "1.1":
        return squad_v1_evaluate(gold, predictions)
    if version == "2.0":
        return squad_v2_evaluate(gold, predictions, na_probs)
    raise ValueError(f"SQuAD version must be '1.1' or '2.0', got {version!r}")


# -- NER: conlleval -------------------------------------------------------------------------------
def _split_tag(tag: str) -> tuple[str, str]:
    """conlleval's split: "B-PER" -> ("B", "PER"); "O" -> ("O", "")."""
    m = re.match(r"^([^-]*)-(.*)$", tag)
    return (m.group(1), m.group(2)) if m else (tag, "")


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    end = (prev_tag, tag) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O")}
    if prev_tag not in ("O", ".") and prev_type != type_:
        end = True
    return end or prev_tag in ("]", "[")


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    start = (prev_tag, tag) in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"), ("O", "E")}
    if tag not in ("O", ".") and prev_type != type_:
        start = True
    return start or tag in ("[", "]")


def conlleval(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level scores of tag sequences (one per sentence) exactly as conlleval.pl counts.

    Returns ``precision``, ``recall``, ``f1`` (percent), ``accuracy`` (token, percent), the
    counts ``found_correct``/``found_guessed``/``correct_chunks``, and per type
    ``<TYPE>_precision``/``_recall``/``_f1``/``_support``.
    """
    if len(gold) != len(pred):
        raise ValueError(f"predictions ({len(pred)} sentences) and labels ({len(gold)}) differ in length")
    found_correct: collections.Counter = collections.Counter()
    found_guessed: collections.Counter = collections.Counter()
    correct_chunks: collections.Counter = collections.Counter()
    correct_tags = tokens = 0
    in_correct = False
    last_c, last_g, last_ct, last_gt = "O", "O", "", ""

    def lines():
        for i, (g_sent, p_sent) in enumerate(zip(gold, pred)):
            if len(g_sent) != len(p_sent):
                raise ValueError(f"sentence {i}: {len(p_sent)} predicted tags for {len(g_sent)} tokens")
            yield from zip(g_sent, p_sent)
            yield None  # the blank line between sentences: a boundary, out of any chunk

    for item in lines():
        if item is None:
            (c, ct), (g, gt) = ("O", ""), ("O", "")
        else:
            (c, ct), (g, gt) = _split_tag(item[0]), _split_tag(item[1])
        if in_correct:
            end_c = _end_of_chunk(last_c, c, last_ct, ct)
            end_g = _end_of_chunk(last_g, g, last_gt, gt)
            if end_c and end_g and last_gt == last_ct:
                in_correct = False
                correct_chunks[last_ct] += 1
            elif end_c != end_g or gt != ct:
                in_correct = False
        start_c = _start_of_chunk(last_c, c, last_ct, ct)
        start_g = _start_of_chunk(last_g, g, last_gt, gt)
        if start_c and start_g and gt == ct:
            in_correct = True
        if start_c:
            found_correct[ct] += 1
        if start_g:
            found_guessed[gt] += 1
        if item is not None:
            correct_tags += int(c == g and ct == gt)
            tokens += 1
        last_c, last_g, last_ct, last_gt = c, g, ct, gt
    if in_correct:
        correct_chunks[last_ct] += 1

    def prf(correct: int, guessed: int, real: int) -> tuple[float, float, float]:
        p = 100.0 * correct / guessed if guessed else 0.0
        r = 100.0 * correct / real if real else 0.0
        return p, r, (2 * p * r / (p + r) if p + r else 0.0)

    total = (sum(correct_chunks.values()), sum(found_guessed.values()), sum(found_correct.values()))
    p, r, f = prf(*total)
    out = {
        "precision": p,
        "recall": r,
        "f1": f,
        "accuracy": 100.0 * correct_tags / tokens if tokens else 0.0,
        "correct_chunks": float(total[0]),
        "found_guessed": float(total[1]),
        "found_correct": float(total[2]),
    }
    for t in sorted(set(found_correct) | set(found_guessed)):
        tp, tr, tf = prf(correct_chunks[t], found_guessed[t], found_correct[t])
        out.update({f"{t}_precision": tp, f"{t}_recall": tr, f"{t}_f1": tf, f"{t}_support": float(found_correct[t])})
    return out
