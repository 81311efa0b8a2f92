"""CoNLL-2003 NER: the column-file reader, first-sub-token labelling, and the family's steps (``Unit``).

1. Reader: the official column files (``word POS chunk NER``, any number of columns, the tag
   last), ``-DOCSTART-`` lines dropped as document marks, a blank line ends a sentence, CRLF
   accepted. A line with one column, or a tag that is not ``O``/``B-X``/``I-X``/``E-X``/``S-X``,
   stops the run with ``file:line``.
2. Labels: IOB1 files (the original release: ``I-`` everywhere, ``B-`` only between two
   entities of one type) are converted to IOB2 by default (``NerConfig.label_scheme``); the
   chunks conlleval finds are the same in both, so the scores are too.
3. First sub-token: each word is tokenised on its own (no pre-tokenizer merging across words);
   the label sits on its first sub-token, later sub-tokens get -100 (ignored in the loss), and
   a word's prediction is its first sub-token's. A sentence longer than ``max_seq_length`` is
   split into windows of whole words (counted: ``dev_extra_windows``), so no word goes unpredicted.
4. Scoring: :func:`tasks.metrics.conlleval` on the word tags; ``predictions.txt`` holds
   ``word gold predicted`` lines with blank lines between sentences: conlleval's own input.
5. Feature-based (the paper's ablation, ``feature_mix`` set): the encoder is frozen and a
   two-layer BiLSTM reads a mix of its hidden states (:mod:`tasks.features`).
"""

from __future__ import annotations

import dataclasses
import logging
import re

import fsspec

from model.contract import join_url
from tasks.driver import Family
from tasks.finetune import IGNORE_INDEX, Feature, check_eval_split, predict, special_id, write_text
from tasks.heads import BertForTokenClassification
from tasks.metrics import conlleval

logger = logging.getLogger("bertflow.finetune")
_TAG = re.compile(r"^(O|[BIES]-\S+)$")


class NerDataError(ValueError):
    """A malformed CoNLL file; the message names the file and the line."""


@dataclasses.dataclass
class NerSentence:
    words: list[str]
    tags: list[str]


def read_conll(url: str) -> list[NerSentence]:
    """Sentences of a CoNLL-2003 column file, tags as written (IOB1 or IOB2)."""
    sentences: list[NerSentence] = []
    words: list[str] = []
    tags: list[str] = []

    def flush():
        if words:
            sentences.append(NerSentence(list(words), list(tags)))
            words.clear()
            tags.clear()

    with fsspec.open(url, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise NerDataError(f"{url}:{lineno}: not valid UTF-8 ({exc})") from exc
            fields = line.split()
            if not fields:
                flush()
                continue
            if fields[0] == "-DOCSTART-":
                flush()
                continue
            if len(fields) < 2:
                raise NerDataError(f"{url}:{lineno}: expected 'word ... tag' columns, got {line!r}")
            if not _TAG.match(fields[-1]):
                raise NerDataError(f"{url}:{lineno}: tag {fields[-1]!r} is not O, B-X, I-X, E-X or S-X")
            words.append(fields[0])
            tags.append(fields[-1])
    flush()
    if not sentences:
        raise NerDataError(f"{url}: no sentences (expected CoNLL-2003 'word POS chunk tag' lines)")
    return sentences


def iob1_to_iob2(tags: list[str]) -> list[str]:
    """I-X that starts a chunk (after O or another type) becomes B-X; the rest stays."""
    out, prev = [], "O"
    for tag in tags:
        if tag.startswith("I-") and (prev == "O" or prev[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        out.append(tag)
        prev = tag
    return out


def label_list(sentences: list[NerSentence]) -> list[str]:
    """O first, then the rest sorted: a stable id per tag."""
    return ["O"] + sorted({t for s in sentences for t in s.tags} - {"O"})


def encode_sentences(
    tokenizer, sentences: list[NerSentence], labels: list[str], max_seq_length: int
) -> tuple[list[Feature], list[list[tuple[int, int]]], int]:
    """Features (label on each word's first sub-token), where each word's first sub-token is
    (feature index, input position), and how many extra windows long sentences needed.

    No word is dropped: a sentence whose pieces do not fit ``max_seq_length`` is split into
    consecutive windows of whole words, each its own feature, so every word is trained on and
    predicted; a single word longer than a window keeps its first pieces (its label and its
    prediction sit on the first one)."""
    cls_id, sep_id = special_id(tokenizer, "[CLS]"), special_id(tokenizer, "[SEP]")
    unk_id = special_id(tokenizer, "[UNK]")
    index = {t: i for i, t in enumerate(labels)}
    room = max_seq_length - 2
    if room < 1:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for a word between [CLS] and [SEP]")
    features: list[Feature] = []
    positions, extra = [], 0
    all_words = sorted({w for s in sentences for w in s.words})
    pieces = dict(zip(all_words, (e.ids for e in tokenizer.encode_batch(all_words, add_special_tokens=False))))

    def flush(ids, labs):
        ids.append(sep_id)
        labs.append(IGNORE_INDEX)
        features.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "labels": labs})

    for s in sentences:
        ids, labs, pos = [cls_id], [IGNORE_INDEX], []
        for word, tag in zip(s.words, s.tags):
            sub = (pieces[word] or [unk_id])[:room]
            if len(ids) > 1 and len(ids) - 1 + len(sub) > room:
                flush(ids, labs)
                ids, labs = [cls_id], [IGNORE_INDEX]
                extra += 1
            pos.append((len(features), len(ids)))
            ids.extend(sub)
            labs.extend([index.get(tag, 0)] + [IGNORE_INDEX] * (len(sub) - 1))
        flush(ids, labs)
        positions.append(pos)
    return features, positions, extra


def word_predictions(logits: list, positions: list[list[tuple[int, int]]], labels: list[str]) -> list[list[str]]:
    """Each word's tag: the arg-max at its first sub-token, in whichever window holds it."""
    out = []
    for pos in positions:
        tags = []
        for feature, p in pos:
            scores = logits[feature][p]
            tags.append(labels[max(range(len(scores)), key=scores.__getitem__)])
        out.append(tags)
    return out


# -- the family's steps (tasks.driver.run_unit runs them) -----------------------------------------
class Unit(Family):
    """CoNLL-2003 NER's unit: fine-tuned token classification, or with the unit's ``feature_mix``
    a BiLSTM on the frozen encoder's features (the model is then not saved)."""

    select = "eval_f1"

    @property
    def feature_mix(self) -> str | None:
        return self.unit.get("feature_mix")

    def _read(self, name: str) -> list[NerSentence]:
        sents = read_conll(join_url(self.data_url, name))
        if self.config.ner.label_scheme == "iob2":
            sents = [NerSentence(s.words, iob1_to_iob2(s.tags)) for s in sents]
        return sents

    def read(self) -> None:
        opts, data_url, config = self.config.ner, self.data_url, self.config
        fs, root = fsspec.core.url_to_fs(data_url)
        self.train_sents, self.dev_sents = self._read(opts.train_file), self._read(opts.dev_file)
        has_test = fs.exists(f"{root.rstrip('/')}/{opts.test_file}")
        self.test_sents = self._read(opts.test_file) if has_test else []
        floor = config.min_eval_examples
        check_eval_split(self.task.name, "dev", join_url(data_url, opts.dev_file), len(self.dev_sents), floor)
        if has_test:
            check_eval_split(self.task.name, "test", join_url(data_url, opts.test_file), len(self.test_sents), floor)
        self.labels = label_list(self.train_sents)
        unseen = sorted({t for s in self.dev_sents for t in s.tags} - set(self.labels))
        if unseen:
            logger.warning("dev tags not in train (never predicted): %s", unseen)

    def encode(self):
        n = self.config.max_seq_length
        train_features, _, self.train_cut = encode_sentences(self.tokenizer, self.train_sents, self.labels, n)
        self.dev_features, self.dev_positions, self.dev_cut = encode_sentences(
            self.tokenizer, self.dev_sents, self.labels, n
        )
        self.dev_gold = [s.tags for s in self.dev_sents]
        return train_features

    def head(self, encoder):
        config = self.config
        if self.feature_mix is None:
            return BertForTokenClassification(encoder, len(self.labels), config.classifier_dropout)
        from tasks.features import FeatureBasedTagger

        return FeatureBasedTagger(
            encoder,
            len(self.labels),
            self.feature_mix,
            config.features.lstm_hidden,
            config.features.lstm_layers,
            config.classifier_dropout,
        )

    def _tag(self, model, device, features, positions) -> list[list[str]]:
        logits = predict(model, features, self.eval_batch, ["logits"], device)["logits"]
        return word_predictions(logits, positions, self.labels)

    def predict(self, model, device) -> list[list[str]]:
        return self._tag(model, device, self.dev_features, self.dev_positions)

    def score(self, predictions) -> dict[str, float]:
        return {f"eval_{k}": v for k, v in conlleval(self.dev_gold, predictions).items()}

    def _write_predictions(self, name: str, sents: list[NerSentence], predicted: list[list[str]]) -> None:
        lines = []
        for s, tags in zip(sents, predicted):
            lines += [f"{w} {g} {p}" for w, g, p in zip(s.words, s.tags, tags)] + [""]
        write_text(join_url(self.output_url, name), "\n".join(lines) + "\n")

    def write(self, model, predictions, result, device) -> dict[str, float]:
        self._write_predictions("predictions.txt", self.dev_sents, predictions)
        counts = {k: float(v) for k, v in self.score(predictions).items()}
        if self.test_sents:
            feats, pos, _ = encode_sentences(self.tokenizer, self.test_sents, self.labels, self.config.max_seq_length)
            test_pred = self._tag(model, device, feats, pos)
            self._write_predictions("test_predictions.txt", self.test_sents, test_pred)
            test_scores = conlleval([s.tags for s in self.test_sents], test_pred)
            counts.update({f"test_{k}": float(v) for k, v in test_scores.items() if k in ("precision", "recall", "f1")})
        counts.update(
            train_sentences=float(len(self.train_sents)),
            dev_sentences=float(len(self.dev_sents)),
            dev_examples=float(len(self.dev_sents)),
            test_sentences=float(len(self.test_sents)),
            train_extra_windows=float(self.train_cut),
            dev_extra_windows=float(self.dev_cut),
        )
        return counts

    def saved(self):
        if self.feature_mix is not None:
            return None
        extra = {
            "num_labels": len(self.labels),
            "finetuning_task": "ner",
            "id2label": dict(enumerate(self.labels)),
            "label2id": {t: i for i, t in enumerate(self.labels)},
        }
        return "BertForTokenClassification", extra

    def header(self):
        return {"labels": self.labels}
