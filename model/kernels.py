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
- ``varlen_attend``: attention over packed sequences (the unpadded path, ``model/packing.py``).
  On CUDA in bf16/fp16 without attention dropout it is ``torch.nn.attention.varlen.varlen_attn``
  (flash; torch >= 2.10), which has no dropout; everywhere else, and with attention dropout,
  :func:`varlen_reference` with the same interface: the packed rows scattered into a padded
  (B, nh, S, hs) layout (indices from the cumulative lengths, on the device: no host sync),
  ``attend`` with a key mask, and the real rows gathered back.

Under ``torch.compile`` (``pretrain.compile``) ``linear`` is plain ``F.linear``: inductor picks
its own kernels, and the oneDNN autograd function would only be an opaque call in its graph.
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


def _varlen_attn(*args):
    """``torch.nn.attention.varlen.varlen_attn``, imported on first use (the module pulls in
    ``torch._dynamo``: 2 s of import time every process would pay)."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(*args)


def _has_varlen() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch.nn.attention.varlen") is not None  # torch >= 2.10


def _onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        ONEDNN["enabled"]
        and not torch.compiler.is_compiling()
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


def _padded_index(cu: torch.Tensor, total: int, width: int) -> torch.Tensor:
    """For each of ``total`` packed rows, its place in a (B * width) padded layout; cu (B + 1,)."""
    row = torch.arange(total, device=cu.device)
    cu = cu.long()
    # the sequence of each row: how many boundaries are <= it, less cu[0] (= 0). The whole ``cu``,
    # not ``cu[1:]``: inductor's CUDA lowering of searchsorted reads the sorted sequence's strides
    # and cannot on a slice ("NotImplementedError: SliceView", torch 2.11 on an H200)
    seq = torch.searchsorted(cu, row, right=True) - 1
    return seq * width + (row - cu[seq])


def varlen_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    p: float,
    training: bool,
) -> torch.Tensor:
    """:func:`varlen_attend` through the padded layout: q (Tq, nh, hs), k, v (Tk, nh, hs) -> (Tq, nh, hs)."""
    B, (nh, hs) = cu_k.numel() - 1, q.shape[1:]
    iq, ik = _padded_index(cu_q, q.size(0), max_q), _padded_index(cu_k, k.size(0), max_k)

    def padded(t: torch.Tensor, index: torch.Tensor, width: int) -> torch.Tensor:
        flat = t.new_zeros(B * width, nh, hs).index_copy(0, index, t)
        return flat.view(B, width, nh, hs).transpose(1, 2)  # (B, nh, width, hs)

    lengths = (cu_k[1:] - cu_k[:-1]).long()
    mask = (torch.arange(max_k, device=q.device)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    y = attend(padded(q, iq, max_q), padded(k, ik, max_k), padded(v, ik, max_k), mask, p, training)
    return y.transpose(1, 2).reshape(B * max_q, nh, hs)[iq]  # (Tq, nh, hs)


def varlen_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    p: float,
    training: bool,
) -> torch.Tensor:
    """Attention of packed queries over packed keys, sequence by sequence (cumulative lengths
    ``cu_q``, ``cu_k``, (B + 1,) int32), dropout ``p`` on the probabilities when training."""
    p = p if training else 0.0
    if flash_varlen(q, p):
        return _varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k)
    return varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k, p, training)


HAS_VARLEN = _has_varlen()


def flash_varlen(q: torch.Tensor, p: float) -> bool:
    """Whether ``varlen_attend`` takes the flash kernel: CUDA, half precision, no dropout."""
    return q.is_cuda and p == 0.0 and q.dtype in (torch.float16, torch.bfloat16) and HAS_VARLEN
