"""The feature-based approach (the paper's NER ablation): a frozen BERT, a mix of its hidden
states, and a two-layer BiLSTM tagger on top.

Hidden states are numbered as Hugging Face's ``output_hidden_states``: 0 is the embedding
output, ``i`` the output of layer ``i`` (1..L). Mixes (:data:`tasks.config.LAYER_MIXES`):
``embeddings`` (0), ``last`` (L), ``second_to_last`` (L-1), ``sum_last4`` / ``concat_last4``
(L-3..L), ``sum_all`` (0..L). A model with fewer than four layers uses the last
``min(4, L+1)`` states (the embedding output included) for the "last four" mixes.

Design choice: the encoder runs under ``no_grad`` in eval mode inside the tagger's forward
(no dropout, no gradient, its weights left out of the optimiser) instead of precomputing
features to disk: simpler, and the tagger trains in the shared loop unchanged; the cost is one
frozen forward pass per step, which a cache would save at BERT-base scale.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.bert import BertModel
from tasks.heads import TokenClassifierOutput


def hidden_states(bert: BertModel, input_ids, token_type_ids, attention_mask) -> list[torch.Tensor]:
    """[embedding output, layer 1 output, ..., layer L output], each (B, T, H)."""
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
    x = bert.embeddings(input_ids, token_type_ids)
    states = [x]
    for layer in bert.encoder.layer:
        x = layer(x, mask)
        states.append(x)
    return states


def mix_width(mix: str, hidden: int, num_layers: int) -> int:
    return hidden * min(4, num_layers + 1) if mix == "concat_last4" else hidden


def mix_states(states: list[torch.Tensor], mix: str) -> torch.Tensor:
    last4 = states[-min(4, len(states)) :]
    if mix == "embeddings":
        return states[0]
    if mix == "last":
        return states[-1]
    if mix == "second_to_last":
        return states[-2]
    if mix == "sum_last4":
        return torch.stack(last4).sum(0)
    if mix == "concat_last4":
        return torch.cat(last4, dim=-1)
    if mix == "sum_all":
        return torch.stack(states).sum(0)
    raise ValueError(f"unknown layer mix {mix!r}")


class FeatureBasedTagger(nn.Module):
    """Frozen BERT -> layer mix -> BiLSTM (``lstm_layers``, ``lstm_hidden`` per direction) -> tags."""

    def __init__(
        self,
        bert: BertModel,
        num_labels: int,
        mix: str,
        lstm_hidden: int = 768,
        lstm_layers: int = 2,
        dropout: float = 0.1,
    ):
        super().__init__()
        self.config = bert.config
        self.bert = bert
        self.mix = mix
        self.num_labels = num_labels
        for p in self.bert.parameters():
            p.requires_grad_(False)
        width = mix_width(mix, bert.config.hidden_size, bert.config.num_hidden_layers)
        self.lstm = nn.LSTM(
            width,
            lstm_hidden,
            num_layers=lstm_layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if lstm_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(2 * lstm_hidden, num_labels)

    def train(self, mode: bool = True):
        super().train(mode)
        self.bert.eval()  # frozen: no dropout in the feature extractor
        return self

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None) -> TokenClassifierOutput:
        with torch.no_grad():
            features = mix_states(hidden_states(self.bert, input_ids, token_type_ids, attention_mask), self.mix)
        lengths = (
            attention_mask.sum(-1)
            if attention_mask is not None
            else torch.full((input_ids.size(0),), input_ids.size(1))
        ).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(features, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=input_ids.size(1))
        logits = self.classifier(self.dropout(out))  # (B, T, L)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, self.num_labels), labels.reshape(-1), ignore_index=-100)
        return TokenClassifierOutput(loss, logits)
