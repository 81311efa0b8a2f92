"""Raw corpus inputs: URL expansion, the record types readers yield, and plain-text books.

Design choices:
1. Dumps are scanned page by page in :mod:`pipeline.corpus.wiki` (bounded memory, resynchronising at
   the next ``<page>`` after a fault); this module holds the types both share and
   :func:`iter_pages`, a strict wrapper for callers that want an error instead of events.
2. Files are opened through fsspec and decompressed by :mod:`pipeline.corpus.compressed`
   (compression from the name), so ``.xml``, ``.xml.bz2`` (and ``.gz``), local or ``gs://``,
   all read alike, and a cut file raises at the cut instead of reading short.
3. An input URL may name a file, a folder or a glob; :func:`expand_inputs` turns it into a sorted
   list of files, each one unit of parallel work in the Beam job (dumps come in many parts).
4. Books are UTF-8; another encoding is detected (``charset-normalizer``) and accepted only when
   it decodes to clean text (a UTF-16/32 byte-order mark is honoured), a binary file is rejected
   with its reason (a NUL in its first 64 KiB, or more than 5% control bytes anywhere), and one
   too large to hold is rejected instead of blowing up a worker. Every refusal is a
   :class:`CorpusReadError` with a ``reason`` the corpus job counts.
5. Memory is bounded by configuration, not by the input: lines are read with
   :func:`bounded_lines`, which never holds more of a line than ``max_line_bytes`` (plus one read
   chunk) and reports a longer one as a :class:`LongLine` (its number, size and first bytes)
   instead of its text; a book is read only up to ``max_book_bytes``. Measured in
   ``docs/corpus.md``: a 200 MB single line costs the reader ~1 chunk, not 5.9 GB.
"""

from __future__ import annotations

import codecs
import io
import logging
from collections.abc import Iterable, Iterator

import fsspec

from pipeline.corpus.compressed import open_inflated
from pipeline.corpus.inputs import BOOK_SUFFIXES, expand_inputs
from pipeline.corpus.records import Book, CorpusReadError, LongLine
from pipeline.corpus.sentences import book_paragraphs, strip_boilerplate
from pipeline.corpus.sources import reader_for

log = logging.getLogger("bertflow.corpus")

DEFAULT_MAX_BOOK_BYTES = 256 << 20
DEFAULT_MAX_LINE_BYTES = 16 << 20
LINE_CHUNK = 1 << 20
"""Bytes read at a time by :func:`bounded_lines`."""
_HEAD = 4096
"""Bytes of a skipped long line kept, for its reject's sample."""
_BOMS = (  # longest first: UTF-32 LE's BOM starts with UTF-16 LE's
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_CONTROL_BYTES = bytes(b for b in range(32) if b not in (9, 10, 11, 12, 13, 27)) + b"\x7f"


def bom_encoding(head: bytes) -> tuple[str, int] | None:
    """(encoding, BOM length) for a UTF-16/32 byte-order mark at the start of ``head``, else None
    (a UTF-8 BOM is dropped by the UTF-8 decoding itself)."""
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            return encoding, len(bom)
    return None


def _line_body(piece: bytes) -> bytes:
    if piece.endswith(b"\r\n"):
        return piece[:-2]
    if piece.endswith((b"\n", b"\r")):
        return piece[:-1]
    return piece


def bounded_lines(chunks: Iterable[bytes], max_line_bytes: int) -> Iterator[tuple[int, bytes | LongLine]]:
    """(line number, line without its end) of a byte stream, lines ended by ``\\n``, ``\\r\\n`` or
    ``\\r`` (Python's universal newlines: the numbers are those of a text-mode read). A line longer
    than ``max_line_bytes`` comes as a :class:`LongLine`: at most the limit plus one chunk of it is
    ever held, the rest is counted and dropped as it is read."""
    number = 0
    parts: list[bytes] = []  # the current line's bytes so far (at most max_line_bytes)
    held = 0
    long: LongLine | None = None  # the current line, once over the limit
    cr = False  # the last chunk ended with "\r": a "\n" starting the next one is its pair
    for chunk in chunks:
        if cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        cr = chunk.endswith(b"\r")
        pieces = chunk.splitlines(keepends=True)
        for i, piece in enumerate(pieces):
            ended = i < len(pieces) - 1 or piece.endswith((b"\n", b"\r"))
            body = _line_body(piece) if ended else piece
            if long is not None:
                long.size += len(body)
            elif held + len(body) > max_line_bytes:
                head = b"".join(parts)[:_HEAD] if parts else b""
                long = LongLine(number + 1, held + len(body), (head + body[: _HEAD - len(head)])[:_HEAD])
                parts, held = [], 0
            elif ended and not parts:
                number += 1
                yield number, body
                continue
            else:
                parts.append(body)
                held += len(body)
            if ended:
                number += 1
                if long is not None:
                    yield number, long
                    long = None
                else:
                    yield number, b"".join(parts)
                    parts, held = [], 0
    if long is not None:
        yield number + 1, long
    elif parts:
        yield number + 1, b"".join(parts)


def _chunks(f, size: int = LINE_CHUNK, first: bytes = b"") -> Iterator[bytes]:
    if first:
        yield first
    while True:
        data = f.read(size)
        if not data:
            return
        yield data


def _size_if_known(url: str) -> int | None:
    """The file's size when it is its content's size (not compressed), else None."""
    if fsspec.utils.infer_compression(url) is not None:
        return None
    try:
        fs, path = fsspec.core.url_to_fs(url)
        return int(fs.size(path))
    except (OSError, TypeError, ValueError):
        return None


# -- books -------------------------------------------------------------------------------------
def book_stem(url: str) -> str:
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


# Encodings the detector may choose from (a closed list: on short text it otherwise picks exotic
# code pages that decode anything, such as cp1006).
_CANDIDATE_ENCODINGS = (
    "utf_8",
    "cp1252",
    "cp1250",
    "cp1251",
    "koi8_r",
    "cp1253",
    "cp1254",
    "cp1255",
    "cp1256",
    "cp1257",
    "shift_jis",
    "euc_jp",
    "gb18030",
    "big5",
    "euc_kr",
    "utf_16",
)
_LATIN_FAMILY = frozenset({"cp1250", "cp1252", "latin_1", "iso8859_15", "iso8859_2", "cp1257"})


def looks_binary(data: bytes) -> bool:
    """A NUL in the first 64 KiB, or more than 5% control bytes in all of ``data`` (C-speed count),
    unless a UTF-16/32 byte-order mark says what the NULs are."""
    if bom_encoding(data[:4]):
        return False
    if b"\x00" in data[:65536]:
        return True
    controls = len(data) - len(data.translate(None, _CONTROL_BYTES))
    return controls > len(data) * 0.05


def _printable_share(text: str) -> float:
    sample = text[:200_000]
    if not sample:
        return 1.0
    good = sum(1 for ch in sample if ch.isprintable() or ch in "\n\r\t")
    return good / len(sample)


def decode_book(data: bytes, url: str) -> tuple[str, str]:
    """(text, encoding) of a book's bytes: UTF-8 (a BOM dropped), or another encoding that
    ``charset-normalizer`` detects and that decodes to printable text.

    Raises CorpusReadError with reason ``binary_file`` or ``undecodable``, naming the file and
    the first bad byte.
    """
    bom = bom_encoding(data[:4])
    if bom is not None:
        encoding, skip = bom
        try:
            return data[skip:].decode(encoding), encoding
        except UnicodeDecodeError as exc:
            raise CorpusReadError(
                f"{url}: not valid {encoding} after its byte-order mark, at byte {skip + exc.start} ({exc.reason})",
                "undecodable",
            ) from None
    if looks_binary(data):
        raise CorpusReadError(f"{url}: binary data, not a text file", "binary_file")
    try:
        return data.decode("utf-8-sig"), "utf-8"
    except UnicodeDecodeError as exc:
        first_bad = exc
    try:
        from charset_normalizer import from_bytes
    except ImportError:  # the detector is optional: refuse rather than guess
        best = None
    else:
        best = from_bytes(data[: 1 << 20], cp_isolation=list(_CANDIDATE_ENCODINGS)).best()
    if best is not None and best.encoding and best.encoding != "utf_8":
        # cp1250 and cp1252 differ in a few letters the detector confuses on short text; the
        # Western one is far the likelier for books (latin-1 Gutenberg texts are the usual case).
        encoding = "cp1252" if best.encoding in _LATIN_FAMILY else best.encoding
        try:
            text = data.decode(encoding)
        except (UnicodeDecodeError, LookupError):
            text = None
        if text is not None and _printable_share(text) >= 0.98:
            return text, encoding
    raise CorpusReadError(
        f"{url}: not valid UTF-8 at byte {first_bad.start} ({first_bad.reason}) and no other "
        "encoding decodes it to text",
        "undecodable",
    )


def _too_large(url: str, max_bytes: int) -> CorpusReadError:
    return CorpusReadError(f"{url}: larger than {max_bytes} bytes (max_book_bytes)", "file_too_large")


def read_book(url: str, max_bytes: int = DEFAULT_MAX_BOOK_BYTES, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Book:
    """Read one book: UTF-8, or a detected encoding (see :func:`decode_book`), never holding more
    than ``max_bytes`` of it; a line longer than ``max_line_bytes`` is left out unread (a blank
    line in its place) and listed in ``Book.long_lines``.

    Raises CorpusReadError naming the file (reasons ``unreadable_file``, ``file_too_large``,
    ``binary_file``, ``undecodable``).
    """
    size = _size_if_known(url)
    if size is not None and size > max_bytes:
        raise _too_large(url, max_bytes)  # not read at all
    long_lines: list[LongLine] = []
    try:
        with open_inflated(url) as f:
            head = f.read(4)
            if bom_encoding(head):  # UTF-16/32: lines are not byte lines; the whole book, bounded
                data = head + f.read(max_bytes + 1 - len(head))
                if len(data) > max_bytes:
                    raise _too_large(url, max_bytes)
            else:
                out = bytearray()
                for _, line in bounded_lines(_chunks(f, LINE_CHUNK, head), max_line_bytes):
                    if isinstance(line, LongLine):
                        long_lines.append(line)
                        line = b""  # a paragraph break where the line was
                    if len(out) + len(line) + 1 > max_bytes + 1:
                        raise _too_large(url, max_bytes)
                    out += line
                    out += b"\n"
                data = bytes(out)
                del out
    except CorpusReadError:
        raise
    except (OSError, EOFError, ValueError) as exc:
        raise CorpusReadError(f"{url}: unreadable file: {exc}") from exc
    text, encoding = decode_book(data, url)
    del data
    if encoding.startswith("utf-") and encoding != "utf-8" and len(text) > max_line_bytes // 4:
        text = _drop_long_lines(text, max_line_bytes // 4, long_lines)  # chars: at most 4 bytes each
    stem = book_stem(url)
    return Book(
        name=stem, title=_book_title(text, stem), text=text, url=url, encoding=encoding, long_lines=tuple(long_lines)
    )


def _drop_long_lines(text: str, max_chars: int, long_lines: list[LongLine]) -> str:
    """A decoded book without its lines over ``max_chars`` (a UTF-16/32 book, read whole)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if len(line) > max_chars:
            long_lines.append(LongLine(i + 1, len(line.encode("utf-8", "replace")), line[:1000].encode()))
            lines[i] = ""
    return "\n".join(lines)


def iter_book_lines(url: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[tuple[int, str | LongLine]]:
    """(line number, line) of a one-document-per-line file, streamed (memory flat in the file size
    and bounded by ``max_line_bytes`` whatever a line's length: a longer one comes as a
    :class:`LongLine`, unread); blank lines are skipped, invalid UTF-8 bytes replaced, a UTF-8 or
    UTF-16/32 byte-order mark honoured."""
    with open_inflated(url) as f:
        head = f.read(4)
        bom = bom_encoding(head)
        if bom is not None:
            yield from _text_lines(f, head, bom, max_line_bytes)
            return
        if head.startswith(codecs.BOM_UTF8):
            head = head[len(codecs.BOM_UTF8) :]
        for number, line in bounded_lines(_chunks(f, LINE_CHUNK, head), max_line_bytes):
            if isinstance(line, LongLine):
                yield number, line
                continue
            text = line.decode("utf-8", "replace").strip()
            if text:
                yield number, text


def _text_lines(f, head: bytes, bom: tuple[str, int], max_line_bytes: int) -> Iterator[tuple[int, str | LongLine]]:
    """Lines of a UTF-16/32 file (after its BOM) through a text reader, each read at most
    ``max_line_bytes // 2`` characters at a time."""
    encoding, skip = bom
    raw = io.BufferedReader(_Prefixed(head[skip:], f))
    text = io.TextIOWrapper(raw, encoding=encoding, errors="replace", newline=None)
    limit = max(1, max_line_bytes // 2)
    number = 0
    while True:
        line = text.readline(limit + 1)
        if not line:
            return
        number += 1
        if len(line) > limit and not line.endswith("\n"):
            size, first = len(line) * 2, line[:1000]
            while line and not line.endswith("\n"):
                line = text.readline(limit)
                size += len(line) * 2
            yield number, LongLine(number, size, first.encode("utf-8", "replace"))
            continue
        line = line.strip()
        if line:
            yield number, line


class _Prefixed(io.RawIOBase):
    """A raw stream: ``prefix`` then what ``f`` reads (the bytes peeked at put back)."""

    def __init__(self, prefix: bytes, f):
        self.prefix, self.f = prefix, f

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.prefix:
            n = min(len(b), len(self.prefix))
            b[:n], self.prefix = self.prefix[:n], self.prefix[n:]
            return n
        data = self.f.read(len(b))
        b[: len(data)] = data
        return len(data)


def iter_books(url: str) -> Iterator[Book]:
    """Every ``.txt`` book under a file, folder or glob URL, in sorted file order."""
    for file_url in expand_inputs(url, BOOK_SUFFIXES):
        yield read_book(file_url)


# -- the books source's row: reader and paragraphs (pipeline.corpus.sources) -----------------------
def paragraphs(text: str, config) -> list[str]:
    """A book's paragraphs, its Project Gutenberg-style front matter and licence cut when
    ``corpus.strip_boilerplate``."""
    return book_paragraphs(strip_boilerplate(text) if config.strip_boilerplate else text)


def read_unit(dofn, unit):
    """A book file: one record (layout "paragraphs") or a record per line ("line_per_document")."""
    url = unit[1]
    if dofn.config.books_layout == "line_per_document":
        return (yield from _book_lines(dofn, url))
    yield from _book(dofn, url)
    return 1


def _is_binary(url: str) -> bool:
    """Whether the file's first 64 KiB look binary; raises when they cannot be read (a cut or
    corrupt compressed file: a file fault, not a binary book)."""
    with open_inflated(url) as f:
        return looks_binary(f.read(65536))


def _not_a_book(dofn, url: str, rid: str) -> None:
    try:
        reason = "binary_file" if _is_binary(url) else "unsupported_file"
    except (OSError, EOFError, ValueError):
        reason = "binary_file"
    hint = f"not a book file (expected {', '.join(BOOK_SUFFIXES)})"
    other = reader_for(url)
    if other is not None and other.name != "books":  # e.g. a JSONL or Parquet corpus given as books
        suffix = next(s for s in other.suffixes if url.lower().endswith(s))
        hint += f"; a {suffix.lstrip('.')} file is read by the {other.name} source: data.{other.name}, "
        hint += f"corpus.sources with '{other.name}'"
    log.error("corpus: %s among the books rejected (%s): %s", url, reason, hint)
    dofn.reject("books", reason, record_id=rid, url=url, detail=hint)


def _book(dofn, url: str):
    config = dofn.config
    rid = f"books:{book_stem(url)}"
    if not url.lower().endswith(BOOK_SUFFIXES):
        _not_a_book(dofn, url, rid)
        return
    try:
        book = read_book(url, config.max_book_bytes, config.max_line_bytes)
    except CorpusReadError as exc:
        reason = "unreadable_book" if exc.reason == "unreadable_file" else exc.reason
        log.error("corpus: book rejected (%s): %s", reason, exc)
        dofn.reject("books", reason, record_id=rid, url=url, detail=str(exc))
        return
    if book.encoding != "utf-8":
        dofn.count("books_reencoded")
        log.warning("corpus: %s is not UTF-8; read as %s", url, book.encoding)
    for line in book.long_lines:  # the book is kept without them
        log.warning("corpus: %s: %s", url, line.detail(config.max_line_bytes))
        detail = line.detail(config.max_line_bytes)
        dofn.reject("books", "long_line", record_id=rid, url=url, detail=detail, sample=line.sample())
    yield {"doc_id": f"books:{book.name}", "source": "books", "title": book.title, "text": book.text}


def _book_lines(dofn, url: str):
    max_line_bytes = dofn.config.max_line_bytes
    stem = book_stem(url)
    read = 0
    try:
        if not url.lower().endswith(BOOK_SUFFIXES) or _is_binary(url):
            _not_a_book(dofn, url, f"books:{stem}")
            return 1
        for number, line in iter_book_lines(url, max_line_bytes):
            read += 1
            rid = f"books:{stem}:{number:09d}"
            if isinstance(line, LongLine):
                detail = line.detail(max_line_bytes)
                dofn.reject("books", "line_too_long", record_id=rid, url=url, detail=detail, sample=line.sample())
                continue
            yield {"doc_id": rid, "source": "books", "title": stem, "text": line, "layout": "line"}
    except (OSError, EOFError, ValueError) as exc:  # a cut or corrupt file: a fault, the lines before it kept
        reason = "truncated_file" if isinstance(exc, EOFError) else "unreadable_file"
        detail = f"{url}: {type(exc).__name__}: {exc} ({read} lines read before it, kept)"
        log.error("corpus: %s: %s", reason, detail)
        dofn.reject("books", reason, url=url, detail=detail)
    return read
