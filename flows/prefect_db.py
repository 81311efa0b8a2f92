"""Prefect's own SQLite database, created or migrated under a lock before a run starts its
temporary server.

Without a ``PREFECT_API_URL`` each ``bertflow run`` starts Prefect's temporary server, and each
such server migrates ``$PREFECT_HOME/prefect.db`` as it starts. Two runs started together on a
new machine (or a new ``PREFECT_HOME``) migrated it at once, and one of them failed in alembic
(``index ix_block_document__block_type_name_name already exists``, ``duplicate column name``;
reproduced with three plain Prefect flows started together on one new home). So the run migrates
it first, under an exclusive lock on ``<database>.lock`` beside it (as ``flows.tracking`` does
for MLflow's store); a second run waits for the first, then finds the database there and its
server's own migration has nothing to do.
"""

from __future__ import annotations

import os

LOCK_WAIT_S = 300.0
"""How long a run waits for another one's migration of the same database."""


def prefect_sqlite_path() -> str | None:
    """The SQLite file of the temporary server a flow will start, or ``None``: a Prefect server
    (``PREFECT_API_URL``) or another database keeps its own migrations."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url:
        return None
    url = settings.server.database.connection_url
    url = url.get_secret_value() if url is not None else ""
    prefix = "sqlite+aiosqlite:///"
    if not url.startswith(prefix) or ":memory:" in url:
        return None
    return url.removeprefix(prefix)


def prepare_prefect_database(wait_s: float = LOCK_WAIT_S) -> str | None:
    """Create the temporary server's SQLite database under ``<database>.lock`` when it is not
    there yet; returns the database's path (``None`` when there is none to prepare). One that
    exists is left to the server's own migration on start (a Prefect upgrade's, rare and usually
    one run's), so a run on a machine that has run before pays for no Prefect server import here."""
    path = prefect_sqlite_path()
    if path is None:
        return None
    from flows.filelock import exclusive

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    busy = (
        f"Prefect's database {path} stayed locked for {wait_s:.0f} s by another run creating or migrating it "
        f"({path}.lock)"
    )
    with exclusive(f"{path}.lock", wait_s, busy, poll=0.2):
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return path  # created, under this lock, by an earlier run (or by Prefect before)
        import asyncio

        from prefect.server.database import provide_database_interface

        asyncio.run(provide_database_interface().create_db())  # alembic upgrade to head
    return path
