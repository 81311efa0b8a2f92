"""DoFn bases the Beam stages share: counters created once, rows written to key-sorted runs.

The choice: a DoFn that writes rows (documents, rejects) writes them itself to run files
(:class:`pipeline.beam.shards.RunWriter`) and announces only the runs' URLs on the tagged output
:data:`RUNS` when its bundle ends, so rows never cross a shuffle; the cost is a file per bundle
and folder, merged later. A stage names its counter namespace and the schema of each folder.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from pipeline.beam.shards import RunWriter, use_lean_memory_pool
from pipeline.schema.storage import join_url

RUNS = "runs"
"""Tagged output of every writing DoFn: (output folder, (run URL, rows)) at the end of a bundle."""
RUN_ID_CHARS = 16


def windowed(value):
    """``value`` in the global window, for what ``finish_bundle`` yields."""
    return WindowedValue(value, GlobalWindow().max_timestamp(), [GlobalWindow()])


class Counted(beam.DoFn):
    """A DoFn that counts under its class's :attr:`namespace`, creating each counter once."""

    namespace: ClassVar[str] = "bertflow"

    def setup(self):
        self._counters = {}

    def count(self, name: str, value: int = 1) -> None:
        if name not in self._counters:
            self._counters[name] = Metrics.counter(self.namespace, name)
        self._counters[name].inc(value)


class Writing(Counted):
    """A counting DoFn that writes rows to key-sorted runs under ``work_url/runs/<folder>/`` and
    announces them on the tagged output :data:`RUNS` when its bundle ends. A folder's rows have
    the schema :attr:`schemas` names for it, else :attr:`default_schema`."""

    schemas: ClassVar[dict[str, pa.Schema]] = {}
    default_schema: ClassVar[pa.Schema | None] = None
    row_group_rows: ClassVar[int] = 128
    """Row-group size of the runs: what a merge reads per run."""

    def __init__(self, work_url: str):
        self.work_url = work_url

    def setup(self):
        super().setup()
        use_lean_memory_pool()

    def start_bundle(self):
        self._writers: dict[str, RunWriter] = {}

    def write(self, folder: str, row: dict[str, Any]) -> None:
        writer = self._writers.get(folder)
        if writer is None:
            schema = self.schemas.get(folder, self.default_schema)
            if schema is None:
                raise ValueError(f"{type(self).__name__}: no schema for the folder {folder!r}")
            prefix = uuid.uuid4().hex[:RUN_ID_CHARS]
            writer = self._writers[folder] = RunWriter(
                schema,
                lambda r: join_url(self.work_url, RUNS, folder, f"{prefix}-{r:04d}.parquet"),
                row_group_rows=self.row_group_rows,
            )
        writer.add(row)

    def finish_bundle(self):
        for folder, writer in sorted(self._writers.items()):
            for run in writer.close():
                yield beam.pvalue.TaggedOutput(RUNS, windowed((folder, run)))
        self._writers = {}
