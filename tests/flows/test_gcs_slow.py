"""Production tier (`python3 -m pytest -m production`, run by `.ci/run`): the tiny chain with its
root on gs://, against a GCS emulator and an `mlflow server` both started by the test on
127.0.0.1 (the production layout: a bucket and a tracking server), gives what a local run gives.

Through the real command line (corpus to export, then the model registered; the downstream tasks
read the export the same way and are left out for time): every stage reads and writes gs://
(pyarrow through gcsfs, WordPiece files, checkpoints, the export, manifests committed as one
object write), the model is registered on the server once, a second run given the server only
through ``MLFLOW_TRACKING_URI`` skips every stage and registers nothing new, and nothing of
gcsfs's retry noise reaches the log. Beam's own GCS IO (google-cloud-storage, what Dataflow
stages and temp files go through) is checked inside a Beam job on the same emulator.
"""

import os
import subprocess
import sys

import fsspec
import pytest

from pipeline.schema.manifest import read_manifest

pytestmark = [pytest.mark.slow, pytest.mark.production]

OVERRIDES = [
    "pretrain.phases.0.steps=60",
    "pretrain.phases.1.steps=10",
    "pretrain.warmup_steps=10",
    "pretrain.checkpoint_every=30",
    "examples.dupe_factor=2",
    "finetune_tasks=[]",
]
STAGES = ("corpus", "vocab", "examples", "pretrain", "export")
FOLDERS = {"corpus": "corpus", "vocab": "vocab", "examples": "examples", "pretrain": "checkpoints", "export": "model"}


def run_chain(root: str, mlflow_uri: str | None, command: str = "run", *extra: str):
    """The CLI on ``root``; ``mlflow_uri`` given with --mlflow-uri, or None: through the
    environment only (``MLFLOW_TRACKING_URI``, set by the caller)."""
    cmd = [sys.executable, "-m", "flows.cli", command, *extra, "--preset", "tiny", "--root", root]
    if mlflow_uri:
        cmd += ["--mlflow-uri", mlflow_uri]
    for o in OVERRIDES:
        cmd += ["--set", o]
    out = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return out


def files_of(url: str) -> dict[str, str]:
    return {f.path: f.sha256 for f in read_manifest(url).files}


def read_bytes(url: str) -> bytes:
    fs, path = fsspec.core.url_to_fs(url)
    return fs.cat_file(path)


@pytest.fixture(scope="module")
def runs(gcs_emulator, mlflow_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gcs")
    fs = fsspec.filesystem("gs", token="anon")
    fs.mkdir("chain")
    local = run_chain(str(tmp / "local"), f"sqlite:///{tmp / 'local.db'}")
    remote = run_chain("gs://chain/run", mlflow_server)
    with pytest.MonkeyPatch.context() as env:  # the rerun and status: the server without --mlflow-uri
        env.setenv("MLFLOW_TRACKING_URI", mlflow_server)
        again = run_chain("gs://chain/run", None)
        status = run_chain("gs://chain/run", None, "status", "--json", "--verify")
    return str(tmp / "local"), "gs://chain/run", local, remote, again, status


def test_a_gs_root_gives_the_local_runs_shards_and_weights(runs):
    local, remote, *_ = runs
    for stage in ("corpus", "vocab", "examples", "export"):
        a, b = files_of(f"{local}/{FOLDERS[stage]}"), files_of(f"{remote}/{FOLDERS[stage]}")
        assert a == b, stage
    assert any(p.startswith("seq128/part-") for p in files_of(f"{remote}/examples"))
    weights = read_bytes(f"{remote}/model/model.safetensors")
    assert len(weights) > 1_000_000 and weights == read_bytes(f"{local}/model/model.safetensors")
    assert read_bytes(f"{remote}/checkpoints/final/model.safetensors") == weights


def test_the_gs_run_is_quiet_and_leaves_no_temporary_objects(runs):
    _, remote, _, out, *_ = runs
    for noise in ("out of retries", "moveTo", "Falling back to copy", "Traceback"):
        assert noise not in out.stderr, noise
    fs, path = fsspec.core.url_to_fs(remote)
    names = fs.find(path)
    assert not [n for n in names if ".tmp" in n], names
    for stage in STAGES:
        assert f"{path}/{FOLDERS[stage]}/_manifest.json" in names, stage


def test_a_second_run_on_gs_skips_every_stage_and_status_verifies_it(runs):
    import json

    again, status = runs[4], runs[5]
    for stage in STAGES:
        assert f"stage {stage}: up to date, skipped" in again.stderr, stage
    rows = {r["stage"]: r["state"] for r in json.loads(status.stdout)}
    assert rows == {stage: "done" for stage in STAGES}  # --verify: every file's sha256 read back from gs://


def test_the_gs_runs_model_is_registered_once_on_the_server(runs, mlflow_server):
    """The first run registered the export (its artifacts where the tracking server keeps them:
    its --artifacts-destination, as a team's shared server does, not under one root); the rerun
    found that version by its fingerprint and registered none; the model loads back."""
    import mlflow
    import pandas as pd

    remote = runs[1]
    client = mlflow.MlflowClient(mlflow_server, registry_uri=mlflow_server)
    versions = client.search_model_versions("name='bert-tiny'")
    assert len(versions) == 1, [(v.version, v.source) for v in versions]
    assert versions[0].tags["bertflow.model_url"] == f"{remote}/model"
    experiment = client.get_experiment_by_name("bertflow")
    assert experiment.artifact_location.startswith("mlflow-artifacts:"), experiment.artifact_location
    runs_here = client.search_runs([experiment.experiment_id], "tags.`bertflow.root` = 'gs://chain/run'")
    parents = [r for r in runs_here if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 2 and {r.info.status for r in runs_here} == {"FINISHED"}  # the run and the rerun
    mlflow.set_tracking_uri(mlflow_server)
    mlflow.set_registry_uri(mlflow_server)
    model = mlflow.pyfunc.load_model(f"models:/bert-tiny/{versions[0].version}")
    assert len(model.predict(pd.DataFrame({"text": ["a [MASK] b"]}))["filled"][0]) == 1


def test_beams_own_gcs_io_works_inside_a_beam_job(gcs_emulator, tmp_path):
    """WriteToText's temporary shards, their rename (a GCS copy + delete) and ReadFromText all
    through Beam's GcsIO; no credentials offline, so Beam retries google.auth for ~20 s and then
    connects anonymously, as it logs."""
    pytest.importorskip("apache_beam.io.gcp.gcsio", reason="needs apache-beam[gcp]")
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    fsspec.filesystem("gs", token="anon").mkdir("beamio")
    lines = [f"line {i}" for i in range(50)]
    options = PipelineOptions(["--runner=FnApiRunner", "--no_auth"])
    with beam.Pipeline(options=options) as p:
        _ = p | beam.Create(lines) | beam.io.WriteToText("gs://beamio/out/part", num_shards=3)
    matched = FileSystems.match(["gs://beamio/out/part*"])[0].metadata_list
    assert len(matched) == 3
    with beam.Pipeline(options=options) as p:
        assert_that(p | beam.io.ReadFromText("gs://beamio/out/part*"), equal_to(lines))
