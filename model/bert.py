"""The BERT network in one file, bottom-up: embeddings -> attention -> layer -> encoder -> model -> heads.

Module names are Hugging Face's (which are google-research/bert's), so ``state_dict()`` keys match
``transformers.BertModel`` / ``BertForPreTraining`` and checkpoint conversion is a key copy
(see ``model/export.py``). Shapes: B batch, T sequence length, H hidden size, nh heads,
hs head size (H / nh), V vocabulary size, N number of masked positions in a batch.

How this differs from google-research/bert ``modeling.py`` and HF ``modeling_bert.py``:

1. Attention is ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels where the
   backend has them) with a boolean padding mask ``[B, 1, 1, T]``, instead of adding -10000 to
   the scores of padded keys. Padded positions never change the outputs at real positions.
2. Sparse MLM prediction: when ``labels`` are given (training), the vocabulary projection runs
   only on the N positions whose label is not -100, and ``prediction_logits`` is ``[N, V]``
   (rows in ``labels != -100`` row-major order), not ``[B, T, V]``. With ~15% of tokens masked
   this skips ~85% of the largest matmul. The reference does the same with a fixed-size gather
   of ``masked_lm_positions``; a boolean mask gives a data-dependent N, which XLA would
   recompile for, so ``BertForPreTraining.sparse_prediction = False`` (set by the training loop
   on XLA) keeps the dense, static-shape path. Without labels, logits are always ``[B, T, V]``.
3. The MLM loss is the mean cross-entropy over all masked positions of the batch (HF). The
   reference weights per position and divides by the sum of weights + 1e-5: the same value.
4. ``hidden_act="gelu"`` is the exact (erf) GELU, as in HF; the reference used the tanh
   approximation, available here as ``"gelu_new"``.
5. ``word_embeddings`` has ``padding_idx=pad_token_id`` (HF): the [PAD] row starts at zero and
   gets no gradient through the embedding lookup (it still does through the tied decoder).
6. None of HF's decoder / cross-attention / KV-cache / head-mask / pruning /
   relative-position options: this is an encoder with absolute positions only. Outputs are
   typed dataclasses; hidden states of every layer and attention maps are not returned.
7. NSP label convention as HF and the reference: 0 = B is the actual next segment, 1 = random.
8. CPU fast paths (``model/kernels.py``, the same maths, fallbacks elsewhere): the linear
   layers run through oneDNN in fp32 on CPU (``Linear``, an ``nn.Linear`` with the same
   parameters); dropout draws its keep mask as ``rand >= p`` instead of ``bernoulli_`` (the
   same distribution, another random stream); CPU training with attention dropout runs the
   attention maths in plain ops, as ``scaled_dot_product_attention`` has no fused CPU kernel
   with dropout.
9. In the sparse training path the **last encoder layer computes only the rows the heads read**
   ([CLS] and the masked positions; keys and values still from every position): every op after
   the keys/values is row-wise, so those rows are what the full layer would give, and the rest
   is never read. At seq 128 with 20 masked positions this skips ~84% of the last layer's
   query/output/feed-forward work. ``head_rows`` lays the rows out as (B, M) per sequence.
10. **Unpadded (packed) batches** (``pretrain.unpad``; ``model/packing.py``, MosaicBERT's and
   ModernBERT's idea): ``packing=`` gives the batch as its real tokens only, ``input_ids``
   (N,), with the layout computed by the loader. Embeddings, every linear layer and LayerNorm
   run over (N, H), attention over the packed sequences with cumulative lengths
   (``kernels.varlen_attend``: flash ``varlen_attn`` on CUDA, a reference elsewhere), the last
   layer over the heads' rows only (as point 9), the MLM head over the M masked tokens, whose
   count and indices come from the loader: no ``nonzero`` and no host sync in the step. The
   same maths as the padded path (tested to 1e-5 in fp32: logits, losses, gradients). The
   padded path stays for XLA (static shapes), evaluation of unpacked batches and fine-tuning.
11. Each region that ``torch.compile`` compiles (``model/compile.py``: the embeddings, every
   encoder layer, the heads with their losses) is a module whose ``forward`` takes tensors and
   ints only and has no data-dependent shape, so it compiles with ``fullgraph=True``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from model.config import BertConfig
from model.kernels import Linear, attend, dropout, varlen_attend
from model.packing import Packing

IGNORE_INDEX = -100


def activation(name: str):
    if name == "gelu":
        return F.gelu
    if name == "gelu_new":
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    raise ValueError(f"model.hidden_act: unknown activation {name!r}")


class VarLen(NamedTuple):
    """Packed attention's layout: queries ``cu_q`` (B + 1,) of at most ``max_q`` rows each, over
    keys ``cu_k`` of at most ``max_k`` (int32 cumulative lengths)."""

    cu_k: torch.Tensor
    max_k: int
    cu_q: torch.Tensor
    max_q: int


def head_rows(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions the pretraining heads read, per sequence: [CLS] (position 0) and the masked ones.

    selected (B, T) bool. Returns ``rows`` (B, M): each sequence's kept positions in ascending
    order (so slot 0 is position 0), padded with position 0 up to the longest count M; and
    ``valid`` (B, M), False on that padding. Row-major order of the valid slots is row-major
    order of the positions, so ``labels.gather(1, rows)[valid & ...]`` keeps the (N, V) order.
    """
    keep = selected.clone()
    keep[:, 0] = True
    counts = keep.sum(1)  # (B,)
    width = int(counts.max())
    order = torch.argsort((~keep).to(torch.uint8), dim=1, stable=True)[:, :width]  # kept first, ascending
    valid = torch.arange(width, device=selected.device)[None, :] < counts[:, None]
    return torch.where(valid, order, torch.zeros_like(order)), valid


# -- parts ------------------------------------------------------------------------------------
class BertEmbeddings(nn.Module):
    """word + position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout_p = config.hidden_dropout_prob

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, T) ids -> (B, T, H); packed: (N,) ids and their ``position_ids`` -> (N, H)."""
        if position_ids is None:
            positions = torch.arange(input_ids.size(1), device=input_ids.device)  # (T,), broadcast over B
        else:
            positions = position_ids
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(token_type_ids)
        )  # (B, T, H)
        return dropout(self.LayerNorm(x), self.dropout_p, self.training)


class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product attention over the whole sequence (no causal mask)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = Linear(config.hidden_size, config.hidden_size)
        self.key = Linear(config.hidden_size, config.hidden_size)
        self.value = Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        queries: torch.Tensor | None = None,
        seq: VarLen | None = None,
    ) -> torch.Tensor:
        """x (B, T, H) gives keys and values; ``queries`` (B, M, H) the rows to compute (default: x).
        Packed (``seq``): x (N, H), queries (R, H) -> (R, H)."""
        xq = x if queries is None else queries
        if seq is not None:
            nh, hs = self.num_heads, self.head_size
            q, k, v = (t.view(-1, nh, hs) for t in (self.query(xq), self.key(x), self.value(x)))  # (n, nh, hs)
            y = varlen_attend(q, k, v, seq.cu_q, seq.cu_k, seq.max_q, seq.max_k, self.dropout_p, self.training)
            return y.reshape(-1, nh * hs)  # (R, H)
        B, T, H = x.shape
        M = xq.size(1)

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.view(B, n, self.num_heads, self.head_size).transpose(1, 2)  # (B, nh, n, hs)

        q, k, v = heads(self.query(xq), M), heads(self.key(x), T), heads(self.value(x), T)
        y = attend(q, k, v, mask, self.dropout_p, self.training)  # (B, nh, M, hs)
        return y.transpose(1, 2).reshape(B, M, H)  # (B, M, H)


class BertSelfOutput(nn.Module):
    """Attention output projection, dropout, residual, LayerNorm (post-LN)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout_p = config.hidden_dropout_prob

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(dropout(self.dense(y), self.dropout_p, self.training) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)  # HF's name: encoder.layer.N.attention.self.*
        self.output = BertSelfOutput(config)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        queries: torch.Tensor | None = None,
        seq: VarLen | None = None,
    ) -> torch.Tensor:
        return self.output(self.self(x, mask, queries, seq), x if queries is None else queries)


class BertIntermediate(nn.Module):
    """Feed-forward expansion H -> intermediate_size with the activation."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))  # (B, T, I)


class BertLayerOutput(nn.Module):
    """Feed-forward contraction back to H, dropout, residual, LayerNorm.

    HF calls this class BertOutput; here that name is the model's output dataclass. Only the
    attribute name (``encoder.layer.N.output``) reaches the state_dict keys.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout_p = config.hidden_dropout_prob

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(dropout(self.dense(h), self.dropout_p, self.training) + residual)  # (B, T, H)


# -- block and stack --------------------------------------------------------------------------
class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertLayerOutput(config)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        rows: torch.Tensor | None = None,
        seq: VarLen | None = None,
    ) -> torch.Tensor:
        """(B, T, H) -> (B, T, H); with ``rows`` (B, M) positions, only those rows: (B, M, H).
        Packed (``seq``): (N, H) -> (N, H), or with ``rows`` (R,) token indices (R, H)."""
        if rows is None:
            queries = None
        elif seq is not None:
            queries = x.index_select(0, rows)  # (R, H)
        else:
            queries = x.gather(1, rows[..., None].expand(-1, -1, x.size(-1)))  # (B, M, H)
        a = self.attention(x, mask, queries, seq)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        rows: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        """``rows``: the last layer computes only those positions (see point 9 of the docstring);
        ``packing``: x is (N, H) packed tokens and the last layer computes ``packing.rows``."""
        last = len(self.layer) - 1
        if packing is None:
            for i, layer in enumerate(self.layer):
                x = layer(x, mask, rows if i == last else None)
            return x
        p = packing
        every = VarLen(p.cu_seqlens, p.max_seqlen, p.cu_seqlens, p.max_seqlen)
        heads = VarLen(p.cu_seqlens, p.max_seqlen, p.cu_rows, p.max_rows)
        for i, layer in enumerate(self.layer):
            x = layer(x, None, p.rows, heads) if i == last else layer(x, None, None, every)
        return x


class BertPooler(nn.Module):
    """tanh(dense(hidden state of [CLS])): the sentence vector NSP and classifiers read."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor, cls_rows: torch.Tensor | None = None) -> torch.Tensor:
        """hidden (B, T, H); packed: (R, H) with ``cls_rows`` (B,) the [CLS] rows. -> (B, H)"""
        first = hidden[:, 0] if cls_rows is None else hidden.index_select(0, cls_rows)
        return torch.tanh(self.dense(first))  # (B, H)


def init_bert_weights(module: nn.Module, std: float) -> None:
    """BERT's init: normal(0, std) weights, zero biases, LayerNorm 1/0, zero [PAD] embedding."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


# -- the backbone -----------------------------------------------------------------------------
@dataclass
class BertOutput:
    last_hidden_state: torch.Tensor  # (B, T, H); (B, M, H) when given rows
    pooler_output: torch.Tensor | None  # (B, H); None without a pooler


class BertModel(nn.Module):
    """The encoder: embeddings -> L transformer layers -> pooler. Keys match HF's BertModel.

    ``add_pooling_layer=False`` (HF's argument): no pooler (``BertForMaskedLM``'s backbone)."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.apply(lambda m: init_bert_weights(m, config.initializer_range))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> BertOutput:
        """``rows`` (B, M) positions, slot 0 = position 0: ``last_hidden_state`` is (B, M, H), those rows only.
        ``packing``: packed (N,) ids; ``last_hidden_state`` is (R, H), the rows ``packing.rows``."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if packing is not None:
            x = self.embeddings(input_ids, token_type_ids, packing.position_ids)  # (N, H)
            x = self.encoder(x, None, packing=packing)  # (R, H)
            pooled = self.pooler(x, packing.cls_slots) if self.pooler is not None else None
            return BertOutput(last_hidden_state=x, pooler_output=pooled)
        mask = None
        if attention_mask is not None:
            mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T): True = real key
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        x = self.encoder(x, mask, rows)
        return BertOutput(last_hidden_state=x, pooler_output=self.pooler(x) if self.pooler is not None else None)


# -- pretraining heads ------------------------------------------------------------------------
class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """transform -> decoder (tied to the word embeddings) + an output-only bias."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x)) + self.bias  # (..., V)


class BertPreTrainingHeads(nn.Module):
    """The MLM head, and (``sentence_head``) the two-way sentence-level head on the pooled [CLS]:
    NSP's (0 = actual next, 1 = random), or SOP's on the same weights (0 = in order, 1 = swapped)."""

    def __init__(self, config: BertConfig, sentence_head: bool = True):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = Linear(config.hidden_size, 2) if sentence_head else None

    def forward(
        self,
        hidden: torch.Tensor,
        pooled: torch.Tensor,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """MLM logits of ``hidden`` (N, H) or (B, T, H), sentence-level logits of ``pooled`` (B, H)
        (None without that head), and their mean cross-entropies (in float32) against ``labels``
        (-100: not predicted) when given."""
        seq_logits = self.seq_relationship(pooled) if self.seq_relationship is not None else None  # (B, 2)
        logits = self.predictions(hidden)  # (N, V) or (B, T, V)
        mlm_loss = nsp_loss = None
        if labels is not None:
            flat = logits.float().view(-1, logits.size(-1))
            mlm_loss = F.cross_entropy(flat, labels.view(-1), ignore_index=IGNORE_INDEX)
        if next_sentence_label is not None and seq_logits is not None:
            nsp_loss = F.cross_entropy(seq_logits.float(), next_sentence_label.view(-1))
        return logits, seq_logits, mlm_loss, nsp_loss


@dataclass
class PreTrainingOutput:
    loss: torch.Tensor | None  # mlm_loss + nsp_loss, when both labels are given
    mlm_loss: torch.Tensor | None
    nsp_loss: torch.Tensor | None  # the sentence-level loss (NSP's or SOP's); None without that head
    prediction_logits: torch.Tensor  # (N, V) with labels and sparse_prediction (or packed), else (B, T, V)
    seq_relationship_logits: torch.Tensor | None  # (B, 2); None without a sentence-level head
    mlm_labels: torch.Tensor | None = None  # the labels of prediction_logits' rows: (N,) or (B, T)


class BertForPreTraining(nn.Module):
    """BERT with the masked-LM and next-sentence heads. Keys match HF's BertForPreTraining.

    ``sentence_head=False`` (:class:`BertForMaskedLM`): the MLM head only, no pooler."""

    def __init__(self, config: BertConfig, sentence_head: bool = True):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=sentence_head)
        self.cls = BertPreTrainingHeads(config, sentence_head)
        self.cls.apply(lambda m: init_bert_weights(m, config.initializer_range))
        self.tie_weights()
        self.sparse_prediction = True
        """Project only masked positions when labels are given (see point 2 of the docstring)."""

    def tie_weights(self) -> None:
        """The MLM decoder IS the word-embedding matrix (one Parameter, V x H).

        Called again after moving to a device: some backends (XLA) copy parameters on ``.to()``.
        """
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> PreTrainingOutput:
        """Padded (B, T) batches, or packed ones (``packing``; ``labels`` (M,): the masked tokens')."""
        if packing is not None:  # the loader laid out the heads' rows: no device-side search
            out = self.bert(input_ids, token_type_ids, packing=packing)
            hidden, mlm_labels = out.last_hidden_state.index_select(0, packing.mlm_slots), labels  # (M, H), (M,)
        elif labels is not None and self.sparse_prediction:  # the last layer only on [CLS] and the masked positions
            rows, valid = head_rows(labels != IGNORE_INDEX)
            out = self.bert(input_ids, token_type_ids, attention_mask, rows)
            row_labels = labels.gather(1, rows)  # (B, M)
            selected = valid & (row_labels != IGNORE_INDEX)  # row-major = labels != -100 row-major
            hidden, mlm_labels = out.last_hidden_state[selected], row_labels[selected]  # (N, H), (N,)
        else:
            out = self.bert(input_ids, token_type_ids, attention_mask)
            hidden, mlm_labels = out.last_hidden_state, labels  # (B, T, H), (B, T)
        logits, seq_logits, mlm_loss, nsp_loss = self.cls(hidden, out.pooler_output, mlm_labels, next_sentence_label)
        parts = [x for x in (mlm_loss, nsp_loss) if x is not None]
        loss = sum(parts[1:], parts[0]) if parts else None
        return PreTrainingOutput(loss, mlm_loss, nsp_loss, logits, seq_logits, mlm_labels)


class BertForMaskedLM(BertForPreTraining):
    """BERT with the masked-LM head only (no pooler, no sentence-level head): the network of the
    one-segment objectives. Keys match HF's BertForMaskedLM."""

    def __init__(self, config: BertConfig):
        super().__init__(config, sentence_head=False)


def pretraining_class(sentence_head: bool) -> type[BertForPreTraining]:
    """The network an objective trains: with its sentence-level head, or the MLM head alone."""
    return BertForPreTraining if sentence_head else BertForMaskedLM


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (the tied decoder weight counted once)."""
    return sum(p.numel() for p in model.parameters())


def mlm_correct(prediction_logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, total) masked-token predictions, for either logits layout; stays on device.
    ``labels``: the batch's (B, T), or those of the logits' rows ((N,): ``PreTrainingOutput.mlm_labels``)."""
    selected = labels != IGNORE_INDEX
    if prediction_logits.dim() == 2 and labels.dim() == 1:  # sparse or packed, the rows' own labels: no search
        return (prediction_logits.argmax(-1) == labels).sum(), selected.sum()
    if prediction_logits.dim() == 2:  # sparse: (N, V) rows in selected order
        correct = (prediction_logits.argmax(-1) == labels[selected]).sum()
    else:  # dense: (B, T, V); static shapes for XLA
        correct = ((prediction_logits.argmax(-1) == labels) & selected).sum()
    return correct, selected.sum()


__all__ = [
    "BertModel",
    "BertOutput",
    "BertForMaskedLM",
    "BertForPreTraining",
    "PreTrainingOutput",
    "pretraining_class",
    "count_parameters",
    "mlm_correct",
    "IGNORE_INDEX",
]
