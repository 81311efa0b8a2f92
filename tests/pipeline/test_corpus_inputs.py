"""Corpus inputs and filters: absent or empty sources, books layouts and boilerplate, reasons."""

import collections
import dataclasses

import pyarrow.parquet as pq
import pytest

from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.documents import build_document, page_record
from pipeline.corpus.filters import minhash, near_duplicates
from pipeline.corpus.inputs import CorpusInputError, check_corpus_inputs
from pipeline.corpus.job import run_corpus
from pipeline.corpus.records import Page
from pipeline.corpus.sentences import book_paragraphs, strip_boilerplate
from pipeline.schema.config import ConfigError
from synth.dumps import page_xml, write_dump

CFG = CorpusConfig(num_shards=1)


def wiki(doc_id, text):
    return {"doc_id": doc_id, "source": "wiki", "title": "T", "text": text}


@pytest.fixture
def raw(tmp_path):
    (tmp_path / "wiki").mkdir()
    write_dump(
        tmp_path / "wiki" / "w.xml",
        [
            page_xml(1, "Cats", "The cat is a small mammal. Cats purr and sleep a lot."),
            page_xml(2, "Dogs", "The dog is a loyal animal. Dogs bark at strangers."),
        ],
    )
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "b.txt").write_text("It was a cold night here. The snow fell on the town.\n")
    return tmp_path


def test_check_corpus_inputs_absent_and_empty_sources(raw, tmp_path):
    both = {"wiki": str(raw / "wiki"), "books": str(raw / "books")}
    assert set(check_corpus_inputs(CFG, both)) == {"wiki", "books"}
    with pytest.raises(CorpusInputError, match="includes 'books' but no books input"):
        check_corpus_inputs(CFG, {"wiki": both["wiki"]})
    wiki_only = dataclasses.replace(CFG, sources=("wiki",))
    assert set(check_corpus_inputs(wiki_only, both)) == {"wiki"}  # books given, ignored
    (tmp_path / "nobooks").mkdir()
    with pytest.raises(CorpusInputError, match="books input .*nobooks matches no files"):
        check_corpus_inputs(CFG, {**both, "books": str(tmp_path / "nobooks")})
    (tmp_path / "empty.xml").write_bytes(b"")
    with pytest.raises(CorpusInputError, match="wiki input .*empty.xml holds only empty files"):
        check_corpus_inputs(CFG, {**both, "wiki": str(tmp_path / "empty.xml")})
    with pytest.raises(CorpusInputError, match="unknown input 'news'"):
        check_corpus_inputs(CFG, {**both, "news": both["wiki"]})


def test_sources_config_validates_and_parses():
    assert CorpusConfig(sources="wiki").sources == ("wiki",)
    assert CorpusConfig(sources=["books", "wiki"]).sources == ("books", "wiki")
    with pytest.raises(ConfigError, match="corpus.sources"):
        CorpusConfig(sources=("news",))
    with pytest.raises(ConfigError, match="corpus.books_layout"):
        CorpusConfig(books_layout="pages")


def test_books_only_run_and_line_per_document(raw, tmp_path):
    lines = raw / "news"
    lines.mkdir()
    (lines / "n.txt").write_text(
        "First article about the harbour. It opened in May.\n"
        "Second article on the election. Votes were counted late.\n"
        "\n"
        "Third article of the day. It rained all afternoon.\n"
    )
    cfg = dataclasses.replace(CFG, sources=("books",), books_layout="line_per_document")
    m = run_corpus(cfg, {"books": str(lines)}, str(tmp_path / "out"))
    rows = sorted(pq.read_table(str(tmp_path / "out" / "books")).to_pylist(), key=lambda r: r["doc_id"])
    assert [r["doc_id"] for r in rows] == ["books:n:000000001", "books:n:000000002", "books:n:000000004"]
    assert rows[1]["sentences"] == ["Second article on the election.", "Votes were counted late."]
    assert m.counts["books_read"] == 3 == m.counts["documents"] + m.counts["records_rejected"]


GUTENBERG = """The Project Gutenberg EBook of Tales, by A. Writer

This eBook is for the use of anyone anywhere at no cost.

Title: Tales
Release Date: May 1, 2004 [EBook #1]

*** START OF THIS PROJECT GUTENBERG EBOOK TALES ***

Produced by Volunteers

It was a cold night in the
village. The snow fell on every
roof.

*** END OF THIS PROJECT GUTENBERG EBOOK TALES ***

Section 1. General Terms of Use and Redistributing Project Gutenberg-tm
electronic works. By reading or using any part of this work you agree.
"""


def test_gutenberg_boilerplate_stripped_and_wrapped_lines_joined():
    assert book_paragraphs(strip_boilerplate(GUTENBERG)) == [
        "It was a cold night in the village. The snow fell on every roof."
    ]
    plain = "A plain book starts here.\nIt has no markers at all.\n"
    assert strip_boilerplate(plain) == plain
    record = {"doc_id": "books:t", "source": "books", "title": "Tales", "text": GUTENBERG}
    row, _ = build_document(record, CFG)
    assert row["sentences"] == ["It was a cold night in the village.", "The snow fell on every roof."]


def test_document_filters_have_reasons():
    table = "\n".join(f"{i} {i * 3} {i * 7} km, {i}.{i} m; {i}% — ok." for i in range(40))
    assert build_document(wiki("wiki:1", table), CFG)[1] == {"mostly_non_text": 1}
    long_cfg = dataclasses.replace(CFG, max_doc_chars=100)
    text = "A sentence that is long enough to pass. " * 10
    assert build_document(wiki("wiki:2", text), long_cfg)[1] == {"doc_too_long": 1}
    short_cfg = dataclasses.replace(CFG, min_doc_chars=500)
    row, rejects = build_document(wiki("wiki:3", "First good sentence here. Second good one here."), short_cfg)
    assert row is None and rejects == {"doc_too_short": 1}
    para = "The same paragraph is repeated here. It has two sentences."
    row, rejects = build_document(wiki("wiki:4", f"{para}\n\n{para}\n\nA new paragraph ends it."), CFG)
    assert rejects == {"duplicate_paragraph": 1} and row["num_sentences"] == 3
    assert build_document(wiki("wiki:5", "{{Infobox}}\n<!-- only -->\n[[Category:X]]"), CFG)[1] == {
        "empty_after_cleaning": 1
    }
    dab = Page("6", "Mercury", 0, None, "'''Mercury''' may refer to:\n* [[Mercury (planet)]]\n{{disambiguation}}")
    assert page_record(dab) == (None, "disambiguation")


def test_near_duplicates_keep_the_smallest_id():
    pytest.importorskip("datasketch")
    base = [f"Sentence number {i} of the long shared story goes on here." for i in range(40)]
    near = base[:39] + ["A different last sentence ends this copy of it."]
    other = [f"Unrelated text {i} about something else entirely today." for i in range(40)]
    sigs = [("wiki:9", minhash(near)), ("wiki:2", minhash(base)), ("wiki:5", minhash(other))]
    assert near_duplicates(sigs, threshold=0.8) == {"wiki:9": "wiki:2"}


def test_near_dedup_in_the_job_counts_and_rejects(tmp_path):
    pytest.importorskip("datasketch")
    body = " ".join(f"Sentence number {i} of the long shared story goes on here." for i in range(40))
    (tmp_path / "w").mkdir()
    write_dump(
        tmp_path / "w" / "w.xml",
        [
            page_xml(1, "A", body),
            page_xml(2, "B", body + " One more sentence at the end."),
            page_xml(3, "C", "A different page entirely. It has its own words."),
        ],
    )
    cfg = dataclasses.replace(CFG, sources=("wiki",), near_dup_threshold=0.8)
    m = run_corpus(cfg, {"wiki": str(tmp_path / "w")}, str(tmp_path / "out"))
    assert m.counts["near_duplicate_document"] == 1 and m.counts["documents"] == 2
    rejects = pq.read_table(str(tmp_path / "out" / "rejects")).to_pylist()
    assert collections.Counter(r["reason"] for r in rejects) == {"near_duplicate_document": 1}
    assert rejects[0]["record_id"] == "wiki:2" and rejects[0]["detail"] == "near duplicate of wiki:1"


def test_multistream_dump_split_over_workers_gives_the_same_output(tmp_path):
    from pipeline.beam.config import BeamConfig
    from synth.dumps import pages_xml, write_multistream

    (tmp_path / "w").mkdir()
    write_multistream(tmp_path / "w" / "xxwiki-1-pages-articles-multistream.xml.bz2", pages_xml(90), per_stream=10)
    results = []
    for split_bytes, workers in ((0, 1), (1, 2)):  # one unit / every stream its own unit
        cfg = dataclasses.replace(
            CFG, sources=("wiki",), split_bytes=split_bytes, num_shards=2, beam=BeamConfig(num_workers=workers)
        )
        m = run_corpus(cfg, {"wiki": str(tmp_path / "w")}, str(tmp_path / f"out{split_bytes}"))
        results.append(({f.path: f.sha256 for f in m.files}, m.counts["wiki_read"], m.counts["documents"]))
    assert results[0] == results[1]
    assert results[0][1] == 90  # the index file beside the dump is not read as a dump


def test_preview_documents_and_rejects(raw, tmp_path):
    from pipeline.corpus.preview import format_preview, preview_corpus

    (raw / "wiki" / "r.xml").write_text(
        "<mediawiki>" + page_xml(9, "Redir", "#REDIRECT [[Cats]]", redirect="Cats") + "</mediawiki>"
    )
    out = str(tmp_path / "out")
    run_corpus(CFG, {"wiki": str(raw / "wiki"), "books": str(raw / "books")}, out)
    docs = preview_corpus(out, n=2)
    assert len(docs) == 2 and all(d["num_sentences"] == 2 for d in docs)
    text = format_preview(preview_corpus(out, n=5, source="wiki"))
    assert "wiki:1  Cats  (2 sentences)" in text and "  1. The cat is a small mammal." in text
    rejects = preview_corpus(out, n=5, rejects=True)
    assert [r["reason"] for r in rejects] == ["redirect"]
    assert "wiki:9  [redirect] Redir" in format_preview(rejects)
