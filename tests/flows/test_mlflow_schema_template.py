"""A new root's MLflow store is copied from a cached empty database instead of being migrated
(``flows.mlflow_store.prepare_store``): MLflow's ~70 migrations
cost 1.4 CPU-s on every new root. The copy must be the database MLflow itself would have made,
the template made once, and a template at another revision or a cache that cannot be written
must fall back to making it again or to migrating."""

import sqlite3

import pytest

from flows import mlflow_store, tracking


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(mlflow_store, "_PREPARED", set())
    return tmp_path / "cache"


def _clauses(sql: str | None) -> list[str]:
    """A ``CREATE`` statement's clauses, sorted: MLflow's migrations write a table's constraints
    in an order that varies from one migration to the next within a process (seen: the ``runs``
    table's two named CHECKs swapped), the same clauses."""
    return sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())


def _dump(path) -> tuple[list, dict]:
    """The database's schema (each statement's clauses) and every row, the default experiment's
    two timestamps left out."""
    db = sqlite3.connect(path)
    schema = sorted(
        (t, n, tbl, _clauses(sql))
        for t, n, tbl, sql in db.execute("select type, name, tbl_name, sql from sqlite_master")
    )
    rows = {}
    for (table,) in db.execute("select name from sqlite_master where type = 'table'"):
        got = db.execute(f"select * from {table}").fetchall()
        if table == "experiments":
            names = [d[0] for d in db.execute("select * from experiments").description]
            got = [tuple(v for n, v in zip(names, r) if n not in ("creation_time", "last_update_time")) for r in got]
        rows[table] = got
    db.close()
    return schema, rows


def test_a_store_from_the_template_is_the_one_mlflow_migrates(cache, tmp_path, monkeypatch):
    import mlflow.store.db.utils as db_utils

    migrations = []
    real = db_utils._initialize_tables
    monkeypatch.setattr(db_utils, "_initialize_tables", lambda engine: (migrations.append(engine), real(engine)))

    copied = tmp_path / "a" / "mlflow.db"
    tracking.prepare_store(f"sqlite:///{copied}")
    template = mlflow_store.schema_template()
    assert template.startswith(str(cache / "bertflow" / "mlflow-schema")) and len(migrations) == 1
    tracking.prepare_store(f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}")
    assert len(migrations) == 1  # the second new store: a copy, no migration

    monkeypatch.setattr(mlflow_store, "copy_schema", lambda path: None)  # MLflow's own creation
    migrated = tmp_path / "ref" / "mlflow.db"
    tracking.prepare_store(f"sqlite:///{migrated}")
    assert len(migrations) == 2
    got, want = _dump(copied), _dump(migrated)
    assert got[0] == want[0], {g[1] for g, w in zip(got[0], want[0]) if g != w}
    assert got[1] == want[1], {t: (got[1][t], want[1].get(t)) for t in got[1] if got[1][t] != want[1].get(t)}
    assert len(want[0]) > 100
    assert {t for t, r in want[1].items() if r} >= {"alembic_version", "experiments"}

    # and MLflow works on it: a run and a registered model
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = client.create_run(client.create_experiment("x", artifact_location=str(tmp_path / "art")))
    client.log_metric(run.info.run_id, "m", 1.0)
    client.create_registered_model("model")
    assert client.get_run(run.info.run_id).data.metrics == {"m": 1.0}


def test_a_template_not_at_mlflows_head_is_made_again(cache, tmp_path, caplog):
    tracking.prepare_store(f"sqlite:///{tmp_path / 'first' / 'mlflow.db'}")
    template = mlflow_store.schema_template()
    with sqlite3.connect(template) as db:  # another revision than this MLflow's head
        db.execute("update alembic_version set version_num = 'abcdef123456'")
    store = tmp_path / "second" / "mlflow.db"
    tracking.prepare_store(f"sqlite:///{store}")
    assert "is not at this MLflow's head revision: made again" in caplog.text
    head = mlflow_store._head_revision()
    assert mlflow_store.revision(str(store)) == mlflow_store.revision(template) == head != "abcdef123456"


def test_a_cache_that_cannot_be_written_falls_back_to_migrating(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # makedirs under a file: OSError
    monkeypatch.setattr(mlflow_store, "_PREPARED", set())
    store = tmp_path / "root" / "mlflow.db"
    tracking.prepare_store(f"sqlite:///{store}")
    assert _dump(store)[1]["alembic_version"]
