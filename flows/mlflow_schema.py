"""A new SQLite store of MLflow's, copied from a cached empty database instead of migrated.

MLflow creates a new SQLite store by running its migrations (~70 in MLflow 3.17), and every new
root has a new store (``<root>/mlflow.db``): 1.38 CPU-seconds each, measured (a fresh
``MlflowClient(...).search_experiments()`` after the imports; 0.02 on an existing file), in a
stage command whose fixed cost is ~3 CPU-s with a Prefect server. :func:`copy_schema` copies
:func:`schema_template`, an empty database that MLflow's own ``_initialize_tables`` made once per
MLflow version, checked against MLflow's head revision before each copy. The client that opens
the copy finds its tables current and adds the default experiment, as it does after migrating
(``tests/flows/test_mlflow_schema_template.py`` compares the two). ``flows.tracking.prepare_store``
calls it under its lock on the new store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3

log = logging.getLogger("bertflow.flow")

LOCK_WAIT_S = 180.0
"""How long a run waits for another one making the template."""


def schema_template() -> str:
    """The cached empty MLflow database of this MLflow (its tables at the last migration, no
    rows but alembic's revision): ``$XDG_CACHE_HOME/bertflow`` (``~/.cache/bertflow``), named by
    MLflow's version and a digest of its migration scripts' names."""
    import hashlib

    import mlflow
    import mlflow.store.db_migrations as migrations

    folder = os.path.join(os.path.dirname(migrations.__file__), "versions")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".py"))
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "bertflow", "mlflow-schema", f"mlflow-{mlflow.__version__}-{digest}.db")


def copy_schema(path: str) -> bool:
    """A new store's file (``path``, which must not exist) copied from :func:`schema_template`,
    made first if missing and made again if it is not at this MLflow's head revision; milliseconds
    against the migrations' 1.4 CPU-s. False (the caller's client migrates as before) where the
    cache cannot be written."""
    import shutil

    template = schema_template()
    try:
        if os.path.exists(template) and _revision(template) != _head_revision():
            log.warning("MLflow schema template %s is not at this MLflow's head revision: made again", template)
            os.remove(template)
        if not os.path.exists(template):
            _make_schema_template(template)
        tmp = f"{path}.template-{os.getpid()}"
        shutil.copyfile(template, tmp)
        os.replace(tmp, path)
        return True
    except OSError as exc:
        log.debug("no MLflow schema template (%s): the store is created by migration", exc)
        return False


def _head_revision() -> str:
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()  # MLflow's own check of a store (its _verify_schema); 15 ms


def _revision(db_path: str) -> str | None:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
            row = db.execute("select version_num from alembic_version").fetchone()
        return row[0] if row else None
    except sqlite3.Error:
        return None


def _make_schema_template(template: str) -> None:
    """MLflow's own table creation and migrations (``_initialize_tables``) on a new file, published
    whole (``os.replace``) under a lock beside it, so concurrent runs make it once."""
    from mlflow.store.db.utils import _initialize_tables
    from sqlalchemy import create_engine

    from flows.filelock import exclusive

    os.makedirs(os.path.dirname(template), exist_ok=True)
    with exclusive(template + ".lock", LOCK_WAIT_S, f"MLflow schema template {template} stayed locked"):
        if os.path.exists(template):
            return
        tmp = f"{template}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            os.remove(tmp)
        engine = create_engine(f"sqlite:///{tmp}")
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()
        os.replace(tmp, template)
