"""Streaming readers for the raw corpora: MediaWiki XML exports and folders of plain-text books.

Design choices:
1. A dump is read with ``xml.etree.ElementTree.iterparse`` and every finished ``<page>`` is
   cleared from the tree, so memory stays constant whatever the file size (an enwiki part is
   gigabytes). Tags are matched by their local name, so any export schema version
   (``http://www.mediawiki.org/xml/export-0.10/``, ``-0.11/`` ...) or none at all parses.
2. Files are opened through fsspec with compression inferred from the name, so ``.xml``,
   ``.xml.bz2`` (and ``.gz``), local or ``gs://``, all read alike.
3. An input URL may name a file, a folder or a glob; :func:`expand_inputs` turns it into a sorted
   list of files, each one unit of parallel work in the Beam job (dumps come in many parts).
4. A broken file raises :class:`CorpusReadError` naming the file (and the line/column for XML);
   the Beam job counts it as a reject and logs it instead of crashing.
"""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from typing import Iterator

import fsspec

WIKI_SUFFIXES = (".xml", ".xml.bz2", ".xml.gz")
BOOK_SUFFIXES = (".txt",)
_GLOB_CHARS = ("*", "?", "[")


class CorpusReadError(RuntimeError):
    """A raw input file could not be read or parsed; the message names the file."""


@dataclasses.dataclass(frozen=True)
class Page:
    """One page of a MediaWiki export (its latest revision)."""

    page_id: str
    title: str
    ns: int
    redirect: str | None  # the redirect target, or None for a real page
    text: str


@dataclasses.dataclass(frozen=True)
class Book:
    """One book: a UTF-8 text file."""

    name: str  # file stem, the stable id
    title: str
    text: str
    url: str


# -- inputs ------------------------------------------------------------------------------------
def _to_url(fs, path: str, like: str) -> str:
    """A path found by ``fs`` as a URL in the same form as the input (plain path when local)."""
    if "://" not in like:
        return path
    return fs.unstrip_protocol(path)


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
                continue
            found.append(p)
    else:
        found = []
    if not found:
        raise FileNotFoundError(f"input {url} matches no files")
    return sorted(_to_url(fs, p, url) for p in found)


# -- MediaWiki XML -----------------------------------------------------------------------------
def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _page_from_element(elem: ET.Element, url: str) -> Page:
    page_id = title = None
    ns = 0
    redirect = None
    text = ""
    for child in elem:
        tag = _local(child.tag)
        if tag == "id":
            page_id = (child.text or "").strip()
        elif tag == "title":
            title = child.text or ""
        elif tag == "ns":
            try:
                ns = int((child.text or "0").strip())
            except ValueError:
                raise CorpusReadError(f"{url}: page {title!r} has a non-integer <ns> {child.text!r}")
        elif tag == "redirect":
            redirect = child.get("title") or ""
        elif tag == "revision":  # a full-history export has several: the last one wins
            for sub in child:
                if _local(sub.tag) == "text":
                    text = sub.text or ""
    if not page_id:
        raise CorpusReadError(f"{url}: page {title!r} has no <id>")
    return Page(page_id=page_id, title=title or "", ns=ns, redirect=redirect, text=text)


def iter_pages(url: str) -> Iterator[Page]:
    """Stream the pages of a MediaWiki export (``.xml`` or compressed), in file order.

    Memory stays constant: each page element is dropped from the tree once yielded.
    Raises CorpusReadError naming the file (and line/column) on malformed XML or a corrupt
    archive; pages before the fault have been yielded by then.
    """
    try:
        with fsspec.open(url, "rb", compression="infer") as f:
            root = None
            for event, elem in ET.iterparse(f, events=("start", "end")):
                if root is None:
                    root = elem
                    continue
                if event == "end" and _local(elem.tag) == "page":
                    page = _page_from_element(elem, url)
                    root.clear()  # drops this page (and siteinfo): constant memory
                    yield page
    except ET.ParseError as exc:
        line, col = getattr(exc, "position", (None, None))
        raise CorpusReadError(f"{url}: malformed XML at line {line}, column {col}: {exc}") from exc
    except (OSError, EOFError, ValueError) as exc:
        raise CorpusReadError(f"{url}: unreadable file: {exc}") from exc


# -- books -------------------------------------------------------------------------------------
def _stem(url: str) -> str:
    name = url.rstrip("/").rsplit("/", 1)[-1]
    for suffix in BOOK_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def _book_title(text: str, stem: str) -> str:
    """The first line when it looks like a title (short, no sentence punctuation), else the stem."""
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.lower().startswith(("chapter", "prologue", "contents")):
            break  # no title line: the book starts with its first chapter
        if len(line) <= 100 and not line.endswith((".", "!", "?", ",", ";", '"', "”")):
            return line
        break
    return stem


def read_book(url: str) -> Book:
    """Read one book as strict UTF-8 (a leading BOM is dropped).

    Raises CorpusReadError naming the file and the byte offset when it is not valid UTF-8.
    """
    try:
        with fsspec.open(url, "rb", compression="infer") as f:
            data = f.read()
    except (OSError, EOFError, ValueError) as exc:
        raise CorpusReadError(f"{url}: unreadable file: {exc}") from exc
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CorpusReadError(
            f"{url}: not valid UTF-8 at byte {exc.start}: {exc.reason}"
        ) from exc
    stem = _stem(url)
    return Book(name=stem, title=_book_title(text, stem), text=text, url=url)


def iter_books(url: str) -> Iterator[Book]:
    """Every ``.txt`` book under a file, folder or glob URL, in sorted file order."""
    for file_url in expand_inputs(url, BOOK_SUFFIXES):
        yield read_book(file_url)
