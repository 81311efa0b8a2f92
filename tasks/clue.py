"""CLUE: the classification tasks (AFQMC, TNEWS, IFLYTEK, CMNLI, OCNLI, CLUEWSC2020, CSL) and
CMRC 2018, in the files of CLUE's distribution (``<task>_public/{train,dev}.json``; CMRC 2018
also as ``cmrc2018_{train,dev}.json`` of its own repository), with their official metrics.

The classification files are JSON lines with CLUE's keys; inputs as CLUE's baselines build them:
AFQMC, CMNLI, OCNLI ``sentence1``/``sentence2``; TNEWS and IFLYTEK ``sentence``; CSL the keywords
joined by spaces, then ``abst``; CLUEWSC2020 the ``text`` with span 1 wrapped in ``_`` and the
pronoun (span 2) in ``[ ]``, at their ``span*_index``. OCNLI/CMNLI rows labelled ``"-"`` (no
annotator majority) are skipped and counted. Every one is scored by accuracy.

CMRC 2018 is SQuAD-style JSON, scored by ``cmrc2018_evaluate.py`` (v5): both strings
lower-cased and stripped; *mixed segmentation* makes each CJK ideograph (U+4E00-U+9FA5) and
each of its punctuation marks a token and runs of other characters nltk's ``word_tokenize``
words; F1 is from the longest common *substring* of the two token lists (not the bag of
tokens), punctuation removed; EM compares the strings with its punctuation removed. Both are
the best over the gold answers, in percent over *every* gold question (an unanswered one
scores 0). The one difference: nltk's ``word_tokenize`` runs with ``preserve_line=True``
(punkt's sentence model is a download); it differs only where a non-Chinese run holds a
sentence-ending period inside it.
"""

from __future__ import annotations

import re

from tasks.jsonl import (
    JsonlDataError,
    Split,
    classification_example,
    field,
    read_jsonl,
)
from tasks.registry import Task

FILES = (("train.json",), ("dev.json",))
CMRC_FILES = (("train.json", "cmrc2018_train.json"), ("dev.json", "cmrc2018_dev.json"))
UNLABELLED = "-"
"""OCNLI/CMNLI's label of a pair without an annotator majority."""


def read_clue(url: str, task: Task, split: str = "train") -> Split:
    """One split of a CLUE classification task."""
    rows = read_jsonl(url)
    if not rows:
        raise JsonlDataError(f"{url}: no examples")
    spec, build = task.layout, task.options.get("build", "")
    examples, skipped = [], 0
    for i, (n, obj) in enumerate(rows):
        if spec.label in obj and obj[spec.label] == UNLABELLED and task.options.get("skip_unlabelled"):
            skipped += 1
            continue
        if build == "wsc":
            text_a, text_b = wsc_text(url, n, obj), None
        elif build == "csl":
            keywords = field(url, n, obj, "keyword")
            if not isinstance(keywords, list):
                raise JsonlDataError(f"{url}:{n}: 'keyword': expected a list, got {type(keywords).__name__}")
            text_a, text_b = " ".join(map(str, keywords)), str(field(url, n, obj, "abst"))
        else:
            text_a = str(field(url, n, obj, spec.text_a))
            text_b = str(field(url, n, obj, spec.text_b)) if spec.text_b else None
        examples.append(
            classification_example(url, n, obj, task, str(obj.get("id", obj.get("idx", i))), text_a, text_b)
        )
    return Split(url, examples, skipped)


def wsc_text(url: str, lineno: int, obj: dict) -> str:
    """CLUEWSC2020's text with span 1 as ``_span_`` and the pronoun as ``[pronoun]`` (CLUE's baseline)."""
    text = str(field(url, lineno, obj, "text"))
    target = field(url, lineno, obj, "target")
    marks = []
    for k, (left, right) in ((1, ("_", "_")), (2, ("[", "]"))):
        start, span = target.get(f"span{k}_index"), target.get(f"span{k}_text")
        if not isinstance(start, int) or not isinstance(span, str) or text[start : start + len(span)] != span:
            raise JsonlDataError(f"{url}:{lineno}: target span{k} {span!r} is not at index {start} of the text")
        marks.append((start, start + len(span), left, right))
    for start, end, left, right in sorted(marks, reverse=True):
        text = text[:start] + left + text[start:end] + right + text[end:]
    return text


# -- CMRC 2018's metric --------------------------------------------------------------------------
SP_CHAR = ["-", ":", "_", "*", "^", "/", "\\", "~", "`", "+", "=", "，", "。", "：", "？", "！", "“", "”", "；",
           "’", "《", "》", "……", "·", "、", "「", "」", "（", "）", "－", "～", "『", "』"]  # fmt: skip
"""cmrc2018_evaluate.py's punctuation list, as it is ("……" is two characters, so never one char)."""
_HAN = re.compile("[\u4e00-\u9fa5]")


def _word_tokenize(text: str) -> list[str]:
    try:
        from nltk import word_tokenize
    except ImportError as exc:
        raise ImportError(
            f"CMRC 2018's metric needs nltk (the 'cjk' extra): pip install 'bertflow[cjk]' ({exc})"
        ) from exc
    return word_tokenize(text, preserve_line=True)


def mixed_segmentation(text: str, rm_punc: bool = False) -> list[str]:
    text = text.lower().strip()
    out: list[str] = []
    run = ""
    for ch in text:
        if rm_punc and ch in SP_CHAR:
            continue
        if _HAN.match(ch) or ch in SP_CHAR:
            if run:
                out.extend(_word_tokenize(run))
                run = ""
            out.append(ch)
        else:
            run += ch
    if run:
        out.extend(_word_tokenize(run))
    return out


def remove_punctuation(text: str) -> str:
    return "".join(ch for ch in text.lower().strip() if ch not in SP_CHAR)


def longest_common_substring(a: list[str], b: list[str]) -> int:
    """Length of the longest run of tokens common to both (``find_lcs``)."""
    best = 0
    prev = [0] * (len(b) + 1)
    for i in range(len(a)):
        cur = [0] * (len(b) + 1)
        for j in range(len(b)):
            if a[i] == b[j]:
                cur[j + 1] = prev[j] + 1
                best = max(best, cur[j + 1])
        prev = cur
    return best


def cmrc_f1(answers: list[str], prediction: str) -> float:
    scores = []
    pred = mixed_segmentation(prediction, rm_punc=True)
    for ans in answers:
        gold = mixed_segmentation(ans, rm_punc=True)
        lcs = longest_common_substring(gold, pred)
        if lcs == 0:
            scores.append(0.0)
            continue
        precision, recall = lcs / len(pred), lcs / len(gold)
        scores.append(2 * precision * recall / (precision + recall))
    return max(scores)


def cmrc_em(answers: list[str], prediction: str) -> int:
    pred = remove_punctuation(prediction)
    return int(any(remove_punctuation(a) == pred for a in answers))


def cmrc2018_evaluate(gold: dict[str, list[str]], predictions: dict[str, str]) -> dict[str, float]:
    """``exact_match`` and ``f1`` in percent over every gold question, ``average`` their mean
    (the script's AVERAGE), ``skipped`` the questions without a prediction (scored 0)."""
    if not gold:
        raise ValueError("cmrc2018_evaluate: no gold questions")
    f1 = em = 0.0
    skipped = 0
    for qid, answers in gold.items():
        if qid not in predictions:
            skipped += 1
            continue
        f1 += cmrc_f1(answers, str(predictions[qid]))
        em += cmrc_em(answers, str(predictions[qid]))
    f1, em = 100.0 * f1 / len(gold), 100.0 * em / len(gold)
    return {"exact_match": em, "f1": f1, "average": (em + f1) / 2, "skipped": float(skipped)}
