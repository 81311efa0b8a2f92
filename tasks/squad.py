"""SQuAD v1.1 / v2.0: JSON reader, doc-stride windows, span decoding, and the family's steps (``Unit``).

Follows the reference ``run_squad.py`` semantics with character offsets instead of its
whitespace-token bookkeeping:

1. Windows: the question (at most ``max_query_length`` tokens) and a slice of the context make
   ``[CLS] question [SEP] context-slice [SEP]``; slices start every ``doc_stride`` tokens until the
   context is covered. Each context token keeps its character span in the original context
   (the tokenizer's offsets survive lower-casing and accent stripping), so an answer is always
   cut from the original text: ``context[start_char:end_char]``.
2. Training: a window that does not hold the whole answer, and every window of a v2.0
   unanswerable question, points start and end at [CLS] (position 0). An answer whose
   ``answer_start`` does not match its text in the context is skipped, counted
   (``train_skipped``) and logged with its question id.
3. Decoding: the ``n_best_size`` best start and end logits of each window, spans of context
   tokens only, end >= start, at most ``max_answer_length`` tokens, the start token in the window
   where it has the most context (the reference's ``_check_is_max_context``); best start+end
   score over windows. v2.0 predicts "" when the best [CLS] score beats it by more than
   ``null_score_diff_threshold`` (``SquadConfig``); left unset it is tuned on dev as the
   official v2.0 script's best-F1 threshold, and both the scores at that threshold
   (``exact``, ``f1``, ``HasAns_*``, ``NoAns_*``) and ``best_*`` are reported. (Tuning on the
   set that is scored is what the reference recipe does; it flatters dev a little.)
4. Scoring is the official evaluation (``tasks/metrics.py``); the best epoch is the highest F1.
5. Readers take the official nested JSON and the flat (Hugging Face) layout; an answer whose
   text differs from the context only in whitespace is mapped to its span (:func:`locate_answer`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re

import fsspec

from model.contract import join_url
from tasks.config import SquadConfig
from tasks.driver import Family
from tasks.finetune import Feature, check_eval_split, predict, special_id, write_json
from tasks.heads import BertForQuestionAnswering
from tasks.metrics import squad_evaluate

logger = logging.getLogger("bertflow.finetune")

FILES = {"1.1": ("train-v1.1.json", "dev-v1.1.json"), "2.0": ("train-v2.0.json", "dev-v2.0.json")}


class SquadDataError(ValueError):
    """A malformed SQuAD file; the message names the file and the question id."""


@dataclasses.dataclass
class SquadExample:
    qid: str
    question: str
    context: str
    answers: list[tuple[str, int]]  # (text, answer_start) in context characters
    is_impossible: bool = False


def read_squad(url: str, version: str = "1.1") -> list[SquadExample]:
    """Every question of a SQuAD file, in file order.

    Layouts: the official nested JSON (``{"data": [{"title", "paragraphs": [{"context", "qas"}]}]}``),
    or flat records as Hugging Face ``datasets`` write them (``id``, ``title``, ``context``,
    ``question``, ``answers: {"text": [...], "answer_start": [...]}``) in a JSON list, under
    ``"data"``, or one per line (JSON Lines). In the flat layout a v2.0 question with no answer
    is unanswerable. Anything else fails naming the file and what was expected.
    """
    if version not in FILES:
        raise ValueError(f"SQuAD version must be '1.1' or '2.0', got {version!r}")
    with fsspec.open(url, "r", encoding="utf-8-sig") as f:
        text = f.read()
    records = _load_json_or_lines(url, text)
    seen: set[str] = set()
    if isinstance(records, dict) and isinstance(records.get("data"), list):
        records = records["data"]
    if not isinstance(records, list) or not records:
        raise SquadDataError(f"{url}: {LAYOUTS}; found {_describe(records)}")
    first = records[0]
    if isinstance(first, dict) and "paragraphs" in first:
        return _read_nested(url, records, version, seen)
    if isinstance(first, dict) and {"context", "question"} <= set(first):
        return [_read_flat(url, i, r, version, seen) for i, r in enumerate(records)]
    raise SquadDataError(
        f"{url}: {LAYOUTS}; the first record has keys "
        f"{sorted(first) if isinstance(first, dict) else type(first).__name__}"
    )


LAYOUTS = (
    "expected the official SQuAD JSON ({'data': [{'title', 'paragraphs': [{'context', 'qas'}]}]}) "
    "or flat records with 'id', 'context', 'question', 'answers' (a JSON list or JSON Lines)"
)


def _describe(obj) -> str:
    if isinstance(obj, dict):
        return f"an object with keys {sorted(obj)[:8]}"
    if isinstance(obj, list):
        return "an empty list" if not obj else f"a list of {type(obj[0]).__name__}"
    return f"a {type(obj).__name__}"


def _load_json_or_lines(url: str, text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if "Extra data" not in str(exc):
            raise SquadDataError(f"{url}: not valid JSON ({exc})") from exc
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SquadDataError(f"{url}:{lineno}: not valid JSON Lines ({exc})") from exc
    return records


def _read_nested(url: str, articles: list, version: str, seen: set[str]) -> list[SquadExample]:
    examples = []
    for a, article in enumerate(articles):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise SquadDataError(f"{url}: data[{a}] has no 'paragraphs' list ({LAYOUTS})")
        for p, paragraph in enumerate(article["paragraphs"]):
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            where = f"{url}: data[{a}].paragraphs[{p}]"
            if not isinstance(context, str):
                raise SquadDataError(f"{where}: 'context' missing or not a string")
            for qa in paragraph.get("qas") or []:
                examples.append(_read_question(qa, context, version, where, seen))
    return examples


def _read_flat(url: str, i: int, record, version: str, seen: set[str]) -> SquadExample:
    where = f"{url}: record {i}"
    if not isinstance(record, dict):
        raise SquadDataError(f"{where}: not an object ({LAYOUTS})")
    context = record.get("context")
    if not isinstance(context, str):
        raise SquadDataError(f"{where}: 'context' missing or not a string")
    answers = record.get("answers")
    if isinstance(answers, dict):
        texts, starts = answers.get("text"), answers.get("answer_start")
        if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
            raise SquadDataError(f"{where}: 'answers' needs equally long 'text' and 'answer_start' lists")
        answers = [{"text": t, "answer_start": s} for t, s in zip(texts, starts)]
    elif answers is None:
        answers = []
    qa = {
        "id": record.get("id"),
        "question": record.get("question"),
        "answers": answers,
        "is_impossible": record.get("is_impossible", version == "2.0" and not answers),
    }
    return _read_question(qa, context, version, where, seen)


def _read_question(qa: dict, context: str, version: str, where: str, seen: set[str]) -> SquadExample:
    if not isinstance(qa, dict):
        raise SquadDataError(f"{where}: a question that is not an object")
    qid = qa.get("id")
    if isinstance(qid, int) and not isinstance(qid, bool):
        qid = str(qid)
    if not isinstance(qid, str) or not qid:
        raise SquadDataError(f"{where}: a question without an 'id'")
    where = f"{where} question {qid}"
    if qid in seen:
        raise SquadDataError(f"{where}: duplicate question id")
    seen.add(qid)
    question = qa.get("question")
    if not isinstance(question, str):
        raise SquadDataError(f"{where}: 'question' missing or not a string")
    marked = bool(qa.get("is_impossible", False))
    impossible = marked and version == "2.0"
    answers = []
    for i, ans in enumerate(qa.get("answers") or []):
        text, start = (ans.get("text"), ans.get("answer_start")) if isinstance(ans, dict) else (None, None)
        if not isinstance(text, str) or not isinstance(start, int) or isinstance(start, bool):
            raise SquadDataError(f"{where}: answers[{i}] needs a string 'text' and an int 'answer_start'")
        if not 0 <= start <= len(context):
            raise SquadDataError(
                f"{where}: answers[{i}].answer_start {start} outside the context ({len(context)} chars)"
            )
        answers.append((text, start))
    if not answers and not impossible:
        if marked:  # a v2.0 question read as v1.1, which has no unanswerable questions
            raise SquadDataError(
                f"{where}: marked is_impossible, which SQuAD v1.1 does not have: this is a v2.0 file "
                "(read it as version '2.0': the squad2 task)"
            )
        if version == "2.0":
            raise SquadDataError(f"{where}: no answers and not marked is_impossible")
        raise SquadDataError(f"{where}: no answers (every SQuAD v1.1 question has at least one)")
    if impossible:
        answers = []
    return SquadExample(qid, question, context, answers, impossible)


def locate_answer(context: str, text: str, start: int) -> tuple[int, int] | None:
    """The answer's character span in ``context``, or None when it is not there.

    As the reference compares whitespace-tokenised text: leading/trailing blanks of the answer
    are dropped (moving the start), and inner runs of whitespace (a newline, two spaces, a
    no-break space) may differ between the answer and the context.
    """
    stripped = text.lstrip()
    start += len(text) - len(stripped)
    stripped = stripped.rstrip()
    if not stripped:
        return None
    if context[start : start + len(stripped)] == stripped:
        return start, start + len(stripped)
    words = stripped.split()
    pattern = r"\s+".join(re.escape(w) for w in words)
    m = re.compile(pattern).match(context, start)
    return (start, m.end()) if m else None


# -- windows --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Window:
    """One model input of one example: where its context tokens come from in the text."""

    example_index: int
    offsets: list[tuple[int, int] | None]  # per input position: (start_char, end_char) or None
    max_context: list[bool]  # per input position: this window gives the token its most context


def _spans(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    spans, start = [], 0
    while True:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length >= num_tokens:
            return spans
        start += min(length, doc_stride)


def _max_context_score(span: tuple[int, int], position: int) -> float:
    start, length = span
    end = start + length - 1
    if not start <= position <= end:
        return -1.0
    return min(position - start, end - position) + 0.01 * length


def _answer_tokens(offsets: list[tuple[int, int]], start_char: int, end_char: int) -> tuple[int, int] | None:
    """First and last context token overlapping [start_char, end_char)."""
    hits = [i for i, (s, e) in enumerate(offsets) if s < end_char and e > start_char]
    return (hits[0], hits[-1]) if hits else None


def make_features(
    tokenizer,
    examples: list[SquadExample],
    max_seq_length: int,
    doc_stride: int = 128,
    max_query_length: int = 64,
    training: bool = False,
) -> tuple[list[Feature], list[Window], int]:
    """Model features and their windows (aligned lists), and the number of skipped answers.

    A question is cut to ``max_query_length`` tokens (the reference's flag), so every window of
    every question has at least ``doc_stride`` tokens of context: a window too short for that is
    refused here, before any question, as :meth:`tasks.config.SquadConfig.check_window` refuses
    the config."""
    SquadConfig(max_seq_length=max_seq_length, doc_stride=doc_stride, max_query_length=max_query_length).check_window(
        max_seq_length
    )
    cls_id, sep_id = special_id(tokenizer, "[CLS]"), special_id(tokenizer, "[SEP]")
    questions = tokenizer.encode_batch([e.question for e in examples], add_special_tokens=False)
    contexts = sorted({e.context for e in examples})
    context_enc = dict(zip(contexts, tokenizer.encode_batch(contexts, add_special_tokens=False)))
    features: list[Feature] = []
    windows: list[Window] = []
    skipped = 0
    for index, (ex, q) in enumerate(zip(examples, questions)):
        q_ids = q.ids[:max_query_length]
        enc = context_enc[ex.context]
        c_ids, c_offsets = enc.ids, [tuple(o) for o in enc.offsets]
        max_tokens = max_seq_length - len(q_ids) - 3  # >= doc_stride (checked above)
        answer = None
        if training and not ex.is_impossible:
            text, start_char = ex.answers[0]
            span = locate_answer(ex.context, text, start_char)
            answer = _answer_tokens(c_offsets, *span) if span else None
            if answer is None:
                skipped += 1
                logger.warning("question %s: answer %r not found at answer_start %d; skipped", ex.qid, text, start_char)
                continue
        spans = _spans(len(c_ids), max_tokens, doc_stride)
        # The window where each context token has the most context (the first one, on ties).
        home = [
            max(range(len(spans)), key=lambda k: (_max_context_score(spans[k], pos), -k)) for pos in range(len(c_ids))
        ]
        first = len(q_ids) + 2  # position of the first context token
        for k, (start, length) in enumerate(spans):
            ids = [cls_id, *q_ids, sep_id, *c_ids[start : start + length], sep_id]
            types = [0] * first + [1] * (length + 1)
            offsets = [None] * first + c_offsets[start : start + length] + [None]
            max_context = [False] * first + [home[start + i] == k for i in range(length)] + [False]
            feature: Feature = {"input_ids": ids, "token_type_ids": types}
            if training:
                s_pos = e_pos = 0
                if answer is not None and start <= answer[0] and answer[1] < start + length:
                    s_pos, e_pos = answer[0] - start + first, answer[1] - start + first
                feature.update(start_positions=s_pos, end_positions=e_pos)
            features.append(feature)
            windows.append(Window(index, offsets, max_context))
    return features, windows, skipped


# -- decoding -------------------------------------------------------------------------------------
def _top(values: list[float], n: int) -> list[int]:
    return sorted(range(len(values)), key=lambda i: -values[i])[:n]


def decode_spans(
    examples: list[SquadExample],
    windows: list[Window],
    start_logits: list[list[float]],
    end_logits: list[list[float]],
    n_best_size: int = 20,
    max_answer_length: int = 30,
) -> tuple[dict[str, str], dict[str, float]]:
    """The best non-null answer per question id ("" when no valid span), and the null-score
    difference per question id (null score - best span score; 1e9 when there is no span)."""
    best: dict[int, tuple[float, str]] = {}
    null: dict[int, float] = {}
    for window, starts, ends in zip(windows, start_logits, end_logits):
        n = len(window.offsets)
        idx = window.example_index
        null[idx] = min(null.get(idx, float("inf")), starts[0] + ends[0])
        for s in _top(starts[:n], n_best_size):
            if window.offsets[s] is None or not window.max_context[s]:
                continue
            for e in _top(ends[:n], n_best_size):
                if window.offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                    continue
                score = starts[s] + ends[e]
                if idx not in best or score > best[idx][0]:
                    text = examples[idx].context[window.offsets[s][0] : window.offsets[e][1]]
                    best[idx] = (score, text)
    texts: dict[str, str] = {}
    null_odds: dict[str, float] = {}
    for idx, ex in enumerate(examples):
        score, text = best.get(idx, (float("-inf"), ""))
        texts[ex.qid] = text
        if idx in null:
            null_odds[ex.qid] = null[idx] - score if score != float("-inf") else 1e9
    return texts, null_odds


def apply_null_threshold(texts: dict[str, str], null_odds: dict[str, float], threshold: float) -> dict[str, str]:
    """v2.0: "" for every question whose null-score difference exceeds ``threshold``."""
    return {q: ("" if null_odds.get(q, 0.0) > threshold else t) for q, t in texts.items()}


def decode_predictions(
    examples: list[SquadExample],
    windows: list[Window],
    start_logits: list[list[float]],
    end_logits: list[list[float]],
    version: str = "1.1",
    n_best_size: int = 20,
    max_answer_length: int = 30,
    null_score_diff_threshold: float = 0.0,
) -> tuple[dict[str, str], dict[str, float]]:
    """Answer text per question id, and (v2.0) the null-score difference per question id."""
    texts, null_odds = decode_spans(examples, windows, start_logits, end_logits, n_best_size, max_answer_length)
    if version != "2.0":
        return texts, {}
    return apply_null_threshold(texts, null_odds, null_score_diff_threshold), null_odds


def gold_answers(examples: list[SquadExample]) -> dict[str, list[str]]:
    return {ex.qid: [text for text, _ in ex.answers] for ex in examples}


def score_dev(
    examples: list[SquadExample],
    texts: dict[str, str],
    null_odds: dict[str, float],
    version: str,
    threshold: float | None,
) -> tuple[dict[str, str], dict[str, float]]:
    """Final predictions and the official scores. v2.0: the null threshold is ``threshold``, or
    when None the official best-F1 threshold on these dev questions (``best_f1_thresh``), and
    ``null_score_diff_threshold`` records the one applied."""
    gold = gold_answers(examples)
    if version != "2.0":
        return texts, squad_evaluate(gold, texts, version)
    tuning = squad_evaluate(gold, texts, version, na_probs=null_odds)
    chosen = tuning["best_f1_thresh"] if threshold is None else threshold
    predictions = apply_null_threshold(texts, null_odds, chosen)
    scores = squad_evaluate(gold, predictions, version)
    scores.update({k: v for k, v in tuning.items() if k.startswith("best_")})
    scores["null_score_diff_threshold"] = float(chosen)
    return predictions, scores


# -- the stage ------------------------------------------------------------------------------------
def squad_files(version: str, squad: SquadConfig) -> tuple[str, str]:
    train_name, dev_name = FILES[version]
    return squad.train_file or train_name, squad.dev_file or dev_name


# -- the family's steps (tasks.driver.run_unit runs them) -----------------------------------------
class Unit(Family):
    """SQuAD's unit (v1.1 or v2.0 by the row's ``options["version"]``): windows over the context,
    start/end logits, the official scores (v2.0: the null threshold tuned on dev unless set).

    Outputs: ``predictions.json`` (question id -> answer, the official format), for v2.0
    ``null_odds.json`` (question id -> null-score difference, the official ``--na-prob-file``),
    ``metrics.json``, the model unless ``save_model`` is off, then ``_manifest.json``."""

    select = "eval_f1"
    eval_batch_floor = 32

    @property
    def version(self) -> str:
        return self.task.options.get("version", "1.1")

    def check(self) -> None:
        if self.version not in FILES:
            raise ValueError(f"SQuAD version must be '1.1' or '2.0', got {self.version!r}")
        self.config.squad.check_window(self.config.max_seq_length)  # before any work (the run config checks it too)

    def split_urls(self) -> tuple[str, str]:
        """The train and dev files' URLs."""
        train_name, dev_name = squad_files(self.version, self.config.squad)
        return join_url(self.data_url, train_name), join_url(self.data_url, dev_name)

    def read(self) -> None:
        train_url, dev_url = self.split_urls()
        self.train_examples = read_squad(train_url, self.version)
        self.dev_examples = read_squad(dev_url, self.version)
        name = f"squad v{self.version}" if self.task.family == "squad" else self.task.name
        check_eval_split(name, "dev", dev_url, len(self.dev_examples), self.config.min_eval_examples)

    def encode(self):
        sq = self.config.squad
        window_args = dict(
            max_seq_length=sq.max_seq_length or self.config.max_seq_length,
            doc_stride=sq.doc_stride,
            max_query_length=sq.max_query_length,
        )
        train_features, _, self.skipped = make_features(
            self.tokenizer, self.train_examples, training=True, **window_args
        )
        self.dev_features, self.dev_windows, _ = make_features(self.tokenizer, self.dev_examples, **window_args)
        self.num_train_features = len(train_features)
        logger.info(
            "%s: %d train questions -> %d features (%d skipped), %d dev -> %d",
            self.task.name,
            len(self.train_examples),
            len(train_features),
            self.skipped,
            len(self.dev_examples),
            len(self.dev_features),
        )
        return train_features

    def head(self, encoder):
        return BertForQuestionAnswering(encoder)

    def predict(self, model, device) -> tuple[dict[str, str], dict[str, float]]:
        """(question id -> answer text, question id -> null-score difference) of the dev set."""
        sq = self.config.squad
        out = predict(model, self.dev_features, self.eval_batch, ["start_logits", "end_logits"], device)
        return decode_spans(
            self.dev_examples, self.dev_windows, out["start_logits"], out["end_logits"], sq.n_best_size,
            sq.max_answer_length,
        )  # fmt: skip

    def dev_scores(self, texts: dict[str, str], null_odds: dict[str, float]):
        """(final predictions, official scores): SQuAD's script, the v2.0 null threshold applied."""
        return score_dev(self.dev_examples, texts, null_odds, self.version, self.config.squad.null_score_diff_threshold)

    def score(self, predictions) -> dict[str, float]:
        scores = self.dev_scores(*predictions)[1]
        return {f"eval_{k}": v for k, v in scores.items() if not k.endswith("total")}

    def write(self, model, predictions, result, device) -> dict[str, float]:
        final, self.scores = self.dev_scores(*predictions)
        write_json(join_url(self.output_url, "predictions.json"), final)
        if self.version == "2.0":
            write_json(join_url(self.output_url, "null_odds.json"), predictions[1])
        counts = {f"eval_{k}": float(v) for k, v in self.scores.items() if not k.endswith("total")}
        return {**counts, **self.feature_counts()}

    def feature_counts(self) -> dict[str, float]:
        """How many examples and windows (features) were read, trained on and skipped."""
        return {
            "train_examples": float(len(self.train_examples)),
            "train_features": float(self.num_train_features),
            "train_skipped": float(self.skipped),
            "dev_examples": float(len(self.dev_examples)),
            "dev_features": float(len(self.dev_features)),
        }

    def saved(self):
        return "BertForQuestionAnswering", {"finetuning_task": f"squad-v{self.version}"}

    def header(self):
        return {"version": self.version, **self.scores}
