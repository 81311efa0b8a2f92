"""The corpus job's writing DoFn base: counters in namespace "corpus", documents and reject rows
written to runs (:class:`pipeline.beam.dofns.Writing`), a reject counted under its reason and
``<source>.<reason>``."""

from __future__ import annotations

from pipeline.beam.dofns import Writing
from pipeline.beam.shards import KEY
from pipeline.corpus.decide import sort_key
from pipeline.corpus.filters import REJECT_SCHEMA, reject_row
from pipeline.schema.parquet import DOCUMENT_SCHEMA

NAMESPACE = "corpus"
REJECTS_FOLDER = "rejects"
ROW_GROUP_ROWS = 128
"""Row-group size of runs (a document row is up to a few KiB): what a merge reads per run."""


class Rejecting(Writing):
    """A corpus DoFn: documents (any folder) and rejects (``rejects/``) to runs, counted."""

    namespace = NAMESPACE
    schemas = {REJECTS_FOLDER: REJECT_SCHEMA}
    default_schema = DOCUMENT_SCHEMA
    row_group_rows = ROW_GROUP_ROWS

    def reject(self, source: str, reason: str, **fields) -> None:
        """Count ``reason`` (and ``<source>.<reason>``) and write a reject row (ordered by a digest of
        its whole content)."""
        self.count(reason)
        self.count(f"{source}.{reason}")
        row = reject_row(source, reason, **fields)
        row[KEY] = sort_key("\x1f".join((row["reject_id"], row["title"] or "", row["sample"])))
        self.write(REJECTS_FOLDER, row)
