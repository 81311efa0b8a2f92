"""The corpus sources, one row each: the one place that says what a source is.

A row names the source, the reader of one unit of read work (a file, or a byte range of one),
how a source's files become units, which files of an input are its data and which are its
layout's companions, what its rejects mean, the paragraphs of one of its raw records, the hint
the preflight check gives when its URL is missing, and a small sample in its layout (under
``data/``) that the registry test reads through the row.

Everything that knows about corpus sources reads :data:`SOURCES`: the config's validation
(:mod:`pipeline.corpus.config`), the input check and file matching (:mod:`pipeline.corpus.inputs`),
the read DoFn (:mod:`pipeline.corpus.read`), the cleaning (:mod:`pipeline.corpus.documents`),
the run config's data URLs and their preflight hints (``flows``). Adding a source is one row here
plus its module (a reader, a paragraphs function) plus its sample; see docs/DESIGN.md. References
to code are ``"module:attribute"`` strings resolved when used (:func:`resolve`), so reading the
registry imports neither Beam nor the readers.

A reader is ``read(dofn, unit) -> Generator[raw record, None, records read]``: ``unit`` is
``(source, url, start, end, part, parts)``, ``dofn`` gives ``config`` (the CorpusConfig),
``count(name, n)`` and ``reject(source, reason, record_id=, title=, url=, detail=, sample=)``. A raw
record is ``{doc_id: "<source>:<id>", source, title, text[, layout]}``.
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """One corpus source (a row of :data:`SOURCES`)."""

    name: str
    """The name in corpus.sources, in doc ids (``<name>:<id>``), in reject rows and folder names."""
    read: str
    """``"module:attr"`` of the unit reader (see the module docstring)."""
    paragraphs: str
    """``"module:attr"`` of ``(text, config) -> list[str]``: the cleaned paragraphs of one of its
    raw records (a record with ``layout == "line"`` is one paragraph whatever its source)."""
    suffixes: tuple[str, ...]
    """File names its reader reads (lower case); another file of its input is read and rejected
    with a reason, and a file with these suffixes given to another source is pointed here."""
    kind: str
    """What its files are, in a sentence's words ("a Wikipedia dump")."""
    hint: str
    """What to set when the run needs the user's data and ``data.<name>`` is empty (preflight)."""
    sample: str
    """A small input in its layout, relative to the repository's ``data/`` folder."""
    plan: str = ""
    """``"module:attr"`` of ``(url, config) -> [(url, start, end)]``: the units of one file;
    empty: one unit per file."""
    handoff: bool = False
    """A whole-file unit may be read by one reader that hands its records to every worker in
    batch files (:func:`pipeline.corpus.read.spread_units`): for sources whose files are few and big."""
    companions: str = ""
    """A regular expression matched against a file's base name: the files of its layout that are
    not data (an index, checksums, a dataset's metadata), left out of its input."""
    bundled: bool = False
    """An empty ``data.<name>`` is the bundled sample's ``<name>`` folder (``data/sample/<name>``)."""
    default: bool = False
    """In the default corpus.sources."""
    xml: bool = False
    """Its text went through an XML parser (which refuses C0 control characters)."""
    rejects: str = ""
    """What a reject of this source means: one record (page, book, line, record) or one file."""


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "wiki",
            read="pipeline.corpus.wiki_reader:read_unit",
            paragraphs="pipeline.corpus.wiki_reader:paragraphs",
            suffixes=(".xml", ".xml.bz2", ".xml.gz"),
            kind="a MediaWiki export",
            hint="a Wikipedia dump by date, e.g. gs://BUCKET/dumps/enwiki-20261101-pages-articles-multistream*.xml.bz2 "
            "(`bertflow fetch-wiki --lang en --date 20261101 --out gs://BUCKET/dumps`)",
            sample="sample/wiki",
            plan="pipeline.corpus.wiki_reader:plan",
            handoff=True,
            companions=r"-index\d*\.txt(?:-p\d+p\d+)?\.bz2$|(?:md5|sha1|sha256)sums\.txt$|\.part$",
            bundled=True,
            default=True,
            xml=True,
            rejects="a page (redirect, other namespace, disambiguation, malformed) or a file fault",
        ),
        Source(
            "books",
            read="pipeline.corpus.books:read_unit",
            paragraphs="pipeline.corpus.books:paragraphs",
            suffixes=(".txt", ".txt.gz", ".txt.bz2"),
            kind="a folder of one UTF-8 .txt per book",
            hint="a folder of one UTF-8 .txt per book, e.g. gs://BUCKET/books",
            sample="sample/books",
            bundled=True,
            default=True,
            rejects="a book file (binary, too large, unreadable), or a line of the line_per_document layout",
        ),
        Source(
            "text",
            read="pipeline.corpus.text:read_unit",
            paragraphs="pipeline.corpus.text:paragraphs",
            suffixes=(
                ".jsonl",
                ".jsonl.gz",
                ".jsonl.zst",
                ".ndjson",
                ".ndjson.gz",
                ".ndjson.zst",
                ".parquet",
                ".arrow",
            ),  # fmt: skip
            kind="records (JSON Lines, Parquet, a datasets folder) with a text field",
            hint="JSON Lines, Parquet or a datasets folder of records with a text field, e.g. gs://BUCKET/c4/en",
            sample="sources/text/records.jsonl",
            companions=r"^(?:dataset_info|state|dataset_dict)\.json$",
            rejects="a record (missing text, malformed, too large, repeated id) or a file fault",
        ),
    )
}
"""Every corpus source, by name."""

CORPUS_SOURCES: tuple[str, ...] = tuple(SOURCES)
DEFAULT_SOURCES: tuple[str, ...] = tuple(s.name for s in SOURCES.values() if s.default)


@functools.cache
def resolve(ref: str):
    """The object a ``"module:attr"`` reference names (cached: readers call it per record)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@functools.cache
def companion_pattern(name: str) -> re.Pattern | None:
    source = SOURCES[name]
    return re.compile(source.companions, re.I) if source.companions else None


def source_of(name: str) -> Source:
    """The row of a source, or a KeyError that lists the known ones."""
    try:
        return SOURCES[name]
    except KeyError:
        raise KeyError(f"unknown corpus source {name!r}; known: {CORPUS_SOURCES}") from None


def reader_for(url: str) -> Source | None:
    """The source whose reader reads a file of this name, if one does."""
    low = url.lower()
    for source in SOURCES.values():
        if low.endswith(source.suffixes):
            return source
    return None
