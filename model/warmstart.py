"""Starting pretraining from another BERT (``pretrain.init_from``), also when the vocabularies differ.

``init_from`` names a BERT folder in Hugging Face layout (ours or a released one). Its weights
start the run; the model's shape must be the run's but for the vocabulary's size. When its
``vocab.txt`` is not the run's (a refresh retrained the vocabulary on the new dump, so ids moved
and some pieces came or went), the rows indexed by token id (the word embeddings, tied to the MLM
decoder, and the MLM output bias) are carried over by token string: a piece both vocabularies
hold keeps what it learnt, a new piece keeps its fresh initialisation, a dropped one is gone.
Every other tensor is copied as it is. Cost: new pieces start untrained while the rest of the
network is not; on a monthly dump, where most pieces stay, that is a small share of the rows.
"""

from __future__ import annotations

import dataclasses
import logging

import fsspec
import torch
from torch import nn

from model.contract import join_url
from model.export import load_pretrained

log = logging.getLogger("bertflow.pretrain")
VOCAB_NAME = "vocab.txt"
BY_TOKEN = ("word_embeddings.weight", "predictions.bias", "predictions.decoder.weight")
"""The tensors whose rows are token ids (``model/bert.py``'s names)."""


def read_vocab(url: str) -> list[str]:
    """The tokens of ``url``'s ``vocab.txt``, in id order ([] when the folder has none)."""
    fs, path = fsspec.core.url_to_fs(join_url(url, VOCAB_NAME))
    if not fs.exists(path):
        return []
    with fs.open(path, "r", encoding="utf-8") as f:
        return f.read().splitlines()


def init_weights(model: nn.Module, init_from: str, vocab_url: str = "") -> dict[str, int]:
    """Load ``init_from``'s weights into ``model`` (a ``BertForPreTraining``), carrying the rows of
    shared tokens over when its vocabulary is not the one at ``vocab_url``; returns counts
    (``shared_tokens``, ``new_tokens``; both 0 when the vocabularies are equal)."""
    from model.bert import BertForPreTraining

    source = load_pretrained(init_from, BertForPreTraining)
    target_config = model.config
    if dataclasses.replace(source.config, vocab_size=target_config.vocab_size) != target_config:
        raise ValueError(
            f"init_from {init_from}: its config.json differs from the model config beyond the vocabulary "
            f"({source.config} vs {target_config})"
        )
    weights, state = source.state_dict(), model.state_dict()
    # another objective's network: heads of the source this one lacks are left behind (an NSP
    # head for an MLM-only run), heads this one has that the source lacks start from their init
    # (the pooler and sentence head of a sentence-order run from an MLM-only model)
    behind, fresh = sorted(set(weights) - set(state)), sorted(set(state) - set(weights))
    if behind or fresh:
        log.info(
            "initialised from %s, a network of another objective: %s left behind; %s start from their init",
            init_from, ", ".join(behind) or "nothing", ", ".join(fresh) or "nothing",
        )  # fmt: skip
    weights = {name: value for name, value in weights.items() if name in state}
    old, new = read_vocab(init_from), read_vocab(vocab_url) if vocab_url else []
    if source.config.vocab_size == target_config.vocab_size and (not new or old == new):
        model.load_state_dict({**state, **weights})
        return {"shared_tokens": 0, "new_tokens": 0}
    if not old or not new:
        raise ValueError(
            f"init_from {init_from}: its vocabulary ({source.config.vocab_size}) is not the run's "
            f"({target_config.vocab_size}) and {VOCAB_NAME} is missing from "
            f"{init_from if not old else vocab_url}: the rows cannot be matched by token"
        )
    where = {tok: i for i, tok in enumerate(old)}
    pairs = [(i, where[tok]) for i, tok in enumerate(new) if tok in where]
    to_ids = torch.tensor([i for i, _ in pairs], dtype=torch.long)
    from_ids = torch.tensor([j for _, j in pairs], dtype=torch.long)
    dst_v = target_config.vocab_size
    with torch.no_grad():
        for name, value in weights.items():
            target = state[name]
            if name.endswith(BY_TOKEN):
                target[to_ids] = value[from_ids]  # (V_new, ...) <- (V_old, ...) by token string
            else:
                target.copy_(value)
    model.load_state_dict(state)
    log.info(
        "initialised from %s: %d of %d tokens carried over by their string, %d new",
        init_from, len(pairs), dst_v, dst_v - len(pairs),
    )  # fmt: skip
    return {"shared_tokens": len(pairs), "new_tokens": dst_v - len(pairs)}
