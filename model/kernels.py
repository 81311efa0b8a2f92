"""CPU fast paths of BERT's three costliest kinds of op: the linear layers, dropout, attention.

Each function here computes exactly what its plain torch counterpart computes (to float
rounding), chooses a cheaper kernel on CPU in fp32, and falls back to the plain op everywhere
else (CUDA, XLA, autocast, other dtypes), so the model has one code path on every backend.
Measured on the 2-core AMD EPYC (Zen 4) development machine, one thread, base shapes
(docs/pretraining.md has the step figures):

- ``linear``: ATen sends fp32 ``addmm``/``mm`` to MKL, which reaches ~90–100 GFLOP/s on this
  CPU for (1024 × 768) · (768 × 3072) but only ~60 for the MLM decoder's (152 × 768) ·
  (768 × 30,522); oneDNN's ``_linear_pointwise`` (the kernel ``torch.compile`` uses for CPU
  linear layers) reaches ~105 on both. ``linear`` runs the forward product and the input
  gradient through oneDNN and the weight gradient through ``mm`` (no faster either way).
  Design choice: an explicit autograd function rather than ``torch.compile`` (whose CPU
  backend needs a compiler at run time and recompiles for every padded batch width).
- ``dropout``: ``bernoulli_`` costs ~6 ns an element here against ~3 for ``rand``; the keep
  mask is ``rand >= p`` in fp32, scaled by ``1 / (1 - p)``. The same distribution as
  ``F.dropout``, another random stream.
- ``attend``: ``scaled_dot_product_attention`` has no fused CPU kernel with dropout and falls
  back to an unfused path with extra masking passes; with dropout on CPU the same maths runs
  here in plain ops. Without dropout (evaluation, fine-tuning with p = 0) the fused kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

try:
    _linear_pointwise = torch.ops.mkldnn._linear_pointwise.default
except (AttributeError, RuntimeError):  # a build without oneDNN
    _linear_pointwise = None

ONEDNN = {"enabled": True}
"""Switch for the oneDNN linear path (tests compare it with ``F.linear``)."""


def _onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        ONEDNN["enabled"]
        and _linear_pointwise is not None
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and type(x) is torch.Tensor  # no DTensor / subclass: they have their own dispatch
        and type(weight) in (torch.Tensor, nn.Parameter)
        and x.numel() > 0
        and torch.backends.mkldnn.is_available()
    )


class _OneDnnLinear(torch.autograd.Function):
    """y = x W^T + b for x (N, in): oneDNN forward and input gradient, ``mm`` weight gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _linear_pointwise(x, weight, bias, "none", [], "")

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _linear_pointwise(grad, weight.t(), None, "none", [], "")  # grad @ W
        if ctx.needs_input_grad[1]:
            grad_w = grad.t().mm(x)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0)
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; through oneDNN for fp32 on CPU (see the module docstring)."""
    if not _onednn(x, weight):
        return F.linear(x, weight, bias)
    lead = x.shape[:-1]
    y = _OneDnnLinear.apply(x.reshape(-1, x.size(-1)), weight, bias)
    return y.view(*lead, weight.size(0))


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state_dict keys) whose forward is :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout as ``F.dropout(x, p, training)``, with a cheaper keep mask on CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, True)
    keep = torch.rand(x.shape, dtype=torch.float32, device=x.device).ge_(p).mul_(1.0 / (1.0 - p))
    return x * keep.to(x.dtype)  # autograd keeps the mask for the backward pass


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, p: float, training: bool
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs), padded keys excluded) v, dropout p on the probabilities when training.

    q (B, nh, M, hs); k, v (B, nh, T, hs); mask (B, 1, 1, T) bool, True = attend. Returns
    (B, nh, M, hs). The CPU dropout path adds the dtype's lowest value to padded keys' scores
    (``baddbmm``: one op for q k^T, the scale and the mask): in a row with at least one real key
    they get probability exactly 0, as with ``-inf`` (every BERT sequence has its [CLS]), and a
    row with none stays finite.
    """
    p = p if training else 0.0
    if p == 0.0 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    B, nh, M, hs = q.shape
    T = k.size(2)
    bias = torch.zeros(B, 1, 1, T, dtype=q.dtype, device=q.device)  # the mask as an additive bias: no backward pass
    if mask is not None:
        bias = bias.masked_fill(~mask.expand(B, 1, 1, T), torch.finfo(q.dtype).min)
    bias = bias.expand(B, nh, 1, T).reshape(B * nh, 1, T)
    scores = torch.baddbmm(
        bias, q.reshape(B * nh, M, hs), k.reshape(B * nh, T, hs).transpose(1, 2), alpha=hs**-0.5
    )  # (B*nh, M, T): scale, product and mask in one op
    y = torch.bmm(dropout(scores.softmax(-1), p, True), v.reshape(B * nh, T, hs))
    return y.view(B, nh, M, hs)
