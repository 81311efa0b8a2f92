"""Raw corpus inputs: URL expansion, the record types readers yield, and plain-text books.

Design choices:
1. Dumps are scanned page by page in :mod:`pipeline.corpus.wiki` (bounded memory, resynchronising at
   the next ``<page>`` after a fault); this module holds the types both share and
   :func:`iter_pages`, a strict wrapper for callers that want an error instead of events.
2. Files are opened through fsspec with compression inferred from the name, so ``.xml``,
   ``.xml.bz2`` (and ``.gz``), local or ``gs://``, all read alike.
3. An input URL may name a file, a folder or a glob; :func:`expand_inputs` turns it into a sorted
   list of files, each one unit of parallel work in the Beam job (dumps come in many parts).
4. Books are UTF-8; another encoding is detected (``charset-normalizer``) and accepted only when
   it decodes to clean text, a binary file is rejected with its reason, and one too large to
   hold is rejected instead of blowing up a worker. Every refusal is a :class:`CorpusReadError`
   with a ``reason`` the corpus job counts.
"""

from __future__ import annotations

from collections.abc import Iterator

import fsspec

from pipeline.corpus.inputs import BOOK_SUFFIXES, expand_inputs
from pipeline.corpus.records import Book, CorpusReadError

DEFAULT_MAX_BOOK_BYTES = 256 << 20


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
    head = data[:65536]
    if b"\x00" in head:
        return True
    controls = sum(1 for b in head if b < 32 and b not in (9, 10, 12, 13, 27))
    return controls > len(head) * 0.05


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


def read_book(url: str, max_bytes: int = DEFAULT_MAX_BOOK_BYTES) -> Book:
    """Read one book: UTF-8, or a detected encoding (see :func:`decode_book`).

    Raises CorpusReadError naming the file (reasons ``unreadable_file``, ``file_too_large``,
    ``binary_file``, ``undecodable``).
    """
    try:
        with fsspec.open(url, "rb", compression="infer") as f:
            data = f.read(max_bytes + 1)
    except (OSError, EOFError, ValueError) as exc:
        raise CorpusReadError(f"{url}: unreadable file: {exc}") from exc
    if len(data) > max_bytes:
        raise CorpusReadError(f"{url}: larger than {max_bytes} bytes (max_book_bytes)", "file_too_large")
    text, encoding = decode_book(data, url)
    stem = book_stem(url)
    return Book(name=stem, title=_book_title(text, stem), text=text, url=url, encoding=encoding)


def iter_book_lines(url: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a one-document-per-line file, streamed (memory flat in the file
    size); blank lines are skipped, invalid UTF-8 bytes replaced."""
    with fsspec.open(url, "rt", compression="infer", encoding="utf-8-sig", errors="replace", newline=None) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if line:
                yield number, line


def iter_books(url: str) -> Iterator[Book]:
    """Every ``.txt`` book under a file, folder or glob URL, in sorted file order."""
    for file_url in expand_inputs(url, BOOK_SUFFIXES):
        yield read_book(file_url)
