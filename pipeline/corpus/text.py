"""The ``text`` source: corpora as they are passed around today, each record a document.

JSON Lines (``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``: OSCAR, C4, crawls), Parquet (a text column:
Hugging Face's Parquet export, data lakes) and a Hugging Face ``datasets`` folder written by
``save_to_disk`` (Arrow IPC stream files ``data-*.arrow`` beside ``dataset_info.json`` and
``state.json``; a ``DatasetDict``'s split folders under one ``dataset_dict.json``). Local or
``gs://``, through fsspec.

Design choices:
1. Read with the libraries made for the formats, batch by batch: pyarrow's Parquet reader one
   record batch of the needed columns at a time (memory: one row group's columns, the writer's
   choice), its IPC reader one record batch at a time, JSON Lines line by line through
   :func:`pipeline.corpus.books.bounded_lines` (a line over ``corpus.max_line_bytes`` is
   skipped unread). The ``datasets`` package is not needed: its files are Arrow.
2. Field names are configuration (``corpus.text_field``, ``text_id_field``,
   ``text_title_field``); a file without the id or title field still reads (ids from the file
   stem and the record number). A bad record costs that record: a reject naming the file and
   the record (``malformed_record``, ``missing_text``, ``line_too_long``,
   ``record_too_large``), never the file.
3. Nothing in a record is fatal, nothing in a file is silent. A record that cannot become a
   document (not JSON, nested past Python's recursion limit, a lone surrogate escape such as
   ``"\\ud800"`` that no UTF-8 file can hold, invalid UTF-8 in a Parquet or Arrow string, a
   wrong type) is a ``malformed_record`` or ``missing_text`` reject naming the file, the line
   or row and the field. String columns are read as bytes and decoded row by row, so one
   invalid value costs its row, not the file. A file that cannot be opened (wrong magic bytes,
   a ``.zst`` that is not zstd, no Parquet footer) is an ``unreadable_file`` fault, and one
   that ends early (a cut gzip/bz2/zstd/xz stream, an Arrow stream without its end marker) a
   ``truncated_file`` fault, each naming how many records were read before it: every record
   up to the cut is kept (:mod:`pipeline.corpus.compressed`), never a silent short read.
4. A text is cleaned like a book without its boilerplate step: blank-line paragraphs, wrapped
   lines joined (:func:`pipeline.corpus.sentences.book_paragraphs`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.corpus.books import bounded_lines
from pipeline.corpus.compressed import TruncatedInput, file_chunks
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.filters import FILE_EVENTS
from pipeline.corpus.records import CorpusReadError, LongLine
from pipeline.corpus.sentences import book_paragraphs

log = logging.getLogger("bertflow.corpus")

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".ndjson", ".ndjson.gz", ".ndjson.zst")
PARQUET_SUFFIXES = (".parquet",)
ARROW_SUFFIXES = (".arrow",)
TEXT_SUFFIXES = JSONL_SUFFIXES + PARQUET_SUFFIXES + ARROW_SUFFIXES
DATASET_METADATA = ("dataset_info.json", "state.json", "dataset_dict.json")
"""A ``datasets`` folder's own files: read by no one, rejected by no one."""
BATCH_ROWS = 1024
_ID_CHARS = 200
_SURROGATE = re.compile("[\ud800-\udfff]")
_STREAM_END = (b"\xff\xff\xff\xff\x00\x00\x00\x00", b"\x00\x00\x00\x00")
"""How an Arrow IPC stream ends (with and without the continuation marker): a stream that
stops anywhere else was cut, even at a message boundary, where pyarrow's reader ends quietly."""


@dataclass(frozen=True)
class TextReject:
    """A record of a text file not read, and why."""

    reason: str
    record_id: str
    detail: str
    sample: str = ""


def text_kind(url: str) -> str | None:
    """ "jsonl", "parquet" or "arrow" by the file name, else None."""
    name = url.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(ARROW_SUFFIXES):
        return "arrow"
    return None


def is_dataset_metadata(url: str) -> bool:
    return url.rstrip("/").rsplit("/", 1)[-1] in DATASET_METADATA


def text_stem(url: str) -> str:
    name = url.rstrip("/").rsplit("/", 1)[-1]
    for suffix in TEXT_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def iter_text_records(url: str, config: CorpusConfig) -> Iterator[dict | TextReject]:
    """Raw records ``{doc_id, source, title, text}`` of one text file, in file order, and a
    :class:`TextReject` for each record that is not one. Raises CorpusReadError naming the file
    when it cannot be read at all (reason ``unsupported_file`` or ``unreadable_file``)."""
    kind = text_kind(url)
    if kind is None:
        raise CorpusReadError(
            f"{url}: not a text-source file (expected {', '.join(TEXT_SUFFIXES)})", "unsupported_file"
        )
    read = 0
    try:
        for item in _jsonl(url, config) if kind == "jsonl" else _columns(url, kind, config):
            read += 1
            yield item
    except CorpusReadError as exc:
        if exc.reason in ("unreadable_file", "truncated_file"):
            raise CorpusReadError(f"{exc} ({read} records read before it)", exc.reason) from exc
        raise
    except (EOFError, TruncatedInput) as exc:  # a cut compressed stream
        raise CorpusReadError(
            f"{url}: {kind} file ends early: {exc} ({read} records read before it, kept)", "truncated_file"
        ) from exc
    except (OSError, ValueError, pa.ArrowException) as exc:  # not the format, damaged: CorruptInput is one
        raise CorpusReadError(
            f"{url}: unreadable {kind} file: {type(exc).__name__}: {exc} ({read} records read before it)"
        ) from exc
    except Exception as exc:  # a codec's own error type (zstandard.ZstdError, ...): still the file's fault
        raise CorpusReadError(
            f"{url}: unreadable {kind} file: {type(exc).__name__}: {exc} ({read} records read before it)"
        ) from exc


def _printable(value: str) -> str:
    """``value`` as UTF-8 can hold it (a lone surrogate replaced): for ids, details and samples."""
    return value.encode("utf-8", "replace").decode("utf-8") if _SURROGATE.search(value) else value


def _sample(value, limit: int = 1000) -> str:
    """At most ``limit`` characters of a rejected value, without building its whole text first."""
    if isinstance(value, str):
        return value[:limit]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value[:limit]).decode("utf-8", "replace")
    if isinstance(value, (list, tuple, dict)) and len(value) > limit:
        return f"a {type(value).__name__} of {len(value):,} items"
    return str(value)[:limit]


def _record(url: str, stem: str, number: int, text, doc_id, title) -> dict | TextReject:
    where = f"{url}: record {number}"
    rid = f"text:{stem}:{number:09d}" if doc_id is None else f"text:{str(doc_id)[:_ID_CHARS]}"
    for field, value in (("text", text), ("id", doc_id), ("title", title)):
        bad = _SURROGATE.search(value) if isinstance(value, str) else None
        if bad:
            return TextReject(
                "malformed_record",
                _printable(rid),
                f"{where}: {field} holds a lone surrogate (U+{ord(bad.group()):04X} at character {bad.start()}), "
                "which UTF-8 cannot encode",
                _printable(value[:1000]),
            )
    if text is None:
        return TextReject("missing_text", rid, f"{where}: no text (null or missing field)")
    if not isinstance(text, str):
        return TextReject(
            "missing_text", rid, f"{where}: text is a {type(text).__name__}, not a string", _printable(_sample(text))
        )
    return {"doc_id": rid, "source": "text", "title": "" if title is None else str(title), "text": text}


def _jsonl(url: str, config: CorpusConfig) -> Iterator[dict | TextReject]:
    stem = text_stem(url)
    field, id_field, title_field = config.text_field, config.text_id_field, config.text_title_field
    # decompressed here: a cut stream raises TruncatedInput after its last whole line
    for number, line in bounded_lines(file_chunks(url), config.max_line_bytes):
        rid = f"text:{stem}:{number:09d}"
        if isinstance(line, LongLine):
            yield TextReject("line_too_long", rid, f"{url}: {line.detail(config.max_line_bytes)}", line.sample())
            continue
        if number == 1 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError; nested too deep
            sample = line[:1000].decode("utf-8", "replace")
            why = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
            yield TextReject("malformed_record", rid, f"{url}: line {number}: not JSON ({why})", sample)
            continue
        if not isinstance(obj, dict):
            yield TextReject(
                "malformed_record", rid, f"{url}: line {number}: a JSON {type(obj).__name__}, not an object"
            )
            continue
        if field not in obj:
            yield TextReject(
                "missing_text",
                rid,
                _printable(f"{url}: line {number}: no {field!r} field (corpus.text_field); keys {sorted(obj)[:8]}"),
            )
            continue
        yield _record(url, stem, number, obj[field], obj.get(id_field), obj.get(title_field))


def _batches(f, kind: str, columns: list[str]) -> Iterator[pa.RecordBatch]:
    if kind == "parquet":
        yield from pq.ParquetFile(f, pre_buffer=False, buffer_size=1 << 20).iter_batches(
            batch_size=BATCH_ROWS, columns=columns
        )
        return
    head = f.read(6)
    f.seek(0)
    if head == b"ARROW1":  # the file format: its footer was read at open, so it is whole
        reader = pa.ipc.open_file(f)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i).select(columns)
        return
    for batch in pa.ipc.open_stream(f):  # datasets writes streams
        yield batch.select(columns)
    f.seek(0, 2)
    size = f.tell()
    f.seek(max(0, size - 8))
    if not f.read(8).endswith(_STREAM_END):
        raise TruncatedInput(f"the Arrow stream has no end-of-stream marker (a cut file of {size} bytes)")


def _schema(f, kind: str) -> pa.Schema:
    if kind == "parquet":
        return pq.ParquetFile(f).schema_arrow
    head = f.read(6)
    f.seek(0)
    schema = (pa.ipc.open_file(f) if head == b"ARROW1" else pa.ipc.open_stream(f)).schema
    f.seek(0)
    return schema


def _values(column: pa.Array) -> list:
    """A column's values; strings as bytes, so that each is decoded (and refused) on its own."""
    if pa.types.is_string(column.type):
        return column.cast(pa.binary()).to_pylist()
    if pa.types.is_large_string(column.type):
        return column.cast(pa.large_binary()).to_pylist()
    return column.to_pylist()


def _decoded(url: str, stem: str, number: int, text, doc_id, title) -> dict | TextReject:
    """One row of string bytes decoded: a value that is not UTF-8 is that row's reject."""
    values = {"text": text, "id": doc_id, "title": title}
    for field, value in values.items():
        if isinstance(value, bytes):
            try:
                values[field] = value.decode("utf-8")
            except UnicodeDecodeError as exc:
                rid = f"text:{stem}:{number:09d}"
                detail = f"{url}: record {number}: {field} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
                return TextReject("malformed_record", rid, detail, value[:1000].decode("utf-8", "replace"))
    return _record(url, stem, number, values["text"], values["id"], values["title"])


def _columns(url: str, kind: str, config: CorpusConfig) -> Iterator[dict | TextReject]:
    stem = text_stem(url)
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as f:
        names = _schema(f, kind).names
        f.seek(0)
        if config.text_field not in names:
            raise CorpusReadError(
                f"{url}: no {config.text_field!r} column (corpus.text_field); columns {names[:12]}", "missing_text"
            )
        columns = [c for c in (config.text_field, config.text_id_field, config.text_title_field) if c in names]
        number = 0
        for batch in _batches(f, kind, columns):
            data = {c: _values(batch.column(i)) for i, c in enumerate(columns)}
            texts = data[config.text_field]
            ids = data.get(config.text_id_field, [None] * len(texts))
            titles = data.get(config.text_title_field, [None] * len(texts))
            for text, doc_id, title in zip(texts, ids, titles, strict=True):
                number += 1
                # sized before anything is decoded or copied: a binary column's 100 MB value is
                # judged by its length, never turned into a 100-million-character str first
                if isinstance(text, (str, bytes)) and len(text) > config.max_line_bytes:
                    if isinstance(doc_id, bytes):
                        doc_id = doc_id.decode("utf-8", "replace")
                    rid = f"text:{stem}:{number:09d}" if doc_id is None else f"text:{str(doc_id)[:_ID_CHARS]}"
                    unit = "characters" if isinstance(text, str) else "bytes"
                    yield TextReject(
                        "record_too_large",
                        _printable(rid),
                        f"{url}: record {number}: {len(text)} {unit}, over "
                        f"corpus.max_line_bytes={config.max_line_bytes}",
                        _printable(_sample(text)),
                    )
                    continue
                yield _decoded(url, stem, number, text, doc_id, title)


# -- the text source's row: reader and paragraphs (pipeline.corpus.sources) ------------------------
def paragraphs(text: str, config: CorpusConfig) -> list[str]:
    """A record's blank-line paragraphs."""
    return book_paragraphs(text)


def read_unit(dofn, unit):
    """Records of a JSONL/Parquet/Arrow file; a bad record is a reject naming file and record."""
    url = unit[1]
    read = 0
    try:
        for item in iter_text_records(url, dofn.config):
            read += 1
            if isinstance(item, TextReject):
                dofn.reject(
                    "text", item.reason, record_id=item.record_id, url=url, detail=item.detail, sample=item.sample
                )
                continue
            yield item
    except CorpusReadError as exc:
        log.error("corpus: text file rejected (%s): %s", exc.reason, exc)
        if exc.reason in FILE_EVENTS:  # a fault of the file: no record (read stays as far as it got)
            dofn.reject("text", exc.reason, url=url, detail=str(exc))
        else:
            read += 1
            dofn.reject("text", exc.reason, record_id=f"text:{url.rsplit('/', 1)[-1]}", url=url, detail=str(exc))
    return read
