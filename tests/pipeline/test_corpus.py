"""The corpus job: pure record functions, composites on TestPipeline, run_corpus end to end."""

import bz2
import collections
import dataclasses
import json

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline

import pipeline.corpus.job as corpus
from pipeline.beam.config import BeamConfig
from pipeline.corpus.clean import CleanToFragments
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.dedup import DedupAndWrite
from pipeline.corpus.documents import build_document, page_record
from pipeline.corpus.filters import sentence_reject
from pipeline.corpus.inputs import CorpusInputError
from pipeline.corpus.job import run_corpus
from pipeline.corpus.records import Page
from pipeline.schema.manifest import read_manifest

CFG = CorpusConfig(min_sentence_chars=12, min_doc_sentences=2, num_shards=2)

ADA = (
    "{{Infobox person|name=Ada}}\n'''Ada Lovelace''' was an English [[mathematician]].<ref>x</ref> "
    "She wrote the first published algorithm.\n\n"
    "Her notes were long and detailed. Her notes were long and detailed. Ok.\n"
    "== References ==\n{{reflist}}\n[[Category:People]]"
)
ADA_SENTENCES = [
    "Ada Lovelace was an English mathematician.",
    "She wrote the first published algorithm.",
    "Her notes were long and detailed.",
]


def wiki_record(doc_id, text, title="T"):
    return {"doc_id": doc_id, "source": "wiki", "title": title, "text": text}


# -- pure functions -------------------------------------------------------------------------------
def test_page_record_rejects_redirects_and_other_namespaces():
    assert page_record(Page("1", "A", 0, "B", "#REDIRECT [[B]]")) == (None, "redirect")
    assert page_record(Page("2", "Talk:A", 1, None, "x")) == (None, "non_article_namespace")
    record, reason = page_record(Page("3", "A", 0, None, "text"))
    assert reason is None and record == wiki_record("wiki:3", "text", "A")


def test_sentence_filters():
    cfg = CorpusConfig(min_sentence_chars=5, max_sentence_chars=30, min_alpha_ratio=0.5)
    assert sentence_reject("Tiny", cfg) == "sentence_too_short"
    assert sentence_reject("A" * 31, cfg) == "sentence_too_long"
    assert sentence_reject("12 345 678 9 x.", cfg) == "sentence_low_alpha"
    assert sentence_reject("A fine sentence.", cfg) is None


def test_build_document_cleans_splits_filters_and_counts():
    row, rejects = build_document(wiki_record("wiki:1", ADA, "Ada"), CFG)
    assert row == {
        "doc_id": "wiki:1",
        "source": "wiki",
        "title": "Ada",
        "sentences": ADA_SENTENCES,
        "num_sentences": 3,
        "num_chars": sum(map(len, ADA_SENTENCES)),
    }
    assert rejects == {"duplicate_sentence": 1, "sentence_too_short": 1}


def test_build_document_rejects_whole_documents():
    assert build_document(wiki_record("wiki:1", "{{Infobox}}\n[[Category:X]]"), CFG) == (
        None,
        {"empty_after_cleaning": 1},
    )
    row, rejects = build_document(wiki_record("wiki:2", "Only one sentence here."), CFG)
    assert row is None and rejects == {"too_few_sentences": 1}
    no_dedup = dataclasses.replace(CFG, dedup_sentences=False)
    row, _ = build_document(wiki_record("wiki:3", "Same sentence here. Same sentence here."), no_dedup)
    assert row["num_sentences"] == 2


def test_build_document_books():
    record = {
        "doc_id": "books:b",
        "source": "books",
        "title": "B",
        "text": "Chapter 1\n\nThe first line of it\nwraps here. Then more text follows.\n",
    }
    row, _ = build_document(record, CFG)
    assert row["sentences"] == ["The first line of it wraps here.", "Then more text follows."]


# -- composites on TestPipeline -------------------------------------------------------------------
def test_clean_dedup_unique_composites(tmp_path):
    records = [
        wiki_record("wiki:2", ADA, "Ada copy"),
        wiki_record("wiki:1", ADA, "Ada"),
        wiki_record("wiki:3", "Short. Tiny."),  # every sentence too short -> too few sentences
        wiki_record("wiki:4", "First distinct sentence. Second distinct sentence.", "Four"),
        wiki_record("wiki:4", "First distinct sentence. Second distinct sentence.", "Four"),
    ]
    out, work = str(tmp_path / "out"), str(tmp_path / "work")
    options = PipelineOptions(["--runner=FnApiRunner"])
    with BeamTestPipeline(options=options) as p:
        cleaned = p | beam.Create(records) | CleanToFragments(CFG, work)
        _ = (cleaned.keys, cleaned.fragments, cleaned.runs) | DedupAndWrite(CFG, work, out)
    rows = read_rows(out + "/wiki")
    assert sorted((r["doc_id"], r["title"], r["num_sentences"]) for r in rows) == [
        ("wiki:1", "Ada", 3),
        ("wiki:4", "Four", 2),
    ]
    rejects = collections.Counter((r["record_id"], r["reason"]) for r in read_rows(out + "/rejects"))
    assert rejects == {
        ("wiki:2", "duplicate_document"): 1,
        ("wiki:3", "too_few_sentences"): 1,
        ("wiki:4", "duplicate_document"): 1,
    }


# -- run_corpus end to end ------------------------------------------------------------------------
def page_xml(page_id, title, text, ns=0, redirect=None):
    from xml.sax.saxutils import escape

    red = f'<redirect title="{escape(redirect)}" />' if redirect else ""
    return (
        f"<page><title>{escape(title)}</title><ns>{ns}</ns><id>{page_id}</id>{red}"
        f"<revision><id>{page_id}00</id><text>{escape(text)}</text></revision></page>\n"
    )


def make_inputs(root):
    wiki = root / "wiki"
    wiki.mkdir(parents=True)
    part1 = (
        page_xml(1, "Ada Lovelace", ADA)
        + page_xml(2, "Lovelace", "#REDIRECT [[Ada Lovelace]]", redirect="Ada Lovelace")
        + page_xml(3, "Talk:Ada", "Some talk page text here. More of it here.", ns=1)
        + page_xml(4, "Stub", "{{stub}}\n[[Category:Stubs]]")
    )
    part2 = (
        page_xml(5, "Ada (copy)", ADA)  # exact duplicate of page 1 -> dropped, smallest id kept
        + page_xml(
            6,
            "Cats",
            "The cat is a small [[mammal]]. Cats purr &amp; sleep a lot.\n\n"
            "{| class=wikitable\n| 1 || 2\n|}\nThey were domesticated long ago.",
        )
    )
    header = '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/"><siteinfo/>\n'
    (wiki / "enwiki-p1.xml.bz2").write_bytes(bz2.compress((header + part1 + "</mediawiki>").encode()))
    (wiki / "enwiki-p2.xml.bz2").write_bytes(bz2.compress((header + part2 + "</mediawiki>").encode()))
    (wiki / "enwiki-p3.xml").write_text(header + "<page><title>Broken</title")  # malformed
    books = root / "books"
    books.mkdir()
    (books / "red_house.txt").write_text(
        "THE RED HOUSE\n\nChapter 1\n\nIt was a dark and\nstormy night outside. The wind blew\n"
        "through the old trees.\n\nShe opened the door slowly.\n"
    )
    (books / "dup_of_cats.txt").write_text(  # same text as the Cats page: books:... < wiki:6
        "The cat is a small mammal. Cats purr & sleep a lot.\n\nThey were domesticated long ago.\n"
    )
    (books / "latin1.txt").write_bytes("Caf\xe9 society was busy. The waiters ran about.".encode("latin-1"))
    (books / "cover.bin").write_bytes(bytes(range(256)) * 4)  # binary among the books
    return {"wiki": str(wiki), "books": str(books)}


def read_rows(url):
    return pq.read_table(url).to_pylist()


def test_run_corpus_end_to_end(tmp_path, monkeypatch, caplog):
    inputs = make_inputs(tmp_path / "raw")
    out = str(tmp_path / "corpus")
    stale = tmp_path / "corpus" / "wiki" / "part-00009-of-00010.parquet"
    stale.parent.mkdir(parents=True)
    stale.write_text("stale")

    seen_at_manifest = {}
    real_write = corpus.write_manifest

    def spy(**kwargs):
        seen_at_manifest["files"] = sorted(p.name for p in (tmp_path / "corpus").rglob("*.parquet"))
        return real_write(**kwargs)

    monkeypatch.setattr(corpus, "write_manifest", spy)
    manifest = run_corpus(CFG, inputs, out)

    # the manifest is written last, after every shard (empty ones included)
    shards = ["part-00000-of-00002.parquet", "part-00001-of-00002.parquet"]
    assert seen_at_manifest["files"] == sorted(shards * 3)  # books/, wiki/, rejects/
    assert not stale.exists()
    on_disk = read_manifest(out)
    assert on_disk.fingerprint == manifest.fingerprint
    assert sorted(f.path for f in on_disk.files) == sorted(f"{s}/{x}" for s in ("books", "wiki") for x in shards)

    wiki = sorted(read_rows(out + "/wiki"), key=lambda r: r["doc_id"])
    books = sorted(read_rows(out + "/books"), key=lambda r: r["doc_id"])
    assert [r["doc_id"] for r in wiki] == ["wiki:1"]
    assert wiki[0]["sentences"] == ADA_SENTENCES and wiki[0]["title"] == "Ada Lovelace"
    assert [r["doc_id"] for r in books] == ["books:dup_of_cats", "books:latin1", "books:red_house"]
    assert books[2]["title"] == "THE RED HOUSE"
    assert books[2]["sentences"] == [
        "It was a dark and stormy night outside.",
        "The wind blew through the old trees.",
        "She opened the door slowly.",
    ]
    assert books[1]["sentences"][0] == "Café society was busy."  # latin-1 detected, not dropped
    assert sum(f.rows for f in on_disk.files) == 4

    c = on_disk.counts
    assert c["redirect"] == 1
    assert c["non_article_namespace"] == 1
    assert c["empty_after_cleaning"] == 1
    assert c["duplicate_document"] == 2  # wiki:5 (= wiki:1) and wiki:6 (= books:dup_of_cats)
    # sentence rejects are counted before document dedup: wiki:1 and its copy wiki:5 both count
    assert c["duplicate_sentence"] == 2 and c["sentence_too_short"] == 2
    assert c["truncated_page"] == 1  # the malformed dump part: its one unclosed page
    assert c["binary_file"] == 1 and c["books_reencoded"] == 1
    assert c["unreadable_file"] == 0 and c["duplicate_doc_id"] == 0
    assert (c["wiki_documents"], c["books_documents"], c["documents"]) == (1, 3, 4)
    assert c["sentences"] == 3 + 3 + 3 + 2
    assert c["chars"] == sum(r["num_chars"] for r in wiki + books)
    assert c["wiki_read"] == 7 and c["books_read"] == 4
    # nothing lost silently: every record read is a document or a reject with a reason
    assert c["read"] == c["documents"] + c["records_rejected"]
    rejects = read_rows(out + "/rejects")
    assert c["duplicate_paragraph_corpus"] == 0
    assert len(rejects) == c["records_rejected"] + c["file_faults"] == c["rejects_written"]
    by_reason = collections.Counter(r["reason"] for r in rejects)
    assert by_reason == {
        "redirect": 1,
        "non_article_namespace": 1,
        "empty_after_cleaning": 1,
        "duplicate_document": 2,
        "truncated_page": 1,
        "binary_file": 1,
    }
    broken = next(r for r in rejects if r["reason"] == "truncated_page")
    assert broken["url"].endswith("enwiki-p3.xml") and broken["title"] == "Broken"
    assert set(on_disk.inputs) == {"wiki", "books"}
    expected = {k: v for k, v in dataclasses.asdict(CFG).items() if k != "beam"}  # how it ran is not recorded
    assert on_disk.config == json.loads(json.dumps(expected))
    assert any("latin1.txt" in r.getMessage() for r in caplog.records)
    assert any("cover.bin" in r.getMessage() for r in caplog.records)


def test_run_corpus_is_deterministic_across_parallelism(tmp_path):
    inputs = make_inputs(tmp_path / "raw")
    outputs = []
    for workers in (1, 2):
        cfg = dataclasses.replace(CFG, num_shards=3, beam=BeamConfig(num_workers=workers))
        out = tmp_path / f"out{workers}"
        m = run_corpus(cfg, inputs, str(out))
        outputs.append(({f.path: f.sha256 for f in m.files}, m.counts))
    assert outputs[0] == outputs[1]  # same bytes and same counters with 1 and 2 workers
    assert len(outputs[0][0]) == 6  # documents; rejects/ is left out of the manifest


def test_run_corpus_glob_input_and_bad_names(tmp_path):
    inputs = make_inputs(tmp_path / "raw")
    wiki_only = dataclasses.replace(CFG, sources=("wiki",))
    m = run_corpus(wiki_only, {"wiki": inputs["wiki"] + "/*.bz2"}, str(tmp_path / "c"))
    assert m.counts["truncated_page"] == 0  # the malformed .xml part is not matched
    assert m.counts["wiki_documents"] == 2 and "books_documents" not in m.counts
    with pytest.raises(ValueError, match="'news'"):
        run_corpus(CFG, {"news": inputs["wiki"]}, str(tmp_path / "d"))
    with pytest.raises(CorpusInputError, match="missing matches no files"):
        run_corpus(wiki_only, {"wiki": str(tmp_path / "missing")}, str(tmp_path / "d"))
    assert not (tmp_path / "d").exists()  # refused before any work
