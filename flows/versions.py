"""A stage's code version: a digest of the source of the modules its row lists (``Stage.code``).

A stage whose manifest was stamped with another code version reruns (and, when its output
changes, every stage after it). The modules are the row's explicit list, read as files (never
imported: ``pipeline.corpus`` would import Beam); a package stands for every module under it.
The digests are computed once per process under a lock, before any stage runs in a thread, so
no two threads share a parser or a half-filled cache. ``tests/flows/test_table.py`` checks that
each row's list covers every module of ours its run function reaches.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading

_LOCK = threading.Lock()
_VERSIONS: dict[tuple[str, ...], str] = {}


def module_files(names: tuple[str, ...]) -> dict[str, str]:
    """Module name -> source file of every module the names cover (a package: all below it)."""
    out: dict[str, str] = {}
    for name in names:
        path = source_file(name)
        if path is None:
            raise ModuleNotFoundError(f"code version: no module or package {name!r} of ours")
        if os.path.basename(path) == "__init__.py":
            root = os.path.dirname(path)
            for folder, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
                for f in sorted(files):
                    if f.endswith(".py"):
                        rel = os.path.relpath(os.path.join(folder, f), root)[:-3].replace(os.sep, ".")
                        out[name if rel == "__init__" else f"{name}.{rel.removesuffix('.__init__')}"] = os.path.join(
                            folder, f
                        )
        else:
            out[name] = path
    return out


def digest_sources(sources: dict[str, bytes]) -> str:
    h = hashlib.blake2b(digest_size=12)
    for name in sorted(sources):
        h.update(name.encode() + b"\0" + sources[name] + b"\0")
    return h.hexdigest()


def code_version(modules: tuple[str, ...]) -> str:
    """The digest of the source of ``modules`` (cached for the process)."""
    key = tuple(sorted(modules))
    with _LOCK:
        if key not in _VERSIONS:
            sources = {}
            for name, path in module_files(key).items():
                with open(path, "rb") as f:
                    sources[name] = f.read()
            _VERSIONS[key] = digest_sources(sources)
        return _VERSIONS[key]


def source_file(name: str) -> str | None:
    """The source file of module ``name`` (its ``__init__.py`` for a package), found without
    importing it."""
    top = importlib.util.find_spec(name.split(".")[0])
    if top is None or not top.submodule_search_locations:
        return None
    path = os.path.join(list(top.submodule_search_locations)[0], *name.split(".")[1:])
    for candidate in (path + ".py", os.path.join(path, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None
