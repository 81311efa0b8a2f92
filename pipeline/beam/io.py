"""Beam building blocks shared by the data jobs: options, deterministic Parquet shards, counters.

``WriteShards`` assigns each row to a shard from a stable digest of its key and sorts rows by key
inside the shard, so the files are byte-identical whatever the runner's parallelism or the order
in which workers meet the data (Beam's own ``WriteToParquet`` may put every row in one shard).
Files are written with pyarrow through fsspec, so a local folder and ``gs://`` work alike.

Runners: ``FnApiRunner`` and ``DirectRunner`` run here (:data:`LOCAL_RUNNERS`); ``DirectRunner``
is run as Beam's local FnApiRunner, which is what Beam's own DirectRunner picks for a batch job
once it has tried Prism, a Go binary it downloads at run time with no timeout (offline: a stall,
online: the job runs on Prism unannounced). Every other runner runs its workers elsewhere: local
paths are refused unless ``beam.shared_filesystem`` says the workers see them
(:func:`check_runner_urls`), and the driver watches the job for up to
:data:`JOB_SERVER_TIMEOUT_S` (:func:`wait_for_job`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

import apache_beam as beam
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.beam.config import BeamConfig
from pipeline.schema.parquet import WRITE_OPTIONS
from pipeline.schema.storage import join_url

log = logging.getLogger(__name__)


LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner")
"""Runners whose workers run on this machine (processes of the driver's)."""
JOB_SERVER_TIMEOUT_S = 7 * 24 * 3600
"""``--job_server_timeout`` given to every non-local runner (PortableRunner, Flink, Spark; Prism).
Beam's default, 300 s, is not only the deadline of each request to the job service: it is also
the deadline of the state and message streams the driver watches the job through
(``portable_runner.py``, ``JobServiceHandle.run``), so a job running longer than 5 minutes ended,
on the driver, in ``DEADLINE_EXCEEDED`` while it went on running on the job server. A week covers
any batch job; ``beam.options.job_server_timeout`` overrides it. Dataflow does not read it: its
driver polls the job's state with no deadline, but gives up (an ``AssertionError``) when the
service does not answer through its retries; :func:`wait_for_job` covers that end too."""
JOB_ENDPOINT_CONNECT_S = 120.0
"""How long :func:`run_job` waits for a given ``job_endpoint`` to accept a connection: Beam
waits ``job_server_timeout`` for it (``job_server.ExternalJobServer``), a week now, so a wrong
address is told here instead."""
STATE_POLL_S = 30.0
"""How often :func:`wait_for_job` asks for the state of a job whose watch ended before it did."""


def beam_args(cfg: BeamConfig, job_name: str | None = None) -> list[str]:
    """The pipeline options of a BeamConfig as command-line words, in the order Beam reads them
    (a later word wins): the runner, the typed fields, ``options``, then ``extra_args``.
    ``DirectRunner`` is given as ``FnApiRunner`` (module docstring)."""
    args = [f"--runner={'FnApiRunner' if cfg.runner == 'DirectRunner' else cfg.runner}"]
    if cfg.runner in LOCAL_RUNNERS and cfg.num_workers > 1:
        args += [f"--direct_num_workers={cfg.num_workers}", "--direct_running_mode=multi_processing"]
    if cfg.runner not in LOCAL_RUNNERS:
        args.append(f"--job_server_timeout={JOB_SERVER_TIMEOUT_S}")
    if cfg.runner == "DataflowRunner":
        if job_name:  # unique per submission: Dataflow refuses a second running job of one name
            args.append(f"--job_name={job_name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
        args.append(f"--num_workers={cfg.num_workers}")
        if cfg.max_num_workers:
            args.append(f"--max_num_workers={cfg.max_num_workers}")
    for name in ("project", "region", "temp_location", "machine_type", "sdk_container_image", "setup_file"):
        if getattr(cfg, name):
            args.append(f"--{name}={getattr(cfg, name)}")
    for name, value in cfg.options.items():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is True:
                args.append(f"--{name}")
            elif v not in (None, False):
                args.append(f"--{name}={v}")
    return args + list(cfg.extra_args)


def beam_option_names() -> set[str]:
    """Every pipeline option Beam knows (its own and its runners'), by name."""
    return set(PipelineOptions([]).get_all_options(drop_default=False).keys())


def pipeline_options(cfg: BeamConfig, job_name: str | None = None) -> PipelineOptions:
    """PipelineOptions for a BeamConfig: local FnApiRunner by default, any runner by its options."""
    return PipelineOptions(beam_args(cfg, job_name))


def local_runner(cfg: BeamConfig):
    """The runner instance for a BeamConfig, or None to let Beam pick it from ``--runner``: the
    local FnApiRunner at 2+ workers forks its workers from the driver (``cfg.fork_workers``)."""
    if cfg.runner in LOCAL_RUNNERS and cfg.num_workers > 1 and cfg.fork_workers:
        from pipeline.beam.local_workers import ForkingFnApiRunner, can_fork

        if can_fork():
            return ForkingFnApiRunner()
    return None


def make_pipeline(cfg: BeamConfig, job_name: str | None = None) -> beam.Pipeline:
    """A Beam pipeline with the options and the runner of a BeamConfig."""
    return beam.Pipeline(runner=local_runner(cfg), options=pipeline_options(cfg, job_name))


def check_runner_urls(cfg: BeamConfig, urls: dict[str, list[str]]) -> None:
    """Refuse, before any work, local paths for a job whose workers run elsewhere (Dataflow's,
    a Flink or Spark cluster's, a job service's: each worker would write its shards to its own
    disk, and the driver then fill the folder with empty shards: a stage "done" with nothing),
    unless ``cfg.shared_filesystem`` says they see this machine's paths; ``urls`` maps a name
    (an input, "output") to URLs."""
    if cfg.runner in LOCAL_RUNNERS or cfg.shared_filesystem:
        return
    for name, group in urls.items():
        for url in group:  # by the protocol alone: making a gcsfs filesystem probes for credentials
            if fsspec.core.split_protocol(url)[0] in (None, "file", "local"):
                raise ValueError(
                    f"{name} {url} is a local path, which {cfg.runner} workers cannot read or write: "
                    "put it in gs:// (--root gs://bucket/run, --set data.wiki=gs://...), or, when every "
                    "worker sees this machine's files, say so: --set corpus.beam.shared_filesystem=true "
                    "(examples.beam for the examples job)"
                )


def run_job(pipeline: beam.Pipeline, cfg: BeamConfig, job: str, connect_s: float = JOB_ENDPOINT_CONNECT_S):
    """Submit a built job and wait for it (:func:`wait_for_job`); a ``job_endpoint`` that does
    not answer within ``connect_s`` fails first, with nothing submitted."""
    endpoint = cfg.options.get("job_endpoint")
    if cfg.runner not in LOCAL_RUNNERS and endpoint:
        import grpc

        with grpc.insecure_channel(str(endpoint)) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=connect_s)
            except grpc.FutureTimeoutError:
                raise ConnectionError(
                    f"{job}: the job service at {endpoint} (beam.options.job_endpoint) did not answer in "
                    f"{connect_s:.0f} s"
                ) from None
    return wait_for_job(pipeline.run(), job)


class JobStillRunningError(RuntimeError):
    """The driver lost sight of a job that may still be running: not retried (a retry would
    submit the same job a second time next to it)."""

    deterministic = True  # flows.proc.protocol.is_deterministic: never retried


def wait_for_job(result, job: str = "the job", poll_s: float = STATE_POLL_S):
    """Wait until a submitted job ends; raise if it did not end DONE.

    When the runner's own wait ends while the job has not (a watch stream cut or past its
    deadline, a job server restarting), the job's state is polled every ``poll_s`` seconds until
    it ends, so the stage's retry never resubmits a job that is still running; if the state
    cannot be read either, :class:`JobStillRunningError` says so instead of a retry."""
    from apache_beam.runners.runner import PipelineState

    try:
        result.wait_until_finish()
    except Exception as exc:
        try:
            state = result.state
        except Exception:
            raise JobStillRunningError(
                f"{job}: the runner stopped watching it ({exc}) and its state cannot be read: it may still be "
                "running; not resubmitted (check the job service or the console, then rerun)"
            ) from exc
        if PipelineState.is_terminal(state):
            if state == PipelineState.DONE:
                return result
            raise
        log.warning("%s is %s after the runner stopped watching it (%s): waiting for it to end", job, state, exc)
        while not PipelineState.is_terminal(state):
            time.sleep(poll_s)
            try:
                state = result.state
            except Exception as lost:
                raise JobStillRunningError(
                    f"{job}: its state cannot be read ({lost}); it may still be running: not resubmitted"
                ) from lost
        if state != PipelineState.DONE:
            raise RuntimeError(f"{job} ended {state}") from exc
        log.info("%s ended DONE", job)
    return result


def stable_shard(key: str, num_shards: int) -> int:
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def shard_name(index: int, num_shards: int, prefix: str = "part") -> str:
    return f"{prefix}-{index:05d}-of-{num_shards:05d}.parquet"


class _WriteShard(beam.DoFn):
    def __init__(self, output_url: str, schema: pa.Schema, num_shards: int, sort_key):
        self.output_url = output_url
        self.schema = schema
        self.num_shards = num_shards
        self.sort_key = sort_key

    def process(self, element):
        index, rows = element
        rows = sorted(rows, key=self.sort_key)
        url = join_url(self.output_url, shard_name(index, self.num_shards))
        write_rows(url, rows, self.schema)
        yield url, len(rows)


def write_rows(url: str, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """Write rows to one Parquet file (written whole, so no reader sees half a file)."""
    table = pa.Table.from_pylist(rows, schema=schema)
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(fs._parent(path), exist_ok=True)
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, **WRITE_OPTIONS)


class WriteShards(beam.PTransform):
    """Write dict rows as ``num_shards`` Parquet files under ``output_url``.

    ``key_fn(row)`` must be unique and stable per row (a doc id, an example id): it picks the
    shard and the order within it. Empty shards are not written here; call
    :func:`fill_empty_shards` after the pipeline so the folder always holds exactly N files.
    """

    def __init__(
        self,
        output_url: str,
        schema: pa.Schema,
        num_shards: int,
        key_fn: Callable[[dict], str],
    ):
        super().__init__()
        self.output_url = output_url
        self.schema = schema
        self.num_shards = num_shards
        self.key_fn = key_fn

    def expand(self, pcoll):
        n, key_fn = self.num_shards, self.key_fn
        return (
            pcoll
            | "AssignShard" >> beam.Map(lambda row: (stable_shard(key_fn(row), n), row))
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShard" >> beam.ParDo(_WriteShard(self.output_url, self.schema, n, key_fn))
        )


def fill_empty_shards(output_url: str, schema: pa.Schema, num_shards: int) -> list[str]:
    """Write an empty Parquet file for every shard index that received no rows."""
    fs, _ = fsspec.core.url_to_fs(output_url)
    urls = []
    for i in range(num_shards):
        url = join_url(output_url, shard_name(i, num_shards))
        _, path = fsspec.core.url_to_fs(url)
        if not fs.exists(path):
            write_rows(url, [], schema)
        urls.append(url)
    return urls


def parquet_rows(url: str) -> int:
    """Row count from a Parquet file's footer (no data read)."""
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as f:
        return pq.ParquetFile(f).metadata.num_rows


def counters(result, namespace: str | None = None) -> dict[str, int]:
    """Committed Beam counter values of a finished pipeline, by name."""
    flt = MetricsFilter()
    if namespace:
        flt = flt.with_namespace(namespace)
    out: dict[str, int] = {}
    for c in result.metrics().query(flt)["counters"]:
        value = c.committed if c.committed is not None else c.attempted
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value or 0)
    return out
