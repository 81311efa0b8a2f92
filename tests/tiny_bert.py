"""The tests' one tiny network shape, sizes all different from each other so that a transposed or
mixed-up dimension fails loudly instead of broadcasting (google-research/bert's test habit:
vocab 99, hidden 32, FFN 37).

    from tiny_bert import tiny_bert_config
    tiny_bert_config()                                        # the shape below
    tiny_bert_config(vocab_size=len(vocab), dropout=0.0)      # a field changed; both dropouts off

(``tests/`` is on ``sys.path`` for every test: its conftest.py sits there.)
"""

from __future__ import annotations

from model.config import BertConfig

TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,  # 8 dimensions per head
    intermediate_size=37,
    max_position_embeddings=64,
)
"""Vocabulary 99, width 32, 2 layers, 4 heads of 8, feed-forward 37, 64 positions (the segment
vocabulary stays 2: A and B)."""


def tiny_bert_config(dropout: float | None = None, **changes) -> BertConfig:
    """:data:`TINY` with ``changes`` (any ``BertConfig`` field); ``dropout`` sets both dropouts."""
    if dropout is not None:
        changes = {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout, **changes}
    return BertConfig(**{**TINY, **changes})
