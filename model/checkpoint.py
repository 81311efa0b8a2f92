"""Resumable training checkpoints: write, find the latest complete one, read back, prune.

Layout: ``{run}/{phase}/step-{global_step:08d}/`` holding ``model.safetensors`` (HF key names,
the same format as an export, so any checkpoint loads with ``load_pretrained``), ``state.pt``
(optimizer, scheduler, RNG states, data-loader position, phase index, global step, counters:
a ``torch.save``'d dict of plain types and tensors, read back with ``weights_only=True``), and a
``_complete`` marker written LAST, which records the sha256 of both files. A folder without the
marker (a crash mid-write, a preempted VM) is never picked, so resuming can't read half a
checkpoint. A checkpoint is verified before use (:func:`read_checkpoint`): both files must match
the checksums its marker recorded (a flipped bit, a same-size overwrite, a bucket that lost an
object), and its weights and optimizer state must be finite. One that fails is skipped with a
warning naming it and why, for the previous good one (:func:`load_latest_good`); it is kept on
disk for a person to look at. Weights that are not finite are never written as a checkpoint
(:func:`save_checkpoint` raises ``FloatingPointError``, a divergence), so a diverged run cannot
leave a poisoned checkpoint for the next run to resume from. Step numbers are global, so the
latest checkpoint is the one with the highest step whatever its phase. Markers of checkpoints
written before checksums existed (``ok``) are read as "no checksums": finiteness is checked still.

Costs: a sha256 of each checkpoint's files as they are written (in memory for the weights, as a
stream for the state) and again when one is resumed from (the state file is read twice then), and
one pass over the tensors for finiteness (the weights at every write; weights and optimizer state at
a resume). Measured parts on this 2-core box, busy (sha256 at 365 MB/s, torch.isfinite over 110M
floats in 2.8 s): a BERT-base checkpoint (0.44 GB of weights, 0.88 GB of AdamW state) costs ~4 s
of hashing and ~3 s of finiteness per write, ~4 s and ~8 s per resume.

Design choice, at what cost: one folder per checkpoint (no overwrite in place) makes writes
crash-safe on object stores that have no atomic rename (gs://); old folders are pruned after a
new one is complete, keeping the last few and every phase-end checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from typing import Any

import fsspec
import safetensors.torch
import torch
from torch import nn

from model.contract import join_url, write_atomically
from model.export import hf_state_dict, load_hf_state_dict

log = logging.getLogger("bertflow.checkpoint")

COMPLETE = "_complete"
STATE_NAME = "state.pt"
WEIGHTS_NAME = "model.safetensors"
_STEP_DIR = re.compile(r"step-(\d{8,})$")


def checkpoint_url(run_url: str, phase_name: str, global_step: int) -> str:
    return join_url(run_url, phase_name, f"step-{global_step:08d}")


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor (in nested dicts, lists, tuples) detached and on the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu")
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


class CheckpointError(ValueError):
    """A checkpoint that must not be resumed from: a checksum differs, a tensor is not finite."""


class _HashingWriter:
    """A file object that hashes what passes through it (``torch.save`` writes, never seeks)."""

    def __init__(self, f):
        self.f, self.sha = f, hashlib.sha256()

    def write(self, data) -> int:
        self.sha.update(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def nonfinite(tensors: dict[str, Any], prefix: str = "") -> list[str]:
    """Names of the floating-point tensors (in nested dicts and lists) holding NaN or inf."""
    bad: list[str] = []
    if isinstance(tensors, torch.Tensor):
        if tensors.is_floating_point() and not bool(torch.isfinite(tensors).all()):
            bad.append(prefix or "tensor")
    elif isinstance(tensors, dict):
        for k, v in tensors.items():
            bad += nonfinite(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(tensors, (list, tuple)):
        for i, v in enumerate(tensors):
            bad += nonfinite(v, f"{prefix}.{i}" if prefix else str(i))
    return bad


def save_checkpoint(url: str, model: nn.Module, state: dict[str, Any]) -> None:
    """Write weights, then state, then the ``_complete`` marker with both files' sha256 (last, so
    a partial one is ignored). Weights that are not finite raise ``FloatingPointError`` instead."""
    weights = hf_state_dict(model)
    bad = nonfinite(weights)
    if bad:
        step = state.get("train", {}).get("global_step", "?")
        raise FloatingPointError(
            f"the weights hold NaN/inf at step {step} ({len(bad)} tensor(s), first {bad[0]}): training "
            f"diverged; not written as checkpoint {url}"
        )
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):  # a leftover partial write of the same step
        fs.rm(path, recursive=True)
    fs.makedirs(path, exist_ok=True)
    data = safetensors.torch.save(weights, metadata={"format": "pt"})
    write_atomically(join_url(url, WEIGHTS_NAME), data)
    # streamed, not buffered (optimizer state is twice the weights): a streamed upload to gs://
    # is still one object that appears when complete, and the marker below guards local folders
    with fs.open(join_url(path, STATE_NAME), "wb") as f:
        writer = _HashingWriter(f)
        torch.save(to_cpu(state), writer)
    sums = {WEIGHTS_NAME: hashlib.sha256(data).hexdigest(), STATE_NAME: writer.sha.hexdigest()}
    write_atomically(join_url(url, COMPLETE), json.dumps({"sha256": sums}, sort_keys=True) + "\n")


def recorded_checksums(url: str) -> dict[str, str]:
    """The sha256 per file that a checkpoint's marker recorded ({} for an older ``ok`` marker)."""
    fs, path = fsspec.core.url_to_fs(join_url(url, COMPLETE))
    with fs.open(path, "r") as f:
        text = f.read().strip()
    if text == "ok":
        return {}
    try:
        return dict(json.loads(text)["sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{url}/{COMPLETE}: not a checkpoint marker ({exc})") from None


def _sha256_of(fs, path: str) -> str:
    h = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _verify(url: str, name: str, sums: dict[str, str], actual: str) -> None:
    if name in sums and sums[name] != actual:
        raise CheckpointError(
            f"{url}/{name}: its sha256 differs from the one recorded when it was written (damaged or overwritten)"
        )


def read_checkpoint(url: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(weights, state) of a checkpoint, both read and verified before anything is applied:
    checksums as recorded, every tensor finite (else :class:`CheckpointError` naming the file)."""
    sums = recorded_checksums(url)
    fs, wpath = fsspec.core.url_to_fs(join_url(url, WEIGHTS_NAME))
    if not fs.exists(wpath):
        raise FileNotFoundError(f"no weights at {url}/{WEIGHTS_NAME}")
    with fs.open(wpath, "rb") as f:
        data = f.read()
    _verify(url, WEIGHTS_NAME, sums, hashlib.sha256(data).hexdigest())
    weights = safetensors.torch.load(data)
    del data
    fs, spath = fsspec.core.url_to_fs(join_url(url, STATE_NAME))
    if STATE_NAME in sums:
        _verify(url, STATE_NAME, sums, _sha256_of(fs, spath))
    with fs.open(spath, "rb") as f:
        state = torch.load(f, map_location="cpu", weights_only=True)
    bad = nonfinite(weights)
    if bad:
        raise CheckpointError(f"{url}/{WEIGHTS_NAME}: {len(bad)} tensor(s) hold NaN/inf (first {bad[0]})")
    bad = nonfinite(state.get("optimizer", {}))
    if bad:
        raise CheckpointError(f"{url}/{STATE_NAME}: the optimizer state holds NaN/inf ({len(bad)}, first {bad[0]})")
    return weights, state


def load_checkpoint(url: str, model: nn.Module) -> dict[str, Any]:
    """Load the weights into ``model`` and return the saved state dict (on CPU)."""
    weights, state = read_checkpoint(url)
    load_hf_state_dict(model, weights, source=url)
    return state


def load_latest_good(run_url: str) -> tuple[str, dict[str, torch.Tensor], dict[str, Any]] | None:
    """The newest complete checkpoint that reads back and verifies: (url, weights, state), or None.

    Bad ones are skipped with a warning naming them and why (never deleted: a person may want to look).
    """
    for _, url in reversed(list_checkpoints(run_url)):
        try:
            weights, state = read_checkpoint(url)
        except Exception as exc:  # any read or verification failure means "not usable"
            log.warning(
                "skipping unreadable checkpoint %s (%s: %s); trying the previous one", url, type(exc).__name__, exc
            )
            continue
        return url, weights, state
    return None


def describe_divergence(run_url: str, exc: BaseException) -> str:
    """What a diverged run says: the step (from ``exc``) and the newest good checkpoint a rerun
    would resume from."""
    found = list_checkpoints(run_url)
    where = (
        f"the newest checkpoint is {found[-1][1]} (step {found[-1][0]}), which a rerun resumes from"
        if found
        else f"no checkpoint under {run_url}: a rerun starts over"
    )
    return (
        f"training diverged: {exc}; {where}. Not retried: the same data and settings diverge the same way; "
        "lower pretrain.learning_rate (or raise pretrain.warmup_steps: --set, or a deployment's overrides) and "
        "rerun, or start over with --force pretrain (a deployment run: --param force='[\"pretrain\"]')"
    )


def list_checkpoints(run_url: str) -> list[tuple[int, str]]:
    """(global step, url) of every COMPLETE checkpoint under a run folder, by step."""
    fs, root = fsspec.core.url_to_fs(run_url)
    if not fs.exists(root):
        return []
    found = []
    for marker in fs.glob(join_url(root, "*", "step-*", COMPLETE)):
        folder = marker.rsplit("/", 1)[0]
        m = _STEP_DIR.search(folder)
        if m:
            rel = folder[len(root.rstrip("/")) + 1 :]
            found.append((int(m.group(1)), join_url(run_url, rel)))
    return sorted(found)


def find_latest_checkpoint(run_url: str) -> str | None:
    """The URL of the complete checkpoint with the highest global step, or None."""
    found = list_checkpoints(run_url)
    return found[-1][1] if found else None


def prune_checkpoints(run_url: str, keep_last: int, keep: set[int] = frozenset()) -> list[str]:
    """Delete all but the ``keep_last`` newest complete checkpoints and the steps in ``keep``.

    The marker goes first, so a crash mid-delete leaves an ignored folder, never a bad resume.
    """
    found = list_checkpoints(run_url)
    doomed = [(s, u) for s, u in found[: max(0, len(found) - keep_last)] if s not in keep]
    for _, url in doomed:
        fs, path = fsspec.core.url_to_fs(url)
        fs.rm(join_url(path, COMPLETE))
        fs.rm(path, recursive=True)
    return [u for _, u in doomed]
