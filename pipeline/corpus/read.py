"""The read half of the corpus job: units of read work (files, multistream ranges) to raw records.

One DoFn for every source: it calls the source's reader named by its row in
:data:`pipeline.corpus.sources.SOURCES`; what is particular to a source (its files, its records,
its rejects) lives in its own module."""

from __future__ import annotations

import logging
import uuid

import apache_beam as beam
import pyarrow as pa

from pipeline.beam.dofns import RUNS
from pipeline.beam.shards import read_transient, write_transient
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.rejects import Rejecting
from pipeline.corpus.sources import resolve, source_of
from pipeline.schema.storage import join_url

log = logging.getLogger("bertflow.corpus")

BATCHES = "batches"
PROGRESS_EVERY = 1000


# -- DoFns and composite transforms -------------------------------------------------------------
class _ReadUnit(Rejecting):
    """(source, url, start, end, part, parts) -> raw records {doc_id, source, title, text[, layout]}
    by the source's reader (``Source.read`` of :data:`pipeline.corpus.sources.SOURCES`); rejects
    written to runs (announced on the tagged output "runs"). A handing-off unit's records go to
    batch files instead (tagged "batches")."""

    def __init__(self, config: CorpusConfig, work_url: str):
        super().__init__(work_url)
        self.config = config

    def process(self, unit):
        source = source_of(unit[0])
        records = resolve(source.read)(self, unit)
        if unit[5] == HANDOFF:
            read = yield from _handed(records, _RecordBatches(self.work_url))
        else:
            read = yield from records
        self.count(f"{source.name}_read", read)


def _handed(records, batches: _RecordBatches):
    """The records of a reader written to batch files, their URLs as tagged outputs; returns what
    the reader returns (the records it read)."""
    while True:
        try:
            record = next(records)
        except StopIteration as done:
            read = done.value
            break
        for batch in batches.add(record):
            yield beam.pvalue.TaggedOutput(BATCHES, batch)
    for batch in batches.close():
        yield beam.pvalue.TaggedOutput(BATCHES, batch)
    return read


def plan_units(source: str, urls: list[str], config: CorpusConfig) -> list[tuple]:
    """Units of read work (source, url, start, end, part, parts): a file each, or the ranges its
    source's ``plan`` gives (multistream dumps split by stream ranges); ``part`` of ``parts``
    readers of one file (see :func:`spread_units`)."""
    row = source_of(source)
    if not row.plan:
        return [(source, url, None, None, 0, 1) for url in urls]
    plan = resolve(row.plan)
    return [(source, *unit, 0, 1) for url in urls for unit in plan(url, config)]


HANDOFF = 0
"""``parts`` of a unit read by one reader that hands its page records to every worker (through
record batch files): see :func:`spread_units`."""
BATCH_BYTES = 1 << 20
"""Page text a handing-off reader holds before it writes a record batch file: small enough that
the batches of a file deal out evenly (the local runner deals them once, round robin: 8 MiB
made 2 batches of a 20 MB dump), large enough that a 20 GB dump makes ~20,000 files, not more."""


def spread_units(units: list[tuple], workers: int) -> list[tuple]:
    """Units for ``workers``: when there are fewer than two per worker, each whole dump file
    of a source that hands off (``Source.handoff``: one that cannot be split by streams, e.g. a
    single-stream ``.bz2``) is read by one reader
    that writes its article records to batch files (``parts == HANDOFF``); the batches are
    dealt to every worker to clean. Page text never crosses a shuffle (only batch file URLs).

    Measured (20 MB dump, 2 workers, CPU-seconds of the whole job): the former choice, N
    readers each decompressing the whole file and cleaning every N-th page, took 8.6 against
    6.4 at 1 worker; one reader alone, 6.5 (and was faster in wall time on the loaded machine
    even with its cleaning on one worker). The cost here: the records are written and read once
    more, and the read (decompression and page scan) is not shared out."""
    if workers <= 1 or len(units) >= 2 * workers:
        return units
    return [
        (source, url, start, end, 0, HANDOFF)
        if start is None and source_of(source).handoff
        else (source, url, start, end, part, parts)
        for source, url, start, end, part, parts in units
    ]


RECORD_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("title", pa.string()),
        pa.field("text", pa.string(), nullable=False),
    ]
)


class _RecordBatches:
    """Records of a handing-off reader, written every ~BATCH_BYTES of text as one batch file
    under ``work_url/batches/``; :meth:`close` returns the URLs written."""

    def __init__(self, work_url: str):
        self.work_url = work_url
        self.rows: list[dict] = []
        self.held = 0
        self.written: list[str] = []

    def add(self, record: dict) -> list[str]:
        self.rows.append(record)
        self.held += len(record["text"])
        return self._flush() if self.held >= BATCH_BYTES else []

    def _flush(self) -> list[str]:
        if not self.rows:
            return []
        url = join_url(self.work_url, "batches", f"{uuid.uuid4().hex}.arrows")
        write_transient(url, pa.Table.from_pylist(self.rows, schema=RECORD_SCHEMA))
        self.rows, self.held = [], 0
        return [url]

    def close(self) -> list[str]:
        return self._flush()


class _ReadBatch(beam.DoFn):
    """Record batch file URL -> its records (the file stays until the job removes its work
    folder, so a retried bundle reads it again)."""

    def process(self, url: str):
        yield from read_transient(url)


class ReadUnits(beam.PTransform):
    """Read units -> {"records": raw records, "handed": the raw records a handing-off reader
    wrote to batch files, read back wherever the batches were dealt, "runs": reject runs}."""

    def __init__(self, config: CorpusConfig, work_url: str):
        super().__init__()
        self.config = config
        self.work_url = work_url

    def expand(self, units):
        read = units | "ReadUnit" >> beam.ParDo(_ReadUnit(self.config, self.work_url)).with_outputs(
            RUNS, BATCHES, main="records"
        )
        # Cleaned apart from the direct records, not flattened with them: a Flatten of two
        # stages' outputs is a buffer in the local runner, and these are whole pages.
        handed = read[BATCHES] | "SpreadBatches" >> beam.Reshuffle() | "ReadBatch" >> beam.ParDo(_ReadBatch())
        return {"records": read.records, "handed": handed, RUNS: read[RUNS]}
