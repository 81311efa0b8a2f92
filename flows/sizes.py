"""What a stage needs of this host, estimated before it runs: memory for pretraining, disk for the
examples stage. The stage rows' preflight (``flows/hooks.py``) compares the estimates with the
host (``/proc/meminfo``'s MemAvailable, the root's free disk) and refuses in seconds, giving the
estimate, instead of a stage that is OOM-killed four times or fills the disk at 0.8 MB/s.

The bounds that hold on every host are the configs' own (``pipeline.schema.config.LIMITS``).
These estimates are lower bounds, labelled as such: pretraining's activations and the Beam
workers' memory come on top.

Calibration (the tiny chain, ``bertflow run --preset tiny`` with the test overrides, dupe 2):
524,629 corpus characters gave 855,320 bytes of example shards at two lengths, 0.41 bytes per
character per copy per length (``EXAMPLE_BYTES_PER_CHAR`` rounds up); the job's sorted runs and
token files take about as much again until the merge (``EXAMPLES_PEAK``). The bundled sample's
raw files gave 0.44 characters per byte of plain text and 3.05 per byte of ``.bz2`` dump.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

EXAMPLE_BYTES_PER_CHAR = 0.5
"""Bytes of example shards per corpus character, per copy (dupe_factor) and sequence length."""
EXAMPLES_PEAK = 2.5
"""Peak disk of the examples job over its final output (sorted runs and token files)."""
CHARS_PER_RAW_BYTE = {"bz2": 3.0, "plain": 0.5}
"""Corpus characters per byte of a raw input, before the corpus stage has run."""
TRAIN_BYTES_PER_PARAMETER = 16
"""fp32 weights, gradients and AdamW's two moments."""


class HostTooSmallError(OSError):
    """A stage would not fit this host's memory or the root's disk; the message gives the estimate."""

    deterministic = True  # a retry on the same host meets it again


def gib(n: float) -> str:
    return f"{n / (1 << 30):,.1f} GiB"


def gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def bert_parameters(model: Any, sentence_head: bool = True) -> int:
    """Parameters of the pretraining network for a ``BertConfig`` (tied decoder counted once):
    ``BertForPreTraining``, or ``BertForMaskedLM`` (no pooler, no sentence-level head) for an
    objective without a sentence-level loss."""
    h, f, v = model.hidden_size, model.intermediate_size, model.vocab_size
    embeddings = (v + model.max_position_embeddings + model.type_vocab_size) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
    heads = (h * h + h) + 2 * h + v  # MLM transform, its bias
    if sentence_head:
        heads += (h * h + h) + (2 * h + 2)  # pooler; NSP / SOP
    return embeddings + model.num_hidden_layers * layer + heads


def available_memory() -> int | None:
    """MemAvailable of this host in bytes (None where ``/proc/meminfo`` is not there)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def loader_bytes(pretrain: Any) -> int:
    """The loader's shuffle buffers over the host: examples held x parts x bytes per example (the
    window, its shuffled copy and the row group being read)."""
    parts = pretrain.data_parts or pretrain.nproc * max(1, pretrain.loader_workers)
    longest = max(p.max_seq_length for p in pretrain.phases)
    per_example = 3 * (2 * longest + 10 * max(1, longest // 6) + 64)
    return pretrain.loader_buffer * parts * per_example


def check_training_memory(cfg: Any, available: int | None) -> None:
    """Raise :class:`HostTooSmallError` when pretraining on the CPU cannot fit this host: every process holds
    the model with its gradients and AdamW state (16 bytes a parameter), plus the loader."""
    if available is None or cfg.pretrain.backend != "cpu":
        return
    import dataclasses

    from pipeline.schema.objectives import get_objective

    model = cfg.model  # unset vocab_size: at most vocab.vocab_size pieces will be trained
    if model.vocab_size is None:
        model = dataclasses.replace(model, vocab_size=cfg.vocab.vocab_size)
    params = bert_parameters(model, bool(get_objective(cfg.examples.objective).sentence_loss))
    replicas = 1 if cfg.pretrain.parallel == "fsdp" else cfg.pretrain.nproc
    model_bytes = params * TRAIN_BYTES_PER_PARAMETER * replicas
    need = model_bytes + loader_bytes(cfg.pretrain)
    if need > available:
        m = model
        raise HostTooSmallError(
            f"pretrain: needs at least {gib(need)} of memory, this host has {gib(available)} available: "
            f"{params:,} parameters (model.vocab_size {m.vocab_size:,}, hidden_size {m.hidden_size}, "
            f"num_hidden_layers {m.num_hidden_layers}, intermediate_size {m.intermediate_size}) x 16 bytes "
            f"(weights, gradients, AdamW) x {replicas} process(es) = {gib(model_bytes)}, and the loader's buffers "
            f"(pretrain.loader_buffer {cfg.pretrain.loader_buffer:,}) {gib(loader_bytes(cfg.pretrain))}; "
            "activations come on top: lower the model's size or pretrain.loader_buffer"
        )


def raw_chars(urls: list[str]) -> float:
    """Corpus characters expected from raw inputs (before the corpus stage ran), from their sizes."""
    import fsspec

    total = 0.0
    for url in urls:
        if not url:
            continue
        fs, path = fsspec.core.url_to_fs(url)
        paths = fs.glob(path) if any(c in path for c in "*?[") else [path]
        for p in paths:
            if not fs.exists(p):
                continue
            sizes = fs.du(p, total=False) if fs.isdir(p) else {p: fs.size(p)}
            for name, size in sizes.items():
                kind = "bz2" if str(name).endswith(".bz2") else "plain"
                total += (size or 0) * CHARS_PER_RAW_BYTE[kind]
    return total


def free_disk(url: str) -> int | None:
    """Free bytes on the filesystem holding ``url`` (its nearest existing folder); None for an
    object store (no bound to check)."""
    if "://" in url and not url.startswith("file://"):
        return None
    path = os.path.abspath(url.removeprefix("file://"))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def check_examples_disk(examples: Any, chars: float, free: int | None, where: str, source: str) -> None:
    """Raise :class:`HostTooSmallError` when the examples stage would not fit on the disk under
    ``where``: corpus characters x dupe_factor x lengths x bytes per character, its temporary
    files included."""
    if free is None or chars <= 0:
        return
    lengths = len(examples.max_seq_lengths)
    final = chars * EXAMPLE_BYTES_PER_CHAR * examples.dupe_factor * lengths
    peak = final * EXAMPLES_PEAK
    if peak > free:
        raise HostTooSmallError(
            f"examples: would write about {gb(final)} of shards and need about {gb(peak)} of disk while it runs "
            f"(an estimate: {chars:,.0f} corpus characters ({source}) x examples.dupe_factor {examples.dupe_factor} "
            f"x {lengths} length(s) x {EXAMPLE_BYTES_PER_CHAR} bytes, x{EXAMPLES_PEAK} for its sorted runs), more "
            f"than the {gb(free)} free under {where}: lower examples.dupe_factor or examples.max_seq_lengths, or "
            "use a root with more space"
        )
