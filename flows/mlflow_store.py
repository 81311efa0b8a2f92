"""MLflow's SQLite stores: where one's file is, and a new one created under a lock, copied from a
cached empty database instead of migrated.

MLflow creates a new SQLite store by running its migrations (~70 in MLflow 3.17), and every new
root has a new store (``<root>/mlflow.db``): 1.38 CPU-seconds each, measured (a fresh
``MlflowClient(...).search_experiments()`` after the imports; 0.02 on an existing file), in a
stage command whose fixed cost is ~3 CPU-s with a Prefect server. :func:`copy_schema` copies
:func:`schema_template`, an empty database that MLflow's own ``_initialize_tables`` made once per
MLflow version, checked against MLflow's head revision before each copy. The client that opens
the copy finds its tables current and adds the default experiment, as it does after migrating
(``tests/flows/test_mlflow_schema_template.py`` compares the two). :func:`prepare_store` calls it
under its lock on the new store (``flows.tracking``'s design choice 6).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3

log = logging.getLogger("bertflow.flow")

BUSY_SECONDS = 180.0
"""How long a run waits for a store another process holds (its lock here, a busy database in
``flows.tracking``'s retries), and for another run making the template."""


def schema_template() -> str:
    """The cached empty MLflow database of this MLflow (its tables at the last migration, no
    rows but alembic's revision): ``$XDG_CACHE_HOME/bertflow`` (``~/.cache/bertflow``), named by
    MLflow's version and a digest of its migration scripts' names. Found without importing MLflow
    (its package's folder, its distribution's version): ``flows.tracker_sqlite`` asks for it in a
    process that never imports MLflow."""
    import hashlib
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("MLflow is not installed", name="mlflow")
    folder = os.path.join(spec.submodule_search_locations[0], "store", "db_migrations", "versions")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".py"))
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    version = importlib.metadata.version("mlflow")
    return os.path.join(cache, "bertflow", "mlflow-schema", f"mlflow-{version}-{digest}.db")


def copy_schema(path: str) -> None:
    """A new store's file (``path``, which must not exist) copied from :func:`schema_template`,
    made first if missing and made again if it is not at this MLflow's head revision; milliseconds
    against the migrations' 1.4 CPU-s. Where the cache cannot be written nothing is copied, and
    the caller's client migrates the new store as before."""
    template = schema_template()
    try:
        if os.path.exists(template) and revision(template) != _head_revision():
            log.warning("MLflow schema template %s is not at this MLflow's head revision: made again", template)
            os.remove(template)
        if not os.path.exists(template):
            _make_schema_template(template)
        publish_copy(template, path)
    except OSError as exc:
        log.debug("no MLflow schema template (%s): the store is created by migration", exc)


def publish_copy(template: str, path: str, finish=None) -> None:
    """``path`` made a copy of ``template``, then ``finish(copy)`` on the copy when given, published
    whole (``os.replace``): no store is ever seen half made."""
    import shutil

    tmp = f"{path}.template-{os.getpid()}"
    try:
        shutil.copyfile(template, tmp)
        if finish is not None:
            finish(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)


def _head_revision() -> str:
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()  # MLflow's own check of a store (its _verify_schema); 15 ms


def revision(db_path: str) -> str | None:
    """A store's alembic revision (None: none, or not a database)."""
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
    with exclusive(template + ".lock", BUSY_SECONDS, f"MLflow schema template {template} stayed locked"):
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


_PREPARED: set[str] = set()


def sqlite_path(uri: str) -> str | None:
    """The database file of a ``sqlite:///`` URI (None: another kind of store, or in memory)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return os.path.abspath(path) if path and path != ":memory:" else None


def prepare_store(uri: str, seconds: float = BUSY_SECONDS) -> None:
    """Create or migrate a SQLite store under an exclusive lock on ``<database>.lock`` beside it
    (``flows.tracking``, design choice 6), once per process and URI; other stores are left to their server."""
    path = sqlite_path(uri)
    if path is None or uri in _PREPARED:
        return
    from mlflow.tracking import MlflowClient

    from flows.filelock import exclusive

    os.makedirs(os.path.dirname(path), exist_ok=True)
    busy = (
        f"MLflow store {path}: another process has held {path}.lock for {seconds:.0f} s while creating or migrating it"
    )
    with exclusive(path + ".lock", seconds, busy):
        if not os.path.exists(path):
            copy_schema(path)  # a cached empty database: no migrations
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.search_experiments(max_results=1)  # builds the tracking store: creates and migrates its tables
        client.search_registered_models(max_results=1)  # and the registry's
    _PREPARED.add(uri)
