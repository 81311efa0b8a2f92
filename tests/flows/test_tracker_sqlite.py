"""A flow's MLflow runs written with ``sqlite3`` (``flows.tracker_sqlite``), checked against
MLflow's own client: the same calls on two stores leave the same rows but for ids and times, a new
store is the one MLflow makes, the runs read back through MLflow, and a store of another layout,
no cached template or the baseline's setting get MLflow's client."""

import math
import os
import sqlite3

import pytest
from test_mlflow_schema_template import _dump

from flows import mlflow_store, tracker_sqlite
from flows.tracker_sqlite import SqliteTracker, TrackingRefused, open_tracker
from flows.tracking import Tracker

_TIMES = {"start_time", "end_time", "creation_time", "last_update_time", "timestamp"}


@pytest.fixture
def stores(tmp_path, monkeypatch):
    """Two new stores of the same layout: one written by MLflow's client, one by sqlite3."""
    monkeypatch.setattr(tracker_sqlite, "_USABLE", {})
    mlflow_store.prepare_store(f"sqlite:///{tmp_path}/warm/mlflow.db")  # the cached template exists
    theirs = Tracker(f"sqlite:///{tmp_path}/a/mlflow.db")
    ours = open_tracker(f"sqlite:///{tmp_path}/b/mlflow.db")
    assert isinstance(ours, SqliteTracker) and not isinstance(theirs, SqliteTracker)
    return theirs, ours


def _rows(tracker) -> dict[str, list]:
    """Every row of the store's run tables, times left out, ids and the store's folder named by
    what they are (a run by its name, a dataset by its name and digest, an input by both ends)."""
    path = tracker.uri.removeprefix("sqlite:///")
    folder = os.path.dirname(path)
    with sqlite3.connect(path) as db:
        names = dict(db.execute("select run_uuid, name from runs"))
        names.update(
            (d, f"dataset:{n}:{g}") for d, n, g in db.execute("select dataset_uuid, name, digest from datasets")
        )
        names.update(
            (i, f"input:{names[s]}->{names[d]}")
            for i, s, d in db.execute("select input_uuid, source_id, destination_id from inputs")
        )

        def plain(value):
            if isinstance(value, str):
                for key, name in names.items():
                    value = value.replace(key, name)
                return value.replace(folder, "<store>")
            return value

        out = {}
        for table in ("experiments", "experiment_tags", "runs", "tags", "params", "metrics", "latest_metrics",
                      "datasets", "inputs", "input_tags"):  # fmt: skip
            cursor = db.execute(f"select * from {table}")
            columns = [d[0] for d in cursor.description]
            out[table] = sorted(
                (tuple(plain(v) for c, v in zip(columns, row) if c not in _TIMES) for row in cursor), key=repr
            )
    return out


def _session(tracker, root: str) -> dict[str, str]:
    """What a stage command records: the experiment, a run left RUNNING by a killed process, the
    parent run and a stage's child run with params, tags, datasets, metrics and a text artifact."""
    tracker.use_experiment("bertflow", artifact_root=os.path.join(os.path.dirname(tracker.uri[10:]), "mlartifacts"))
    stale = tracker.start_run("killed-before", tags={"bertflow.root": root})
    other = tracker.start_run("other-root", tags={"bertflow.root": root + "x"})
    assert tracker.mark_killed_runs(root) == [stale]
    parent = tracker.start_run("stage-corpus", tags={"bertflow.root": root, "long": "y" * 9000})
    tracker.log_params(parent, {"preset": "tiny", "nested": {"a": [1, 2], "token": "secret"}, "long": "x" * 7000})
    child = tracker.start_run("corpus", parent_id=parent, tags={"bertflow.stage": "corpus", "bertflow.root": root})
    tracker.log_params(child, {"a": 1})
    tracker.log_params(child, {"a": 1, "b": "two"})  # the same value again: accepted
    tracker.set_tags(child, {"bertflow.status": "ran", "bertflow.url": root + "/corpus"})
    tracker.set_tags(child, {"bertflow.status": "skipped", "mlflow.runName": "corpus-renamed"})
    inputs = {"wiki": "/data/wiki", "books": "gs://bucket/books", "web": "https://host/x.bz2", "s3": "s3://b/k",
              "file": "file:///data/f", "hdfs": "hdfs://n/x", "relative": "data/rel"}  # fmt: skip
    fingerprints = {"wiki": "w" * 40, "books": "b" * 12}  # the others' digests are computed
    tracker.log_datasets(child, inputs, fingerprints)
    tracker.log_datasets(child, inputs, fingerprints)  # again: nothing new
    tracker.log_datasets(parent, {"wiki": "/data/wiki"}, fingerprints, context="training")  # the same dataset
    tracker.log_metrics(child, {"stage.read": 3, "nan": float("nan"), "inf": float("inf"), "flag": True})
    tracker.log_metrics(child, {"loss": 2.0}, step=2)
    tracker.log_metrics(child, {"loss": 3.0}, step=1)  # an earlier step: not the latest
    tracker.log_metrics(child, {"loss": 1.0}, step=5)
    tracker.log_metrics(child, {"loss": 1.0}, step=5)  # the same value again: one row (a time apart or not)
    tracker.log_text(child, "# sample\n\u00e9\n", "corpus_sample.txt")
    tracker.log_text(child, "{}", "deep/manifest.json")
    tracker.end_run(child)
    tracker.end_run(other, ok=False)
    tracker.end_run(parent, status="KILLED")
    return {"parent": parent, "child": child}


def test_the_same_calls_leave_the_rows_mlflows_client_leaves(stores, tmp_path):
    theirs, ours = stores
    a, b = _session(theirs, "/r/it's"), _session(ours, "/r/it's")
    got, want = _rows(ours), _rows(theirs)
    for table in want:
        assert got[table] == want[table], table
    assert len(want["datasets"]) == 7 and len(want["inputs"]) == 8 and want["metrics"]
    for tracker, runs in ((theirs, a), (ours, b)):  # the artifacts, where MLflow puts them
        folder = os.path.join(os.path.dirname(tracker.uri[10:]), "mlartifacts")
        with open(os.path.join(folder, runs["child"], "artifacts", "corpus_sample.txt"), encoding="utf-8") as f:
            assert f.read() == "# sample\n\u00e9\n"
        assert os.path.exists(os.path.join(folder, runs["child"], "artifacts", "deep", "manifest.json"))


def test_runs_written_here_read_back_through_mlflow(stores):
    _, ours = stores
    runs = _session(ours, "/r")
    run = ours.client.get_run(runs["child"])  # MLflow's client, made now, on the same file
    assert run.info.status == "FINISHED" and run.info.run_name == "corpus-renamed"
    assert run.data.params == {"a": "1", "b": "two"} and run.data.metrics["loss"] == 1.0
    assert math.isnan(run.data.metrics["nan"]) and run.data.metrics["inf"] > 1e300
    assert {m.step for m in ours.client.get_metric_history(runs["child"], "loss")} == {1, 2, 5}
    assert sorted(d.dataset.name for d in run.inputs.dataset_inputs) == sorted(
        ["wiki", "books", "web", "s3", "file", "hdfs", "relative"]
    )
    assert [a.path for a in ours.client.list_artifacts(runs["child"])] == ["corpus_sample.txt", "deep"]
    assert ours.client.get_run(runs["parent"]).info.status == "KILLED"
    assert ours.client.get_run(runs["child"]).data.tags["mlflow.parentRunId"] == runs["parent"]


def test_refusals_are_mlflows(stores):
    theirs, ours = stores
    for tracker, refusal in ((theirs, Exception), (ours, TrackingRefused)):
        tracker.use_experiment("bertflow", artifact_root="/tmp/unused-artifacts")
        run = tracker.start_run("r")
        tracker.log_params(run, {"a": 1})
        with pytest.raises(refusal, match="Changing param values is not allowed"):
            tracker.log_params(run, {"a": 2})
        with pytest.raises(refusal, match="not found"):
            tracker.log_metrics("0" * 32, {"x": 1.0})
        tracker.end_run("0" * 32, quiet=True)  # quiet: logged, not raised


def test_a_new_store_is_the_one_mlflow_makes(stores):
    """The copy of the cached template with MLflow's default experiment: what MLflow's client
    leaves on a new file (its default experiment's artifacts under ./mlruns of the process)."""
    theirs, ours = stores  # both made in this directory
    theirs.client.search_experiments()  # MLflow makes its store on first use
    a, b = _dump(theirs.uri[10:]), _dump(ours.uri[10:])
    assert a == b
    assert b[1]["experiments"] == [(0, "Default", os.path.abspath("mlruns/0"), "active", "default")]


def test_other_stores_get_mlflows_client(tmp_path, monkeypatch):
    monkeypatch.setattr(tracker_sqlite, "_USABLE", {})
    mlflow_store.prepare_store(f"sqlite:///{tmp_path}/warm/mlflow.db")
    changed = tmp_path / "changed" / "mlflow.db"
    mlflow_store.prepare_store(f"sqlite:///{changed}")
    with sqlite3.connect(changed) as db:
        db.execute("alter table runs add column extra text")  # another MLflow's layout
    assert type(open_tracker(f"sqlite:///{changed}")) is Tracker
    assert type(open_tracker(f"sqlite:///{tmp_path}/fine/mlflow.db")) is SqliteTracker
    monkeypatch.setenv(tracker_sqlite.ENV_MLFLOW_CLIENT, "1")
    assert type(open_tracker(f"sqlite:///{tmp_path}/fine/mlflow.db")) is Tracker
    assert not tracker_sqlite.without_mlflow(f"sqlite:///{tmp_path}/fine/mlflow.db")
    monkeypatch.delenv(tracker_sqlite.ENV_MLFLOW_CLIENT)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))  # no template: MLflow makes the store
    assert not tracker_sqlite.without_mlflow(f"sqlite:///{tmp_path}/new/mlflow.db")
    assert type(open_tracker(f"sqlite:///{tmp_path}/new/mlflow.db")) is Tracker
    assert not os.path.exists(tmp_path / "new" / "mlflow.db.template")


@pytest.mark.parametrize(
    "url", ["/data/x", "data/x", "file:///data/x", "gs://b/x", "s3://b/x", "hdfs://n/x", "http://h/x", "https://h/x"]
)
def test_dataset_sources_are_the_ones_mlflow_resolves(url):
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = resolve_dataset_source(url)
    assert tracker_sqlite.dataset_source(url) == (source._get_source_type(), source.to_json())
    assert tracker_sqlite.dataset_source("weird://x") is None and tracker_sqlite.dataset_source("file://h/x") is None


def test_a_stage_command_records_its_runs_without_importing_mlflow(tmp_path):
    """``bertflow stage corpus`` on a new root: its runs in the store, and no process of the
    command imported MLflow (Python's import log of every process, the worker's included)."""
    import re
    import subprocess
    import sys

    mlflow_store.prepare_store(f"sqlite:///{tmp_path}/warm/mlflow.db")  # the cached template exists
    root = tmp_path / "root"
    # the root's own store and Prefect's temporary server: an earlier test's ``mlflow.set_tracking_uri``
    # sets MLFLOW_TRACKING_URI in this process
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1", "MLFLOW_TRACKING_URI": ""}
    for name in (tracker_sqlite.ENV_MLFLOW_CLIENT, "PREFECT_API_URL"):
        env.pop(name, None)
    argv = [sys.executable, "-m", "flows.cli", "stage", "corpus", "--preset", "tiny", "--root", str(root)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    imported = set(re.findall(r"^import time:.*\|\s*([\w.]+)\s*$", out.stderr, re.M))
    assert {"prefect", "apache_beam", "flows.tracker_sqlite"} <= imported  # the worker's imports are in the log
    assert not {m for m in imported if m == "mlflow" or m.startswith("mlflow.")}
    with sqlite3.connect(root / "mlflow.db") as db:
        runs = dict(db.execute("select name, status from runs"))
        tags = dict(
            db.execute("select t.key, t.value from tags t join runs r using (run_uuid) where r.name = 'corpus'")
        )
    assert runs == {"stage-corpus": "FINISHED", "corpus": "FINISHED"} and tags["bertflow.status"] == "done"
    assert os.path.exists(root / "mlartifacts")


def test_a_busy_store_is_waited_for_and_said_so(stores, monkeypatch, caplog):
    """Another process holds the store exclusively for 3 s: the write waits (SQLite's own wait cut
    to 0.2 s here, then the warning and a retry, as MLflow's client does) and lands after it."""
    import subprocess
    import sys
    import time

    _, ours = stores
    ours.use_experiment("bertflow", artifact_root="/tmp/unused-artifacts")
    run = ours.start_run("r")
    monkeypatch.setattr(tracker_sqlite, "SQLITE_BUSY_SECONDS", 0.2)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
         "c.execute('begin exclusive'); print('held', flush=True); time.sleep(3); c.execute('commit')",
         ours.path], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    start = time.monotonic()
    with caplog.at_level("WARNING", logger="bertflow.flow"):
        ours.log_params(run, {"a": 1})
    assert holder.wait(timeout=30) == 0 and time.monotonic() - start > 2
    assert any("MLflow store busy" in r.getMessage() and "log_params" in r.getMessage() for r in caplog.records)
    assert ours.client.get_run(run).data.params == {"a": "1"}


def test_a_url_kind_not_known_here_is_logged_through_mlflow(stores):
    """A dataset URL of a kind ``dataset_source`` does not know goes to MLflow's own registry,
    through MLflow's client made then, on the same store: what MLflow records for it, or nothing
    where MLflow has no source for it either (as before)."""
    _, ours = stores
    ours.use_experiment("bertflow", artifact_root="/tmp/unused-artifacts")
    run = ours.start_run("r")
    assert ours._mlflow is None
    ours.log_datasets(run, {"wiki": "/data/wiki", "odd": "weird://x/y"}, {"wiki": "w" * 40})
    assert ours._mlflow is not None  # MLflow's client, made for it
    got = ours.client.get_run(run).inputs.dataset_inputs
    assert [(d.dataset.name, d.dataset.source_type) for d in got] == [("wiki", "local")]
