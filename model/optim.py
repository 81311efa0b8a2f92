"""BERT's optimiser and learning-rate schedule.

Adam with decoupled weight decay (``torch.optim.AdamW``), decay off for biases and LayerNorm
weights (the reference excludes parameter names containing "bias" or "LayerNorm"), and one
schedule over the whole run: linear warm-up from 0, then linear decay to 0 at ``total_steps``.

Design choice, and what it costs: the reference ``AdamWeightDecayOptimizer`` (and HF's old
``BertAdam``) skips Adam's bias correction; torch's AdamW applies it. With β2 = 0.999 and a
10k-step warm-up the two differ only in the first few thousand steps, where the warm-up keeps
the learning rate small anyway; we take the standard optimiser, fused (one kernel over every
tensor) where torch has that kernel: plain CPU/CUDA parameters (6× faster than foreach on CPU).
:class:`Lamb` (You et al. 2019, the optimiser of BERT's 76-minute, 32k-64k batch runs) is the
option for very large batches: Adam's update, weight decay added to it, then scaled per tensor
by the trust ratio ``||w|| / ||update||`` (1 where either norm is 0).
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


class Lamb(torch.optim.Optimizer):
    """LAMB: Adam moments with bias correction, decoupled weight decay, a per-tensor trust ratio.

    Multi-tensor (``torch._foreach_*``): each update is a few kernels over every tensor of a
    group, not a few per tensor, and nothing leaves the device (the trust ratios are a tensor of
    per-tensor norms; the step counts are CPU tensors, as torch's own optimizers keep them).
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            b1, b2 = group["betas"]
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
            grads = [p.grad for p in params]
            m = [self.state[p]["exp_avg"] for p in params]
            v = [self.state[p]["exp_avg_sq"] for p in params]
            t = [float(self.state[p]["step"]) for p in params]
            torch._foreach_mul_(m, b1)
            torch._foreach_add_(m, grads, alpha=1 - b1)
            torch._foreach_mul_(v, b2)
            torch._foreach_addcmul_(v, grads, grads, value=1 - b2)
            update = torch._foreach_div(m, [1 - b1**n for n in t])  # bias-corrected moments
            denom = torch._foreach_div(v, [1 - b2**n for n in t])
            torch._foreach_sqrt_(denom)
            torch._foreach_add_(denom, group["eps"])
            torch._foreach_div_(update, denom)
            if group["weight_decay"]:
                torch._foreach_add_(update, params, alpha=group["weight_decay"])
            w_norm = torch.stack(torch._foreach_norm(params))
            u_norm = torch.stack(torch._foreach_norm(update))
            trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
            torch._foreach_mul_(update, list(trust.unbind(0)))
            torch._foreach_add_(params, update, alpha=-group["lr"])
        return loss


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    name: str = "adamw",
) -> torch.optim.Optimizer:
    """AdamW (or LAMB) with two parameter groups: [0] decayed weights, [1] biases and LayerNorm (no decay).

    ``named_parameters()`` yields a tied parameter once (under its first name, the word
    embeddings), so the tied MLM decoder weight is optimised exactly once.
    """
    decay, plain = [], []
    for pname, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (plain if no_decay(pname) else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": plain, "weight_decay": 0.0},
    ]
    if name == "lamb":
        return Lamb(groups, lr=lr, betas=betas, eps=eps)
    if name != "adamw":
        raise ValueError(f"pretrain.optimizer: unknown optimizer {name!r}, expected adamw|lamb")
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=_fusable(decay + plain) or None)


def _fusable(params: list[torch.Tensor]) -> bool:
    """torch's fused AdamW (one kernel over all tensors) for plain CPU/CUDA parameters.

    The base model's step on one CPU thread: 0.07 s against 0.46 s for the default
    multi-tensor (foreach) AdamW. The same update; not for XLA or FSDP's DTensors.
    """
    return bool(params) and all(
        type(p) is nn.Parameter
        and p.device.type in ("cpu", "cuda")
        and p.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)
        for p in params
    )


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
