"""Both Beam jobs built for Dataflow and validated without submitting anything.

``--dry_run=True`` makes ``DataflowRunner`` do everything up to the service call: it validates
the options (project id, region, gs:// temp location, job name), applies its overrides, pickles
every DoFn into the portable job graph and resolves the worker container; the job's
``Environment`` (worker pool, machine type, autoscaling, image) is then built the way the
runner builds it for submission. Needs the ``gcp`` extra (``apache-beam[gcp]``, part of the
``test`` extra); skipped without it.
"""

import pytest

from pipeline.beam.config import BeamConfig
from pipeline.corpus.config import CorpusConfig
from pipeline.examples.config import ExamplesConfig
from pipeline.schema.config import ConfigError

pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient", reason="needs apache-beam[gcp] (the gcp extra)")

IMAGE = "us-docker.pkg.dev/my-proj/bertflow/beam-worker:0.1.0"
DATAFLOW = dict(
    runner="DataflowRunner",
    project="my-proj",
    region="us-central1",
    temp_location="gs://my-bucket/tmp",
    num_workers=4,
    max_num_workers=32,
    machine_type="n2-highmem-4",
    sdk_container_image=IMAGE,
)
OFFLINE = {"dry_run": "True", "no_auth": True}  # build and validate, submit nothing, no credentials


def dataflow_job(pipeline):
    """(job, environment proto) of a pipeline run with ``--dry_run=True``."""
    from apache_beam.runners.dataflow.internal import apiclient

    result = pipeline.run()
    job = result.job
    env = apiclient.Environment(
        packages=[],
        options=job.options,
        environment_version=apiclient._FNAPI_ENVIRONMENT_MAJOR_VERSION,
        proto_pipeline_staged_url="gs://my-bucket/tmp/staging/pipeline.pb",
        proto_pipeline=job.proto_pipeline,
    ).proto
    return job, env


def transform_names(job) -> set[str]:
    return {t.unique_name for t in job.proto_pipeline.components.transforms.values()}


def container_images(job) -> set[str]:
    from apache_beam.portability.api import beam_runner_api_pb2

    return {
        beam_runner_api_pb2.DockerPayload.FromString(e.payload).container_image
        for e in job.proto_pipeline.components.environments.values()
    }


def check_worker_pool(env):
    (pool,) = env.worker_pools
    assert pool.machine_type == "n2-highmem-4" and pool.num_workers == 4
    assert pool.autoscaling_settings.max_num_workers == 32
    assert [c.container_image for c in pool.sdk_harness_container_images] == [IMAGE]
    assert env.temp_storage_prefix.startswith("storage.googleapis.com/my-bucket/tmp/")


def test_the_corpus_job_builds_and_validates_for_dataflow():
    from pipeline.corpus.job import build_corpus_pipeline

    cfg = CorpusConfig(num_shards=256, beam=BeamConfig(**DATAFLOW, options=OFFLINE))
    files = {
        "wiki": ["gs://my-bucket/dumps/enwiki-20261101-pages-articles1.xml"],
        "books": ["gs://my-bucket/books/a.txt"],
    }
    job, env = dataflow_job(build_corpus_pipeline(cfg, files, "gs://my-bucket/run/corpus"))
    assert job.proto.name.startswith("bertflow-corpus-") and job.proto.type.name == "JOB_TYPE_BATCH"
    check_worker_pool(env)
    assert container_images(job) == {IMAGE}
    names = transform_names(job)
    assert {
        "Read/ReadUnit",
        "Clean/BuildDocument",
        "Dedup/ExactDocuments",
        "Dedup/OnePerDocId",
        "Dedup/SharedParagraphs",
        "Dedup/DropFiles",
        "Dedup/ApplyDrops",
        "Dedup/MergeFolder",
    } <= names


def test_the_examples_job_builds_and_validates_for_dataflow():
    from pipeline.examples.job import build_examples_pipeline

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    cfg = ExamplesConfig(
        max_seq_lengths=(128, 512),
        max_predictions_per_seq=(20, 80),
        num_shards=1024,
        beam=BeamConfig(**DATAFLOW, options=OFFLINE),
    )
    docs = [f"gs://my-bucket/run/corpus/wiki/part-{i:05d}-of-00256.parquet" for i in range(256)]
    job, env = dataflow_job(build_examples_pipeline(cfg, docs, vocab, True, 64, "gs://my-bucket/run/examples"))
    assert job.proto.name.startswith("bertflow-examples-")
    check_worker_pool(env)
    assert {"Examples/TokenizeToBuckets", "Examples/CreateExamples", "Examples/MergeShards"} <= transform_names(job)


def test_dataflow_rejects_a_bad_project_id_before_submitting():
    from pipeline.corpus.job import build_corpus_pipeline

    cfg = CorpusConfig(beam=BeamConfig(**{**DATAFLOW, "project": "Not A Project"}, options=OFFLINE))
    with pytest.raises(ValueError, match="Invalid Project ID"):
        build_corpus_pipeline(cfg, {"books": ["gs://my-bucket/books/a.txt"]}, "gs://my-bucket/run/corpus")


def test_a_dataflow_job_refuses_local_paths_before_any_work(tmp_path):
    from pipeline.corpus.job import build_corpus_pipeline

    cfg = CorpusConfig(beam=BeamConfig(**DATAFLOW))
    with pytest.raises(ValueError, match="output .* is a local path"):
        build_corpus_pipeline(cfg, {"books": ["gs://my-bucket/books/a.txt"]}, str(tmp_path / "corpus"))
    with pytest.raises(ValueError, match="books .* is a local path"):
        build_corpus_pipeline(cfg, {"books": [str(tmp_path / "a.txt")]}, "gs://my-bucket/run/corpus")


@pytest.mark.parametrize(
    "missing, field",
    [
        ("project", "beam.project"),
        ("region", "beam.region"),
        ("temp_location", "beam.temp_location"),
        ("sdk_container_image", "beam.sdk_container_image"),
    ],
)
def test_dataflow_settings_are_checked_at_load_naming_the_field(missing, field):
    with pytest.raises(ConfigError, match=field):
        BeamConfig(**{**DATAFLOW, missing: ""})
    with pytest.raises(ConfigError, match="beam.temp_location: must be a gs://"):
        BeamConfig(**{**DATAFLOW, "temp_location": "/tmp/x"})
    BeamConfig(**{**DATAFLOW, "sdk_container_image": "", "setup_file": "/src/setup.py"})  # either will do
    BeamConfig(**{**DATAFLOW, missing: ""}, options={missing: "gs://given/as-an-option"})


def test_flink_and_spark_options_pass_straight_through_from_overrides():
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, SparkRunnerOptions

    from flows.overrides import parse_overrides
    from flows.presets import load_config
    from pipeline.beam.io import pipeline_options

    cfg = load_config(
        "base",
        parse_overrides(
            [
                "corpus.beam.runner=FlinkRunner",
                "corpus.beam.options.flink_master=http://jm:8081",
                'corpus.beam.options.flink_version="1.20"',
                "corpus.beam.options.parallelism=32",
                "examples.beam.runner=SparkRunner",
                "examples.beam.options.spark_master_url=spark://m:7077",
                'examples.beam.extra_args=["--environment_type=DOCKER"]',
            ]
        ),
    )
    flink = pipeline_options(cfg.corpus.beam).view_as(FlinkRunnerOptions)
    assert (flink.flink_master, flink.flink_version, flink.parallelism) == ("http://jm:8081", "1.20", 32)
    spark = pipeline_options(cfg.examples.beam)
    assert spark.view_as(SparkRunnerOptions).spark_master_url == "spark://m:7077"
    assert spark.get_all_options()["runner"] == "SparkRunner"
    assert spark.get_all_options()["environment_type"] == "DOCKER"


def test_run_sh_dry_run_prints_the_stage_commands_with_valid_dataflow_settings():
    import shlex
    import shutil
    import subprocess
    from pathlib import Path

    from flows.overrides import parse_overrides
    from flows.presets import load_config

    script = Path(__file__).resolve().parents[2] / "infra" / "dataflow" / "run.sh"
    if shutil.which("shellcheck"):
        check = subprocess.run(["shellcheck", "-x", str(script)], capture_output=True, text=True, cwd=script.parents[2])
        assert check.returncode == 0, check.stdout
    out = subprocess.run(
        [
            "bash",
            str(script),
            "--dry-run",
            "--project",
            "my-proj",
            "--region",
            "us-central1",
            "--root",
            "gs://my-bucket/run",
            "--mlflow-uri",
            "http://mlflow:5000",
            "--image",
            IMAGE,
            "--machine-type",
            "n2-highmem-4",
            "--workers",
            "4",
            "--max-workers",
            "32",
            "--books",
            "gs://my-bucket/books",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    commands = [shlex.split(line[2:]) for line in out.stdout.splitlines()]
    assert [c[:3] for c in commands] == [["bertflow", "stage", s] for s in ("corpus", "vocab", "examples")]
    sets = [w.split("=", 1) for c in commands[:1] for prev, w in zip(c, c[1:]) if prev == "--set"]
    cfg = load_config("base", parse_overrides([f"{k}={v}" for k, v in sets]))
    for beam in (cfg.corpus.beam, cfg.examples.beam):
        assert beam.runner == "DataflowRunner" and (beam.num_workers, beam.max_num_workers) == (4, 32)
        assert (beam.project, beam.region, beam.machine_type, beam.sdk_container_image) == (
            "my-proj",
            "us-central1",
            "n2-highmem-4",
            IMAGE,
        )
        assert beam.temp_location == "gs://my-bucket/run/_dataflow/tmp"
    assert cfg.data.books == "gs://my-bucket/books"
    bad = subprocess.run(
        [
            "bash",
            str(script),
            "--dry-run",
            "--project",
            "p",
            "--region",
            "r",
            "--root",
            "/local",
            "--mlflow-uri",
            "http://m",
            "--image",
            "i",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--root must be a gs:// URL" in bad.stderr


def test_the_worker_image_pins_match_the_project():
    """infra/dataflow/requirements.txt pins what pyproject.toml pins (the same pyarrow writes
    the same bytes on a worker as here)."""
    import re
    import tomllib
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    pins = {}
    for req in project["dependencies"] + project["optional-dependencies"]["neardup"]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^;\s]+)", req)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    worker = {}
    for line in (repo / "infra" / "dataflow" / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.strip().split("==")
            worker[name.lower()] = version
    for name in ("pyarrow", "numpy", "tokenizers", "gcsfs", "datasketch"):
        assert worker[name] == pins[name], name
    assert "torch" not in worker and "prefect" not in worker and "mlflow" not in worker


def test_the_setup_file_route_builds_the_workers_package(tmp_path):
    """``run.sh --setup-file``'s layout (setup.py and requirements.txt beside a copy of
    pipeline/): the dry run builds the sdist Dataflow would stage as workflow.tar.gz."""
    import shutil
    import tarfile
    from pathlib import Path

    from apache_beam.portability.api import beam_runner_api_pb2

    from pipeline.corpus.job import build_corpus_pipeline

    repo = Path(__file__).resolve().parents[2]
    shutil.copytree(repo / "pipeline", tmp_path / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "requirements.txt", "MANIFEST.in"):
        shutil.copy(repo / "infra" / "dataflow" / name, tmp_path / name)
    beam = BeamConfig(**{**DATAFLOW, "sdk_container_image": ""}, setup_file=str(tmp_path / "setup.py"), options=OFFLINE)
    job, _ = dataflow_job(
        build_corpus_pipeline(
            CorpusConfig(beam=beam), {"books": ["gs://my-bucket/books/a.txt"]}, "gs://my-bucket/run/corpus"
        )
    )
    staged = {}
    for env in job.proto_pipeline.components.environments.values():
        for dep in env.dependencies:
            name = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(dep.role_payload).staged_name
            staged[name] = beam_runner_api_pb2.ArtifactFilePayload.FromString(dep.type_payload).path
    with tarfile.open(staged["workflow.tar.gz"]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
        requires = next(
            sdist.extractfile(m).read().decode() for m in sdist.getmembers() if m.name.endswith("requires.txt")
        )
    assert {
        "setup.py",
        "requirements.txt",
        "pipeline/corpus/job.py",
        "pipeline/examples/job.py",
        "pipeline/schema/manifest.py",
    } <= names
    assert "pyarrow==25.0.1" in requires and "torch" not in requires
