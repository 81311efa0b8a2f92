"""Resumable training checkpoints: write, find the latest complete one, read back, prune.

Layout: ``{run}/{phase}/step-{global_step:08d}/`` holding ``model.safetensors`` (HF key names,
the same format as an export, so any checkpoint loads with ``load_pretrained``), ``state.pt``
(optimizer, scheduler, RNG states, data-loader position, phase index, global step, counters:
a ``torch.save``'d dict of plain types and tensors, read back with ``weights_only=True``), and a
``_complete`` marker written LAST. A folder without the marker (a crash mid-write, a preempted
VM) is never picked, so resuming can't read half a checkpoint; a complete one that does not read
back (a corrupt file, a bucket that lost an object) is skipped with a warning for the previous
good one (:func:`load_latest_good`). Step numbers are global, so the
latest checkpoint is the one with the highest step whatever its phase.

Design choice, at what cost: one folder per checkpoint (no overwrite in place) makes writes
crash-safe on object stores that have no atomic rename (gs://); old folders are pruned after a
new one is complete, keeping the last few and every phase-end checkpoint.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import fsspec
import torch
from torch import nn

from model.contract import join_url, write_atomically
from model.export import load_hf_state_dict, read_weights, save_weights

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


def save_checkpoint(url: str, model: nn.Module, state: dict[str, Any]) -> None:
    """Write weights, then state, then the ``_complete`` marker (last, so a partial one is ignored)."""
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):  # a leftover partial write of the same step
        fs.rm(path, recursive=True)
    fs.makedirs(path, exist_ok=True)
    save_weights(model, join_url(url, WEIGHTS_NAME))
    # streamed, not buffered (optimizer state is twice the weights): a streamed upload to gs://
    # is still one object that appears when complete, and the marker below guards local folders
    with fs.open(join_url(path, STATE_NAME), "wb") as f:
        torch.save(to_cpu(state), f)
    write_atomically(join_url(url, COMPLETE), "ok\n")


def read_checkpoint(url: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(weights, state) of a checkpoint, both read before anything is applied."""
    weights = read_weights(join_url(url, WEIGHTS_NAME))
    fs, path = fsspec.core.url_to_fs(join_url(url, STATE_NAME))
    with fs.open(path, "rb") as f:
        state = torch.load(f, map_location="cpu", weights_only=True)
    return weights, state


def load_checkpoint(url: str, model: nn.Module) -> dict[str, Any]:
    """Load the weights into ``model`` and return the saved state dict (on CPU)."""
    weights, state = read_checkpoint(url)
    load_hf_state_dict(model, weights, source=url)
    return state


def load_latest_good(run_url: str) -> tuple[str, dict[str, torch.Tensor], dict[str, Any]] | None:
    """The newest complete checkpoint that reads back: (url, weights, state), or None.

    Unreadable ones are skipped with a warning (never deleted: a person may want to look).
    """
    for _, url in reversed(list_checkpoints(run_url)):
        try:
            weights, state = read_checkpoint(url)
        except Exception as exc:  # any read failure means "not usable"
            log.warning(
                "skipping unreadable checkpoint %s (%s: %s); trying the previous one", url, type(exc).__name__, exc
            )
            continue
        return url, weights, state
    return None


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
