"""``pretrain.compile``: the network compiled with ``torch.compile``, region by region.

Regions: the embeddings, every encoder layer, and the pretraining heads with their losses
(``BertPreTrainingHeads``): each module's ``forward`` is replaced, on the instance, by its
``torch.compile(..., fullgraph=True, dynamic=True)`` version. What that gives, and why:

1. **fullgraph**: every region is one graph, forward and backward (AOTAutograd), with no graph
   break: the unpadded path (``model/packing.py``) has no data-dependent shape (the loader
   computes every index and count) and no host sync. A graph break would raise.
2. **dynamic shapes**: packed batches change their token count every step, so the regions are
   compiled once with symbolic sizes instead of once per shape (the padded path's widths, a
   multiple of 8, would be up to 64 specialisations at length 512).
3. **regions, not the whole model**: the encoder layers share one compiled graph (the same code
   and guards; parameters are graph inputs), so compile time is that of one layer whatever
   the depth (BERT-Large: 24 layers), the hooks of DDP and FSDP2 stay outside the compiled code
   (DDP's gradient buckets still overlap the backward pass layer by layer; FSDP2 all-gathers per
   layer), and ``state_dict`` keys are unchanged (no ``_orig_mod.``), so checkpoints and exports
   are the same files. The cost: no fusion across a region's boundary (a residual add).

On CPU ``model.kernels.linear`` falls back to ``F.linear`` inside compiled code; dropout inside a
compiled region draws from inductor's generator (another stream than eager, the same
distribution). Compilation needs a C++ compiler on CPU (inductor) and Triton on CUDA.
"""

from __future__ import annotations

import torch
from torch import nn


def regions(model: nn.Module) -> list[nn.Module]:
    """The modules ``compile_regions`` compiles, of a ``model.bert.BertForPreTraining``."""
    return [model.bert.embeddings, *model.bert.encoder.layer, model.cls]


def compile_regions(model: nn.Module, backend: str = "inductor", mode: str | None = None) -> nn.Module:
    """Compile ``model``'s regions in place (see the module docstring); returns ``model``."""
    for module in regions(model):
        module.forward = torch.compile(module.forward, fullgraph=True, dynamic=True, backend=backend, mode=mode)
    return model


def is_compiled(model: nn.Module) -> bool:
    return all(hasattr(m.forward, "_torchdynamo_orig_callable") for m in regions(model))
