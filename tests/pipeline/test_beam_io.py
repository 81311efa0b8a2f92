import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.beam.io import WriteShards, fill_empty_shards, parquet_rows, shard_name, stable_shard

SCHEMA = pa.schema([("id", pa.string()), ("value", pa.int64())])


def _write(out, rows, num_shards, extra=()):
    opts = PipelineOptions(["--runner=FnApiRunner", *extra])
    with beam.Pipeline(options=opts) as p:
        _ = p | beam.Create(rows) | WriteShards(str(out), SCHEMA, num_shards, key_fn=lambda r: r["id"])
    return fill_empty_shards(str(out), SCHEMA, num_shards)


def test_shards_are_deterministic_and_complete(tmp_path):
    rows = [{"id": f"doc-{i}", "value": i} for i in range(200)]
    a = _write(tmp_path / "a", rows, 4)
    b = _write(tmp_path / "b", list(reversed(rows)), 4)
    assert [u.rsplit("/", 1)[1] for u in a] == [shard_name(i, 4) for i in range(4)]
    for ua, ub in zip(a, b):
        assert open(ua, "rb").read() == open(ub, "rb").read()  # input order does not matter
    assert sum(parquet_rows(u) for u in a) == 200
    for i, u in enumerate(a):
        ids = pq.read_table(u).column("id").to_pylist()
        assert ids == sorted(ids)
        assert all(stable_shard(x, 4) == i for x in ids)


def test_empty_shards_are_filled(tmp_path):
    urls = _write(tmp_path / "c", [{"id": "only", "value": 1}], 3)
    assert sorted(parquet_rows(u) for u in urls) == [0, 0, 1]


def test_direct_runner_runs_on_beams_local_runner_never_prism():
    """Beam's DirectRunner tries Prism first, a binary it downloads with no timeout; ours is the
    FnApiRunner it would fall back to, with the same worker options."""
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from pipeline.beam.config import BeamConfig
    from pipeline.beam.io import beam_args, make_pipeline

    one = make_pipeline(BeamConfig(runner="DirectRunner"))
    assert isinstance(one.runner, FnApiRunner)
    assert beam_args(BeamConfig(runner="DirectRunner", num_workers=2, fork_workers=False))[:3] == [
        "--runner=FnApiRunner",
        "--direct_num_workers=2",
        "--direct_running_mode=multi_processing",
    ]


def test_non_local_runners_watch_their_job_for_a_week_unless_told_otherwise():
    from apache_beam.options.pipeline_options import PortableOptions

    from pipeline.beam.config import BeamConfig
    from pipeline.beam.io import JOB_SERVER_TIMEOUT_S, pipeline_options

    def timeout(**kw):
        return pipeline_options(BeamConfig(**kw)).view_as(PortableOptions).job_server_timeout

    assert JOB_SERVER_TIMEOUT_S >= 24 * 3600
    for runner in ("PortableRunner", "FlinkRunner", "SparkRunner"):
        assert timeout(runner=runner) == JOB_SERVER_TIMEOUT_S, runner
    assert timeout(runner="PortableRunner", options={"job_server_timeout": 600}) == 600
    assert timeout(runner="FnApiRunner") == 300  # Beam's default: the local runner has no job server


@pytest.mark.parametrize("runner", ["PortableRunner", "FlinkRunner", "SparkRunner"])
def test_every_non_local_runner_refuses_local_paths_unless_the_filesystem_is_shared(runner, tmp_path):
    from pipeline.beam.config import BeamConfig
    from pipeline.beam.io import check_runner_urls

    urls = {"books": ["gs://b/books/a.txt"], "output": [str(tmp_path / "corpus")]}
    with pytest.raises(ValueError, match=r"output .* is a local path.*shared_filesystem=true"):
        check_runner_urls(BeamConfig(runner=runner), urls)
    with pytest.raises(ValueError, match="books file:///x/a.txt is a local path"):
        check_runner_urls(BeamConfig(runner=runner), {"books": ["file:///x/a.txt"]})
    check_runner_urls(BeamConfig(runner=runner), {"books": ["gs://b/a.txt"], "output": ["gs://b/run/corpus"]})
    check_runner_urls(BeamConfig(runner=runner, shared_filesystem=True), urls)
    for local in ("FnApiRunner", "DirectRunner"):
        check_runner_urls(BeamConfig(runner=local), urls)


def test_a_job_endpoint_that_does_not_answer_fails_before_anything_is_submitted():
    """Beam would wait job_server_timeout (a week now) for the channel: told in connect_s."""
    import socket

    from pipeline.beam.config import BeamConfig
    from pipeline.beam.io import make_pipeline, run_job

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = BeamConfig(runner="PortableRunner", options={"job_endpoint": f"localhost:{port}"})
    p = make_pipeline(cfg)
    _ = p | beam.Create([1])
    with pytest.raises(ConnectionError, match=f"job service at localhost:{port} .* did not answer in 1 s"):
        run_job(p, cfg, "the test job", connect_s=1)


def test_a_job_the_driver_lost_sight_of_is_not_retried_by_the_flow():
    """A stage task retries what a retry can fix; a job that may still be running is not that:
    a retry would submit it a second time beside it."""
    from flows.proc.protocol import worth_retrying
    from pipeline.beam.io import JobStillRunningError

    lost = JobStillRunningError("the corpus job: its state cannot be read")
    assert not worth_retrying(lost)
    try:
        raise RuntimeError("stage corpus failed") from lost
    except RuntimeError as wrapped:
        assert not worth_retrying(wrapped)
    assert worth_retrying(ConnectionError("the job service did not answer"))  # nothing was submitted
