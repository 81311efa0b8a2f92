"""The registry as an outcome, through the real CLI: a run killed between the export and its
registration, and a tracking store locked for a minute while the export logs.

Before: the killed run's new export was never registered (the next run skipped the export and
registered only when the export stage had run), and the locked store failed the export's logging,
left its MLflow run RUNNING, and the retry skipped the export, so nothing was registered either.
Slow tier: ``python3 -m pytest -m slow tests/flows/test_model_registry_slow.py``.
"""

import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from flows.proc.supervisor import kill_tree, processes, tree
from pipeline.schema.manifest import read_manifest

pytestmark = pytest.mark.slow
OTHER_WEIGHTS = "pretrain.learning_rate=9e-4"  # not one of the chain's overrides (theirs come last)


def _copy(chain, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(chain[0], root, ignore=shutil.ignore_patterns(".bertflow.lock"))
    return root


def _versions(root):
    with sqlite3.connect(root / "mlflow.db") as db:
        return sorted(
            (int(v), fp)
            for v, fp in db.execute(
                "select v.version, t.value from model_versions v join model_version_tags t "
                "on t.name = v.name and t.version = v.version where t.key = 'bertflow.export_fingerprint'"
            )
        )


def _running(root):
    with sqlite3.connect(root / "mlflow.db") as db:
        return db.execute("select count(*) from runs where status = 'RUNNING'").fetchone()[0]


def _wait_for(predicate, proc, timeout=900):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, proc.stdout.read()[-3000:] if proc.stdout else proc.returncode
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _wait_for_exit(pids, timeout=30):
    """Until none of ``pids`` is alive (a SIGKILLed process is gone once its parent reaps it)."""
    deadline = time.monotonic() + timeout
    while set(pids) & set(processes()):
        assert time.monotonic() < deadline, f"still alive: {set(pids) & set(processes())}"
        time.sleep(0.05)


def test_a_run_killed_after_the_export_is_registered_by_the_next(chain, cli, cli_env, tmp_path):
    root = _copy(chain, tmp_path)
    assert [v for v, _ in _versions(root)] == [1]
    args = ["--set", OTHER_WEIGHTS]
    out = subprocess.run(cli(["stage", "pretrain", "--preset", "tiny", *args], root), env=cli_env,
                         capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    manifest = root / "model" / "_manifest.json"
    before = manifest.stat().st_mtime_ns
    proc = subprocess.Popen(cli(["stage", "export", "--preset", "tiny", *args], root), env=cli_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip

    def stamped() -> bool:  # the export's manifest rewritten, with its code version: the stage is done
        try:
            return manifest.stat().st_mtime_ns != before and bool(json.loads(manifest.read_text())["code_version"])
        except (OSError, ValueError, KeyError):
            return False

    _wait_for(stamped, proc)
    tree_before = tree(proc.pid)
    # The export is written, its registration not yet: SIGKILL the whole run at once, as a lost
    # machine or a cgroup's OOM kill would: the supervisor, its worker (a session of its own,
    # which a SIGKILL of the supervisor alone would only ask to stop) and every process below.
    kill_tree(proc.pid, signal.SIGKILL)
    proc.wait()
    _wait_for_exit(tree_before)
    new = read_manifest(str(root / "model")).fingerprint
    assert [fp for _, fp in _versions(root)] != [new] and new not in dict(_versions(root)).values()
    rerun = subprocess.run(cli(["run", "--preset", "tiny", *args], root), env=cli_env, capture_output=True,
                           text=True, timeout=1200)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    assert "stage export: up to date, skipped" in rerun.stderr
    assert new in dict(_versions(root)).values()  # registered although the export did not run
    assert _running(root) == 0  # the killed run's MLflow runs were closed (KILLED)


def test_a_store_locked_during_the_export_is_waited_for(chain, cli, cli_env, tmp_path):
    root = _copy(chain, tmp_path)
    args = ["--set", "pretrain.learning_rate=8e-4"]
    out = subprocess.run(cli(["stage", "pretrain", "--preset", "tiny", *args], root), env=cli_env,
                         capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    proc = subprocess.Popen(cli(["stage", "export", "--preset", "tiny", *args], root), env=cli_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    lines = []
    for line in proc.stderr:  # hold the store from the moment the export starts, for a minute
        lines.append(line)
        if "stage export: running" in line:
            break
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
         "c.execute('begin exclusive'); time.sleep(60); c.execute('commit')", str(root / "mlflow.db")],
    )  # fmt: skip
    rest = proc.stderr.read()
    code = proc.wait(timeout=1200)
    holder.wait(timeout=120)
    assert code == 0, "".join(lines)[-2000:] + rest[-4000:]
    assert "MLflow store busy" in rest
    assert read_manifest(str(root / "model")).fingerprint in dict(_versions(root)).values()
    assert _running(root) == 0
