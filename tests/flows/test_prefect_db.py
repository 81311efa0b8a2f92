"""Prefect's temporary-server database is migrated once, under a lock, before a run's flow starts
(``flows/prefect_db.py``): runs started together on a new ``PREFECT_HOME`` raced in alembic."""

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flows.prefect_db as prefect_db

ROOT = Path(__file__).resolve().parents[2]

RUN = """
import sys
if sys.argv[1] == "prepared":
    from flows.prefect_db import prepare_prefect_database
    print("prepared", prepare_prefect_database())
from prefect import flow

@flow
def hello():
    return 1

print("result", hello())
"""


def _start_together(home: Path, how: str, n: int = 3) -> list[tuple[int, str]]:
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "PYTHONPATH": str(ROOT)}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    procs = [subprocess.Popen([sys.executable, "-c", RUN, how], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(n)]  # fmt: skip
    return [(p.wait(timeout=900), p.stdout.read()) for p in procs]


@pytest.mark.slow
@pytest.mark.ci
def test_runs_started_together_on_a_new_prefect_home_migrate_once(tmp_path):
    runs = _start_together(tmp_path / "home", "prepared")
    for code, out in runs:
        assert code == 0 and "result 1" in out, out[-3000:]
        assert "alembic" not in out and "OperationalError" not in out, out[-3000:]  # unprepared: "already exists"
        assert f"prepared {tmp_path / 'home' / 'prefect.db'}" in out
    assert (tmp_path / "home" / "prefect.db.lock").exists()


def test_a_run_waits_for_anothers_migration_and_names_the_lock(tmp_path, monkeypatch):
    db = tmp_path / "prefect.db"
    monkeypatch.setattr(prefect_db, "prefect_sqlite_path", lambda: str(db))
    with open(f"{db}.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another run is migrating it
        with pytest.raises(TimeoutError, match=r"prefect\.db stayed locked for 0 s by another run .*prefect\.db\.lock"):
            prefect_db.prepare_prefect_database(wait_s=0.3)


def test_a_prefect_server_or_another_database_is_left_to_itself():
    probe = "from flows.prefect_db import prefect_sqlite_path; print(prefect_sqlite_path())"
    base = {**os.environ, "PYTHONPATH": str(ROOT)}
    base.pop("PREFECT_API_URL", None)
    cases = {
        "server": ({"PREFECT_API_URL": "http://127.0.0.1:4200/api"}, "None"),
        "postgres": ({"PREFECT_API_DATABASE_CONNECTION_URL": "postgresql+asyncpg://u:p@db/prefect"}, "None"),
        "home": ({"PREFECT_HOME": "/tmp/somewhere"}, "/tmp/somewhere/prefect.db"),
    }
    for name, (env, expected) in cases.items():
        out = subprocess.run([sys.executable, "-c", probe], env={**base, **env}, capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip() == expected, (name, out.stdout, out.stderr[-2000:])


def test_the_mlflow_store_is_prepared_under_the_same_kind_of_lock(tmp_path):
    from flows.tracking import prepare_store

    db = tmp_path / "team" / "mlflow.db"
    db.parent.mkdir()
    with open(f"{db}.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another run is creating the store
        with pytest.raises(TimeoutError, match=r"MLflow store .*mlflow\.db: another process has held .*\.lock for 0 s"):
            prepare_store(f"sqlite:///{db}", seconds=0.3)
    assert not db.exists()  # nothing created while another held the lock
    prepare_store(f"sqlite:///{db}", seconds=5)  # released: created and migrated
    assert db.stat().st_size > 0
