"""BERT's optimiser and learning-rate schedule.

Adam with decoupled weight decay (``torch.optim.AdamW``), decay off for biases and LayerNorm
weights (the reference excludes parameter names containing "bias" or "LayerNorm"), and one
schedule over the whole run: linear warm-up from 0, then linear decay to 0 at ``total_steps``.

Design choice, and what it costs: the reference ``AdamWeightDecayOptimizer`` (and HF's old
``BertAdam``) skips Adam's bias correction; torch's AdamW applies it. With β2 = 0.999 and a
10k-step warm-up the two differ only in the first few thousand steps, where the warm-up keeps
the learning rate small anyway; we take the standard, fused/foreach-capable optimiser.
The schedule matches HF's ``get_linear_schedule_with_warmup``: the factor is ``step / warmup``
during warm-up (0 at the very first step) and ``(total - step) / (total - warmup)`` after.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR


def no_decay(name: str) -> bool:
    """Biases (including the MLM output bias) and LayerNorm parameters are not decayed."""
    return name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
) -> torch.optim.AdamW:
    """AdamW with two parameter groups: [0] decayed weights, [1] biases and LayerNorm (no decay).

    ``named_parameters()`` yields a tied parameter once (under its first name, the word
    embeddings), so the tied MLM decoder weight is optimised exactly once.
    """
    decay, plain = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (plain if no_decay(name) else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": plain, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


class WarmupLinear:
    """The LR factor at a step: a picklable callable (so it survives ``state_dict`` round trips)."""

    def __init__(self, warmup_steps: int, total_steps: int):
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / max(1, self.warmup_steps)
        return max(0.0, (self.total_steps - step) / max(1, self.total_steps - self.warmup_steps))


def warmup_linear_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int) -> LambdaLR:
    """Linear warm-up over ``warmup_steps`` then linear decay to 0 at ``total_steps``."""
    if warmup_steps < 0 or total_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps} and total_steps={total_steps} must be >= 0")
    return LambdaLR(optimizer, WarmupLinear(warmup_steps, total_steps))
