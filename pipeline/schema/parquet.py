"""The Parquet schemas of the stages' outputs: documents and pretraining examples.

Writers (the corpus and examples jobs) and readers (the vocab stage, ``model/``'s loader) both
import this module, so a column is named in exactly one place, and so is how a file is written
and read: zstd pages, each with a CRC32 of its bytes in its header (``WRITE_OPTIONS``), which every
reader verifies (``READ_OPTIONS``). A flipped bit in a page's data is an error naming the file
when a stage reads it, not a silently different token, without a pass over the file to hash it
(the manifest's sha256 stays for ``bertflow status --verify``). Cost: 4 bytes per page and a
CRC32 per page read (a few GB/s per core).
"""

from __future__ import annotations

import pyarrow as pa

from pipeline.schema.objectives import DEFAULT_OBJECTIVE, get_objective

WRITE_OPTIONS: dict = {"compression": "zstd", "write_page_checksum": True}
"""Keyword arguments of every ``pq.write_table`` / ``pq.ParquetWriter`` of a stage's output."""
READ_OPTIONS: dict = {"page_checksum_verification": True}
"""Keyword arguments of every ``pq.ParquetFile`` / ``pq.read_table`` that reads a stage's output
(pages written without a checksum, by an older version, are read unverified)."""

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
# input_ids is "[CLS] A [SEP] B [SEP]" unpadded for a pair objective; segment ids derive from
# len_a (the number of tokens of "[CLS] A [SEP]"). One-segment objectives (mlm) have no len_a and
# no sentence label. masked_ids hold the ORIGINAL tokens at masked_positions. Which columns an
# objective carries is its row's (pipeline/schema/objectives.py).
def example_schema(vocab_size: int, max_seq_length: int, objective: str = DEFAULT_OBJECTIVE) -> pa.Schema:
    """The example schema of ``objective`` with the narrowest integer types that fit this vocabulary and length."""
    id_type = pa.uint16() if vocab_size <= 1 << 16 else pa.uint32()
    pos_type = pa.uint16() if max_seq_length <= 1 << 16 else pa.uint32()
    types = {
        "input_ids": pa.list_(id_type),
        "len_a": pos_type,
        "masked_positions": pa.list_(pos_type),
        "masked_ids": pa.list_(id_type),
    }
    return pa.schema([pa.field(c, types.get(c, pa.bool_()), nullable=False) for c in get_objective(objective).columns])


EXAMPLE_COLUMNS = get_objective(DEFAULT_OBJECTIVE).columns
"""The columns of the default objective's shards (``example_columns`` gives any objective's)."""


def example_columns(objective: str) -> tuple[str, ...]:
    """The Parquet columns of ``objective``'s example shards."""
    return get_objective(objective).columns
