"""MLflow tracking on a real SQLite store: run layout, params, metrics, artifacts.

Registration (one version per export, aliases by score) is tested in test_model_registry.py."""

import pytest

from flows.tracking import Tracker, default_tracking_uri


def test_parent_child_runs_metrics_and_artifacts(tmp_path):
    uri = default_tracking_uri(str(tmp_path / "root"))
    assert uri == f"sqlite:///{tmp_path}/root/mlflow.db"
    tracker = Tracker(uri)
    tracker.use_experiment("bertflow", artifact_root=str(tmp_path / "root" / "mlartifacts"))
    parent = tracker.start_run("pretrain-tiny")
    child = tracker.start_run("corpus", parent_id=parent)
    tracker.log_params(child, {"corpus": {"num_shards": 2, "beam": {"runner": "FnApiRunner"}}, "lengths": [64, 128]})
    for step, loss in enumerate([9.0, 7.5, 6.1]):
        tracker.log_metrics(child, {"loss": loss, "ignored_flag": True}, step)
    tracker.log_text(child, '{"stage": "corpus"}', "manifest.json")
    tracker.end_run(child)

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "bert"}')
    tracker.client.log_artifacts(parent, str(model_dir), "model")
    tracker.end_run(parent)

    client = tracker.client
    run = client.get_run(child)
    assert run.data.params["corpus.beam.runner"] == "FnApiRunner"
    assert run.data.params["lengths"] == "[64, 128]"
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(child, "loss")
    assert [m.value for m in history] == [9.0, 7.5, 6.1]
    assert "ignored_flag" not in run.data.metrics
    assert client.get_run(parent).info.status == "FINISHED"
    assert [r.info.run_id for r in tracker.runs_with_tag("mlflow.parentRunId", parent)] == [child]
    artifacts = [a.path for a in client.list_artifacts(parent, "model")]
    assert artifacts == ["model/config.json"]
    assert (tmp_path / "root" / "mlartifacts").exists()


def test_the_ui_link_opens_the_training_runs():
    """MLflow 3.17's UI opens an experiment on its GenAI overview unless the URL asks for the
    machine-learning view (seen in headless Chromium: the experimentKind tag no longer decides)."""
    from flows.tracking import ui_url

    assert (
        ui_url("sqlite:////r/mlflow.db", "1")
        == "http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning"
    )
    assert ui_url("https://mlflow.example.org/", "7").startswith("https://mlflow.example.org/#/experiments/7/runs?")


_OPEN_STORE = """
import os, sys, time
go, uri, root = sys.argv[1:4]
from flows.tracking import Tracker, store_artifact_root
import mlflow.tracking
open(root + ".ready", "w").close()
while not os.path.exists(go):  # both processes open the new store at the same moment
    time.sleep(0.005)
t = Tracker(uri)
t.use_experiment("bertflow", artifact_root=store_artifact_root(uri, root))
t.end_run(t.start_run("corpus", tags={"bertflow.root": root}))
"""


def test_two_processes_creating_one_new_store_both_work(tmp_path):
    """Two runs opening one new SQLite store together: without the lock one of them failed inside
    MLflow's migration (3 of 3 tries here) and the store was left half made."""
    import os
    import subprocess
    import sys
    import time

    uri = f"sqlite:///{tmp_path}/shared/mlflow.db"
    go = tmp_path / "go"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_STORE, str(go), uri, str(tmp_path / f"root{i}")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(2)
    ]
    while not all((tmp_path / f"root{i}.ready").exists() for i in range(2)):  # both imported what they need
        assert all(p.poll() is None for p in procs), [p.communicate()[1] for p in procs]
        time.sleep(0.05)
    go.touch()
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    tracker = Tracker(uri)
    tracker.use_experiment("bertflow")
    runs = tracker.client.search_runs([tracker.experiment_id])
    assert sorted(r.data.tags["bertflow.root"] for r in runs) == [str(tmp_path / "root0"), str(tmp_path / "root1")]
    # the artifacts of a shared store live beside it, not under the root that happened to create it
    location = tracker.client.get_experiment(tracker.experiment_id).artifact_location
    assert location == f"file://{tmp_path}/shared/mlartifacts"
    assert (tmp_path / "shared" / "mlflow.db.lock").exists()


def test_a_remote_root_with_a_tracking_server_is_not_relocated():
    """A gs:// root has no store of its own to follow (its store is the server or database the
    run was given): the moved-root check leaves it alone instead of asking for the default store,
    which a remote root has none of (every gs:// flow failed there)."""
    from flows.tracking import default_tracking_uri, follow_moved_root

    with pytest.raises(ValueError, match="is remote: give --mlflow-uri"):
        default_tracking_uri("gs://bucket/run")
    for uri in ("http://127.0.0.1:5000", "sqlite:////tmp/elsewhere.db"):
        assert follow_moved_root("gs://bucket/run", uri) is None


def test_the_wait_for_a_gone_server_is_set_by_the_environment_and_its_failure_is_not_retried(monkeypatch):
    """``BERTFLOW_TRACKING_WAIT_S`` sets the wait (a bad value: the default, with a warning); a
    server that refused connections for the whole wait fails the call naming it, in the wait,
    and that failure is a stage process's exit 6, never retried. A port nobody listens on is a
    real refused connection."""
    import socket
    import time

    from flows import tracking
    from flows.proc.protocol import EXIT_TRACKING_GONE, NOT_RETRIED, describe_exit, exit_code_for, worth_retrying

    monkeypatch.setattr(tracking, "_GAVE_UP", set())
    for raw, seconds in (("7", 7.0), ("0", 0.0), ("2.5", 2.5), ("soon", 120.0), ("-1", 120.0), ("nan", 120.0)):
        monkeypatch.setenv(tracking.ENV_WAIT, raw)
        assert tracking.unreachable_seconds() == seconds, raw
    monkeypatch.delenv(tracking.ENV_WAIT)
    assert tracking.unreachable_seconds() == tracking.UNREACHABLE_SECONDS

    with socket.socket() as s:  # a free port, closed again: connecting to it is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    monkeypatch.setenv(tracking.ENV_WAIT, "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    client = tracking._client(uri)
    start = time.monotonic()
    with pytest.raises(tracking.TrackingServerGone, match=f"MLflow tracking server {uri} refused connections") as err:
        client.search_experiments()
    assert 1.0 <= time.monotonic() - start < 60  # retried within the wait, never past it
    assert exit_code_for(err.value) == EXIT_TRACKING_GONE and EXIT_TRACKING_GONE in NOT_RETRIED
    assert not worth_retrying(err.value)
    wrapped = RuntimeError("the trainer's log call failed")
    wrapped.__cause__ = err.value
    assert exit_code_for(wrapped) == EXIT_TRACKING_GONE and not worth_retrying(wrapped)
    assert describe_exit(6) == "exited with code 6 (the MLflow tracking server went away)"

    monkeypatch.setattr(tracking, "_GAVE_UP", set())
    tracking.give_up(uri)  # a stage's process waited already: this one tries once
    start = time.monotonic()
    with pytest.raises(tracking.TrackingServerGone, match=uri):
        client.search_experiments()
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("store", ["sqlite", "server"])
def test_an_experiment_and_a_model_another_run_made_meanwhile_are_used(tmp_path, store, servers, monkeypatch):
    """Two runs started together on a new store both look the experiment (and, at registration,
    the registered model) up, find none and create it: the later creation fails
    (RESOURCE_ALREADY_EXISTS). CI saw one of two `bertflow run`s on a new `mlflow server` exit 1
    so. The interleaving forced here: the other run creates each right after our lookup; ours
    uses theirs. A creation that fails with nothing there still raises its own error."""
    from mlflow.exceptions import MlflowException

    from flows.model_registry import ensure_registered_model
    from flows.tracking import Tracker

    server = None
    if store == "server":
        server, uri = servers.start_mlflow_server(tmp_path / "team")
    else:
        uri = f"sqlite:///{tmp_path}/team/mlflow.db"
    try:
        ours, theirs = Tracker(uri), Tracker(uri)
        lookups = []
        real_lookup = ours.client.get_experiment_by_name

        def looked_up_before_theirs(name):
            lookups.append(name)
            if len(lookups) > 1:
                return real_lookup(name)
            assert real_lookup(name) is None
            theirs.use_experiment(name)  # the other run, between our lookup and our creation
            return None

        monkeypatch.setattr(ours.client, "get_experiment_by_name", looked_up_before_theirs)
        assert ours.use_experiment("bertflow") == theirs.experiment_id
        assert lookups == ["bertflow", "bertflow"]
        assert [e.name for e in ours.client.search_experiments()] == ["bertflow", "Default"]

        real_get_model = ours.client.get_registered_model
        first = []

        def registered_before_theirs(name):
            if first:
                return real_get_model(name)
            first.append(name)
            with pytest.raises(MlflowException):
                real_get_model(name)
            ensure_registered_model(theirs, name)
            raise MlflowException(f"Registered Model with name={name} not found")

        monkeypatch.setattr(ours.client, "get_registered_model", registered_before_theirs)
        ensure_registered_model(ours, "bert-tiny")
        assert [m.name for m in ours.client.search_registered_models()] == ["bert-tiny"]

        def refused(*args, **kwargs):
            raise MlflowException("the store refused it")

        monkeypatch.setattr(ours.client, "get_experiment_by_name", real_lookup)
        monkeypatch.setattr(ours.client, "create_experiment", refused)
        with pytest.raises(MlflowException, match="the store refused it"):
            ours.use_experiment("another")
        monkeypatch.setattr(ours.client, "create_registered_model", refused)
        with pytest.raises(MlflowException, match="the store refused it"):
            ensure_registered_model(ours, "another-model")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
