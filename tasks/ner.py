"""CoNLL-2003 NER: the column-file reader, first-sub-token labelling, and ``run_ner``.

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
import time

import fsspec

from model.contract import Manifest, join_url, write_manifest
from tasks.config import FinetuneConfig
from tasks.finetune import (
    IGNORE_INDEX,
    Feature,
    LogFn,
    begin_run,
    check_eval_split,
    load_encoder,
    pick_device,
    predict,
    save_finetuned,
    special_id,
    train,
    write_json,
    write_text,
)
from tasks.heads import BertForTokenClassification
from tasks.metrics import conlleval
from tasks.registry import Task

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


def run_ner(
    config: FinetuneConfig,
    data_url: str,
    model_url: str,
    output_url: str,
    log_fn: LogFn | None = None,
    save_model: bool = True,
    feature_mix: str | None = None,
) -> Manifest:
    """Fine-tune (or, with ``feature_mix``, train a BiLSTM on frozen features) for CoNLL-2003 NER."""
    started = time.time()
    opts = config.ner
    inputs, tokenizer = begin_run(config.seed, model_url, data_url, output_url)
    fs, root = fsspec.core.url_to_fs(data_url)

    def read(name):
        sents = read_conll(join_url(data_url, name))
        if opts.label_scheme == "iob2":
            sents = [NerSentence(s.words, iob1_to_iob2(s.tags)) for s in sents]
        return sents

    train_sents, dev_sents = read(opts.train_file), read(opts.dev_file)
    has_test = fs.exists(f"{root.rstrip('/')}/{opts.test_file}")
    test_sents = read(opts.test_file) if has_test else []
    floor = config.min_eval_examples
    check_eval_split("conll2003", "dev", join_url(data_url, opts.dev_file), len(dev_sents), floor)
    if has_test:
        check_eval_split("conll2003", "test", join_url(data_url, opts.test_file), len(test_sents), floor)
    labels = label_list(train_sents)
    unseen = sorted({t for s in dev_sents for t in s.tags} - set(labels))
    if unseen:
        logger.warning("dev tags not in train (never predicted): %s", unseen)
    train_features, _, train_cut = encode_sentences(tokenizer, train_sents, labels, config.max_seq_length)
    dev_features, dev_positions, dev_cut = encode_sentences(tokenizer, dev_sents, labels, config.max_seq_length)

    encoder = load_encoder(model_url)
    if feature_mix is None:
        model = BertForTokenClassification(encoder, len(labels), config.classifier_dropout)
    else:
        from tasks.features import FeatureBasedTagger

        model = FeatureBasedTagger(
            encoder,
            len(labels),
            feature_mix,
            config.features.lstm_hidden,
            config.features.lstm_layers,
            config.classifier_dropout,
        )
    device = pick_device()
    model.to(device)
    eval_batch = max(config.batch_size, 64)
    dev_gold = [s.tags for s in dev_sents]

    def tag(m, features, positions):
        return word_predictions(predict(m, features, eval_batch, ["logits"], device)["logits"], positions, labels)

    def evaluate(m) -> dict[str, float]:
        scores = conlleval(dev_gold, tag(m, dev_features, dev_positions))
        return {f"eval_{k}": v for k, v in scores.items()}

    result = train(model, train_features, config, evaluate, "eval_f1", log_fn, device)

    def write_predictions(name, sents, predicted):
        lines = []
        for s, tags in zip(sents, predicted):
            lines += [f"{w} {g} {p}" for w, g, p in zip(s.words, s.tags, tags)] + [""]
        write_text(join_url(output_url, name), "\n".join(lines) + "\n")

    dev_pred = tag(model, dev_features, dev_positions)
    scores = conlleval(dev_gold, dev_pred)
    write_predictions("predictions.txt", dev_sents, dev_pred)
    counts = {f"eval_{k}": float(v) for k, v in scores.items()}
    if test_sents:
        feats, pos, _ = encode_sentences(tokenizer, test_sents, labels, config.max_seq_length)
        test_pred = tag(model, feats, pos)
        write_predictions("test_predictions.txt", test_sents, test_pred)
        counts.update(
            {
                f"test_{k}": float(v)
                for k, v in conlleval([s.tags for s in test_sents], test_pred).items()
                if k in ("precision", "recall", "f1")
            }
        )
    if save_model and feature_mix is None:
        save_finetuned(
            model,
            model.config,
            output_url,
            "BertForTokenClassification",
            {
                "num_labels": len(labels),
                "finetuning_task": "ner",
                "id2label": dict(enumerate(labels)),
                "label2id": {t: i for i, t in enumerate(labels)},
            },
            model_url,
        )
    seconds = time.time() - started
    counts.update(
        train_sentences=float(len(train_sents)),
        dev_sentences=float(len(dev_sents)),
        dev_examples=float(len(dev_sents)),
        test_sentences=float(len(test_sents)),
        train_extra_windows=float(train_cut),
        dev_extra_windows=float(dev_cut),
        best_epoch=float(result.best_epoch),
        steps=float(result.steps),
        seconds=seconds,
    )
    write_json(join_url(output_url, "metrics.json"), {"labels": labels, **counts, "history": result.history})
    logger.info("NER%s done in %.1f s: F1 %.2f", f" ({feature_mix})" if feature_mix else "", seconds, scores["f1"])
    name = "conll2003" if feature_mix is None else "conll2003_features"
    config_dict = {**dataclasses.asdict(config), "task": name, **({"feature_mix": feature_mix} if feature_mix else {})}
    return write_manifest(f"finetune-{name}", output_url, config_dict, inputs, counts, seconds=seconds)


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
    return run_ner(
        config,
        data_url,
        model_url,
        output_url,
        log_fn=log_fn,
        save_model=save_model,
        feature_mix=(unit or {}).get("feature_mix"),
    )
