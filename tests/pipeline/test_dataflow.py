"""Both Beam jobs built for Dataflow and validated without submitting anything.

``--dry_run=True`` makes ``DataflowRunner`` do everything up to the service call: it validates
the options (project id, region, gs:// temp location, job name), applies its overrides, pickles
every DoFn into the portable job graph and resolves the worker container; the job's
``Environment`` (worker pool, machine type, autoscaling, image) is then built the way the
runner builds it for submission. Needs the ``gcp`` extra (``apache-beam[gcp]``, part of the
``test`` extra); skipped without it.
"""

import pytest

from pipeline.config import BeamConfig, ConfigError, CorpusConfig, ExamplesConfig

pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient", reason="needs apache-beam[gcp] (the gcp extra)")

IMAGE = "us-docker.pkg.dev/my-proj/bertflow/beam-worker:0.1.0"
DATAFLOW = dict(
    runner="DataflowRunner", project="my-proj", region="us-central1", temp_location="gs://my-bucket/tmp",
    num_workers=4, max_num_workers=32, machine_type="n2-highmem-4", sdk_container_image=IMAGE,
)
OFFLINE = {"dry_run": "True", "no_auth": True}  # build and validate, submit nothing, no credentials


def dataflow_job(pipeline):
    """(job, environment proto) of a pipeline run with ``--dry_run=True``."""
    from apache_beam.runners.dataflow.internal import apiclient

    result = pipeline.run()
    job = result.job
    env = apiclient.Environment(
        packages=[], options=job.options, environment_version=apiclient._FNAPI_ENVIRONMENT_MAJOR_VERSION,
        proto_pipeline_staged_url="gs://my-bucket/tmp/staging/pipeline.pb", proto_pipeline=job.proto_pipeline,
    ).proto
    return job, env


def transform_names(job) -> set[str]:
    return {t.unique_name for t in job.proto_pipeline.components.transforms.values()}


def container_images(job) -> set[str]:
    from apache_beam.portability.api import beam_runner_api_pb2

    return {beam_runner_api_pb2.DockerPayload.FromString(e.payload).container_image
            for e in job.proto_pipeline.components.environments.values()}


def check_worker_pool(env):
    (pool,) = env.worker_pools
    assert pool.machine_type == "n2-highmem-4" and pool.num_workers == 4
    assert pool.autoscaling_settings.max_num_workers == 32
    assert [c.container_image for c in pool.sdk_harness_container_images] == [IMAGE]
    assert env.temp_storage_prefix.startswith("storage.googleapis.com/my-bucket/tmp/")


def test_the_corpus_job_builds_and_validates_for_dataflow():
    from pipeline.corpus import build_corpus_pipeline

    cfg = CorpusConfig(num_shards=256, beam=BeamConfig(**DATAFLOW, options=OFFLINE))
    files = {"wiki": ["gs://my-bucket/dumps/enwiki-20261101-pages-articles1.xml"],
             "books": ["gs://my-bucket/books/a.txt"]}
    job, env = dataflow_job(build_corpus_pipeline(cfg, files, "gs://my-bucket/run/corpus"))
    assert job.proto.name.startswith("bertflow-corpus-") and job.proto.type.name == "JOB_TYPE_BATCH"
    check_worker_pool(env)
    assert container_images(job) == {IMAGE}
    names = transform_names(job)
    assert {"Read/ReadUnit", "Clean/BuildDocument", "UniqueDocIds", "Write[wiki]/WriteShard",
            "Write[books]/WriteShard", "WriteRejects/WriteShard"} <= names


def test_the_examples_job_builds_and_validates_for_dataflow():
    from pipeline.examples import build_examples_pipeline

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    cfg = ExamplesConfig(max_seq_lengths=(128, 512), max_predictions_per_seq=(20, 80), num_shards=1024,
                         beam=BeamConfig(**DATAFLOW, options=OFFLINE))
    docs = [f"gs://my-bucket/run/corpus/wiki/part-{i:05d}-of-00256.parquet" for i in range(256)]
    job, env = dataflow_job(build_examples_pipeline(cfg, docs, vocab, True, 64, "gs://my-bucket/run/examples"))
    assert job.proto.name.startswith("bertflow-examples-")
    check_worker_pool(env)
    assert {"Examples/TokenizeToBuckets", "Examples/CreateExamples", "Examples/MergeShards"} <= transform_names(job)


def test_dataflow_rejects_a_bad_project_id_before_submitting():
    from pipeline.corpus import build_corpus_pipeline

    cfg = CorpusConfig(beam=BeamConfig(**{**DATAFLOW, "project": "Not A Project"}, options=OFFLINE))
    with pytest.raises(ValueError, match="Invalid Project ID"):
        build_corpus_pipeline(cfg, {"books": ["gs://my-bucket/books/a.txt"]}, "gs://my-bucket/run/corpus")


def test_a_dataflow_job_refuses_local_paths_before_any_work(tmp_path):
    from pipeline.corpus import build_corpus_pipeline

    cfg = CorpusConfig(beam=BeamConfig(**DATAFLOW))
    with pytest.raises(ValueError, match="output .* is a local path"):
        build_corpus_pipeline(cfg, {"books": ["gs://my-bucket/books/a.txt"]}, str(tmp_path / "corpus"))
    with pytest.raises(ValueError, match="books .* is a local path"):
        build_corpus_pipeline(cfg, {"books": [str(tmp_path / "a.txt")]}, "gs://my-bucket/run/corpus")


@pytest.mark.parametrize("missing, field", [("project", "beam.project"), ("region", "beam.region"),
                                            ("temp_location", "beam.temp_location"),
                                            ("sdk_container_image", "beam.sdk_container_image")])
def test_dataflow_settings_are_checked_at_load_naming_the_field(missing, field):
    with pytest.raises(ConfigError, match=field):
        BeamConfig(**{**DATAFLOW, missing: ""})
    with pytest.raises(ConfigError, match="beam.temp_location: must be a gs://"):
        BeamConfig(**{**DATAFLOW, "temp_location": "/tmp/x"})
    BeamConfig(**{**DATAFLOW, "sdk_container_image": "", "setup_file": "/src/setup.py"})  # either will do
    BeamConfig(**{**DATAFLOW, missing: ""}, options={missing: "gs://given/as-an-option"})
