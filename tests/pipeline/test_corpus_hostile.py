"""Hostile inputs to every corpus reader: a record is rejected, never fatal; a file that cannot be
opened or that ends early is a counted fault naming how many records came before it.

Generated here, seeded: JSON Lines records with lone surrogate escapes, nesting past the
recursion limit, NULs, invalid UTF-8, wrong types; Parquet and Arrow (``datasets``) files with
one invalid UTF-8 value among good rows; every compressed, Parquet and Arrow file also cut at
every 10% of its bytes; files whose magic bytes are not their name's. Each file through the
reader alone (fast, exact), then all of them through one corpus stage: it ends, and
``text_read == documents + record rejects`` (the stage's accounting), every fault counted."""

import bz2
import dataclasses
import gzip
import json
import random
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline.beam.config import BeamConfig
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.filters import RECORD_REJECTS
from pipeline.corpus.job import run_corpus
from pipeline.corpus.records import CorpusReadError
from pipeline.corpus.text import TextReject, iter_text_records

CFG = CorpusConfig(num_shards=1, beam=BeamConfig(num_workers=1), sources=("text", "books"), allow_empty_sources=True)
PROSE = [
    "The harbour of Velmora opened in the spring of that year. Ships came from the south with salt.",
    "A winter storm closed the mountain road for a month. The village waited for the thaw.",
    "The old library keeps maps of every valley. Scholars travel far to read them.",
]
CUTS = [i / 10 for i in range(1, 10)]


def good(rng: random.Random, n: int) -> dict:
    return {"id": f"g{n}", "title": f"Doc {n}", "text": f"{rng.choice(PROSE)} Record {n} was kept whole."}


def hostile_lines(rng: random.Random, n: int) -> list[bytes]:
    """JSON Lines: good records mixed with every kind of bad one (and a few that only look bad)."""
    bad = [
        b'{"id": "s1", "text": "a lone \\ud800 surrogate"}',
        b'{"id": "s2", "title": "\\udfff", "text": "fine text. Quite fine."}',
        b'{"id": "s3\\ud83d", "text": "fine text. Quite fine."}',
        b'{"id": "deep", "text": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
        b"[" * 100_000,
        b'{"id": "nul", "text": "a NUL \\u0000 inside. And more text here."}',
        b'{"id": "rawnul", "text": "raw \x00 byte"}',
        b'{"id": "utf8", "text": "bad \xff\xfe bytes"}',
        b'{"id": "int", "text": 12}',
        b'{"id": "list", "text": ["a", "\\ud800"]}',
        b'{"id": "dict", "text": {"x": 1}}',
        b'{"id": "null", "text": null}',
        b'{"id": {"k": [1, 2]}, "title": ["t"], "text": "odd id and title. Still a text."}',
        b'"just a string"',
        b"{not json",
        b'{"no_text": 1}',
    ]
    lines = [json.dumps(good(rng, i)).encode() for i in range(n)] + bad
    rng.shuffle(lines)
    return lines


def six_rows() -> pa.Table:
    """Five good rows and one invalid UTF-8 value (written as bytes viewed as a string)."""
    texts = [f"{PROSE[i % 3]} Row {i} of six.".encode() for i in range(5)] + [b"bad \xff\xfe here"]
    return pa.table({"text": pa.array(texts, pa.binary()).view(pa.string()), "id": [f"p{i}" for i in range(6)]})


def arrow_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=2):
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=2)
    return sink.getvalue().to_pybytes()


def write_inputs(root: Path, seed: int = 28) -> dict[str, set[str]]:
    """The hostile text and books folders; returns the file names that must end in a file fault."""
    rng = random.Random(seed)
    text, books = root / "text", root / "books"
    text.mkdir(parents=True)
    books.mkdir(parents=True)
    faults: set[str] = set()
    jsonl = b"\n".join(hostile_lines(rng, 400)) + b"\n"
    (text / "hostile.jsonl").write_bytes(b"\xef\xbb\xbf" + jsonl)
    packed = {
        "gz": gzip.compress(jsonl),
        "zst": zstandard.ZstdCompressor().compress(jsonl),
        "bz2": bz2.compress(jsonl),
    }
    (text / "whole.jsonl.zst").write_bytes(packed["zst"])
    stream, parquet = arrow_stream(six_rows()), parquet_bytes(six_rows())
    (text / "six.parquet").write_bytes(parquet)
    (text / "data-six.arrow").write_bytes(stream)
    for cut in CUTS:
        tag = f"{int(cut * 100):02d}"
        (text / f"cut{tag}.jsonl").write_bytes(jsonl[: int(len(jsonl) * cut)])  # a short last line: a reject
        for kind in ("gz", "zst"):
            name = f"cut{tag}.jsonl.{kind}"
            (text / name).write_bytes(packed[kind][: int(len(packed[kind]) * cut)])
            faults.add(name)
        for name, data in ((f"cut{tag}.parquet", parquet), (f"data-cut{tag}.arrow", stream)):
            (text / name).write_bytes(data[: int(len(data) * cut)])
            faults.add(name)
    wrong = {
        "magic.jsonl.gz": jsonl[:500],
        "magic.jsonl.zst": b"this is not zstd\n" * 10,
        "magic.parquet": jsonl[:500],
        "data-magic.arrow": b"\x00\x01\x02 not arrow at all",
        "bzip.jsonl.zst": packed["bz2"],
    }
    for name, data in wrong.items():
        (text / name).write_bytes(data)
        faults.add(name)
    book = "\n\n".join(PROSE * 30).encode()
    (books / "whole.txt.gz").write_bytes(gzip.compress(book))
    (books / "cut.txt.gz").write_bytes(gzip.compress(book)[: len(gzip.compress(book)) // 2])
    (books / "magic.txt.bz2").write_bytes(book[:300])
    return {"text": faults, "books": {"cut.txt.gz", "magic.txt.bz2"}}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    return root, write_inputs(root)


def test_each_text_file_alone_rejects_records_and_names_its_fault(inputs):
    root, faults = inputs
    seen_faults = set()
    for path in sorted((root / "text").iterdir()):
        items = []
        try:
            for item in iter_text_records(str(path), CFG):
                items.append(item)
        except CorpusReadError as exc:
            assert exc.reason in ("truncated_file", "unreadable_file"), (path.name, exc)
            assert f"({len(items)} records read before it" in str(exc) and str(path) in str(exc)
            seen_faults.add(path.name)
        for item in items:  # every string UTF-8 can write (encode raises on a lone surrogate)
            if isinstance(item, TextReject):
                (item.record_id + item.detail + item.sample).encode()
                assert str(path) in item.detail
            else:
                assert isinstance(item["text"], str)
                (item["text"] + item["title"] + item["doc_id"]).encode()
    assert seen_faults == faults["text"]
    rejects = [i for i in iter_text_records(str(root / "text" / "hostile.jsonl"), CFG) if isinstance(i, TextReject)]
    details = " | ".join(r.detail for r in rejects)
    assert "text holds a lone surrogate (U+D800" in details and "title holds a lone surrogate" in details
    assert "id holds a lone surrogate" in details and "not JSON (nested too deep)" in details
    assert "text is a int" in details and "text is a dict" in details and "a JSON str, not an object" in details
    for name in ("six.parquet", "data-six.arrow"):  # row-level decoding: one bad value costs one row
        items = list(iter_text_records(str(root / "text" / name), CFG))
        assert [isinstance(i, TextReject) for i in items] == [False] * 5 + [True], name
        assert "record 6: text is not valid UTF-8" in items[5].detail


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_truncation_keeps_every_record_before_the_cut(inputs, tmp_path, kind):
    root, _ = inputs
    cut = root / "text" / f"cut60.jsonl.{kind}"
    if kind == "gz":  # every byte the cut stream still holds, by the codec alone
        held = zlib.decompressobj(wbits=47).decompress(cut.read_bytes())
    else:
        held = zstandard.ZstdDecompressor().decompressobj().decompress(cut.read_bytes())
    whole_lines = tmp_path / "cut60.jsonl"
    whole_lines.write_bytes(held[: held.rindex(b"\n") + 1])
    expected = list(iter_text_records(str(whole_lines), CFG))
    got = []
    with pytest.raises(CorpusReadError, match="jsonl file ends early") as info:
        for item in iter_text_records(str(cut), CFG):
            got.append(item)
    assert info.value.reason == "truncated_file"
    assert f"({len(expected)} records read before it, kept)" in str(info.value)

    def same(item, url):
        return dataclasses.replace(item, detail=item.detail.replace(url, "F")) if isinstance(item, TextReject) else item

    # every record before the cut, none lost to buffering
    assert [same(i, str(cut)) for i in got] == [same(i, str(whole_lines)) for i in expected] and len(got) > 100


def test_the_corpus_stage_reads_every_hostile_file_to_its_end_and_counts_all(inputs, tmp_path):
    root, faults = inputs
    out = tmp_path / "out"
    m = run_corpus(CFG, {"text": str(root / "text"), "books": str(root / "books")}, str(out))
    c = m.counts
    for source in ("text", "books"):
        rejected = sum(c.get(f"{source}.{r}", 0) for r in RECORD_REJECTS)
        assert c[f"{source}_read"] == c[f"{source}_documents"] + rejected, (source, c)
        assert c[f"{source}_documents"] > 0
    assert c["read"] == c["documents"] + c["records_rejected"]
    assert c["file_faults"] == len(faults["text"])  # a book is one record: a cut one is a record reject
    rows = pq.read_table(str(out / "rejects")).to_pylist()
    faulted = {r["url"].rsplit("/", 1)[-1] for r in rows if r["reason"] in ("truncated_file", "unreadable_file")}
    assert faulted == faults["text"]
    books = {r["url"].rsplit("/", 1)[-1]: r["reason"] for r in rows if r["source"] == "books"}
    assert books == {"cut.txt.gz": "unreadable_book", "magic.txt.bz2": "unreadable_book"}
    docs = pq.read_table(str(out / "text")).to_pylist()
    assert all("\x00" not in s and "\ufffd" not in s for d in docs for s in d["sentences"])
    assert {"g0", "p0"} <= {d["doc_id"].split(":", 1)[1] for d in docs}


@pytest.mark.parametrize("layout", ["line_per_document"])  # paragraphs: in the stage test above
def test_a_cut_or_wrong_book_file_is_a_counted_reject_in_both_layouts(inputs, tmp_path, layout):
    root, _ = inputs
    cfg = dataclasses.replace(CFG, sources=("books",), books_layout=layout)
    m = run_corpus(cfg, {"books": str(root / "books")}, str(tmp_path / "out"))
    c = m.counts
    rejected = sum(c.get(f"books.{r}", 0) for r in RECORD_REJECTS)
    assert c["books_read"] == c["books_documents"] + rejected and c["books_documents"] > 0
    rows = pq.read_table(str(tmp_path / "out" / "rejects")).to_pylist()
    named = {r["url"].rsplit("/", 1)[-1]: r for r in rows if r["url"]}
    assert {"cut.txt.gz", "magic.txt.bz2"} <= set(named), named
    assert "ended inside a stream" in named["cut.txt.gz"]["detail"]
