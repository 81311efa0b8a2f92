"""Commands that only look import only what looking needs: ``--help``, config errors, refusals and
``status`` load neither torch, Beam, Prefect nor MLflow (each costs seconds of CPU and hundreds of
MB; ``benchmarks/bench_commands.py`` measures what is left). Checked in a fresh interpreter, by
the modules it holds when the command returns: behaviour, not timing."""

import json
import os
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "args, code",
    [
        (["--help"], 0),
        (["run", "--help"], 0),
        (["config", "--set", "nope=1"], 2),  # a config error
        (["run", "--preset", "tinyy"], 2),  # a refusal by the parser
        (["status", "--set", "pretrain.learning_rate=-1"], 2),
        (["inspect", "/no/such/folder"], 2),
    ],
)
def test_help_config_errors_and_refusals_import_no_library(args, code, run_command):
    got, loaded, _, err = run_command(args)
    assert got == code, err[-2000:]
    assert loaded == [], f"bertflow {' '.join(args)} imported {loaded}"


def test_config_help_still_lists_every_field_built_only_when_asked(run_command):
    code, loaded, out, _ = run_command(["config", "--help"])
    assert code == 0 and "pretrain.learning_rate (float, default 0.0001)" in out
    assert loaded == []


def _store_with_runs(uri: str, root: str, artifacts: Path) -> dict[str, str]:
    """A store MLflow itself wrote: per stage, an older and a newer run of ``root``, a newer
    run of the same stage that was deleted, and a run of another root. Returns what status must
    show: stage -> "id (status)" of the newest active run."""
    import time

    from flows.tracking import Tracker

    tracker = Tracker(uri)
    tracker.use_experiment("bertflow", artifact_root=str(artifacts))
    want = {}
    for stage in ("corpus", "vocab"):
        old = tracker.start_run(stage, tags={"bertflow.stage": stage, "bertflow.root": root})
        tracker.end_run(old, True)
        time.sleep(0.01)  # start times in milliseconds: the newer run is newer
        new = tracker.start_run(stage, tags={"bertflow.stage": stage, "bertflow.root": root})
        tracker.end_run(new, ok=stage == "corpus")
        want[stage] = f"{new} ({'finished' if stage == 'corpus' else 'failed'})"
        time.sleep(0.01)
        gone = tracker.start_run(stage, tags={"bertflow.stage": stage, "bertflow.root": root})
        tracker.client.delete_run(gone)
    other = tracker.start_run("examples", tags={"bertflow.stage": "examples", "bertflow.root": root + "-other"})
    tracker.end_run(other, True)
    return want


def test_status_shows_each_stages_latest_run_without_importing_mlflow(tmp_path, run_command):
    """A shared store named by MLFLOW_TRACKING_URI: the runs tagged with this root; the root's own
    store (``<root>/mlflow.db``): every run in it. Deleted runs never count, as in MLflow's
    search; the store is read with sqlite3."""
    root = tmp_path / "root"
    root.mkdir()
    uri = f"sqlite:///{tmp_path}/shared.db"
    want = _store_with_runs(uri, str(root), tmp_path / "artifacts")
    code, loaded, out, err = run_command(["status", "--root", str(root), "--json"], {"MLFLOW_TRACKING_URI": uri})
    assert code == 3, err[-2000:]
    runs = {r["stage"]: r["mlflow_run"] for r in json.loads(out)}
    assert {s: r for s, r in runs.items() if r} == want  # the other root's examples run is not this root's
    assert not {"torch", "apache_beam", "prefect", "mlflow"} & set(loaded), loaded

    own = tmp_path / "own"
    own.mkdir()
    want = _store_with_runs(f"sqlite:///{own}/mlflow.db", str(tmp_path / "elsewhere"), own / "mlartifacts")
    env = {k: "" for k in ("MLFLOW_TRACKING_URI",) if k in os.environ}
    code, loaded, out, err = run_command(["status", "--root", str(own), "--json"], env)
    runs = {r["stage"]: r["mlflow_run"] for r in json.loads(out)}
    assert {s: r for s, r in runs.items() if r} == {**want, "examples": runs["examples"]}  # every run of its own store
    assert runs["examples"].endswith(" (finished)")
    assert not {"torch", "apache_beam", "prefect", "mlflow"} & set(loaded), loaded


def test_status_of_a_missing_store_creates_none(tmp_path, run_command):
    root = tmp_path / "root"
    root.mkdir()
    db = tmp_path / "nobody.db"
    code, _, out, _ = run_command(["status", "--root", str(root), "--json"], {"MLFLOW_TRACKING_URI": f"sqlite:///{db}"})
    assert code == 3 and {r["mlflow_run"] for r in json.loads(out)} == {""}
    assert not db.exists()
