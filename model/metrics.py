"""Training metrics: per-window sums kept on the device, model FLOPs and utilisation.

A :class:`Window` sums losses, accuracies and the gradient norm over the steps between two log
lines without a host sync per step; :func:`summary` reduces it over ranks at log time.

FLOPs are counted from the shapes actually computed (padded batch width, masked positions for
the sparse MLM head), as matmul multiply-adds x 2, and x 3 for forward + backward:
per layer ``2*N*(4H^2 + 2HI)`` for the projections and feed-forward on ``N = B*T`` tokens, plus
``4*B*T^2*H`` for attention scores and values; the MLM head ``2*M*(H^2 + HV)`` on ``M`` predicted
tokens; the pooler and NSP head ``2*B*(H^2 + 2H)``. Model-FLOPs utilisation divides the achieved
rate by the device's peak (``pretrain.peak_tflops``, or a table of known GPUs for bf16).
"""

from __future__ import annotations

import time

import torch

from model.bert import mlm_correct
from model.config import BertConfig

# bf16 dense peak TFLOP/s (no sparsity), by a substring of torch.cuda.get_device_name().
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L4": 121.0, "A10G": 125.0, "V100": 125.0}


def step_flops(
    cfg: BertConfig, batch: int, width: int, predicted: int, tokens: int | None = None, pairs: int | None = None
) -> float:
    """Training FLOPs (forward + backward) of one micro-batch of shape (batch, width); for a packed
    batch ``tokens`` (its real tokens) and ``pairs`` (the sum of its sequences' squared lengths:
    the query-key pairs attention computes) replace ``batch * width`` and ``batch * width**2``."""
    H, F, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers  # F: feed-forward
    n = batch * width if tokens is None else tokens
    pairs = batch * width * width if pairs is None else pairs
    encoder = L * (2 * n * (4 * H * H + 2 * H * F) + 4 * pairs * H)
    heads = 2 * predicted * (H * H + H * V) + 2 * batch * (H * H + 2 * H)
    return 3.0 * (encoder + heads)


def peak_tflops(configured: float, device: torch.device, precision: str) -> float:
    """The peak to divide by for MFU: the configured one, else a known GPU's bf16 peak, else 0."""
    if configured:
        return configured
    if device.type == "cuda" and precision == "bf16":
        name = torch.cuda.get_device_name(device)
        for key, value in PEAK_BF16_TFLOPS.items():
            if key in name:
                return value
    return 0.0


class Window:
    """Metric sums over the steps since the last log, kept on the device."""

    KEYS = ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_total", "nsp_correct", "nsp_total", "grad_norm")
    """The sums kept; ``nsp_*`` hold the sentence-level loss of the objective (NSP's, SOP's), which
    :func:`summary` names by ``sentence_loss``."""

    def __init__(self, device: torch.device, sentence_loss: str = "nsp"):
        self.device = device
        self.sentence_loss = sentence_loss
        """The objective's sentence-level loss ("nsp", "sop"), or "" (MLM only)."""
        self.reset()

    def reset(self) -> None:
        self.sums = torch.zeros(len(self.KEYS), dtype=torch.float64, device=self.device)
        self.micro = self.steps = self.examples = self.tokens = 0
        self.flops = 0.0
        self.started = time.perf_counter()

    def add_micro(
        self, out, batch: dict[str, torch.Tensor], flops: float, tokens: int, examples: int | None = None
    ) -> None:
        """One forward pass's outputs (before any loss scaling). ``flops``, ``tokens`` and
        ``examples`` count this process's share (default: the batch's rows); on an XLA pod slice
        the device ``batch`` is the global one and the host's share is passed in."""
        labels = out.mlm_labels if out.mlm_labels is not None else batch["labels"]
        correct, total = mlm_correct(out.prediction_logits.detach(), labels)
        if out.nsp_loss is None:  # no sentence-level head
            rows = int(batch["input_ids"].size(0)) if "packing" not in batch else len(batch["packing"].lengths)
            zero = torch.zeros((), dtype=torch.float64, device=self.device)
            sentence, sentence_correct, rows_t = zero, zero, zero
        else:
            label = batch["next_sentence_label"]
            rows = int(label.numel())
            sentence = out.nsp_loss.detach().double()
            sentence_correct = (out.seq_relationship_logits.detach().argmax(-1) == label).sum().double()
            rows_t = torch.full((), float(rows), dtype=torch.float64, device=self.device)  # no copy, no sync
        self.sums[:7] += torch.stack(
            [
                out.loss.detach().double(),
                out.mlm_loss.detach().double(),
                sentence,
                correct.double(),
                total.double(),
                sentence_correct,
                rows_t,
            ]
        )
        self.micro += 1
        self.examples += rows if examples is None else int(examples)
        self.tokens += tokens
        self.flops += flops

    def add_step(self, grad_norm: torch.Tensor | None) -> None:
        if grad_norm is not None:
            self.sums[7] += grad_norm.detach().double().to(self.device)
        self.steps += 1


def summary(window: Window, backend, lr: float, phase_index: int, peak: float) -> dict[str, float]:
    """The window's metrics, reduced over ranks: means, accuracies, rates and MFU.

    The device sums are per DDP rank (summed over ``world_size``; on XLA, SPMD computed them over
    the global batch already); the rates count this process's share of the data, times
    ``data_world`` (DDP ranks, or the hosts of a pod slice)."""
    backend.wait()
    elapsed = max(time.perf_counter() - window.started, 1e-9)
    s = dict(zip(Window.KEYS, backend.all_reduce_sum(window.sums).tolist()))
    w = backend.world_size
    micro = max(window.micro * w, 1)
    out = {"loss": s["loss"] / micro, "mlm_loss": s["mlm_loss"] / micro}
    if name := window.sentence_loss:
        out[f"{name}_loss"] = s["nsp_loss"] / micro
    out["mlm_accuracy"] = s["mlm_correct"] / max(s["mlm_total"], 1.0)
    if name:
        out[f"{name}_accuracy"] = s["nsp_correct"] / max(s["nsp_total"], 1.0)
    out |= {
        "grad_norm": s["grad_norm"] / max(window.steps * w, 1),  # the same on every rank
        "lr": lr,
        "examples_per_sec": window.examples * backend.data_world / elapsed,
        "tokens_per_sec": window.tokens * backend.data_world / elapsed,
        "model_tflops_per_sec": window.flops * backend.data_world / elapsed / 1e12,
        "phase_index": float(phase_index),
    }
    if peak:
        out["mfu"] = out["model_tflops_per_sec"] / (peak * w * backend.devices)
    return out
