"""The fine-tuning loop shared by every downstream task: batches, AdamW, schedule, eval, best-keeping.

A task (``tasks/glue.py``, ``tasks/squad.py``) turns its data into *features*: one dict per model
input row, holding ``input_ids`` and ``token_type_ids`` (unpadded lists) plus the label fields its
head's ``forward`` takes (``labels``, or ``start_positions``/``end_positions``). It passes them with
an ``evaluate(model) -> metrics`` callback and the name of the metric to maximise to :func:`train`.

Design choices:
1. Dynamic padding: each batch is padded to its own longest row and the attention mask derives
   from the lengths, so short GLUE sentences don't pay for ``max_seq_length`` on a CPU.
2. Determinism from ``config.seed`` alone: torch's global RNG (head init, dropout) is seeded once,
   and each epoch's shuffle order comes from a generator seeded with a blake2b digest of
   (seed, epoch), not from whatever state the RNG reached. Bitwise on the CPU; on CUDA some
   kernels (attention backward, scatter) are not deterministic, so expect tiny differences.
3. Best-keeping in memory: the best epoch's weights are cloned to the CPU when the score improves
   and restored at the end (one extra copy of a BERT-base is ~440 MB; no checkpoint round trip).
   Fractional ``epochs`` (e.g. 2.5) stop mid-epoch and evaluate there too.
4. The loop never imports tracking: ``log_fn(metrics, step)`` is the caller's callback.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import fsspec
import torch
from safetensors.torch import save as safetensors_save
from tokenizers import Tokenizer

from model.config import BertConfig
from model.contract import WordTokenizer, clear_stage, fingerprint_input, join_url, word_tokenizer_of
from model.export import copy_tokenizer, hf_config, read_tokenizer_config
from model.optim import build_optimizer, warmup_linear_schedule
from tasks.config import FINETUNED_FOLDER

logger = logging.getLogger("bertflow.finetune")

Feature = dict[str, Any]
LogFn = Callable[[dict[str, float], int], None]
SEQUENCE_KEYS = ("input_ids", "token_type_ids")
MAX_GRAD_NORM = 1.0  # as in the reference run_classifier.py / run_squad.py


# -- setup ----------------------------------------------------------------------------------------
class TooFewRowsError(ValueError):
    """A dev or test split with fewer usable rows than ``finetune.min_eval_examples``."""


def check_eval_split(
    task: str, split: str, url: str, usable: int, floor: int, rejected: dict[str, int] | None = None
) -> None:
    """Fail the task before any training when a dev or test split has fewer than ``floor`` usable
    rows: its score would mean nothing (0 rows scored 0.0 and entered the GLUE average)."""
    if usable >= max(1, floor):
        return
    rejects = ", ".join(f"{n} {why}" for why, n in (rejected or {}).items() if n) or "none rejected"
    raise TooFewRowsError(
        f"{task}: {split} split {url} has {usable} usable row(s), fewer than finetune.min_eval_examples={floor} "
        f"(the reader's rejects: {rejects}); a score on it would mean nothing: fix the file or point "
        f"data.downstream_urls.{task} elsewhere"
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def stable_seed(*parts: Any) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_tokenizer(model_url: str) -> Tokenizer | WordTokenizer:
    """The model folder's ``tokenizer.json`` (local or gs://), with padding and truncation off.

    A released BERT folder with only Google's ``vocab.txt`` gets the BERT WordPiece tokenizer
    built from it (lower-casing as its ``tokenizer_config.json`` says, else by the folder name:
    "uncased" lower-cases). A folder whose ``tokenizer_config.json`` names MeCab (ours, or a
    cl-tohoku model: ``word_tokenizer_type="mecab"`` with unidic-lite) or jieba gets the
    segmenting tokenizer of its ``vocab.txt``, which tokenises as ``BertJapaneseTokenizer`` does."""
    fs, root = fsspec.core.url_to_fs(model_url)
    root = root.rstrip("/")
    segmented = word_tokenizer_of(read_tokenizer_config(model_url))
    if segmented is not None:
        source = f"{model_url.rstrip('/')}/vocab.txt"
        with fs.open(f"{root}/vocab.txt", "r", encoding="utf-8", newline="") as f:
            vocab = f.read().rstrip("\n").split("\n")
        check_vocabulary({t: i for i, t in enumerate(vocab)}, source, model_url)
        tokenizer = WordTokenizer(vocab, *segmented, specials=True)
    elif fs.exists(f"{root}/tokenizer.json"):
        source = f"{model_url.rstrip('/')}/tokenizer.json"
        with fs.open(f"{root}/tokenizer.json", "r", encoding="utf-8") as f:
            tokenizer = Tokenizer.from_str(f.read())
        check_vocabulary(tokenizer.get_vocab(with_added_tokens=True), source, model_url)
    elif fs.exists(f"{root}/vocab.txt"):
        tokenizer = _wordpiece_from_vocab(fs, root, model_url)
    else:
        raise FileNotFoundError(f"{model_url}: no tokenizer.json or vocab.txt")
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


SPECIALS_NEEDED = ("[CLS]", "[SEP]", "[UNK]")
"""The tokens every task's inputs are built with."""


def check_vocabulary(vocab: dict[str, int], source: str, model_url: str) -> None:
    """Refuse a model folder whose vocabulary does not belong to its weights, naming the file and
    the mismatch: a special token the tasks need is missing, or an id is past ``config.json``'s
    ``vocab_size`` (the embedding rows) -- instead of ``KeyError: '[CLS]'`` or an ``IndexError``
    from the embedding at the first batch."""
    from model.export import load_bert_config

    missing = [t for t in SPECIALS_NEEDED if t not in vocab]
    if missing:
        raise ValueError(
            f"{source}: no {', '.join(missing)} token among its {len(vocab):,} entries: not a BERT vocabulary "
            f"(the tasks need {', '.join(SPECIALS_NEEDED)})"
        )
    fs, root = fsspec.core.url_to_fs(model_url)
    if not fs.exists(f"{root.rstrip('/')}/config.json"):
        return  # load_encoder names the missing config
    rows = load_bert_config(model_url).vocab_size
    top = max(vocab.values())
    if top >= rows:
        token = next(t for t, i in vocab.items() if i == top)
        raise ValueError(
            f"{source}: token {token!r} has id {top:,}, past {model_url.rstrip('/')}/config.json's vocab_size "
            f"{rows:,} (the embedding has rows 0..{rows - 1:,}): the vocabulary ({len(vocab):,} entries) does not "
            "belong to these weights"
        )


def _wordpiece_from_vocab(fs, root: str, model_url: str) -> Tokenizer:
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    with fs.open(f"{root}/vocab.txt", "r", encoding="utf-8") as f:
        vocab = {line.rstrip("\n"): i for i, line in enumerate(f) if line.rstrip("\n")}
    check_vocabulary(vocab, f"{model_url.rstrip('/')}/vocab.txt", model_url)
    lowercase = "uncased" in root.rsplit("/", 1)[-1].lower() or "cased" not in root.rsplit("/", 1)[-1].lower()
    if fs.exists(f"{root}/tokenizer_config.json"):
        with fs.open(f"{root}/tokenizer_config.json", "r") as f:
            lowercase = bool(json.load(f).get("do_lower_case", lowercase))
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase or None)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    tok.decoder = decoders.WordPiece()
    return tok


def load_encoder(model_url: str) -> torch.nn.Module:
    """The BertModel of any BERT folder in Hugging Face layout: ours, or a released one
    (``model.safetensors``, else ``pytorch_model.bin``; ``bert.*`` or bare key names; a
    pretraining or task head's extra keys ignored)."""
    from model.bert import BertModel
    from model.export import load_bert_config, load_hf_state_dict, load_pretrained

    fs, root = fsspec.core.url_to_fs(model_url)
    root = root.rstrip("/")
    if fs.exists(f"{root}/model.safetensors"):
        return load_pretrained(model_url)
    if not fs.exists(f"{root}/pytorch_model.bin"):
        raise FileNotFoundError(f"{model_url}: no model.safetensors or pytorch_model.bin")
    model = BertModel(load_bert_config(model_url))
    with fs.open(f"{root}/pytorch_model.bin", "rb") as f:
        state = torch.load(f, map_location="cpu", weights_only=True)
    load_hf_state_dict(model, state, source=model_url)
    return model


def special_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"the tokenizer has no {token} token")
    return token_id


# -- batches --------------------------------------------------------------------------------------
IGNORE_INDEX = -100  # label of a position that is not scored (padding, a word's later sub-tokens)


def collate(rows: Sequence[Feature], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad ``input_ids``/``token_type_ids`` to the batch's longest row; other fields to tensors.

    A row whose ``input_ids`` is a list of sequences (multiple choice) gives (B, C, T) tensors;
    a list-valued label field (token labels) is padded with :data:`IGNORE_INDEX`."""
    if rows and rows[0]["input_ids"] and isinstance(rows[0]["input_ids"][0], list):
        return _collate_choices(rows, pad_id)
    width = max(len(r["input_ids"]) for r in rows)
    batch: dict[str, torch.Tensor] = {}
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    types = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.tensor(r["input_ids"], dtype=torch.long)
        types[i, :n] = torch.tensor(r["token_type_ids"], dtype=torch.long)
        mask[i, :n] = 1
    batch.update(input_ids=ids, token_type_ids=types, attention_mask=mask)
    for key in rows[0]:
        if key in SEQUENCE_KEYS:
            continue
        values = [r[key] for r in rows]
        if isinstance(values[0], list):
            padded = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
            for i, v in enumerate(values):
                padded[i, : len(v)] = torch.tensor(v, dtype=torch.long)
            batch[key] = padded
            continue
        dtype = torch.float if isinstance(values[0], float) else torch.long
        batch[key] = torch.tensor(values, dtype=dtype)
    return batch


def _collate_choices(rows: Sequence[Feature], pad_id: int) -> dict[str, torch.Tensor]:
    choices = len(rows[0]["input_ids"])
    width = max(len(seq) for r in rows for seq in r["input_ids"])
    ids = torch.full((len(rows), choices, width), pad_id, dtype=torch.long)
    types = torch.zeros((len(rows), choices, width), dtype=torch.long)
    mask = torch.zeros((len(rows), choices, width), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r["input_ids"]) != choices:
            raise ValueError(f"rows differ in their number of choices: {len(r['input_ids'])} vs {choices}")
        for c, (seq, seg) in enumerate(zip(r["input_ids"], r["token_type_ids"])):
            ids[i, c, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            types[i, c, : len(seq)] = torch.tensor(seg, dtype=torch.long)
            mask[i, c, : len(seq)] = 1
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    for key in rows[0]:
        if key not in SEQUENCE_KEYS:
            batch[key] = torch.tensor([r[key] for r in rows], dtype=torch.long)
    return batch


def batches(features: Sequence[Feature], batch_size: int, order: Sequence[int] | None = None) -> list[list[Feature]]:
    order = range(len(features)) if order is None else order
    order = list(order)
    return [[features[i] for i in order[s : s + batch_size]] for s in range(0, len(order), batch_size)]


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    gen = torch.Generator().manual_seed(stable_seed(seed, "shuffle", epoch))
    return torch.randperm(n, generator=gen).tolist()


@torch.no_grad()
def predict(
    model: torch.nn.Module,
    features: Sequence[Feature],
    batch_size: int,
    outputs: Sequence[str],
    device: torch.device | None = None,
) -> dict[str, list]:
    """Run the model over features in order; the named output fields, row by row, as lists."""
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    collected: dict[str, list] = {name: [] for name in outputs}
    for rows in batches(features, batch_size):
        batch = collate(rows)
        inputs = {k: batch[k].to(device) for k in ("input_ids", "token_type_ids", "attention_mask")}
        out = model(**inputs)
        for name in outputs:
            collected[name].extend(getattr(out, name).float().cpu().tolist())
    model.train(was_training)
    return collected


# -- the loop -------------------------------------------------------------------------------------
@dataclasses.dataclass
class TrainResult:
    best_metrics: dict[str, float]
    best_epoch: int
    history: list[dict[str, float]]
    steps: int
    seconds: float


def train(
    model: torch.nn.Module,
    train_features: Sequence[Feature],
    config,  # tasks.config.FinetuneConfig
    evaluate: Callable[[torch.nn.Module], dict[str, float]],
    score_key: str,
    log_fn: LogFn | None = None,
    device: torch.device | None = None,
    log_every: int = 10,
) -> TrainResult:
    """Fine-tune ``model`` in place; evaluate each epoch; leave the best epoch's weights loaded.

    ``model(**batch)`` must return an object with ``.loss``. ``evaluate(model)`` returns metrics
    (names as they should be logged, e.g. ``eval_accuracy``) that include ``score_key``.
    """
    if not train_features:
        raise ValueError("no training features")
    started = time.time()
    device = device or pick_device()
    model.to(device)
    steps_per_epoch = math.ceil(len(train_features) / config.batch_size)
    total_steps = max(1, math.ceil(config.epochs * steps_per_epoch))
    warmup_steps = int(total_steps * config.warmup_proportion)
    optimizer = build_optimizer(model, config.learning_rate, config.weight_decay)
    scheduler = warmup_linear_schedule(optimizer, warmup_steps, total_steps)
    logger.info(
        "fine-tuning on %d features: %d steps (%d/epoch, warm-up %d), batch %d, lr %g, device %s",
        len(train_features),
        total_steps,
        steps_per_epoch,
        warmup_steps,
        config.batch_size,
        config.learning_rate,
        device,
    )

    best_score, best_state, best_metrics, best_epoch = -math.inf, None, {}, 0
    history: list[dict[str, float]] = []
    step, epoch = 0, 0
    running, running_n = 0.0, 0
    model.train()
    while step < total_steps:
        epoch += 1
        epoch_loss, epoch_n = 0.0, 0
        order = epoch_order(len(train_features), config.seed, epoch)
        for rows in batches(train_features, config.batch_size, order):
            batch = {k: v.to(device) for k, v in collate(rows).items()}
            loss = model(**batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            scheduler.step()
            step += 1
            value = loss.item()
            running, running_n = running + value, running_n + 1
            epoch_loss, epoch_n = epoch_loss + value, epoch_n + 1
            if step % log_every == 0 or step == total_steps:
                lr = scheduler.get_last_lr()[0]
                train_metrics = {
                    "train_loss": running / running_n,
                    "learning_rate": lr,
                    "epoch": step / steps_per_epoch,
                }
                logger.info("step %d/%d loss %.4f lr %.3g", step, total_steps, running / running_n, lr)
                if log_fn:
                    log_fn(train_metrics, step)
                running, running_n = 0.0, 0
            if step >= total_steps:
                break

        metrics = dict(evaluate(model))
        if score_key not in metrics:
            raise KeyError(f"evaluate() returned no {score_key!r}: {sorted(metrics)}")
        metrics["epoch"] = float(epoch)
        record = {"epoch": float(epoch), "step": float(step), "train_loss": epoch_loss / max(epoch_n, 1)}
        record.update(metrics)
        history.append(record)
        logger.info("epoch %d (step %d): %s", epoch, step, ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        if log_fn:
            log_fn(metrics, step)
        if metrics[score_key] > best_score:
            best_score, best_epoch, best_metrics = metrics[score_key], epoch, metrics
            best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    if best_state is not None:
        model.load_state_dict(best_state)
    logger.info("best epoch %d: %s %.4f", best_epoch, score_key, best_score)
    return TrainResult(best_metrics, best_epoch, history, step, time.time() - started)


# -- outputs --------------------------------------------------------------------------------------
def begin_run(seed: int, model_url: str, data_url: str, output_url: str) -> tuple[dict[str, str], Tokenizer]:
    """What every task's run does first: fingerprint its inputs (for the manifest), empty its
    output folder, seed, load the model's tokenizer. Returns (input fingerprints, tokenizer)."""
    inputs = {"model": fingerprint_input(model_url), "data": fingerprint_input(data_url)}
    prepare_output(output_url, model_url, data_url)
    seed_everything(seed)
    return inputs, load_tokenizer(model_url)


def prepare_output(output_url: str, *input_urls: str) -> None:
    """Empty the stage folder (so no stale file enters the manifest), refusing one that holds an input."""
    out = output_url.rstrip("/")
    for url in input_urls:
        url = url.rstrip("/")
        if url == out or url.startswith(out + "/"):
            raise ValueError(f"output {output_url} would overwrite the input {url}")
    clear_stage(output_url)


def write_text(url: str, text: str) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(fs._parent(path), exist_ok=True)
    with fs.open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(url: str, obj: Any) -> None:
    write_text(url, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_finetuned(
    model: torch.nn.Module,
    bert_config: BertConfig,
    output_url: str,
    architecture: str,
    extra_config: dict[str, Any] | None = None,
    model_url: str | None = None,
) -> None:
    """Write the fine-tuned model into ``{output_url}/model/`` in Hugging Face layout:
    ``model.safetensors`` (the head model's own key names, bert.* and the head's), ``config.json``
    as transformers 5 writes it, and the tokenizer files copied from ``model_url`` when it has
    them, so ``AutoModelFor<Task>.from_pretrained`` and ``AutoTokenizer`` load the folder."""
    folder = join_url(output_url, FINETUNED_FOLDER)
    fs, root = fsspec.core.url_to_fs(folder)
    fs.makedirs(root, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    with fs.open(f"{root}/model.safetensors", "wb") as f:
        f.write(safetensors_save(state, metadata={"format": "pt"}))
    write_json(join_url(folder, "config.json"), hf_config(bert_config, architecture, extra_config))
    if model_url:
        src_fs, src_root = fsspec.core.url_to_fs(model_url)
        if src_fs.exists(f"{src_root.rstrip('/')}/vocab.txt"):
            copy_tokenizer(model_url, folder, bert_config.max_position_embeddings)
