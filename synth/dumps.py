"""Dump fixtures in the real formats, good and bad: multistream ``.bz2`` with its index, and the
faults a reader meets on real inputs (cut archives, malformed pages, invalid UTF-8, stray
``<page>``, huge pages). Tests and benchmarks build their inputs from these; nothing here is
written to ``data/sample/``.
"""

from __future__ import annotations

import bz2
from collections.abc import Iterable
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

HEADER = (
    '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11" xml:lang="en">\n'
    "  <siteinfo>\n    <sitename>Wikipedia</sitename>\n  </siteinfo>\n"
)
FOOTER = "</mediawiki>\n"


def page_xml(page_id: int, title: str, text: str, ns: int = 0, redirect: str | None = None) -> str:
    """One ``<page>`` element as a dump writes it (text escaped, ids of page and revision)."""
    red = f"    <redirect title={quoteattr(redirect)} />\n" if redirect else ""
    return (
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{page_id}</id>\n"
        f"{red}    <revision>\n      <id>{page_id * 10 + 7}</id>\n"
        f'      <text bytes="{len(text.encode())}" xml:space="preserve">{escape(text)}</text>\n'
        "    </revision>\n  </page>\n"
    )


def article(i: int, words: int = 120) -> str:
    """Wikitext of a small article with the usual markup (templates, refs, links, a table)."""
    body = " ".join(f"word{(i * 7 + k) % 97}" for k in range(words))
    return (
        f"{{{{Infobox thing|name=Thing {i}|size={{{{convert|{i}|km}}}}}}}}\n"
        f"'''Thing {i}''' is a [[thing|Thing]] in [[Place {i % 13}]].<ref>{{{{cite web|url=x}}}}</ref> "
        f"It has {body}.\n\nThe second paragraph of thing {i} is here. It ends well.\n"
        "{| class=wikitable\n| a || b\n|}\n== See also ==\n* [[Other]]\n[[Category:Things]]"
    )


def pages_xml(n: int, start: int = 1, words: int = 120) -> list[str]:
    return [page_xml(i, f"Thing {i}", article(i, words)) for i in range(start, start + n)]


def write_dump(path: Path, pages: Iterable[str], compress: bool | None = None) -> Path:
    """A whole dump (header, pages, footer); bz2 when the name ends with .bz2."""
    data = (HEADER + "".join(pages) + FOOTER).encode("utf-8")
    path.write_bytes(bz2.compress(data) if (compress or str(path).endswith(".bz2")) else data)
    return path


def write_multistream(path: Path, pages: list[str], per_stream: int = 100) -> tuple[Path, Path]:
    """A multistream dump as Wikimedia writes it: the header in its own bz2 stream, then one
    stream per ``per_stream`` pages, then the footer; and the index beside it
    (``offset:page_id:title`` per page, bz2). ``path`` should end with
    ``-multistream.xml.bz2``. Returns (dump, index)."""
    streams = [bz2.compress(HEADER.encode())]
    index_lines = []
    offset = len(streams[0])
    for k in range(0, len(pages), per_stream):
        group = pages[k : k + per_stream]
        for p in group:
            pid = p.split("<id>", 1)[1].split("</id>", 1)[0]
            title = p.split("<title>", 1)[1].split("</title>", 1)[0]
            index_lines.append(f"{offset}:{pid}:{title}\n")
        data = bz2.compress("".join(group).encode("utf-8"))
        streams.append(data)
        offset += len(data)
    streams.append(bz2.compress(FOOTER.encode()))
    path.write_bytes(b"".join(streams))
    index = Path(str(path).replace("multistream.xml", "multistream-index.txt"))
    index.write_bytes(bz2.compress("".join(index_lines).encode("utf-8")))
    return path, index


def stream_ends(path: Path) -> list[int]:
    """Byte offsets where each bz2 stream of a multistream file ends."""
    data = path.read_bytes()
    ends, pos = [], 0
    while pos < len(data):
        dec = bz2.BZ2Decompressor()
        dec.decompress(data[pos:])
        pos = len(data) - len(dec.unused_data)
        ends.append(pos)
    return ends


def huge_page(page_id: int, mbytes: int) -> Iterable[bytes]:
    """A page of ``mbytes`` MB of text, in 1 MB pieces (never held whole)."""
    yield (
        f"  <page>\n    <title>Huge {page_id}</title>\n    <ns>0</ns>\n    <id>{page_id}</id>\n"
        '    <revision><text xml:space="preserve">'
    ).encode()
    piece = ("Huge prose here. " * 61681)[: 1 << 20].encode()
    for _ in range(mbytes):
        yield piece
    yield b"</text></revision>\n  </page>\n"
