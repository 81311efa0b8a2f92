"""The corpus and examples jobs on a portable runner, as a Flink or Spark job server runs them:
``PortableRunner`` against Beam's own Python job service (``local_job_service_main``) whose
jobs run on an EXTERNAL pool of SDK workers (``worker_pool_main``: every worker a fresh Python
with its pipeline options from the provision API), all on 127.0.0.1.

Production tier (`python3 -m pytest -m production`, run by `.ci/run`): every file the corpus,
vocab and examples stages leave (the 11 of the corpus and examples jobs: documents, rejects,
example shards, the vocab copy) is byte-identical to the local runner's, and a job that
outlives the driver's watch of it (Beam's ``job_server_timeout``, 300 s by default) is waited
for, not failed and not submitted twice.
"""

import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.presets import load_config
from flows.runner import run_stage
from pipeline.schema.manifest import read_manifest

pytestmark = [pytest.mark.slow, pytest.mark.production]
REPO = Path(__file__).resolve().parents[2]
OBJECT_BOUND = 64
"""Work objects a corpus stage of the sample may write on gs:// (11 measured): below one per
dedup partition it had before on every non-local runner."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"nothing listens on {port}: {log.read_text()[-3000:]}"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def job_service(tmp_path_factory, gcs_emulator):
    """Beam's Python job service and an external SDK worker pool; -> (pipeline options, endpoint).
    Started after the GCS emulator: its SDK workers inherit ``STORAGE_EMULATOR_HOST``."""
    tmp = tmp_path_factory.mktemp("job-service")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    job_port, pool_port = free_port(), free_port()
    commands = {
        "pool": [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={pool_port}"],
        "jobs": [
            sys.executable,
            "-m",
            "apache_beam.runners.portability.local_job_service_main",
            f"--port={job_port}",
            f"--staging_dir={tmp / 'staging'}",
        ],
    }
    procs = []
    try:
        for name, cmd in commands.items():
            log = tmp / f"{name}.log"
            with open(log, "wb") as out:  # a file: an unread pipe fills up and blocks the server
                procs.append(subprocess.Popen(cmd, env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT))
            wait_for_port(job_port if name == "jobs" else pool_port, procs[-1], log)
        options = {
            "job_endpoint": f"localhost:{job_port}",
            "environment_type": "EXTERNAL",
            "environment_config": f"localhost:{pool_port}",
        }
        yield options, f"localhost:{job_port}"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def stage_files(folder: Path) -> dict[str, str]:
    """{path: sha256} of every file a stage left in its folder (the rejects included), but its
    manifest, which holds times."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "_manifest.json"
    }


def jobs_on(endpoint: str) -> list[str]:
    """The ids of every job the job service was given."""
    import grpc
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

    with grpc.insecure_channel(endpoint) as channel:
        stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
        return [j.job_id for j in stub.GetJobs(beam_job_api_pb2.GetJobsRequest(), timeout=60).job_info]


def test_corpus_and_examples_through_the_job_service_equal_the_local_runners(job_service, tmp_path):
    options, endpoint = job_service
    before = jobs_on(endpoint)
    portable = {
        f"{stage}.beam.{k}": v
        for stage in ("corpus", "examples")
        for k, v in {"runner": "PortableRunner", "options": options, "shared_filesystem": True}.items()
    }
    roots = {"local": tmp_path / "local", "portable": tmp_path / "portable"}
    results = {}
    for name, overrides in (("local", {}), ("portable", portable)):
        cfg = load_config("tiny", {"examples.dupe_factor": 2, **overrides})
        results[name] = {s: run_stage(s, cfg, str(roots[name])) for s in ("corpus", "vocab", "examples")}
    assert len(jobs_on(endpoint)) == len(before) + 2  # the corpus and the examples job, once each
    for stage in ("corpus", "vocab", "examples"):
        local, ported = (stage_files(roots[n] / stage) for n in ("local", "portable"))
        assert local == ported, stage
        # the manifest's checksums are those of the files (the rejects are on disk, not in it)
        listed = {f.path: f.sha256 for f in read_manifest(results["portable"][stage].url).files}
        assert listed.items() <= ported.items(), stage
    assert results["portable"]["corpus"].counts["documents"] > 300
    assert any(p.startswith("rejects/part-") for p in stage_files(roots["portable"] / "corpus"))
    assert any(p.startswith("seq128/part-") for p in local)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # Beam's message thread
def test_a_job_that_outlives_the_drivers_watch_is_waited_for_not_resubmitted(job_service, tmp_path, caplog):
    """``job_server_timeout`` 5 s and a job that sleeps 15 s: Beam's own wait ends in
    DEADLINE_EXCEEDED while the job runs on; ``wait_for_job`` follows its state to DONE."""
    import apache_beam as beam
    from apache_beam.runners.runner import PipelineState

    from pipeline.beam.config import BeamConfig
    from pipeline.beam.io import make_pipeline, wait_for_job

    options, endpoint = job_service
    before = jobs_on(endpoint)
    cfg = BeamConfig(runner="PortableRunner", options={**options, "job_server_timeout": 5}, shared_filesystem=True)
    p = make_pipeline(cfg)
    out = tmp_path / "out"
    _ = (
        p
        | beam.Create(["a", "b"])
        | beam.Map(lambda x: (time.sleep(15), x.upper())[1])
        | beam.io.WriteToText(str(out / "part"), num_shards=1)
    )
    result = p.run()
    with caplog.at_level("WARNING", logger="pipeline.beam.io"):
        assert wait_for_job(result, "the sleeping job", poll_s=1) is result
    assert result.state == PipelineState.DONE
    assert "after the runner stopped watching it" in caplog.text  # Beam's wait did end first
    assert sorted((out / "part-00000-of-00001").read_text().split()) == ["A", "B"]
    assert len(jobs_on(endpoint)) == len(before) + 1


def test_a_corpus_stage_on_gs_through_the_job_service_writes_few_objects(
    job_service, gcs_bucket, gcs_objects_written, tmp_path
):
    """The sample's corpus stage with its output on gs:// (the emulator; the SDK workers find it
    through STORAGE_EMULATOR_HOST like gcsfs here): documents equal to the local runner's, and
    the dedup passes sized from the input (one partition) keep the objects it writes, work
    files included, to a few dozen: with 64 partitions for every non-local runner they were
    thousands."""
    options, _ = job_service
    ported = {"corpus.beam.runner": "PortableRunner", "corpus.beam.options": options}
    ported["corpus.beam.shared_filesystem"] = True  # the inputs: the sample, on this machine
    local = run_stage("corpus", load_config("tiny"), str(tmp_path / "local"))
    remote = run_stage("corpus", load_config("tiny", ported), f"{gcs_bucket}/run")
    files = {f.path: f.sha256 for f in read_manifest(remote.url).files}
    assert files == {f.path: f.sha256 for f in read_manifest(local.url).files}
    written = gcs_objects_written(gcs_bucket.removeprefix("gs://"), "run/corpus/")
    work = {n for n in written if n.startswith("run/corpus/_work/")}
    assert {f"run/corpus/{p}" for p in files} <= written - work
    assert len(work) <= OBJECT_BOUND, sorted(work)  # 11 here
