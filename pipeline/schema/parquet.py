"""The Parquet schemas of the stages' outputs: documents and pretraining examples.

Writers (the corpus and examples jobs) and readers (the vocab stage, ``model/``'s loader) both
import this module, so a column is named in exactly one place.
"""

from __future__ import annotations

import pyarrow as pa

# -- documents: {root}/corpus/{source}/part-*.parquet ------------------------------------------
DOCUMENT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),  # stable: "wiki:<page id>" or "books:<file>"
        pa.field("source", pa.string(), nullable=False),  # "wiki" | "books"
        pa.field("title", pa.string(), nullable=False),
        pa.field("sentences", pa.list_(pa.string()), nullable=False),  # document order kept
        pa.field("num_sentences", pa.int32(), nullable=False),
        pa.field("num_chars", pa.int64(), nullable=False),
    ]
)


# -- pretraining examples: {root}/examples/seq{N}/part-*.parquet -------------------------------
# input_ids is "[CLS] A [SEP] B [SEP]" unpadded; segment ids derive from len_a (the number of
# tokens of "[CLS] A [SEP]"). masked_ids hold the ORIGINAL tokens at masked_positions.
def example_schema(vocab_size: int, max_seq_length: int) -> pa.Schema:
    """The example schema with the narrowest integer types that fit this vocabulary and length."""
    id_type = pa.uint16() if vocab_size <= 1 << 16 else pa.uint32()
    pos_type = pa.uint16() if max_seq_length <= 1 << 16 else pa.uint32()
    return pa.schema(
        [
            pa.field("input_ids", pa.list_(id_type), nullable=False),
            pa.field("len_a", pos_type, nullable=False),
            pa.field("masked_positions", pa.list_(pos_type), nullable=False),
            pa.field("masked_ids", pa.list_(id_type), nullable=False),
            pa.field("is_random_next", pa.bool_(), nullable=False),
        ]
    )


EXAMPLE_COLUMNS = ("input_ids", "len_a", "masked_positions", "masked_ids", "is_random_next")
