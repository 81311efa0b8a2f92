"""Task heads on the BERT backbone: sequence classification/regression, extractive QA, token
classification (NER) and multiple choice (SWAG).

Module names are Hugging Face's (``bert.*``, ``classifier.*``, ``qa_outputs.*``), so the
``state_dict`` of a fine-tuned model loads into ``transformers.BertForSequenceClassification`` /
``BertForQuestionAnswering``. Each head wraps an already-built (usually pretrained) ``BertModel``
instead of building one from a config: loading weights is the caller's business
(``model.export.load_pretrained``), and the head adds only its own freshly initialised layers.

Choices, as in the reference ``run_classifier.py`` / ``run_squad.py`` and HF:
1. Classification reads the pooled [CLS] vector (tanh(dense(h_CLS))), dropout, one linear layer.
   ``num_labels == 1`` means regression (STS-B) with a mean-squared-error loss.
2. QA projects every token to two logits (start, end); the loss is the mean of the two
   cross-entropies. Positions outside the sequence (clamped to T) are ignored, as in HF.
   Padded positions are not masked here; span decoding only ever looks at context tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.bert import BertModel, init_bert_weights


@dataclass
class SequenceClassifierOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor  # (B, num_labels)


@dataclass
class QuestionAnsweringOutput:
    loss: torch.Tensor | None
    start_logits: torch.Tensor  # (B, T)
    end_logits: torch.Tensor  # (B, T)


class BertForSequenceClassification(nn.Module):
    """Pooled [CLS] -> dropout -> linear: classification, or regression when num_labels == 1."""

    def __init__(self, bert: BertModel, num_labels: int, classifier_dropout: float = 0.1):
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        self.config = bert.config
        self.num_labels = num_labels
        self.bert = bert
        self.dropout = nn.Dropout(classifier_dropout)
        self.classifier = nn.Linear(bert.config.hidden_size, num_labels)
        init_bert_weights(self.classifier, bert.config.initializer_range)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> SequenceClassifierOutput:
        pooled = self.bert(input_ids, token_type_ids, attention_mask).pooler_output  # (B, H)
        logits = self.classifier(self.dropout(pooled))  # (B, num_labels)
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.float().squeeze(-1), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels.long())
        return SequenceClassifierOutput(loss, logits)


class BertForQuestionAnswering(nn.Module):
    """Every token's hidden state -> (start, end) logits."""

    def __init__(self, bert: BertModel):
        super().__init__()
        self.config = bert.config
        self.bert = bert
        self.qa_outputs = nn.Linear(bert.config.hidden_size, 2)
        init_bert_weights(self.qa_outputs, bert.config.initializer_range)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
    ) -> QuestionAnsweringOutput:
        hidden = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, T, H)
        start_logits, end_logits = self.qa_outputs(hidden).unbind(-1)  # (B, T) each
        loss = None
        if start_positions is not None and end_positions is not None:
            T = start_logits.size(1)
            start = start_positions.clamp(0, T)  # T = out of range -> ignored
            end = end_positions.clamp(0, T)
            loss = (
                F.cross_entropy(start_logits.float(), start, ignore_index=T)
                + F.cross_entropy(end_logits.float(), end, ignore_index=T)
            ) / 2
        return QuestionAnsweringOutput(loss, start_logits, end_logits)


@dataclass
class TokenClassifierOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor  # (B, T, num_labels)


class BertForTokenClassification(nn.Module):
    """Every token's hidden state -> dropout -> linear: a tag per token (NER). Labels equal to
    -100 (padding, a word's later sub-tokens) are ignored by the loss."""

    def __init__(self, bert: BertModel, num_labels: int, classifier_dropout: float = 0.1):
        super().__init__()
        self.config = bert.config
        self.num_labels = num_labels
        self.bert = bert
        self.dropout = nn.Dropout(classifier_dropout)
        self.classifier = nn.Linear(bert.config.hidden_size, num_labels)
        init_bert_weights(self.classifier, bert.config.initializer_range)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None) -> TokenClassifierOutput:
        hidden = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, T, H)
        logits = self.classifier(self.dropout(hidden))  # (B, T, L)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, self.num_labels), labels.reshape(-1), ignore_index=-100)
        return TokenClassifierOutput(loss, logits)


class BertForMultipleChoice(nn.Module):
    """Each choice's pooled [CLS] -> dropout -> one score; softmax over the choices (SWAG)."""

    def __init__(self, bert: BertModel, classifier_dropout: float = 0.1):
        super().__init__()
        self.config = bert.config
        self.bert = bert
        self.dropout = nn.Dropout(classifier_dropout)
        self.classifier = nn.Linear(bert.config.hidden_size, 1)
        init_bert_weights(self.classifier, bert.config.initializer_range)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None) -> SequenceClassifierOutput:
        B, C, T = input_ids.shape

        def flat(t):
            return None if t is None else t.reshape(B * C, T)

        pooled = self.bert(flat(input_ids), flat(token_type_ids), flat(attention_mask)).pooler_output  # (B*C, H)
        logits = self.classifier(self.dropout(pooled)).reshape(B, C)  # (B, C)
        loss = F.cross_entropy(logits.float(), labels.long()) if labels is not None else None
        return SequenceClassifierOutput(loss, logits)
