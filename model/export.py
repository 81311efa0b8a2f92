"""Export and import in Hugging Face layout: config.json + model.safetensors (+ tokenizer files).

A folder written here loads with ``transformers.BertForPreTraining.from_pretrained`` (or
``BertModel``/``AutoModel``; an MLM-only model, ``BertForMaskedLM``, with no pooler and no
sentence-level head, as ``AutoModelForMaskedLM``), and a folder written by transformers loads here. Key convention:
every file stores HF ``BertForPreTraining`` names, "bert.*" for the backbone and "cls.*" for the
heads; a bare ``BertModel`` is saved with the "bert." prefix too (transformers strips it when
loading a ``BertModel``). The tied MLM decoder weight is stored once, as
``bert.embeddings.word_embeddings.weight``, like transformers does.

On import, keys are normalised so that all of these load: our files, HF ``BertForPreTraining``
/ ``BertForMaskedLM`` files ("bert."/"cls." prefixes), HF ``BertModel`` files (no prefix), old
TF-converted files (LayerNorm ``gamma``/``beta``). Missing backbone keys are an error; missing
head keys (loading heads from a backbone-only file) leave the heads at their init with a warning.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time

import fsspec
import safetensors.torch
import torch
from torch import nn

from model.bert import BertForMaskedLM, BertForPreTraining, BertModel, count_parameters
from model.config import BertConfig, load_bert_config
from model.contract import (
    Manifest,
    clear_stage,
    fingerprint_input,
    join_url,
    read_manifest,
    word_tokenizer_of,
    write_atomically,
    write_manifest,
)
from model.stage_configs import export_manifest_config as manifest_config

log = logging.getLogger("bertflow.export")

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}
TRANSFORMERS_VERSION = "5.24.0"
"""The transformers release whose ``config.json`` layout the folders follow (``dtype``, not the
pre-5.0 ``torch_dtype``); a constant, not the installed version, so the file (and the export's
fingerprint) is the same wherever it is written. tests/model/test_export.py checks it against the
installed transformers (the test extra's pin)."""
# Keys transformers may write that carry nothing of their own here.
_IGNORED = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "embeddings.position_ids")


# -- state dicts in HF naming -----------------------------------------------------------------
def hf_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors under HF BertForPreTraining names, tied decoder weight dropped, on CPU."""
    model = getattr(model, "module", model)  # a DDP wrapper
    if isinstance(model, BertForPreTraining):
        state = model.state_dict()
    elif isinstance(model, BertModel):
        state = {f"bert.{k}": v for k, v in model.state_dict().items()}
    else:
        raise TypeError(f"cannot export {type(model).__name__}: expected BertModel or BertForPreTraining")
    state.pop("cls.predictions.decoder.weight", None)
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def normalise_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Any HF-style BERT checkpoint's keys -> "bert.*" / "cls.*" with weight/bias names."""
    out = {}
    for key, value in state.items():
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if key.startswith(("embeddings.", "encoder.", "pooler.")):
            key = "bert." + key
        if any(key.endswith(i) for i in _IGNORED):
            continue
        out[key] = value
    return out


def load_hf_state_dict(model: nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Load normalised HF-named tensors into a BertModel or BertForPreTraining, in place."""
    state = normalise_keys(state)
    model = getattr(model, "module", model)
    if isinstance(model, BertModel):
        wanted = {k[len("bert.") :]: v for k, v in state.items() if k.startswith("bert.")}
        others = [k for k in state if not k.startswith("bert.")]
    else:
        wanted = {k: v for k, v in state.items() if k.startswith(("bert.", "cls."))}
        others = [k for k in state if not k.startswith(("bert.", "cls."))]
    own = model.state_dict()
    own.pop("cls.predictions.decoder.weight", None)  # tied: comes with the word embeddings
    missing = sorted(set(own) - set(wanted))
    # an MLM-only export has no pooler (HF's BertForMaskedLM): a backbone built on it starts its pooler untrained
    backbone_missing = [
        k
        for k in missing
        if (isinstance(model, BertModel) or k.startswith("bert.")) and not k.startswith(("pooler.", "bert.pooler."))
    ]
    if backbone_missing:
        raise KeyError(
            f"{source} lacks backbone weights: {backbone_missing[:5]}"
            f"{' ...' if len(backbone_missing) > 5 else ''} ({len(backbone_missing)} missing)"
        )
    if missing:
        log.warning("%s has no weights for %s; they keep their random init", source, missing)
    unexpected = sorted(set(wanted) - set(own)) + sorted(others)
    if unexpected:
        # a backbone loaded from a pretraining export drops the MLM/NSP heads: expected, nothing for
        # anyone to act on (every fine-tuning unit printed it), so only with --verbose
        heads_only = isinstance(model, BertModel) and all(k.startswith("cls.") for k in unexpected)
        log.log(
            logging.DEBUG if heads_only else logging.WARNING,
            "%s: ignoring weights this model does not have: %s",
            source,
            unexpected[:10],
        )
    for k in set(wanted) & set(own):
        if wanted[k].shape != own[k].shape:
            raise ValueError(
                f"{source}: {k} has shape {tuple(wanted[k].shape)}, "
                f"the model expects {tuple(own[k].shape)} (config mismatch?)"
            )
    model.load_state_dict({k: v for k, v in wanted.items() if k in own}, strict=False)


def save_weights(model: nn.Module, url: str) -> None:
    data = safetensors.torch.save(hf_state_dict(model), metadata={"format": "pt"})
    write_atomically(url, data)


def read_weights(url: str) -> dict[str, torch.Tensor]:
    fs, path = fsspec.core.url_to_fs(url)
    if not fs.exists(path):
        raise FileNotFoundError(f"no weights at {url}")
    with fs.open(path, "rb") as f:
        return safetensors.torch.load(f.read())


def _write_json(url: str, obj: dict) -> None:
    write_atomically(url, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _architecture(model: nn.Module) -> str:
    return type(getattr(model, "module", model)).__name__


# -- the public API -----------------------------------------------------------------------------
def save_pretrained(model: nn.Module, output_url: str, vocab_url: str | None = None) -> None:
    """Write ``model`` to ``output_url`` in HF layout; copy the tokenizer from ``vocab_url`` if given."""
    inner = getattr(model, "module", model)
    fs, root = fsspec.core.url_to_fs(output_url)
    fs.makedirs(root, exist_ok=True)
    save_weights(inner, join_url(output_url, WEIGHTS_NAME))
    _write_json(join_url(output_url, CONFIG_NAME), hf_config(inner.config, _architecture(inner)))
    if vocab_url is not None:
        copy_tokenizer(vocab_url, output_url, inner.config.max_position_embeddings)


def hf_config(config: BertConfig, architecture: str, extra: dict | None = None) -> dict:
    """``config.json`` as transformers 5 writes it for a BERT of ``architecture`` (float32 weights)."""
    out = dataclasses.asdict(config)
    out.update(
        model_type="bert",
        architectures=[architecture],
        position_embedding_type="absolute",
        dtype="float32",
        transformers_version=TRANSFORMERS_VERSION,
    )
    out.update(extra or {})
    return out


def read_tokenizer_config(folder_url: str) -> dict:
    """A folder's ``tokenizer_config.json`` ({} when it has none)."""
    fs, path = fsspec.core.url_to_fs(join_url(folder_url, "tokenizer_config.json"))
    if not fs.exists(path):
        return {}
    with fs.open(path, "r", encoding="utf-8") as f:
        return json.load(f)


def copy_tokenizer(vocab_url: str, output_url: str, model_max_length: int) -> None:
    """vocab.txt (required) and tokenizer.json (if present), plus HF's tokenizer config files.

    A MeCab or jieba vocabulary's ``tokenizer_config.json`` is carried over as it is (it tells
    ``AutoTokenizer`` to build ``BertJapaneseTokenizer`` with MeCab, or marks jieba input), with
    ``model_max_length`` set; otherwise BERT's, lower-casing as the vocabulary's config says."""
    source = read_tokenizer_config(vocab_url)
    for name, required in (("vocab.txt", True), ("tokenizer.json", False)):
        src_fs, src = fsspec.core.url_to_fs(join_url(vocab_url, name))
        if not src_fs.exists(src):
            if required:
                raise FileNotFoundError(f"{vocab_url} has no {name}")
            continue
        with src_fs.open(src, "rb") as f:
            write_atomically(join_url(output_url, name), f.read())
    if word_tokenizer_of(source) is not None:
        _write_json(join_url(output_url, "tokenizer_config.json"), {**source, "model_max_length": model_max_length})
        _write_json(join_url(output_url, "special_tokens_map.json"), SPECIAL_TOKENS)
        return
    _write_json(
        join_url(output_url, "tokenizer_config.json"),
        {
            "do_lower_case": bool(source.get("do_lower_case", True)),
            "model_max_length": model_max_length,
            "tokenizer_class": "BertTokenizer",
            **SPECIAL_TOKENS,
        },
    )
    _write_json(join_url(output_url, "special_tokens_map.json"), SPECIAL_TOKENS)


def load_pretrained(model_url: str, cls: type[nn.Module] = BertModel) -> nn.Module:
    """A ``cls`` (BertModel, BertForPreTraining or BertForMaskedLM) built from ``model_url``'s
    config and weights. ``BertForPreTraining`` asks for the pretraining network the folder holds:
    a ``BertForMaskedLM`` when its ``config.json`` says so (an MLM-only objective)."""
    if cls not in (BertModel, BertForPreTraining, BertForMaskedLM):
        raise TypeError(f"cls must be BertModel, BertForPreTraining or BertForMaskedLM, got {cls!r}")
    if cls is BertForPreTraining and _architectures(model_url) == ["BertForMaskedLM"]:
        cls = BertForMaskedLM
    model = cls(load_bert_config(model_url))
    load_hf_state_dict(model, read_weights(join_url(model_url, WEIGHTS_NAME)), source=model_url)
    return model


def _architectures(model_url: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(join_url(model_url, CONFIG_NAME))
    with fs.open(path, "r") as f:
        return list(json.load(f).get("architectures") or [])


def run_export(checkpoint_url: str, vocab_url: str, output_url: str) -> Manifest:
    """Export the pretrain stage's final weights with the vocabulary as a HF model folder."""
    t0 = time.time()
    read_manifest(checkpoint_url)  # refuses an unfinished pretraining run
    model = load_pretrained(join_url(checkpoint_url, "final"), BertForPreTraining)
    clear_stage(output_url)
    save_pretrained(model, output_url, vocab_url)
    return write_manifest(
        "export",
        output_url,
        config=manifest_config(model.config, _architecture(model)),
        inputs={"pretrain": fingerprint_input(checkpoint_url), "vocab": fingerprint_input(vocab_url)},
        counts={"parameters": count_parameters(model)},
        seconds=time.time() - t0,
    )
