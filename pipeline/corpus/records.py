"""The records the corpus readers yield: pages, books, long lines, events, and the read error."""

from __future__ import annotations

import dataclasses


class CorpusReadError(RuntimeError):
    """A raw input file or record could not be read or parsed; the message names it."""

    def __init__(self, message: str, reason: str = "unreadable_file"):
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class ReadEvent:
    """Something a reader met besides a good record, in file order.

    kind "page": a record read and rejected (it counts as read); "file": a fault of the file
    itself (truncated, unreadable: no record); "note": a repair, the record was kept.
    """

    kind: str
    reason: str
    url: str
    record_id: str
    title: str
    detail: str
    sample: str = ""


@dataclasses.dataclass(frozen=True)
class Page:
    """One page of a MediaWiki export (its latest revision)."""

    page_id: str
    title: str
    ns: int
    redirect: str | None  # the redirect target, or None for a real page
    text: str


@dataclasses.dataclass
class LongLine:
    """A line longer than ``corpus.max_line_bytes``, skipped unread: its number, its size in bytes
    (as far as it was counted) and its first bytes."""

    number: int
    size: int
    head: bytes

    def sample(self) -> str:
        return self.head.decode("utf-8", "replace")[:1000]

    def detail(self, limit: int) -> str:
        return f"line {self.number}: {self.size} bytes, over corpus.max_line_bytes={limit}; skipped unread"


@dataclasses.dataclass(frozen=True)
class Book:
    """One book: a text file, decoded."""

    name: str  # file stem, the stable id
    title: str
    text: str
    url: str
    encoding: str = "utf-8"  # as read; another one was detected
    long_lines: tuple[LongLine, ...] = ()  # lines left out, unread (over corpus.max_line_bytes)
