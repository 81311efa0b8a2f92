"""Raw corpus inputs: a file, a folder or a glob, expanded to the files of each source.

Every file found is read or rejected with a reason, never skipped silently, except what a
source's layout names as its own companions: a dump folder's multistream index and checksum
files, a ``datasets`` folder's ``dataset_info.json``/``state.json``/``dataset_dict.json``."""

from __future__ import annotations

import logging
import re

import fsspec

from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.sources import CORPUS_SOURCES, SOURCES, companion_pattern

WIKI_SUFFIXES = SOURCES["wiki"].suffixes
# Parts of a split dump: enwiki-…-pages-articles-multistream3.xml-p1p41242.bz2
_WIKI_PART = re.compile(r"\.xml(?:-p\d+p\d+)?(?:\.bz2|\.gz)?$", re.I)
BOOK_SUFFIXES = SOURCES["books"].suffixes
_GLOB_CHARS = ("*", "?", "[")

log = logging.getLogger("bertflow.corpus")


# -- inputs ------------------------------------------------------------------------------------
def _to_url(fs, path: str, like: str) -> str:
    """A path found by ``fs`` as a URL in the same form as the input (plain path when local)."""
    if "://" not in like:
        return path
    return fs.unstrip_protocol(path)


def is_wiki_file(name: str) -> bool:
    """A dump file by its name: ``.xml``, ``.xml.bz2``, ``.xml.gz`` or a split part
    ``….xml-p1p41242.bz2`` (index files ``….txt.bz2`` are not)."""
    return bool(_WIKI_PART.search(name))


def _hidden(rel: str) -> bool:
    return any(part.startswith((".", "_")) for part in rel.split("/") if part)


def expand_inputs(url: str, suffixes: tuple[str, ...] | None = None) -> list[str]:
    """The files an input URL names, sorted: a file, every file under a folder, or a glob.

    Hidden files and ``_``-prefixed ones (manifests, markers) are skipped in a folder or a glob;
    under a folder, when ``suffixes`` is given, only names ending with one of them are kept. A
    glob's matches and a single file are otherwise taken as given. Raises FileNotFoundError when nothing matches.
    """
    fs, path = fsspec.core.url_to_fs(url)
    if any(ch in path for ch in _GLOB_CHARS):
        found = [p for p in fs.glob(path) if fs.isfile(p) and not _hidden(p.rsplit("/", 1)[-1])]
    elif fs.isfile(path):
        found = [path]
    elif fs.isdir(path):
        root = path.rstrip("/") + "/"
        found = []
        for p in fs.find(path):
            rel = p[len(root) :] if p.startswith(root) else p
            if _hidden(rel):
                continue
            if suffixes and not p.lower().endswith(suffixes):
                if not (suffixes == WIKI_SUFFIXES and is_wiki_file(p)):
                    continue
            found.append(p)
    else:
        found = []
    if not found:
        raise FileNotFoundError(f"input {url} matches no files")
    return sorted(_to_url(fs, p, url) for p in found)


class CorpusInputError(ValueError):
    """A corpus input is missing or empty when the config needs it; the message names it."""


def _input_files(name: str, url: str) -> list[str]:
    """Every file of a source's input: a stray binary, a .pdf among the books or a .zst dump is a
    unit its reader rejects with a reason, not a file skipped; only a layout's own companions
    (``Source.companions``: a dump's index and checksums, a ``datasets`` folder's metadata) are
    left out."""
    found = expand_inputs(url)
    companion = companion_pattern(name)
    if companion is None:
        return found
    kept = [u for u in found if not companion.search(u.rstrip("/").rsplit("/", 1)[-1])]
    if not kept:
        raise FileNotFoundError(f"input {url} holds only its layout's companion files ({name}), no data")
    return kept


def check_corpus_inputs(config: CorpusConfig, inputs: dict[str, str]) -> dict[str, list[str]]:
    """The input files of each source the run uses, or a clear error before any work starts.

    Every source in ``config.sources`` must be given in ``inputs`` and name at least one
    non-empty file; an input of a source not in ``config.sources`` is ignored (logged), so a
    preset that always passes both can run on one. Raises :class:`CorpusInputError` naming the
    source, the URL and what to change.
    """
    for name in inputs:
        if name not in CORPUS_SOURCES:
            raise CorpusInputError(f"corpus: unknown input {name!r}; expected some of {CORPUS_SOURCES}")
    files: dict[str, list[str]] = {}
    for name in config.sources:
        url = inputs.get(name)
        if not url:
            raise CorpusInputError(
                f"corpus: corpus.sources includes {name!r} but no {name} input was given; give "
                f"one (data.{name}) or leave {name!r} out of corpus.sources"
            )
        try:
            found = _input_files(name, url)
        except FileNotFoundError:
            raise CorpusInputError(
                f"corpus: the {name} input {url} matches no files; corpus.sources includes "
                f"{name!r}, so it may not be empty"
            ) from None
        fs, _ = fsspec.core.url_to_fs(found[0])
        if all(fs.size(fsspec.core.url_to_fs(u)[1]) == 0 for u in found):
            raise CorpusInputError(
                f"corpus: the {name} input {url} holds only empty files ({len(found)}); "
                f"corpus.sources includes {name!r}, so it may not be empty"
            )
        files[name] = found
    for name in sorted(n for n in set(inputs) - set(config.sources) if inputs[n]):
        log.warning("corpus: ignoring the %s input %s (not in corpus.sources %s)", name, inputs[name], config.sources)
    return files
