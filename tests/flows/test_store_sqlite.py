"""The MLflow SQLite store as ``flows.store_sqlite`` reads and writes it, checked against MLflow
itself: a store MLflow creates has the layout it knows, a run it writes reads back through MLflow
as the run MLflow's client writes, its registry reads agree with MLflow's, and
``flows.model_registry.rescoring`` predicts what scoring a version again writes."""

import math
import sqlite3
import time

import pytest

from flows import model_registry as registry
from flows import store_sqlite as store
from flows.tracking import Tracker, metric_items, param_items


@pytest.fixture
def tracker(tmp_path):
    t = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    t.use_experiment("bertflow", artifact_root=str(tmp_path / "mlartifacts"))
    return t


def _db(tracker) -> str:
    return tracker.uri.removeprefix("sqlite:///")


def test_a_store_mlflow_creates_has_the_layout_written_here(tracker, tmp_path):
    assert store.layout_differences(_db(tracker)) == []
    with sqlite3.connect(_db(tracker)) as db:
        db.execute("alter table runs add column extra text")
    assert store.layout_differences(_db(tracker)) == ["runs: +extra"]


def test_a_run_written_here_reads_back_as_the_one_mlflows_client_writes(tracker):
    """The same tags, params, metrics (NaN and infinity included) and text artifact, once through
    MLflow's client as the flow records them and once here: MLflow reads back the same run."""
    client = tracker.client
    tags = {"bertflow.root": "/r/it's", "bertflow.outcome": "nothing to do", "empty": ""}
    params = {"preset": "tiny", "nested": {"a": [1, 2], "token": "secret-value"}, "long": "x" * 7000}
    metrics = {"a.b": 1.5, "nan": float("nan"), "inf": float("inf"), "neg": -float("inf"), "n": 3, "flag": True}

    theirs = tracker.start_run("pretrain-tiny", tags=tags)
    tracker.log_params(theirs, params)
    tracker.log_metrics(theirs, metrics)
    tracker.log_text(theirs, "# results\n\u00e9\n", "results.md")
    tracker.end_run(theirs)

    exp = store.experiment(_db(tracker), "bertflow")
    assert exp is not None and exp.experiment_id == tracker.experiment_id
    now = int(time.time() * 1000)
    texts = {"results.md": "# results\n\u00e9\n"}
    ours = store.write_run(_db(tracker), exp, "pretrain-tiny", tags, param_items(params),
                           [(k, v, now) for k, v in metric_items(metrics)], texts, now)  # fmt: skip

    a, b = client.get_run(theirs), client.get_run(ours)
    assert b.data.tags == a.data.tags
    assert b.data.params == a.data.params and b.data.params["nested.token"] == "***"
    assert b.data.metrics.keys() == a.data.metrics.keys() == {"a.b", "nan", "inf", "neg", "n"}
    for key, value in a.data.metrics.items():
        assert (math.isnan(value) and math.isnan(b.data.metrics[key])) or b.data.metrics[key] == value, key
        history = client.get_metric_history(ours, key)
        assert [(m.step, m.timestamp) for m in history] == [(0, now)]
    for field in ("status", "user_id", "run_name", "lifecycle_stage", "experiment_id"):
        assert getattr(b.info, field) == getattr(a.info, field), field
    assert b.info.artifact_uri == a.info.artifact_uri.replace(theirs, ours)
    assert [f.path for f in client.list_artifacts(ours)] == ["results.md"]
    with open(client.download_artifacts(ours, "results.md"), encoding="utf-8") as f:
        assert f.read() == texts["results.md"]
    with sqlite3.connect(_db(tracker)) as db:  # the rows themselves, but for the ids and times
        rows = {
            run: db.execute(
                "select name, source_type, source_name, entry_point_name, user_id, status, source_version,"
                " lifecycle_stage, experiment_id, deleted_time from runs where run_uuid = ?",
                (run,),
            ).fetchone()
            for run in (theirs, ours)
        }
        latest = {
            run: sorted(db.execute("select key, is_nan, step from latest_metrics where run_uuid = ?", (run,)))
            for run in (theirs, ours)
        }
    assert rows[ours] == rows[theirs] and latest[ours] == latest[theirs]
    found = client.search_runs([tracker.experiment_id], "tags.`bertflow.outcome` = 'nothing to do'")
    assert sorted(r.info.run_id for r in found) == sorted([theirs, ours])


def test_running_runs_and_the_registry_read_as_mlflow_reads_them(tracker):
    client = tracker.client
    running = tracker.start_run("pretrain-tiny", tags={"bertflow.root": "/r"})
    tracker.end_run(tracker.start_run("pretrain-tiny", tags={"bertflow.root": "/r"}))
    tracker.start_run("pretrain-tiny", tags={"bertflow.root": "/other"})
    assert store.running_runs(_db(tracker), tracker.experiment_id, "/r") == [running]

    client.create_registered_model("bert-x")
    client.create_registered_model("bert-y")
    for i in range(3):
        client.create_model_version("bert-x", f"file:///m{i}", run_id=running, tags={"k": str(i)},
                                    description=f"v{i}")  # fmt: skip
    client.create_model_version("bert-y", "file:///y", run_id=running)
    client.delete_model_version("bert-x", "2")
    client.set_registered_model_alias("bert-x", "champion", "3")
    client.set_registered_model_alias("bert-x", "challenger", "1")
    client.set_model_version_tag("bert-x", "3", "bertflow.score", "51.5")

    mine = store.model_versions(_db(tracker), "bert-x")
    theirs = sorted(client.search_model_versions("name = 'bert-x'"), key=lambda v: int(v.version))
    assert [(v.version, v.description, v.tags) for v in mine] == [
        (str(v.version), v.description, v.tags) for v in theirs
    ]
    assert [v.version for v in mine] == ["1", "3"]  # the deleted one is not there
    assert store.model_aliases(_db(tracker), "bert-x") == {"champion": "3", "challenger": "1"}
    assert store.model_aliases(_db(tracker), "bert-y") == {}


def _scores(*percents: float) -> list[registry.TaskScore]:
    return [registry.TaskScore(f"t{i}", "eval_accuracy", p, i == 0) for i, p in enumerate(percents)]


def _score_again(tracker, name: str, number: str, scores: list[registry.TaskScore]) -> str:
    """What ``register_model_task`` writes for a version that already holds the export."""
    score, glue = registry.model_score(scores)
    client = tracker.client
    client.update_model_version(name, number, description=registry.describe(scores, score, glue))
    for s in scores:
        client.set_model_version_tag(name, number, f"{s.task}.score_percent", f"{s.percent:.4f}")
    if glue is not None:
        client.set_model_version_tag(name, number, "bertflow.glue_average", f"{glue:.4f}")
    return registry.set_alias_by_score(tracker, name, number, score)


def _state(tracker, name: str):
    db = _db(tracker)
    return [(v.version, v.description, v.tags) for v in store.model_versions(db, name)], store.model_aliases(db, name)


@pytest.mark.parametrize(
    "steps",
    [
        # (version scored, its scores), in order; the last one is predicted, then done
        [("1", (70.0, 60.0)), ("1", (70.0, 60.0))],  # the champion, scored the same: nothing
        [("1", (70.0, 60.0)), ("1", (71.0, 60.0))],  # the champion, new scores: tags and description
        [("1", (70.0, 60.0)), ("2", (50.0, 40.0)), ("2", (50.0, 40.0))],  # the challenger again: nothing
        [("1", (70.0, 60.0)), ("2", (50.0, 40.0)), ("3", (50.0, 40.0))],  # another challenger: the alias moves
        [("1", (70.0, 60.0)), ("2", (90.0, 80.0))],  # a better score: champion moves
        [("2", (70.0,))],  # no champion yet
        [("1", ())],  # no score: nothing, whatever aliases it holds
    ],
)
def test_rescoring_predicts_what_scoring_a_version_again_writes(tracker, steps):
    client = tracker.client
    client.create_registered_model("bert-x")
    for i in range(3):
        client.create_model_version("bert-x", f"file:///m{i}")
    for number, percents in steps[:-1]:
        _score_again(tracker, "bert-x", number, _scores(*percents))
    number, percents = steps[-1]
    versions, aliases = _state(tracker, "bert-x")
    tags = {v: t for v, _, t in versions}
    description = next(d for v, d, _ in versions if v == number)
    champion = tags.get(aliases.get("champion"), {})
    changes, alias = registry.rescoring(number, description, tags[number], aliases, champion, _scores(*percents))
    if percents:
        assert _score_again(tracker, "bert-x", number, _scores(*percents)) == alias
    else:
        assert alias is None
    assert (changes == []) == (_state(tracker, "bert-x") == (versions, aliases)), changes
