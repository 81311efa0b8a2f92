"""URLs, and the one commit rule for whole files on every storage (local folders, ``gs://``).

Whole small files (manifests, configs, vocabularies, weights) are written with
:func:`write_atomically`: on a local folder a temporary file renamed into place (POSIX rename is
atomic); on an object store (``gs://``) a single object write, because an object appears only
when its upload completes, while a "rename" there is a copy plus a delete (gcsfs first tries
GCS's ``moveTo``, which the emulator lacks: 30-40 s of retries and an error traceback per
manifest).
"""

from __future__ import annotations

import os
import uuid

import fsspec


def join_url(base: str, *parts: str) -> str:
    base = base.rstrip("/")
    rest = "/".join(p.strip("/") for p in parts if p)
    return f"{base}/{rest}" if rest else base


def is_local_fs(fs: fsspec.AbstractFileSystem) -> bool:
    """True for the local filesystem (where rename is atomic), False for object stores and the rest."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "file" in protocols or "local" in protocols


def write_atomically(url: str, data: bytes | str) -> None:
    """Write ``data`` (str: UTF-8) as the whole of ``url`` so that no reader ever sees part of it.

    Local folders: a uniquely named temporary file in the same folder, flushed to disk and
    renamed over the target (``os.replace``), removed if anything fails. Object stores: one
    object write (``pipe_file``), no temporary object and no rename: GCS (and S3) publish an
    object only when its upload completes, so the old object or the whole new one is all a
    reader can see. Parent folders are made as needed.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    fs, path = fsspec.core.url_to_fs(url)
    if not is_local_fs(fs):
        fs.makedirs(fs._parent(path), exist_ok=True)
        fs.pipe_file(path, data)
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
