"""The registry as an outcome: one version per export whatever happened in between, scored on one
scale; a store that is busy, a root with quotes in its path, a root copied elsewhere."""

import os
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

from flows import model_registry as registry
from flows.calls import StageResult
from flows.tracking import Tracker, relocate_store


@pytest.fixture
def tracker(tmp_path):
    t = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    t.use_experiment("bertflow", artifact_root=str(tmp_path / "mlartifacts"))
    return t


def test_champion_moves_only_to_a_better_score(tracker):
    run = tracker.start_run("pretrain-tiny")
    tracker.client.create_registered_model("bert-x")
    versions = [
        str(tracker.client.create_model_version("bert-x", f"file:///m{i}", run_id=run).version) for i in range(4)
    ]
    assert registry.set_alias_by_score(tracker, "bert-x", versions[0], 70.0) == "champion"
    assert registry.set_alias_by_score(tracker, "bert-x", versions[1], 65.0) == "challenger"
    assert registry.set_alias_by_score(tracker, "bert-x", versions[2], 80.0) == "champion"
    assert registry.set_alias_by_score(tracker, "bert-x", versions[3], None) == "challenger"
    assert registry.set_alias_by_score(tracker, "bert-x", versions[2], 80.0) == "champion"  # stays
    aliases = {
        a: str(tracker.client.get_model_version_by_alias("bert-x", a).version) for a in ("champion", "challenger")
    }
    assert aliases == {"champion": versions[2], "challenger": versions[3]}


def _downstream(task, metric, value, dev_median):
    return task, StageResult(f"finetune/{task}", "done", 1.0, "/r", {metric: value, "dev_median": dev_median})


def test_the_score_is_in_percent_for_fraction_and_percent_metrics():
    """SST-2 counts accuracy as a fraction, SQuAD F1 in percent: the score used to average 0.7725
    with 26.66; every task now enters in percent (its aggregate's ``dev_median``)."""
    results = [
        _downstream("sst2", "eval_accuracy", 0.7725, 77.25),  # fraction-scale metric
        _downstream("squad1", "eval_f1", 26.66, 26.66),  # percent-scale metric
        _downstream("cola", "eval_mcc", 0.30, 30.0),
        _downstream("wnli", "eval_accuracy", 0.56, 56.0),  # not in the paper's GLUE average
    ]
    scores = registry.task_scores(results)
    assert [(s.task, s.percent) for s in scores] == [("sst2", 77.25), ("squad1", 26.66), ("cola", 30.0), ("wnli", 56.0)]
    score, glue = registry.model_score(scores)
    assert score == pytest.approx((77.25 + 26.66 + 30.0 + 56.0) / 4)
    assert glue == pytest.approx((77.25 + 30.0) / 2)
    text = registry.describe(scores, score, glue)
    assert "in percent" in text and "but WNLI" in text and "sst2 accuracy 77.25" in text
    assert registry.model_score([]) == (None, None)


def test_a_busy_store_is_waited_for_not_failed(tmp_path, caplog):
    """Another process holds the SQLite file exclusively for longer than SQLite's own busy
    timeout (MLflow sets 20 s; the failure was a 60 s lock): the calls wait and retry instead of
    failing (and leaving the run RUNNING). SQLite's wait is injected as 1 s and the lock held 3 s
    (it was the real 20 s and 24 s)."""
    busy, held = 1.0, 3.0
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", sqlite_busy_seconds=busy)
    tracker.use_experiment("bertflow", artifact_root=str(tmp_path / "mlartifacts"))
    caplog.set_level("WARNING", logger="bertflow")
    run = tracker.start_run("export")
    db = str(tmp_path / "mlflow.db")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
         f"c.execute('begin exclusive'); print('locked', flush=True); time.sleep({held}); c.execute('commit')", db],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "locked"
    started = time.monotonic()
    tracker.log_metrics(run, {"x": 1.0})
    tracker.end_run(run, True)
    holder.wait(timeout=30)
    print(f"waited {time.monotonic() - started:.1f} s")
    assert time.monotonic() - started > busy  # it did meet the lock, past SQLite's own wait
    assert tracker.client.get_run(run).info.status == "FINISHED"
    assert tracker.client.get_metric_history(run, "x")[0].value == 1.0
    assert any("busy" in r.getMessage() for r in caplog.records)


def test_sqlite_waits_mlflows_20_seconds_unless_told(tmp_path):
    """The injected wait is SQLite's own ``busy_timeout`` of every session: the default leaves
    MLflow's 20 s, ``sqlite_busy_seconds`` replaces it."""
    import sqlalchemy

    from flows import tracking

    seen = []
    for busy in (None, 0.2):  # one store: a second client of it skips the migrations
        store = Tracker(f"sqlite:///{tmp_path}/mlflow.db", sqlite_busy_seconds=busy).client._tracking_client.store
        with store.ManagedSessionMaker() as session:
            seen.append(session.execute(sqlalchemy.text("PRAGMA busy_timeout")).scalar())
    assert seen == [int(tracking.SQLITE_BUSY_SECONDS * 1000), 200]


@pytest.mark.parametrize("name", ["it's", 'say "hi"', "back\\slash", "both'\""])
def test_runs_of_a_root_are_found_whatever_its_path_holds(tracker, tmp_path, name):
    root = str(tmp_path / name)
    stuck = tracker.start_run("corpus", tags={"bertflow.root": root})
    other = tracker.start_run("corpus", tags={"bertflow.root": root + "x"})
    assert tracker.mark_killed_runs(root) == [stuck]
    assert tracker.client.get_run(stuck).info.status == "KILLED"
    assert tracker.client.get_run(other).info.status == "RUNNING"


def test_relocating_a_store_rewrites_locations_and_root_tags_only(tracker, tmp_path):
    run = tracker.start_run("corpus", tags={"bertflow.root": str(tmp_path), "bertflow.url": f"{tmp_path}/corpus"})
    tracker.set_tags(run, {"note": "/elsewhere/x"})
    db = str(tmp_path / "mlflow.db")
    n = relocate_store(db, str(tmp_path), "/new/place")
    assert n >= 4
    info = tracker.client.get_run(run)
    assert info.info.artifact_uri.startswith("file:///new/place/mlartifacts/")
    assert info.data.tags["bertflow.root"] == "/new/place" and info.data.tags["bertflow.url"] == "/new/place/corpus"
    assert info.data.tags["note"] == "/elsewhere/x"
    with sqlite3.connect(db) as c:
        assert c.execute("select artifact_location from experiments where name='bertflow'").fetchone()[0] == (
            "file:///new/place/mlartifacts"
        )


# -- on a copy of the tiny chain's root ----------------------------------------------------------------
@pytest.fixture
def moved_root(chain, tmp_path):
    """The tiny chain's root copied to A, A copied to B, A removed: B's store still names A."""
    first = tmp_path / "A"
    shutil.copytree(chain[0], first, ignore=shutil.ignore_patterns(".bertflow.lock"))
    moved = tmp_path / "B"
    shutil.copytree(first, moved)
    shutil.rmtree(first)
    return first, moved


def test_a_moved_root_loads_its_model_and_shows_its_runs(moved_root, chain_overrides):
    import mlflow
    import pandas as pd

    from flows.overrides import parse_overrides
    from flows.presets import load_config
    from flows.status import collect_status
    from flows.tracking import default_tracking_uri, follow_moved_root

    old, root = moved_root
    uri = default_tracking_uri(str(root))
    cfg = load_config("tiny", parse_overrides(chain_overrides))
    rows = collect_status(cfg, str(root))
    assert all(r["mlflow_run"] for r in rows)  # the root's own store: its runs, wherever it was recorded
    follow_moved_root(str(root), uri)  # what a run on the moved root does first
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    model = mlflow.pyfunc.load_model("models:/bert-tiny@champion")
    assert len(model.predict(pd.DataFrame({"text": ["the [MASK] of the river"]}))["filled"][0]) == 1
    with sqlite3.connect(str(root / "mlflow.db")) as c:
        uris = [u for (u,) in c.execute("select artifact_uri from runs")]
    assert uris and all(u.startswith(f"file://{root}/") for u in uris) and not any(str(old) in u for u in uris)


def test_each_export_is_registered_once_and_a_new_one_always(moved_root, chain_overrides, tmp_path):
    """What a run killed between export and registration leaves: an export no version holds. The
    next registration (any run that reaches the export, done or skipped) registers it."""
    import safetensors.torch

    from flows.overrides import parse_overrides
    from flows.prefect_tasks import Tracking, register_model_task
    from flows.presets import load_config
    from flows.tracking import default_tracking_uri, follow_moved_root
    from pipeline.schema.manifest import read_manifest, write_manifest

    _, root = moved_root
    uri = default_tracking_uri(str(root))
    follow_moved_root(str(root), uri)
    cfg = load_config("tiny", parse_overrides(chain_overrides))
    t = Tracker(uri)
    t.use_experiment("bertflow")
    tracking = Tracking(uri, t.experiment_id, t.start_run("pretrain-tiny"))
    model_url = str(root / "model")
    before = read_manifest(model_url)
    versions = lambda: sorted(int(v.version) for v in t.client.search_model_versions("name='bert-tiny'"))
    assert versions() == [1]  # the chain's three commands made one version of one export
    result = StageResult("export", "skipped", 0.0, model_url, before.counts, before)
    out = register_model_task.fn(cfg, result, [], tracking)
    assert out["new"] is False and versions() == [1]
    # a new export (other weights): a new version, whatever the export stage's status
    weights = safetensors.torch.load_file(str(root / "model" / "model.safetensors"))
    first = sorted(weights)[0]
    weights[first] = weights[first] + 1.0
    safetensors.torch.save_file(weights, str(root / "model" / "model.safetensors"), metadata={"format": "pt"})
    after = write_manifest("export", model_url, before.config, before.inputs, before.counts)
    assert after.fingerprint != before.fingerprint
    result = StageResult("export", "skipped", 0.0, model_url, after.counts, after)
    out = register_model_task.fn(cfg, result, [], tracking)
    assert out["new"] is True and out["version"] == "2" and versions() == [1, 2]
    assert str(registry.find_version(t, "bert-tiny", after.fingerprint).version) == "2"
    assert str(registry.find_version(t, "bert-tiny", before.fingerprint).version) == "1"
    assert register_model_task.fn(cfg, result, [], tracking)["new"] is False and versions() == [1, 2]
    assert os.path.exists(tmp_path / "B")
    # the same export in another root on this store: that root's own version, with its own lineage
    other = tmp_path / "other"
    shutil.copytree(root, other, ignore=shutil.ignore_patterns("mlflow.db*", "mlartifacts"))
    copy = read_manifest(str(other / "model"))
    assert copy.fingerprint == after.fingerprint  # byte-identical: the manifests name no folder
    result = StageResult("export", "skipped", 0.0, str(other / "model"), copy.counts, copy)
    out = register_model_task.fn(cfg, result, [], tracking)
    assert out["new"] is True and out["version"] == "3" and versions() == [1, 2, 3]
    tags = t.client.get_model_version("bert-tiny", "3").tags
    assert tags[registry.TAG_MODEL_URL] == str(other / "model") and tags["lineage.vocab.url"] == str(other / "vocab")
    assert str(registry.find_version(t, "bert-tiny", after.fingerprint, model_url).version) == "2"


def test_ending_a_run_in_a_finally_never_hides_the_error_on_its_way_out(tracker, caplog):
    """A full disk used to surface as MLflow's "database or disk is full" raised by the stage's
    ``finally``: with ``quiet`` the failure to end the run is logged and the first error stays."""
    caplog.set_level("WARNING", logger="bertflow")
    lost = "0" * 32  # a run the store cannot end (as when its disk is full)
    with pytest.raises(OSError, match="No space left on device"):
        try:
            raise OSError(28, "No space left on device")
        finally:
            tracker.end_run(lost, ok=False, quiet=True)
    assert any("could not be marked FAILED" in r.getMessage() for r in caplog.records)
    with pytest.raises(Exception, match=lost):
        tracker.end_run(lost, ok=False)  # not quiet: the store's error is raised
