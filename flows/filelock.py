"""An exclusive ``flock`` on a lock file, waited for at most so many seconds: how a run creates or
migrates a database that other runs may be creating at the same moment (MLflow's SQLite store,
``flows.tracking``; Prefect's, ``flows.prefect_db``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def exclusive(lock_path: str, seconds: float, busy: str, poll: float = 0.1) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if missing) for the ``with`` block;
    another holder is waited for up to ``seconds``, then :class:`TimeoutError` with ``busy``.
    Closing the file drops the lock, so a killed holder never leaves it held."""
    import fcntl

    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        wait_for_flock(fd, fcntl.LOCK_EX, time.monotonic() + seconds, busy, poll)
        yield
    finally:
        os.close(fd)


def wait_for_flock(fd: int, how: int, deadline: float, busy: str, poll: float = 0.1) -> None:
    """``flock(fd, how)`` (``fcntl.LOCK_EX`` or ``LOCK_SH``), retried until ``deadline``
    (``time.monotonic()``), then :class:`TimeoutError` with ``busy``."""
    import fcntl

    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(busy) from None
            time.sleep(poll)
