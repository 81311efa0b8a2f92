"""Typed configuration of downstream fine-tuning and evaluation."""

from __future__ import annotations

from dataclasses import dataclass


class ConfigError(ValueError):
    """An invalid configuration value; the message names the field."""


def check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{name}: {message}")


@dataclass(frozen=True)
class FinetuneConfig:
    """One fine-tune/eval run of a pretrained model on a downstream task."""

    learning_rate: float = 2e-5
    batch_size: int = 32
    epochs: float = 3.0
    max_seq_length: int = 128
    warmup_proportion: float = 0.1
    weight_decay: float = 0.01
    seed: int = 42
    classifier_dropout: float = 0.1

    def __post_init__(self):
        check(self.learning_rate > 0, "finetune.learning_rate", "must be > 0")
        check(self.batch_size >= 1, "finetune.batch_size", "must be >= 1")
        check(self.epochs > 0, "finetune.epochs", "must be > 0")
        check(self.max_seq_length >= 8, "finetune.max_seq_length", "must be >= 8")
        check(0 <= self.warmup_proportion <= 1, "finetune.warmup_proportion", "must lie in [0, 1]")
        check(0 <= self.classifier_dropout < 1, "finetune.classifier_dropout", "in [0, 1)")
