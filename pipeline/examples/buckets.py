"""A bucket's tokenized documents, read back from its token files for the examples job.

The choice: documents stay flat Arrow/numpy arrays (2-4 bytes a token) and a sentence becomes
a Python list only when an example reads it; duplicates of a doc_id (a rerun's files) keep the
smallest content, so the bucket is the same whatever the file layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.schema.parquet import READ_OPTIONS


def documents_array(
    values: np.ndarray, sentence_lengths: np.ndarray, doc_sentences: Sequence[int], id_type: pa.DataType
) -> pa.ListArray:
    """The token files' ``sentences`` column (documents of sentences of ids, what
    :class:`BucketDocuments` reads back) from flat ids, each sentence's length and each document's
    number of sentences: built from offsets, not from a Python list per sentence. An id that does
    not fit ``id_type`` is an error (a cast would wrap it silently)."""
    dtype = id_type.to_pandas_dtype()
    if values.size and int(values.max()) > np.iinfo(dtype).max:
        raise ValueError(f"token id {int(values.max())} does not fit the token files' {id_type}")
    sentences = pa.ListArray.from_arrays(_offsets(sentence_lengths), pa.array(values.astype(dtype)))
    return pa.ListArray.from_arrays(_offsets(doc_sentences), sentences)


def _offsets(lengths) -> pa.Array:
    out = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=out[1:])
    return pa.array(out)


class BucketDocuments(Sequence):
    """A bucket's tokenized documents as flat arrays; ``docs[i][j]`` is sentence j as a list.

    Sentences become Python lists only when an example reads them: a bucket of long documents
    costs 2-4 bytes a token, not the ~36 of a list of ints."""

    def __init__(self, sentences: pa.ListArray, rows: list[int]):
        self.doc_offsets = sentences.offsets.to_numpy()
        inner = sentences.values
        self.sent_offsets = inner.offsets.to_numpy()
        self.values = inner.values.to_numpy()
        self.rows = rows  # kept rows, in doc_id order

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> _Document:
        row = self.rows[i]
        return _Document(self, int(self.doc_offsets[row]), int(self.doc_offsets[row + 1]))

    def materialize(self, i: int) -> list[list[int]]:
        """Document ``i`` as lists of ints: one ``tolist`` for the whole document, then slices."""
        row = self.rows[i]
        offs = self.sent_offsets[int(self.doc_offsets[row]) : int(self.doc_offsets[row + 1]) + 1]
        if len(offs) < 2:
            return []
        flat = self.values[offs[0] : offs[-1]].tolist()
        bounds = (offs - offs[0]).tolist()
        return [flat[a:b] for a, b in zip(bounds, bounds[1:])]

    def with_current(self, i: int) -> CurrentFirst:
        """These documents, with document ``i`` materialized once (see :class:`CurrentFirst`)."""
        return CurrentFirst(self, i)


class CurrentFirst(Sequence):
    """A bucket's documents where the one whose examples are being made is held as lists.

    Its examples read every sentence of it, once per copy and per length; the other documents
    are read a span at a time (random-next), so they stay lazy."""

    def __init__(self, docs: BucketDocuments, index: int):
        self.docs, self.index = docs, index
        self.current = docs.materialize(index)

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int):
        return self.current if i == self.index else self.docs[i]


class _Document(Sequence):
    def __init__(self, docs: BucketDocuments, first: int, end: int):
        self.docs, self.first, self.end = docs, first, end

    def __len__(self) -> int:
        return self.end - self.first

    def __getitem__(self, j: int) -> list[int]:
        if not 0 <= j < self.end - self.first:
            raise IndexError(j)
        offs = self.docs.sent_offsets
        s = self.first + j
        return self.docs.values[offs[s] : offs[s + 1]].tolist()


def _read_table(url: str) -> pa.Table:
    """A whole Parquet file through fsspec: ``pq.read_table("gs://...")`` would take pyarrow's own
    GCS client, which ignores gcsfs's credentials and STORAGE_EMULATOR_HOST (it hangs offline)."""
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as f:
        return pq.read_table(f, **READ_OPTIONS)


def bucket_documents(urls: list[str]) -> tuple[list[str], BucketDocuments, int]:
    """Read a bucket's token files: doc ids in order, their documents, duplicates dropped.

    A doc_id seen twice keeps its smallest content, whatever the file layout."""
    tables = [_read_table(u) for u in sorted(urls)]
    table = pa.concat_tables(tables)
    table = table.take(pc.sort_indices(table, sort_keys=[("doc_id", "ascending")]))
    doc_ids = table.column("doc_id").to_pylist()
    docs = BucketDocuments(table.column("sentences").combine_chunks(), list(range(len(doc_ids))))
    kept_rows, kept_ids, duplicates = [], [], 0
    i = 0
    while i < len(doc_ids):
        j = i
        while j + 1 < len(doc_ids) and doc_ids[j + 1] == doc_ids[i]:
            j += 1
        if j > i:
            duplicates += j - i
            kept_rows.append(min(range(i, j + 1), key=docs.materialize))
        else:
            kept_rows.append(i)
        kept_ids.append(doc_ids[i])
        i = j + 1
    docs.rows = kept_rows
    return kept_ids, docs, duplicates
