"""Bad input never crashes the reader and costs only what is unreadable, in bounded memory."""

import bz2
import tracemalloc

import pytest

from pipeline.corpus.inputs import is_wiki_file
from pipeline.corpus.records import Page, ReadEvent
from pipeline.corpus.wiki import index_url, iter_wiki, plan_reads, stream_offsets
from synth.dumps import (
    FOOTER,
    HEADER,
    huge_page,
    page_xml,
    pages_xml,
    stream_ends,
    write_dump,
    write_multistream,
)


def split(items):
    pages = [i for i in items if isinstance(i, Page)]
    events = [i for i in items if isinstance(i, ReadEvent)]
    return pages, events


def ids(pages):
    return [int(p.page_id) for p in pages]


def peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_truncated_bz2_keeps_every_page_before_the_cut(tmp_path):
    path, _ = write_multistream(tmp_path / "w-multistream.xml.bz2", pages_xml(200), per_stream=20)
    ends = stream_ends(path)  # header, 10 streams of 20 pages, footer
    data = path.read_bytes()
    cut = tmp_path / "cut.xml.bz2"
    cut.write_bytes(data[: (ends[5] + ends[6]) // 2])  # inside the 6th stream of pages
    pages, events = split(list(iter_wiki(str(cut))))
    assert ids(pages) == list(range(1, 101))  # the 5 whole streams before the cut
    assert [e.reason for e in events] == ["truncated_file"]
    assert "TruncatedInput" in events[0].detail and "ended inside a stream" in events[0].detail


def test_malformed_page_and_invalid_utf8_resynchronise(tmp_path):
    pages = pages_xml(50)
    pages[10] = pages[10].replace("<ns>0</ns>", "<ns>0</nss>")  # malformed XML
    pages[20] = pages[20].replace("&amp;", "&bogus;")  # undefined entity
    raw = (HEADER + "".join(pages) + FOOTER).encode()
    bad = raw.replace(b"Thing 31</title>", b"Thing 31\xff\xfe</title>")  # invalid UTF-8
    path = tmp_path / "bad.xml"
    path.write_bytes(bad)
    got, events = split(list(iter_wiki(str(path))))
    assert ids(got) == [i for i in range(1, 51) if i != 11]
    assert [(e.kind, e.reason, e.record_id) for e in events] == [
        ("page", "malformed_xml", "11"),
        ("note", "invalid_utf8", "31"),
    ]
    assert got[29].title == "Thing 31\ufffd\ufffd"  # the bad bytes replaced, the page kept


def test_stray_unclosed_page_costs_one_page_and_no_memory(tmp_path):
    pages = pages_xml(3000, words=60)
    clean = write_dump(tmp_path / "clean.xml", pages)
    stray = list(pages)
    stray[5] = stray[5].split("<revision>")[0]  # <page> ... never closed
    broken = write_dump(tmp_path / "stray.xml", stray)
    got, events = split(list(iter_wiki(str(broken))))
    assert ids(got) == [i for i in range(1, 3001) if i != 6]
    assert [(e.reason, e.record_id, e.title) for e in events] == [("unclosed_page", "6", "Thing 6")]
    peak_clean = peak_bytes(lambda: sum(1 for _ in iter_wiki(str(clean))))
    peak_stray = peak_bytes(lambda: sum(1 for _ in iter_wiki(str(broken))))
    assert peak_stray < 2 * peak_clean + (1 << 20)


def test_unclosed_page_at_end_and_empty_and_markup_only(tmp_path):
    path = tmp_path / "end.xml"
    path.write_text(HEADER + page_xml(1, "A", "Text.") + "<page><title>Cut</title><ns>0</ns>")
    got, events = split(list(iter_wiki(str(path))))
    assert ids(got) == [1] and [(e.reason, e.title) for e in events] == [("truncated_page", "Cut")]
    empty = tmp_path / "empty.xml"
    empty.write_bytes(b"")
    assert list(iter_wiki(str(empty))) == []
    not_bz2 = tmp_path / "junk.xml.bz2"
    not_bz2.write_bytes(b"this is not bzip2 data at all")
    assert [e.reason for e in iter_wiki(str(not_bz2))] == ["unreadable_file"]
    assert [e.reason for e in iter_wiki(str(tmp_path / "missing.xml"))] == ["unreadable_file"]


def _write_huge(path, mbytes):
    with open(path, "wb") as f:
        f.write((HEADER + page_xml(1, "Before", "Prose before.")).encode())
        for piece in huge_page(2, mbytes):
            f.write(piece)
        f.write((page_xml(3, "After", "Prose after.") + FOOTER).encode())


def test_fifty_megabyte_page_is_skipped_in_bounded_memory(tmp_path):
    path = tmp_path / "huge.xml"
    _write_huge(path, 50)
    items = []
    peak = peak_bytes(lambda: items.extend(iter_wiki(str(path), max_page_bytes=1 << 20)))
    got, events = split(items)
    assert [p.title for p in got] == ["Before", "After"]
    assert [(e.reason, e.record_id, e.title) for e in events] == [("page_too_large", "2", "Huge 2")]
    assert events[0].sample.startswith("<page>") or "Huge 2" in events[0].sample
    assert peak < 8 << 20  # the limit plus a read chunk or two, never the 50 MB page


def test_memory_is_flat_in_dump_size(tmp_path):
    # the small dump is large enough to fill the reader thread's prefetch window (4 x 256 KiB)
    small = write_dump(tmp_path / "small.xml.bz2", pages_xml(4000, words=60))
    big = write_dump(tmp_path / "big.xml.bz2", pages_xml(16000, words=60))
    peak_small = peak_bytes(lambda: sum(1 for _ in iter_wiki(str(small))))
    peak_big = peak_bytes(lambda: sum(1 for _ in iter_wiki(str(big))))
    # the bound is flat: how full the reader thread's window happens to be (up to its queue, one
    # chunk being made and one being read) is scheduling, not dump size; the big dump is ~8 MB of XML
    from pipeline.corpus.compressed import CHUNK
    from pipeline.corpus.wiki import PREFETCH_CHUNKS

    assert peak_big < peak_small + (PREFETCH_CHUNKS + 2) * CHUNK
    assert big.stat().st_size > 4 * small.stat().st_size * 0.9


def test_multistream_ranges_read_every_page_once(tmp_path):
    path, index = write_multistream(
        tmp_path / "enwiki-20261101-pages-articles-multistream.xml.bz2", pages_xml(230), per_stream=20
    )
    assert index_url(str(path)) == str(index)
    assert index_url("x/enwiki-1-pages-articles-multistream3.xml-p1p41242.bz2") == (
        "x/enwiki-1-pages-articles-multistream-index3.txt-p1p41242.bz2"
    )
    assert index_url("x/enwiki-1-pages-articles.xml.bz2") is None
    offsets = stream_offsets(str(index))
    assert len(offsets) == 12 and offsets[0] == stream_ends(path)[0]
    units = plan_reads(str(path), split_bytes=1)  # every stream its own unit
    assert len(units) == 13  # the header stream, 12 page streams (the footer rides with the last)
    units = plan_reads(str(path), split_bytes=path.stat().st_size // 4)
    assert 3 <= len(units) <= 5
    assert units[0][1] == 0 and units[-1][2] == path.stat().st_size
    assert all(a[2] == b[1] for a, b in zip(units, units[1:]))  # contiguous, no gap or overlap
    got = []
    for url, start, end in units:
        pages, events = split(list(iter_wiki(url, start, end)))
        assert events == []
        got += ids(pages)
    assert got == list(range(1, 231))
    assert plan_reads(str(path), split_bytes=0) == [(str(path), None, None)]


def test_multistream_range_with_a_corrupt_stream(tmp_path):
    path, _ = write_multistream(tmp_path / "w-multistream.xml.bz2", pages_xml(60), per_stream=20)
    ends = stream_ends(path)
    data = bytearray(path.read_bytes())
    mid = (ends[1] + ends[2]) // 2  # inside the 2nd page stream
    data[mid : mid + 8] = b"\x00" * 8
    path.write_bytes(bytes(data))
    got, events = split(list(iter_wiki(str(path), ends[2], len(data))))
    assert ids(got) == list(range(41, 61))  # the next range is untouched
    got, events = split(list(iter_wiki(str(path), 0, ends[2])))
    assert ids(got) == list(range(1, 21)) and events[-1].reason == "truncated_file"


@pytest.mark.parametrize(
    "name, ok",
    [
        ("enwiki-20261101-pages-articles.xml.bz2", True),
        ("enwiki-20261101-pages-articles-multistream3.xml-p1p41242.bz2", True),
        ("enwiki-20261101-pages-articles1.xml-p1p41242.bz2", True),
        ("dump.xml", True),
        ("enwiki-20261101-pages-articles-multistream-index.txt.bz2", False),
        ("notes.md", False),
    ],
)
def test_is_wiki_file(name, ok):
    assert is_wiki_file(name) is ok


def test_bz2_of_a_single_page_dump_reads(tmp_path):
    path = tmp_path / "one.xml.bz2"
    path.write_bytes(bz2.compress((HEADER + page_xml(7, "Only", "Text here.") + FOOTER).encode()))
    assert [p.title for p in iter_wiki(str(path))] == ["Only"]


def test_prefetched_chunks_are_the_same_and_faults_arrive_in_place():
    from pipeline.corpus.wiki import prefetched

    def chunks(fail_at=None):
        for i in range(50):
            if i == fail_at:
                raise EOFError("cut")
            yield bytes([i]) * 1000

    assert list(prefetched(chunks(), depth=2)) == list(chunks())
    got = []
    with pytest.raises(EOFError, match="cut"):
        for c in prefetched(chunks(fail_at=30), depth=2):
            got.append(c)
    assert got == list(chunks())[:30]  # every chunk before the fault, then the fault
    it = prefetched(chunks(), depth=2)
    assert next(it) == bytes([0]) * 1000
    it.close()  # a reader that stops early stops the thread


def test_readers_sharing_one_file_together_read_it_exactly_once(tmp_path):
    pages = pages_xml(200, words=30)
    pages[7] = pages[7].replace("<ns>0</ns>", "<ns>0</nss>")  # malformed XML
    pages[12] = pages[12].split("<revision>")[0]  # never closed
    pages[20] = pages[20].replace("Thing 21</title>", "Thing 21 &#1;</title>")
    pages[30] = pages[30].replace("</text>", "x" * 300_000 + "</text>")  # over max_page_bytes
    full, _ = write_multistream(tmp_path / "w-multistream.xml.bz2", pages, per_stream=20)
    ends = stream_ends(full)
    path = tmp_path / "cut.xml.bz2"
    path.write_bytes(full.read_bytes()[: (ends[5] + ends[6]) // 2])  # truncated in stream 6
    whole = list(iter_wiki(str(path), max_page_bytes=4096))
    for parts in (2, 3):
        shares = [list(iter_wiki(str(path), max_page_bytes=4096, part=k, parts=parts)) for k in range(parts)]
        assert sorted(map(repr, sum(shares, []))) == sorted(map(repr, whole))
        assert all(shares)  # every reader got pages
        file_events = [[e for e in s if isinstance(e, ReadEvent) and e.kind == "file"] for s in shares]
        assert [len(f) for f in file_events] == [1] + [0] * (parts - 1)  # truncated_file, once
    reasons = {e.reason for e in whole if isinstance(e, ReadEvent)}
    assert {"malformed_xml", "unclosed_page", "page_too_large", "truncated_file"} <= reasons
