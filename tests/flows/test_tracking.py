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


def test_a_remote_root_with_a_tracking_server_is_not_relocated():
    """A gs:// root has no store of its own to follow (its store is the server or database the
    run was given): the moved-root check leaves it alone instead of asking for the default store,
    which a remote root has none of (every gs:// flow failed there)."""
    from flows.prefect_tasks import _follow_moved_root
    from flows.tracking import default_tracking_uri

    with pytest.raises(ValueError, match="is remote: give --mlflow-uri"):
        default_tracking_uri("gs://bucket/run")
    for uri in ("http://127.0.0.1:5000", "sqlite:////tmp/elsewhere.db"):
        assert _follow_moved_root("gs://bucket/run", uri) is None
