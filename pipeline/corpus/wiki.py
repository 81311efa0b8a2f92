"""MediaWiki XML dumps read page by page, resynchronising at the next ``<page>`` after any fault.

Design choices:
1. The dump is scanned as bytes for ``<page>`` ... ``</page>`` and each page is parsed on its own
   (``xml.etree.ElementTree.fromstring``), instead of one ``iterparse`` over the whole file. A
   malformed page, an invalid UTF-8 byte or a stray unclosed ``<page>`` then costs that page
   only (a reject with its reason), never the rest of the file; the XML header and the
   ``<mediawiki>`` root are never needed, so any export schema version parses.
2. Memory is bounded by ``max_page_bytes`` plus one read chunk whatever the dump or page size: a
   page that grows past the limit is skipped to its ``</page>`` without being held (a
   ``page_too_large`` reject with its id and title), and text before a ``<page>`` is never kept.
3. Invalid UTF-8 bytes inside a page are replaced (U+FFFD, dropped by the cleaner) and counted
   (``invalid_utf8``): one bad byte should not cost an article.
4. A truncated or corrupt archive ends the file with a ``truncated_file`` event after every page
   decompressed before the fault (bz2 decompresses whole blocks, so the pages of the block cut
   in half are lost with it; a multistream dump loses at most one stream of 100 pages).
5. Any XML encoding: UTF-8 (the dumps Wikimedia writes) is scanned as it is; a byte-order mark
   (UTF-16/32, LE or BE), the UTF-16/32 shape of ``<?xml`` or an encoding declaration
   (``<?xml version="1.0" encoding="ISO-8859-1"?>``) makes :func:`utf8_chunks` transcode the
   decompressed bytes to UTF-8 chunk by chunk (an incremental decoder, memory flat) before the
   same scanner, so the fast path costs one peek at the first KiB. An encoding Python does not
   know is an ``unreadable_file`` event naming it, a file with bytes but no ``<page>`` a
   ``no_pages`` event: never 0 pages and 0 rejects. Byte offsets in messages are then those of
   the UTF-8 stream.
6. Multistream ``.bz2`` dumps come with an index (``offset:page_id:title`` per page); the
   stream offsets split one big file into byte ranges that separate Beam workers read
   (:func:`plan_reads`). Each range is decompressed stream by stream from its own start.

Everything a reader meets is yielded in file order: a :class:`~pipeline.corpus.records.Page`, or a
:class:`~pipeline.corpus.records.ReadEvent` (a rejected page, a file fault, a repair), so the caller
counts every page read as kept or rejected.
"""

from __future__ import annotations

import codecs
import itertools
import queue
import re
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator

import fsspec

from pipeline.corpus.compressed import file_chunks
from pipeline.corpus.compressed import inflate as _inflate
from pipeline.corpus.compressed import raw_chunks as _raw_chunks
from pipeline.corpus.records import CorpusReadError, Page, ReadEvent

DEFAULT_MAX_PAGE_BYTES = 16 << 20
_OPEN = b"<page>"
_CLOSE = b"</page>"
_TITLE = re.compile(rb"<title>([^<]{0,300})<")
_ID = re.compile(rb"<id>\s*(\d{1,20})\s*</id>")
_MULTISTREAM = re.compile(r"multistream(\d*)\.xml")
_SAMPLE = 1000


# -- MediaWiki XML -----------------------------------------------------------------------------
def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def page_from_element(elem: ET.Element, url: str) -> Page:
    page_id = title = None
    ns = 0
    redirect = None
    text = ""
    for child in elem:
        tag = child.tag
        if "}" in tag:  # a page cut out of the dump has no namespace: no split, no call, mostly
            tag = _local(tag)
        if tag == "id":
            page_id = (child.text or "").strip()
        elif tag == "title":
            title = child.text or ""
        elif tag == "ns":
            try:
                ns = int((child.text or "0").strip())
            except ValueError:
                raise CorpusReadError(
                    f"{url}: page {title!r} has a non-integer <ns> {child.text!r}", "malformed_page"
                ) from None
        elif tag == "redirect":
            redirect = child.get("title") or ""
        elif tag == "revision":  # a full-history export has several: the last one wins
            for sub in child:
                if sub.tag == "text" or sub.tag.endswith("}text"):  # _local(sub.tag) == "text"
                    text = sub.text or ""
    if not page_id:
        raise CorpusReadError(f"{url}: page {title!r} has no <id>", "malformed_page")
    return Page(page_id=page_id, title=title or "", ns=ns, redirect=redirect, text=text)


def _head_info(head: bytes) -> tuple[str, str]:
    """(page id, title) from the first bytes of a page, for naming a rejected one."""
    title = _TITLE.search(head)
    page_id = _ID.search(head)
    return (
        page_id.group(1).decode("ascii") if page_id else "",
        title.group(1).decode("utf-8", "replace") if title else "",
    )


def _sample(data: bytes) -> str:
    return data[: _SAMPLE * 2].decode("utf-8", "replace")[:_SAMPLE]


# -- byte sources ------------------------------------------------------------------------------
def _file_chunks(url: str, fast_bz2: bool = False) -> Iterator[bytes]:
    """Decompressed bytes of a whole file (compression from the name), chunk by chunk."""
    return file_chunks(url, fast_bz2)


def _range_chunks(url: str, start: int, end: int) -> Iterator[bytes]:
    """Decompressed bytes of the bz2 streams in bytes [start, end) of a multistream file."""
    with fsspec.open(url, "rb") as f:
        f.seek(start)
        yield from _inflate(_raw_chunks(f, end - start), "bz2")


PREFETCH_CHUNKS = 4
"""Decompressed chunks a reader thread may hold ahead of the page scanner (memory bound)."""


def prefetched(chunks: Iterator[bytes], depth: int = PREFETCH_CHUNKS) -> Iterator[bytes]:
    """``chunks`` produced by a thread, at most ``depth`` ahead: bz2/zlib decompression and
    file reads release the GIL, so they overlap the scanning and cleaning of earlier pages on a
    second core (wikiextractor does the same with a reader process). The same chunks come in
    the same order, and an exception of the producer is raised here at the same point."""
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce():
        try:
            for chunk in chunks:
                while not stop.is_set():
                    try:
                        items.put((chunk, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put((None, None))
        except BaseException as exc:  # handed over to the consumer, raised there
            items.put((None, exc))

    thread = threading.Thread(target=produce, name="dump-reader", daemon=True)
    thread.start()
    try:
        while True:
            chunk, exc = items.get()
            if exc is not None:
                raise exc
            if chunk is None:
                return
            yield chunk
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                items.get_nowait()
            except queue.Empty:
                thread.join(0.05)


# -- encodings ---------------------------------------------------------------------------------
SNIFF_BYTES = 1024
_DECLARATION = re.compile(rb"""\s*<\?xml[^>]{0,200}?encoding\s*=\s*["']([A-Za-z0-9._:-]{1,40})["']""")
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_SHAPES = ((b"<\0\0\0", "utf-32-le"), (b"\0\0\0<", "utf-32-be"), (b"<\0", "utf-16-le"), (b"\0<", "utf-16-be"))


def sniff_encoding(head: bytes) -> tuple[str, int]:
    """(Python codec name, bytes of byte-order mark to skip) of XML whose first bytes are
    ``head``: a BOM, else the UTF-16/32 shape of ``<`` (XML 1.0 appendix F; also the middle of a
    UTF-16 file: NULs between ASCII letters), else the encoding declaration, else UTF-8.
    Raises ValueError naming a declared encoding Python does not know."""
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            return encoding, len(bom)
    body = head.lstrip(b" \t\r\n") if b"\0" not in head[:2] else head
    for shape, encoding in _SHAPES:
        if body.startswith(shape):
            return encoding, 0
    sample = head[:512]
    if len(sample) >= 16 and sample.count(0) > len(sample) // 3:  # text that is half NULs: UTF-16
        odd = sample[1::2].count(0)
        return ("utf-16-le" if odd > sample[0::2].count(0) else "utf-16-be"), 0
    m = _DECLARATION.match(head)
    if not m:
        return "utf-8", 0
    declared = m.group(1).decode("ascii")
    try:
        name = codecs.lookup(declared).name
    except LookupError:
        raise ValueError(f"the XML declares encoding {declared!r}, which Python does not know") from None
    if name in ("utf-8", "ascii") or name.startswith(("utf-16", "utf-32")):
        return "utf-8", 0  # ASCII-compatible bytes (the declaration read as such): UTF-8 or its subset
    return name, 0


class Transcoding:
    """What :func:`utf8_chunks` found: the encoding read, characters it could not decode."""

    def __init__(self):
        self.encoding = "utf-8"
        self.replaced = 0


def utf8_chunks(chunks: Iterable[bytes], state: Transcoding, head: bytes | None = None) -> Iterator[bytes]:
    """``chunks`` as UTF-8: passed through untouched when the XML is UTF-8 (one peek at its first
    KiB, or at ``head``, the file's own first bytes, for a range that starts in the middle),
    else decoded incrementally from its encoding (:func:`sniff_encoding`) and re-encoded, chunk by
    chunk; bytes that do not decode become U+FFFD (counted in ``state.replaced``)."""
    chunks = iter(chunks)
    peeked: list[bytes] = []
    size = 0
    while size < SNIFF_BYTES:
        data = next(chunks, None)
        if data is None:
            break
        peeked.append(data)
        size += len(data)
    data = None  # not held: the chunks stay the scanner's to drop
    encoding, skip = sniff_encoding(head if head is not None else b"".join(peeked)[:SNIFF_BYTES])
    if head is not None:
        skip = 0  # the BOM was at the file's start, not here
    if encoding == "utf-8":
        peeked.reverse()
        while peeked:  # handed on, not held: the scanner's memory bound stays its own
            yield peeked.pop()
        yield from chunks
        return
    state.encoding = encoding
    decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    first = [b"".join(peeked)[skip:]]
    peeked.clear()
    for data in itertools.chain(_drain(first), chunks):
        text = decoder.decode(data)
        if text:
            state.replaced += text.count("\ufffd")
            yield text.encode("utf-8")
    text = decoder.decode(b"", final=True)
    if text:
        state.replaced += text.count("\ufffd")
        yield text.encode("utf-8")


def _drain(items: list[bytes]) -> Iterator[bytes]:
    while items:
        yield items.pop()


def _file_head(url: str) -> bytes:
    """The first decompressed bytes of a dump file (its BOM or declaration)."""
    chunks = _file_chunks(url)
    try:
        return next(chunks, b"")[:SNIFF_BYTES]
    except (OSError, EOFError, ValueError):
        return b""
    finally:
        chunks.close()


# -- the page scanner --------------------------------------------------------------------------
def scan_pages(
    chunks: Iterable[bytes], url: str, max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES, part: int = 0, parts: int = 1
) -> Iterator[Page | ReadEvent]:
    """Pages and events from a stream of dump bytes; see the module docstring.

    With ``parts > 1`` only every ``parts``-th page from the ``part``-th (0-based; a page event
    counts as a page) is parsed and yielded, and file events only for part 0: ``parts`` readers
    of one file that cannot be split (a single-stream ``.bz2``) share its pages between them
    without moving page text between workers, and together yield exactly what one reader does.

    ``buf[pos:]`` is the unconsumed data (``pos`` moves, the buffer is compacted once per chunk,
    so each byte is copied a bounded number of times); ``offset`` is ``buf[0]``'s position in
    the decompressed stream, for messages.
    """
    buf = b""
    pos = 0
    in_page = False
    skipping: tuple[str, str, str] | None = None  # (id, title, sample) of a page over the limit
    scan_from = 0  # where to resume searching (absolute index in buf)
    offset = 0
    received = False
    total = 0  # decompressed bytes met
    chunks = iter(chunks)
    ordinal = -1  # of the last page met

    def mine() -> bool:
        nonlocal ordinal
        ordinal += 1
        return ordinal % parts == part

    def info(end: int) -> tuple[str, str, str]:
        if skipping:
            return skipping
        page_id, title = _head_info(buf[pos : pos + 4096])
        return page_id, title, _sample(buf[pos:end])

    while True:
        try:
            data = next(chunks, None)
        except (OSError, EOFError, ValueError) as exc:
            if not received:
                if part == 0:
                    yield ReadEvent("file", "unreadable_file", url, "", "", f"{type(exc).__name__}: {exc}")
                return
            if in_page and mine():
                page_id, title, sample = info(len(buf))
                yield ReadEvent(
                    "page",
                    "truncated_page",
                    url,
                    page_id,
                    title,
                    f"page cut by the end of the readable data: {exc}",
                    sample,
                )
            if part == 0:
                yield ReadEvent(
                    "file",
                    "truncated_file",
                    url,
                    "",
                    "",
                    f"unreadable after byte {offset + len(buf)} of the decompressed data: {type(exc).__name__}: {exc}",
                )
            return
        if data is None:
            break
        received = True
        total += len(data)
        # compact: drop what is consumed (and, outside a page, all but a possible partial tag)
        keep_from = pos if in_page and not skipping else max(pos, len(buf) - len(_CLOSE))
        offset += keep_from
        scan_from = max(0, scan_from - keep_from)
        buf = buf[keep_from:] + data
        pos = 0
        while True:
            if not in_page:
                k = buf.find(_OPEN, max(pos, scan_from))
                if k < 0:
                    pos = max(pos, len(buf) - len(_OPEN) + 1)
                    scan_from = pos
                    break
                pos = k
                in_page = True
                scan_from = k + len(_OPEN)
                continue
            close = buf.find(_CLOSE, scan_from)
            reopen = buf.find(_OPEN, scan_from, close if close >= 0 else len(buf))
            if reopen >= 0:
                # A <page> never closed before the next one: reject it, resynchronise.
                if mine():
                    page_id, title, sample = info(reopen)
                    yield ReadEvent(
                        "page",
                        "unclosed_page",
                        url,
                        page_id,
                        title,
                        f"<page> at byte {offset + pos} not closed before the next <page>",
                        sample,
                    )
                skipping = None
                pos = reopen
                scan_from = reopen + len(_OPEN)
                continue
            if close >= 0:
                end = close + len(_CLOSE)
                if not mine():
                    pass
                elif skipping:
                    page_id, title, sample = skipping
                    yield ReadEvent(
                        "page",
                        "page_too_large",
                        url,
                        page_id,
                        title,
                        f"page larger than {max_page_bytes} bytes (max_page_bytes)",
                        sample,
                    )
                else:
                    yield from _parse_page(buf[pos:end], url, offset + pos)
                skipping = None
                pos = end
                in_page = False
                scan_from = end
                continue
            # no end in sight: keep reading, bounded
            if not skipping and len(buf) - pos > max_page_bytes:
                skipping = info(len(buf))
            scan_from = max(scan_from, len(buf) - len(_CLOSE) + 1)
            if skipping:
                pos = scan_from  # forget the page's bytes; only look for its end
            break
    if in_page and mine():
        page_id, title, sample = info(len(buf))
        yield ReadEvent(
            "page", "truncated_page", url, page_id, title, "<page> not closed at the end of the file", sample
        )
    if ordinal < 0 and received and part == 0:
        yield ReadEvent(
            "file",
            "no_pages",
            url,
            "",
            "",
            f"no <page> element in its {total} bytes: not a MediaWiki export, or compressed in a form not read "
            "(.bz2 and .gz are)",
            _sample(buf[:2000]),
        )


def _parse_page(data: bytes, url: str, offset: int) -> Iterator[Page | ReadEvent]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        text = data.decode("utf-8", "replace")
        page_id, title = _head_info(data[:4096])
        yield ReadEvent(
            "note", "invalid_utf8", url, page_id, title, f"invalid UTF-8 at byte {offset + exc.start} replaced"
        )
    try:
        elem = ET.fromstring(text)
        yield page_from_element(elem, url)
    except ET.ParseError as exc:
        line, col = getattr(exc, "position", (None, None))
        page_id, title = _head_info(data[:4096])
        yield ReadEvent(
            "page",
            "malformed_xml",
            url,
            page_id,
            title,
            f"malformed XML in the page at byte {offset} (line {line}, column {col} of the page): {exc}",
            _sample(data),
        )
    except CorpusReadError as exc:
        page_id, title = _head_info(data[:4096])
        yield ReadEvent("page", "malformed_page", url, page_id, title, str(exc), _sample(data))


def iter_wiki(
    url: str,
    start: int | None = None,
    end: int | None = None,
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES,
    part: int = 0,
    parts: int = 1,
    reader: str = "thread",
) -> Iterator[Page | ReadEvent]:
    """Every page of a dump file (or of the bz2 streams in bytes [start, end) of a multistream
    file) and every event, in file order; with ``parts > 1``, the share of reader ``part`` (see
    :func:`scan_pages`). Never raises on bad content; an input that cannot be opened at all
    yields one ``unreadable_file`` event.

    ``reader``: "thread" decompresses on a second thread, "inline" in this one (one core); the
    same items either way (:func:`pipeline.corpus.wiki_reader.read_wiki` adds "process")."""
    # indexed_bzip2's decoder holds the GIL: only where nothing is to overlap it
    chunks = _file_chunks(url, reader != "thread") if start is None else _range_chunks(url, start, end)
    state = Transcoding()
    chunks = utf8_chunks(chunks, state, _file_head(url) if start else None)  # UTF-8: untouched
    if reader == "thread" and (start is not None or url.lower().endswith((".bz2", ".gz"))):
        chunks = prefetched(chunks)  # decompression on a second core; a plain file is cheap to read
    yield from scan_pages(chunks, url, max_page_bytes, part, parts)
    if state.encoding != "utf-8" and part == 0:
        detail = f"read as {state.encoding}, transcoded to UTF-8"
        if state.replaced:
            detail += f"; {state.replaced} undecodable byte sequences replaced (U+FFFD)"
        yield ReadEvent("note", "wiki_reencoded", url, "", "", detail)


def iter_pages(url: str) -> Iterator[Page]:
    """Stream the pages of a MediaWiki export (``.xml`` or compressed), in file order.

    Strict: raises CorpusReadError naming the file, the page and the fault at the first rejected
    page or file fault (pages before it have been yielded). The corpus job uses
    :func:`iter_wiki`, which reports those as events and goes on.
    """
    for item in iter_wiki(url):
        if isinstance(item, Page):
            yield item
        elif item.kind != "note":
            named = f" page {item.title!r} (id {item.record_id})" if item.record_id else ""
            raise CorpusReadError(f"{url}:{named} {item.reason}: {item.detail}", item.reason)


# -- multistream splitting ---------------------------------------------------------------------
def index_url(dump_url: str) -> str | None:
    """The index file name of a multistream dump part, or None for other dumps.

    ``…-multistream.xml.bz2`` -> ``…-multistream-index.txt.bz2``;
    ``…-multistream3.xml-p1p41242.bz2`` -> ``…-multistream-index3.txt-p1p41242.bz2``.
    """
    head, sep, name = dump_url.rpartition("/")
    if not name.endswith(".bz2") or not _MULTISTREAM.search(name):
        return None
    return head + sep + _MULTISTREAM.sub(lambda m: f"multistream-index{m.group(1)}.txt", name, 1)


def stream_offsets(index: str) -> list[int]:
    """Sorted distinct stream offsets of a multistream index (``offset:page_id:title`` lines)."""
    offsets: set[int] = set()
    with fsspec.open(index, "rt", compression="infer", encoding="utf-8", errors="replace") as f:
        for line in f:
            head = line.split(":", 1)[0]
            if head.isdigit():
                offsets.add(int(head))
    return sorted(offsets)


def plan_reads(url: str, split_bytes: int) -> list[tuple[str, int | None, int | None]]:
    """Units of read work for one dump file: (url, start, end) byte ranges of whole bz2 streams
    of about ``split_bytes`` each when the file is a multistream dump with its index beside it,
    else one unit (url, None, None) for the whole file."""
    idx = index_url(url)
    if idx is None or split_bytes <= 0:
        return [(url, None, None)]
    fs, path = fsspec.core.url_to_fs(idx)
    if not fs.exists(path):
        return [(url, None, None)]
    dfs, dpath = fsspec.core.url_to_fs(url)
    size = dfs.size(dpath)
    offsets = [o for o in stream_offsets(idx) if 0 < o < size]
    units = []
    start = 0
    for o in offsets:
        if o - start >= split_bytes:
            units.append((url, start, o))
            start = o
    units.append((url, start, size))
    return units
