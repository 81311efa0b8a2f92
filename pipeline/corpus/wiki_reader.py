"""A dump read by a child process: decompression, page scanning and XML parsing beside the cleaning.

:func:`pipeline.corpus.wiki.iter_wiki` reads in the worker's own process, its decompression on a
second thread. Scanning for pages and parsing each page's XML hold the GIL, so with a thread they
stay on the cleaning's core: ~0.55 CPU-seconds per 20 MB of XML of the ~5.5 that one worker
spends (measured). wikiextractor gives them a process of its own; so can we.

The choice: :func:`iter_wiki_in_child` runs ``python -m pipeline.corpus.wiki_reader`` (a fresh process,
not a fork: the worker may hold threads and gRPC channels) that calls ``iter_wiki`` and writes
every page and event, in file order, as pickled batches of plain tuples to its stdout; the
worker unpickles them (~0.1 s per 50 MB). The same items come out in the same order, so the
output does not change. Memory: the child holds one batch (:data:`BATCH_BYTES` of page text,
or one page up to ``max_page_bytes``) plus the pipe.

When: only where the worker has a core to spare for it (:func:`wiki_reader_mode`: local runners,
at least two cores per worker); on one core a second process costs more than it saves, and
there even the decompression thread is left out (measured: 10% faster pinned to one core), as
it is where local workers have a core each (the decoder is then ``indexed_bzip2``'s).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator

from pipeline.corpus.records import Page, ReadEvent
from pipeline.corpus.wiki import DEFAULT_MAX_PAGE_BYTES, iter_wiki, plan_reads
from pipeline.runtime import economical_gc

log = logging.getLogger("bertflow.corpus")

BATCH_BYTES = 256 << 10
"""Page text the child gathers before it writes one batch."""
_HEADER = 8


def available_cores() -> int:
    """Cores this process may run on (its affinity), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def wiki_reader_mode(mode: str, runner: str, workers: int) -> str:
    """The way a worker reads a dump: ``mode`` unless "auto"; then "process" for a local runner
    with at least two cores per worker, "inline" (no thread) for a local runner with at most
    one core per worker or on one core, else "thread" (decompression on a second thread).

    Inline, a whole ``.bz2`` dump is decoded by ``indexed_bzip2`` (which holds the GIL; a thread
    would only wait for it): measured on the real enwiki dump x10 at two workers on two cores,
    8.6 against 9.2 CPU-s with the stdlib's decoder on a thread, wall 6.4 against 6.6 s."""
    if mode != "auto":
        return mode
    cores = available_cores()
    local = runner in ("FnApiRunner", "DirectRunner")
    if local and cores >= 2 * max(1, workers):
        return "process"
    if cores < 2 or (local and cores <= max(1, workers)):
        return "inline"
    return "thread"


def _encode(item: Page | ReadEvent) -> tuple:
    if isinstance(item, Page):
        return (0, item.page_id, item.title, item.ns, item.redirect, item.text)
    return (1, item.kind, item.reason, item.url, item.record_id, item.title, item.detail, item.sample)


def _decode(t: tuple) -> Page | ReadEvent:
    if t[0] == 0:
        return Page(page_id=t[1], title=t[2], ns=t[3], redirect=t[4], text=t[5])
    return ReadEvent(*t[1:])


def read_wiki(
    url: str,
    start: int | None = None,
    end: int | None = None,
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES,
    part: int = 0,
    parts: int = 1,
    reader: str = "thread",
) -> Iterator[Page | ReadEvent]:
    """The pages and events of :func:`pipeline.corpus.wiki.iter_wiki`, read the way ``reader``
    says: "process" in a child process (:func:`iter_wiki_in_child`), "thread" or "inline" here."""
    if reader == "process":
        return iter_wiki_in_child(url, start, end, max_page_bytes, part, parts)
    return iter_wiki(url, start, end, max_page_bytes, part, parts, reader)


def iter_wiki_in_child(
    url: str,
    start: int | None = None,
    end: int | None = None,
    max_page_bytes: int | None = None,
    part: int = 0,
    parts: int = 1,
) -> Iterator[Page | ReadEvent]:
    """What :func:`pipeline.corpus.wiki.iter_wiki` yields for the same arguments, read by a child
    process. Raises RuntimeError naming the file if the child dies before the end."""
    import pipeline

    root = os.path.dirname(os.path.dirname(os.path.abspath(pipeline.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    args = json.dumps([url, start, end, max_page_bytes, part, parts])
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.corpus.wiki_reader", args],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        bufsize=0,  # read with os.read (read_exactly), never through a buffer
        env=env,
    )
    finished = False
    try:
        fd = proc.stdout.fileno()
        while True:
            head = read_exactly(fd, _HEADER)
            if len(head) < _HEADER:
                break
            size = int.from_bytes(head, "big")
            if size == 0:
                finished = True
                break
            data = read_exactly(fd, size)
            if len(data) < size:
                break
            for t in pickle.loads(data):
                yield _decode(t)
    finally:
        if not finished and proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        code = proc.wait()
    if not finished:
        raise RuntimeError(f"the reader process of {url} ended before the end of the file (exit code {code})")


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the pipe ``fd``, a partial write at a time. Python's buffered
    ``sys.stdout.buffer.write`` of a batch larger than its buffer lost bytes when the writer was
    stopped and continued mid-write (SIGSTOP and SIGCONT; a profiler's ptrace stops do the same:
    measured on CPython 3.11, 5-7 MiB of 20 lost), and the reader met slipped frames
    (``UnicodeDecodeError`` in the unpickling, or the end taken for a dead reader)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_exactly(fd: int, size: int) -> bytes:
    """``size`` bytes from the pipe ``fd``, fewer only at its end (a read may return part)."""
    parts, got = [], 0
    while got < size:
        part = os.read(fd, min(size - got, 1 << 20))
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _main(argv: list[str]) -> int:
    economical_gc()
    url, start, end, max_page_bytes, part, parts = json.loads(argv[0])
    fd = sys.stdout.fileno()
    batch: list[tuple] = []
    held = 0

    def flush() -> None:
        nonlocal batch, held
        data = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        write_all(fd, len(data).to_bytes(_HEADER, "big") + data)
        batch, held = [], 0

    for item in iter_wiki(url, start, end, max_page_bytes or DEFAULT_MAX_PAGE_BYTES, part, parts, reader="inline"):
        batch.append(_encode(item))
        held += len(item.text) if isinstance(item, Page) else len(item.sample)
        if held >= BATCH_BYTES:
            flush()
    if batch:
        flush()
    write_all(fd, (0).to_bytes(_HEADER, "big"))  # the end: anything short of it is a failure
    return 0


# -- the wiki source's row: planning, reader and paragraphs (pipeline.corpus.sources) -------------
def plan(url: str, config) -> list[tuple[str, int | None, int | None]]:
    """A dump file's units: ranges of whole bz2 streams of about ``corpus.split_bytes`` each."""
    return plan_reads(url, config.split_bytes)


def paragraphs(text: str, config) -> list[str]:
    """A page's wikitext cleaned to paragraphs."""
    from pipeline.corpus.wikitext import clean_wikitext  # here: the reader child needs none of it

    return clean_wikitext(text)


def read_unit(dofn, unit):
    """A dump file or a range of it: article records; other pages and faults are rejects."""
    from pipeline.corpus.documents import page_record  # here: the reader child needs none of it

    _, url, start, end, part, parts = unit
    config = dofn.config
    read = 0
    reader = wiki_reader_mode(config.wiki_reader, config.beam.runner, config.beam.num_workers)
    for item in read_wiki(url, start, end, config.max_page_bytes, part, max(parts, 1), reader):
        if isinstance(item, Page):
            read += 1
            record, reason = page_record(item)
            if reason:
                dofn.reject(
                    "wiki", reason, record_id=f"wiki:{item.page_id}", title=item.title, url=url, sample=item.text
                )
            else:
                yield record
            continue
        if item.kind == "note":
            dofn.count(item.reason)
            continue
        if item.kind == "page":
            read += 1
        else:
            log.error("corpus: %s in %s: %s", item.reason, url, item.detail)
        rid = f"wiki:{item.record_id}" if item.record_id else ""
        dofn.reject(
            "wiki", item.reason, record_id=rid, title=item.title, url=url, detail=item.detail, sample=item.sample
        )
    return read


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
