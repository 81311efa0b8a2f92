"""MLflow tracking on a real SQLite store: run layout, params, metrics, registry."""

from flows.tracking import Tracker, default_tracking_uri


def test_parent_child_runs_metrics_and_registry(tmp_path):
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
    version = tracker.register_model(parent, "bert-tiny", artifact_path="model", tags={"sst2.eval_accuracy": "0.9"})
    assert version == "1"
    assert tracker.register_model(parent, "bert-tiny", source="gs://bucket/run/model") == "2"
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
    mv = client.get_model_version("bert-tiny", "1")
    assert mv.run_id == parent and mv.tags["sst2.eval_accuracy"] == "0.9"
    artifacts = [a.path for a in client.list_artifacts(parent, "model")]
    assert artifacts == ["model/config.json"]
    assert (tmp_path / "root" / "mlartifacts").exists()
