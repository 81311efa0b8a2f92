"""What the pretrain and export stages record as their config in their manifests: the flow
compares it with the manifest to skip a finished stage (``bertflow run``, ``bertflow status``).

Kept apart from ``model.train`` and ``model.export`` because those import torch, and deciding
that a stage is up to date must not: ``bertflow status`` answers from manifests alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from model.config import BertConfig, PretrainConfig

FREE = (
    "log_every",
    "checkpoint_every",
    "backend",
    "eval_every",
    "eval_batches",
    "loader_workers",
    "precision",
    "peak_tflops",
    "keep_checkpoints",
    "nproc",
    "unpad",
    "compile",
    "xla_cache",
)  # nproc: data_parts holds what binds; unpad, compile: the same maths, another kernel
"""The pretraining fields that never change the weights: left out of the manifest's config."""


def pretrain_manifest_config(config: PretrainConfig, model_config: BertConfig) -> dict[str, Any]:
    """The config run_pretrain records in its manifest (the flow compares it to skip a finished run).
    Without the fields that never change the weights (:data:`FREE`: backend, precision,
    processes, logging, ...): a run finished on a TPU is up to date where the same preset resolves
    to another backend."""
    kept = {k: v for k, v in dataclasses.asdict(config).items() if k not in FREE}
    return {**kept, "model": dataclasses.asdict(model_config)}


def export_manifest_config(config: BertConfig, architecture: str = "BertForPreTraining") -> dict:
    """The config run_export records in its manifest (the flow compares it to skip a finished run)."""
    return {**dataclasses.asdict(config), "architectures": [architecture]}
