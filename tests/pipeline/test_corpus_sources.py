"""The corpus stage on inputs it did not make: nothing silent (a source that yields nothing fails
naming why), dumps in other XML encodings, the text source (JSONL, Parquet, datasets folders),
lines of any length, control characters anywhere. Every input is written here, in its real format."""

import bz2
import dataclasses
import glob
import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.beam.config import BeamConfig
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.job import EmptySourceError, run_corpus
from pipeline.corpus.records import Page
from pipeline.corpus.text import iter_text_records
from pipeline.corpus.wiki import iter_wiki, sniff_encoding

REPO = Path(__file__).resolve().parents[2]
CFG = CorpusConfig(num_shards=1, beam=BeamConfig(num_workers=1))
PROSE = [
    "The harbour of Velmora opened in the spring of that year. Ships came from the south with salt.",
    "A winter storm closed the mountain road for a month. The village waited for the thaw.",
    "The old library keeps maps of every valley. Scholars travel far to read them.",
    "Farmers on the plain grow barley and beans. Their markets open at dawn on Fridays.",
]


def documents(out: Path, source: str) -> list[dict]:
    return sorted(pq.read_table(str(out / source)).to_pylist(), key=lambda r: r["doc_id"])


def rejects(out: Path) -> list[dict]:
    return pq.read_table(str(out / "rejects")).to_pylist()


# -- nothing silent ----------------------------------------------------------------------------
def test_a_books_file_of_long_unpunctuated_lines_fails_the_stage_naming_why(tmp_path):
    """One document per line, every line a run-on without sentence ends: all rejected. This used
    to end "done" with 0 documents."""
    books = tmp_path / "books"
    books.mkdir()
    line = " ".join(["word"] * 600)  # one 3,000-character "sentence": sentence_too_long, then too_few_sentences
    (books / "crawl.txt").write_text("\n".join(line for _ in range(50)) + "\n")
    cfg = dataclasses.replace(CFG, sources=("books",), books_layout="line_per_document")
    out = tmp_path / "out"
    with pytest.raises(EmptySourceError) as e:
        run_corpus(cfg, {"books": str(books)}, str(out))
    message = str(e.value)
    assert "the books source gave 0 documents" in message and "50 records read from 1 file(s)" in message
    assert "crawl.txt" in message and "too_few_sentences 50" in message and "sentence_too_long 50" in message
    assert "corpus.allow_empty_sources" in message
    assert not (out / "_manifest.json").exists()  # never "done"
    assert {r["reason"] for r in rejects(out)} == {"too_few_sentences"}  # kept with their samples
    allowed = run_corpus(dataclasses.replace(cfg, allow_empty_sources=True), {"books": str(books)}, str(out))
    assert allowed.counts["books_documents"] == 0 and allowed.counts["too_few_sentences"] == 50


@pytest.mark.parametrize("name", ["corpus.jsonl", "corpus.parquet"])
def test_a_jsonl_or_parquet_file_given_as_books_is_named_and_pointed_to_the_text_source(tmp_path, name):
    books = tmp_path / "books"
    books.mkdir()
    records = [{"id": i, "text": t} for i, t in enumerate(PROSE)]
    if name.endswith(".jsonl"):
        (books / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        pq.write_table(pa.Table.from_pylist(records), str(books / name))
    with pytest.raises(EmptySourceError, match=f"{name}.*(unsupported_file|binary_file) 1"):
        run_corpus(dataclasses.replace(CFG, sources=("books",)), {"books": str(books)}, str(tmp_path / "out"))
    [row] = rejects(tmp_path / "out")
    assert row["url"].endswith(name) and "read by the text source: data.text" in row["detail"]


# -- dumps in any XML encoding -----------------------------------------------------------------
def sample_export(pages: int = 40) -> str:
    """The bundled sample dump (the project's synthetic MediaWiki export), cut to ``pages`` pages."""
    xml = bz2.decompress(Path(sorted(glob.glob(str(REPO / "data/sample/wiki/*.xml.bz2")))[0]).read_bytes()).decode()
    head, _, rest = xml.partition("  <page>")
    kept = rest.split("  <page>")[:pages]
    return head + "".join("  <page>" + p for p in kept).split("</mediawiki>")[0] + "</mediawiki>\n"


def _bulgarian(xml: str) -> str:
    return re.sub(r'xml:lang="\w+"', 'xml:lang="bg"', xml, count=1)


@pytest.mark.parametrize(
    "name, encode",
    [
        ("le-bom.xml", lambda x: b"\xff\xfe" + ('<?xml version="1.0" encoding="UTF-16"?>\n' + x).encode("utf-16-le")),
        ("be-bom.xml.bz2", lambda x: bz2.compress(b"\xfe\xff" + x.encode("utf-16-be"))),
        (
            "le-nobom.xml.gz",
            lambda x: gzip.compress(('<?xml version="1.0" encoding="UTF-16"?>\n' + x).encode("utf-16-le")),
        ),
        ("utf32.xml", lambda x: x.encode("utf-32")),  # with its BOM
        ("utf8-bom.xml", lambda x: b"\xef\xbb\xbf" + x.encode()),
    ],
)
def test_a_dump_in_another_unicode_encoding_gives_the_pages_of_its_utf8_twin(tmp_path, name, encode):
    xml = _bulgarian(sample_export(30))
    (tmp_path / "twin.xml").write_bytes(xml.encode())
    (tmp_path / name).write_bytes(encode(xml))
    twin = [p for p in iter_wiki(str(tmp_path / "twin.xml")) if isinstance(p, Page)]
    got = list(iter_wiki(str(tmp_path / name)))
    assert len(twin) == 30 and [p for p in got if isinstance(p, Page)] == twin
    notes = [e.reason for e in got if not isinstance(e, Page)]
    assert notes == ([] if name.startswith("utf8") else ["wiki_reencoded"])


def test_a_declared_8bit_encoding_is_honoured_and_an_unknown_one_is_a_reject(tmp_path):
    page = (
        "  <page>\n    <title>Gdańsk</title>\n    <ns>0</ns>\n    <id>7</id>\n"
        "    <revision><text>Łódź ma rzekę. Wisła płynie.</text></revision>\n  </page>\n"
    )
    xml = '<?xml version="1.0" encoding="ISO-8859-2"?>\n<mediawiki xml:lang="pl">\n' + page + "</mediawiki>\n"
    (tmp_path / "pl.xml").write_bytes(xml.encode("iso-8859-2"))
    [item, note] = list(iter_wiki(str(tmp_path / "pl.xml")))
    assert item.title == "Gdańsk" and item.text == "Łódź ma rzekę. Wisła płynie." and note.reason == "wiki_reencoded"
    (tmp_path / "x.xml").write_bytes(xml.replace("ISO-8859-2", "x-unheard-of").encode("iso-8859-2"))
    [event] = list(iter_wiki(str(tmp_path / "x.xml")))
    assert event.kind == "file" and event.reason == "unreadable_file" and "x-unheard-of" in event.detail
    (tmp_path / "notes.xml").write_text("<notes><note>no pages in here</note></notes>\n")
    [event] = list(iter_wiki(str(tmp_path / "notes.xml")))
    assert event.reason == "no_pages" and "no <page> element" in event.detail  # never 0 pages and 0 rejects
    assert sniff_encoding(b'<?xml version="1.0" encoding="utf-8"?>') == ("utf-8", 0)
    assert sniff_encoding(" <\0p\0a\0g\0e\0>\0".encode("latin-1")) == ("utf-16-le", 0)  # a range mid-file


def test_a_utf16_export_runs_through_the_corpus_stage_like_its_utf8_twin(tmp_path):
    """The issue's case: BOM FF FE, UTF-16LE, <mediawiki ... xml:lang="bg">; 0 pages before."""
    xml = _bulgarian(sample_export(40))
    (tmp_path / "u8").mkdir()
    (tmp_path / "u16").mkdir()
    (tmp_path / "u8" / "bgwiki.xml").write_bytes(xml.encode())
    (tmp_path / "u16" / "bgwiki.xml").write_bytes(b"\xff\xfe" + xml.encode("utf-16-le"))
    cfg = dataclasses.replace(CFG, sources=("wiki",))
    a = run_corpus(cfg, {"wiki": str(tmp_path / "u8")}, str(tmp_path / "out8"))
    b = run_corpus(cfg, {"wiki": str(tmp_path / "u16")}, str(tmp_path / "out16"))
    assert a.counts["documents"] > 10
    assert documents(tmp_path / "out16", "wiki") == documents(tmp_path / "out8", "wiki")
    assert b.counts["wiki_read"] == a.counts["wiki_read"] == 40 and b.counts["wiki_reencoded"] == 1


# -- the text source ---------------------------------------------------------------------------
CODA = ["one", "two", "three", "four"]
RECORDS = [
    {
        "id": f"r{i}",
        "title": f"Doc {i}",
        "text": f"{PROSE[i]}\n\nRecord {CODA[i]} ends with words of its own. No other says so.",
    }
    for i in range(4)
]
BAD = [
    '{"id": "b1", "body": "no text field"}',
    '{"id": "b2", "text": null}',
    '{"id": "b3", "text": ["a", "list"]}',
    "[1, 2, 3]",
    "{not json",
]


def write_jsonl(path: Path, lines: list[str]) -> None:
    data = "".join(line + "\n" for line in lines).encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)


def write_dataset_folder(folder: Path, rows: list[dict], splits: tuple[str, ...] = ()) -> None:
    """A Hugging Face ``datasets`` folder as ``save_to_disk`` writes it: Arrow IPC *stream* files
    (``data-00000-of-00001.arrow``) beside ``dataset_info.json`` and ``state.json``; with
    ``splits``, a DatasetDict (``dataset_dict.json`` and one such folder per split)."""
    if splits:
        folder.mkdir(parents=True)
        (folder / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
        half = len(rows) // len(splits)
        for i, split in enumerate(splits):
            write_dataset_folder(folder / split, rows[i * half : (i + 1) * half])
        return
    folder.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=2):
                writer.write_batch(batch)
    (folder / "dataset_info.json").write_text(
        json.dumps({"features": {c: {"dtype": "string"} for c in table.schema.names}})
    )
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))


@pytest.mark.parametrize("name", ["c4.jsonl", "c4.jsonl.gz", "c4.jsonl.zst"])
def test_jsonl_records_are_documents_and_bad_records_are_named_rejects(tmp_path, name):
    folder = tmp_path / "text"
    folder.mkdir()
    write_jsonl(folder / name, [json.dumps(r) for r in RECORDS] + BAD + [json.dumps(RECORDS[0] | {"id": "zcopy"})])
    out = tmp_path / "out"
    m = run_corpus(dataclasses.replace(CFG, sources=("text",)), {"text": str(folder)}, str(out))
    docs = documents(out, "text")
    assert [d["doc_id"] for d in docs] == ["text:r0", "text:r1", "text:r2", "text:r3"]
    assert docs[1]["title"] == "Doc 1" and docs[1]["sentences"][0] == PROSE[1].split(". ")[0] + "."
    assert m.counts["text_read"] == 10 and m.counts["documents"] == 4  # read = documents + rejects
    assert m.counts["missing_text"] == 3 and m.counts["malformed_record"] == 2 and m.counts["duplicate_document"] == 1
    malformed = sorted(r["detail"] for r in rejects(out) if r["reason"] == "malformed_record")
    assert all(name in d for d in malformed)  # the file and the line of each
    assert "line 8: a JSON list, not an object" in malformed[0] and "line 9: not JSON" in malformed[1]
    details = " ".join(r["detail"] for r in rejects(out))
    assert "no 'text' field" in details and "text is a list" in details and "line 5: no" in details


def test_parquet_and_datasets_folders_with_configured_fields(tmp_path):
    rows = [{"doc": r["text"], "key": r["id"], "name": r["title"], "lang": "en"} for r in RECORDS]
    cfg = dataclasses.replace(
        CFG, sources=("text",), text_field="doc", text_id_field="key", text_title_field="name", dedup_paragraphs=False
    )
    export = tmp_path / "export" / "plain_text" / "train"  # the Hub's Parquet export layout
    export.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows[:2]), str(export / "0000.parquet"), row_group_size=1)
    pq.write_table(pa.Table.from_pylist(rows[2:]), str(export / "0001.parquet"))
    write_dataset_folder(tmp_path / "saved", rows)  # save_to_disk
    write_dataset_folder(tmp_path / "dict", rows, splits=("train", "test"))  # a DatasetDict
    results = {}
    for layout in ("export", "saved", "dict"):
        out = tmp_path / f"out-{layout}"
        m = run_corpus(cfg, {"text": str(tmp_path / layout)}, str(out))
        results[layout] = documents(out, "text")
        assert m.counts["text_read"] == 4 and m.counts["records_rejected"] == 0, layout  # metadata not records
    assert results["export"] == results["saved"] == results["dict"]
    assert [d["doc_id"] for d in results["saved"]] == ["text:r0", "text:r1", "text:r2", "text:r3"]
    assert results["saved"][2]["title"] == "Doc 2"
    # without the id and title fields: ids from the file and record number; a missing text column is named
    bare = tmp_path / "bare.parquet"
    pq.write_table(pa.Table.from_pylist([{"doc": r["text"]} for r in RECORDS]), str(bare))
    items = list(iter_text_records(str(bare), cfg))
    assert [i["doc_id"] for i in items] == [f"text:bare:{n:09d}" for n in range(1, 5)] and items[0]["title"] == ""
    with pytest.raises(Exception, match="no 'text' column"):
        list(iter_text_records(str(bare), CFG))


def test_text_records_stream_from_any_fsspec_filesystem():
    """``gs://`` goes through fsspec like ``memory://`` here (the GCS emulator run is the slow tier's)."""
    import fsspec

    with fsspec.open("memory://bucket/c4/part-0.jsonl.gz", "wb") as f:
        f.write(gzip.compress("".join(json.dumps(r) + "\n" for r in RECORDS).encode()))
    items = list(iter_text_records("memory://bucket/c4/part-0.jsonl.gz", CFG))
    assert [i["doc_id"] for i in items] == ["text:r0", "text:r1", "text:r2", "text:r3"]


def test_data_text_must_come_with_the_text_source():
    from flows.presets import load_config
    from flows.table import stage_inputs
    from pipeline.schema.config import ConfigError

    with pytest.raises(ConfigError, match="data.text: .*--set corpus.sources=wiki,books,text"):
        load_config("tiny", {"data.text": "/data/c4"})
    cfg = load_config("tiny", {"data.text": "/data/c4", "corpus.sources": "wiki,books,text"})
    assert stage_inputs("corpus", cfg, "/root")["text"] == "/data/c4"  # through the table
    assert "text" not in stage_inputs("corpus", load_config("tiny"), "/root")  # not given: left out


# -- lines of any length, control characters anywhere --------------------------------------------
def test_nul_and_control_bytes_past_the_first_64k_never_reach_the_corpus(tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    clean = "\n\n".join(PROSE * 200)  # ~70 KB of prose first: past the binary sniff
    dirty = "\n\n".join(f"Sentence {i} has a\x00 NUL in it. And a bell\x07 here too." for i in range(300))
    (books / "mixed.txt").write_bytes((clean + "\n\n" + dirty + "\n").encode())
    out = tmp_path / "out"
    m = run_corpus(dataclasses.replace(CFG, sources=("books",), dedup_sentences=False), {"books": str(books)}, str(out))
    sentences = [s for d in documents(out, "books") for s in d["sentences"]]
    assert any("NUL in it" in s for s in sentences)
    assert not [s for s in sentences if re.search("[\x00-\x08\x0e-\x1f]", s)]
    assert m.counts["control_chars"] == 1  # the book, repaired
    (books / "mixed.txt").write_bytes(b"\x00\x01" * 40_000 + clean.encode())
    with pytest.raises(EmptySourceError, match="binary_file 1"):
        run_corpus(dataclasses.replace(CFG, sources=("books",)), {"books": str(books)}, str(tmp_path / "o2"))


def test_a_long_line_is_skipped_unread_in_every_layout(tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    long = "x" * 5000
    (books / "b.txt").write_text(PROSE[0] + "\n" + long + "\n" + PROSE[1] + "\n\n" + PROSE[2] + "\n")
    cfg = dataclasses.replace(CFG, sources=("books",), max_line_bytes=4096)
    out = tmp_path / "para"
    m = run_corpus(cfg, {"books": str(books)}, str(out))
    [doc] = documents(out, "books")
    assert m.counts["long_line"] == 1 and not any("xxxx" in s for s in doc["sentences"])
    assert len(doc["sentences"]) == 6  # the rest of the book is kept
    [row] = [r for r in rejects(out) if r["reason"] == "long_line"]
    assert "line 2: 5000 bytes" in row["detail"] and row["sample"].startswith("xxx")
    out = tmp_path / "lines"
    m = run_corpus(dataclasses.replace(cfg, books_layout="line_per_document"), {"books": str(books)}, str(out))
    assert m.counts["line_too_long"] == 1 and m.counts["books_read"] == 4 and m.counts["books_documents"] == 3


_PEAK = """
import resource, sys
sys.path.insert(0, {repo!r})
from pipeline.beam.config import BeamConfig
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.job import run_corpus
cfg = CorpusConfig(sources=("books",), books_layout={layout!r}, num_shards=1, max_line_bytes=16 << 20,
                   beam=BeamConfig(num_workers=1))
m = run_corpus(cfg, {{"books": {books!r}}}, {out!r})
try:  # this process's own peak: getrusage's ru_maxrss keeps the forking parent's (pytest's) across exec
    peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) // 1024
except OSError:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(peak, m.counts["books_documents"], m.counts["line_too_long"] + m.counts["long_line"])
"""


@pytest.mark.parametrize("layout", ["line_per_document", "paragraphs"])
def test_memory_is_bounded_by_the_line_limit_not_by_the_line(tmp_path, layout):
    """A 200 MB single line (no newline in it) between two short ones, with a 16 MiB line limit:
    peak RSS of the whole stage (one process: Beam's in-process runner; its VmHWM, since
    ``ru_maxrss`` of a child starts at its parent's) stays under 600 MiB.
    Before: 2,954 MiB (line_per_document) and 2,928 MiB (paragraphs), growing with the line
    (5.9 GB at 300 MB); now ~270 MiB whatever its length (docs/corpus.md)."""
    books = tmp_path / "books"
    books.mkdir()
    word = b"lorem ipsum dolor sit amet consectetur "
    with open(books / "long.txt", "wb") as f:
        f.write(PROSE[0].encode() + b"\n")
        for _ in range(200_000_000 // (len(word) * 10_000)):
            f.write(word * 10_000)
        f.write(b"\n" + PROSE[1].encode() + b"\n")
    code = _PEAK.format(repo=str(REPO), layout=layout, books=str(books), out=str(tmp_path / "out"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=os.environ)
    assert res.returncode == 0, res.stderr[-3000:]
    peak_mib, docs, skipped = map(int, res.stdout.split())
    assert skipped == 1 and docs == (2 if layout == "line_per_document" else 1)
    assert peak_mib < 600, f"peak RSS {peak_mib} MiB"


def test_every_file_of_an_input_is_read_or_rejected_but_a_layouts_own_companions(tmp_path):
    from pipeline.corpus.inputs import _input_files

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    names = [
        "enwiki-1-pages-articles-multistream.xml.bz2",
        "enwiki-1-pages-articles-multistream-index.txt.bz2",  # the index: the dump's companion
        "enwiki-1-sha1sums.txt",
        "enwiki-1-pages-articles.xml.zst",  # a dump compressed in a form not read: a unit, rejected
        "README.md",
    ]
    for name in names:
        (dumps / name).write_bytes(b"x")
    found = [u.rsplit("/", 1)[-1] for u in _input_files("wiki", str(dumps))]
    assert found == sorted([names[0], names[3], names[4]])
    [event] = list(iter_wiki(str(dumps / "README.md")))
    assert event.reason == "no_pages"
    write_dataset_folder(tmp_path / "ds", RECORDS)
    assert [u.rsplit("/", 1)[-1] for u in _input_files("text", str(tmp_path / "ds"))] == ["data-00000-of-00001.arrow"]


def test_a_utf16_book_with_its_bom_is_read_not_rejected_as_binary(tmp_path):
    """Notepad's "Unicode": BOM FF FE then UTF-16LE (NUL bytes everywhere); both layouts."""
    from pipeline.corpus.books import iter_book_lines, read_book

    text = PROSE[0] + "\r\n\r\n" + PROSE[1] + "\r\n" + "y" * 3000 + "\r\n" + PROSE[2] + "\r\n"
    path = tmp_path / "notepad.txt"
    path.write_bytes(b"\xff\xfe" + text.encode("utf-16-le"))
    book = read_book(str(path), max_line_bytes=4096)
    assert book.encoding == "utf-16-le" and PROSE[1] in book.text and "yyyy" not in book.text
    assert [line.number for line in book.long_lines] == [4]
    lines = list(iter_book_lines(str(path), max_line_bytes=4096))
    assert [n for n, line in lines if isinstance(line, str)] == [1, 3, 5] and lines[2][1].number == 4


def test_a_binary_text_column_is_sized_before_it_is_decoded(tmp_path):
    """A Parquet ``binary`` text column: a value over corpus.max_line_bytes is a ``record_too_large``
    reject judged by its byte length, its sample 1,000 characters (a 100 MB value was turned into a
    100-million-character ``str(bytes)`` first, then rejected as missing_text); a small one is
    decoded as UTF-8 text, or is a ``malformed_record`` reject with a short sample."""
    from pipeline.corpus.text import TextReject

    big = b"x" * (3 << 20)
    path = tmp_path / "mixed.parquet"
    table = pa.table({"text": pa.array([b"fine words here", big, b"\xff\xfe small"], pa.binary())})
    pq.write_table(table, path)
    out = list(iter_text_records(str(path), CorpusConfig(max_line_bytes=1 << 20)))
    # string bytes are decoded row by row (one bad value loses one row): UTF-8 in a binary column
    # is text, as Impala and older Spark write it; bytes that are not UTF-8 are that row's reject
    assert out[0]["text"] == "fine words here"
    assert [r.reason for r in out[1:]] == ["record_too_large", "malformed_record"]
    assert f"{len(big)} bytes, over corpus.max_line_bytes=1048576" in out[1].detail
    assert all(isinstance(r, TextReject) and len(r.sample) <= 1000 for r in out[1:])
