"""Corpus-wide dedup on small keys: paragraph hashes, decisions, applying drops, and the job."""

import collections
import dataclasses
import random
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.beam.config import BeamConfig
from pipeline.beam.io import shard_name
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.decide import paragraph_drops
from pipeline.corpus.dedup import apply_drops, doc_digest, paragraph_hash
from pipeline.corpus.documents import build_paragraphs
from pipeline.corpus.job import run_corpus
from pipeline.schema.manifest import read_manifest
from synth.dumps import page_xml, write_dump

CFG = CorpusConfig(num_shards=3)
BOILER = "This article uses material from a shared source. It is licensed freely."


def test_paragraph_hash_is_normalised_and_stable():
    assert paragraph_hash(["This  Article", "uses it."]) == paragraph_hash(["this article uses", "IT."])
    assert paragraph_hash(["One."]) != paragraph_hash(["Two."])
    assert len(paragraph_hash(["One."])) == 12
    assert paragraph_hash(["Äb"]).hex() == paragraph_hash(["äB"]).hex()  # not hash(): stable


def test_build_paragraphs_groups_kept_sentences():
    record = {
        "doc_id": "wiki:1",
        "source": "wiki",
        "title": "T",
        "text": "First kept sentence here. Tiny.\n\nOk.\n\nSecond paragraph sentence here.",
    }
    paragraphs, rejects = build_paragraphs(record, CFG)
    assert paragraphs == [["First kept sentence here."], ["Second paragraph sentence here."]]
    assert rejects == {"sentence_too_short": 2}  # the paragraph "Ok." is left out whole
    assert doc_digest(paragraphs) == doc_digest([["First kept sentence here.", "Second paragraph sentence here."]])


def test_digest_and_hashes_from_the_dedup_keys_are_the_same():
    from pipeline.corpus.dedup import norms_digest, norms_hash
    from pipeline.corpus.documents import _build_paragraphs

    record = {
        "doc_id": "wiki:1",
        "source": "wiki",
        "title": "T",
        "text": "Die STRASSE  heißt\u00a0Weg.  Sie ist lang und breit.\n\n"
        "İstanbul is a large city. ΣΟΦΙΑ was here today.",
    }
    paragraphs, norms, _ = _build_paragraphs(record, CFG)
    assert len(paragraphs) == 2 and norms[0][0] == "die strasse heisst weg."
    assert norms_digest(norms) == doc_digest(paragraphs)
    assert [norms_hash(n) for n in norms] == [paragraph_hash(p) for p in paragraphs]
    assert _build_paragraphs(record, dataclasses.replace(CFG, dedup_sentences=False))[1] is None


def test_the_sentence_keys_are_normalise_of_the_kept_sentences():
    """The dedup keys skip normalise's split and join (a sentence holds single spaces only):
    no character casefolds to or from whitespace, and on random texts of spaces, tabs, NBSP,
    ß, İ, Σ, ligatures and punctuation every key is normalise() of its sentence."""
    from pipeline.corpus.documents import _build_paragraphs
    from pipeline.corpus.filters import normalise

    assert not [c for c in range(0x110000) if not chr(c).isspace() and any(x.isspace() for x in chr(c).casefold())]
    rng, checked = random.Random(7), 0
    alphabet = list("abcXYZ ßİΣςﬁŉ.!?,") + [" ", "  ", "\t", "\u00a0", "\u3000", "\n", ". ", "? "]
    for i in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(20, 300)))
        record = {"doc_id": f"wiki:{i}", "source": "books", "title": "T", "text": text}
        paragraphs, norms, _ = _build_paragraphs(record, dataclasses.replace(CFG, min_alpha_ratio=0.0))
        for sentences, keys in zip(paragraphs or [], norms or [], strict=True):
            assert keys == [normalise(s) for s in sentences]
            checked += len(keys)
    assert checked > 300


def test_paragraph_drops_keep_the_smallest_doc_id_in_any_order():
    occurrences = [("wiki:9", ("f2", 0), 1), ("books:a", ("f1", 3), 0), ("wiki:10", ("f1", 4), 2)]
    for _ in range(5):
        random.shuffle(occurrences)
        assert paragraph_drops(occurrences) == [
            (("wiki:10", ("f1", 4), 2), "books:a"),
            (("wiki:9", ("f2", 0), 1), "books:a"),
        ]
    assert paragraph_drops([("wiki:1", ("f", 0), 0)]) == []


def test_apply_drops_refilters_what_is_left():
    row = {
        "doc_id": "wiki:1",
        "source": "wiki",
        "title": "T",
        "paragraphs": [["A first sentence here.", "A second one here."], ["Boiler text here."]],
    }
    doc, reason = apply_drops(row, {1: "paragraph 1 same as wiki:0"}, CFG)
    assert reason is None and doc["sentences"] == ["A first sentence here.", "A second one here."]
    assert doc["num_sentences"] == 2 and doc["num_chars"] == 40
    assert apply_drops(row, {0: "x", 1: "x"}, CFG) == (None, "all_paragraphs_duplicate")
    assert apply_drops(row, {0: "x"}, CFG) == (None, "too_few_sentences")
    assert apply_drops(row, {}, dataclasses.replace(CFG, min_doc_chars=100)) == (None, "doc_too_short")


def make_inputs(root):
    (root / "wiki").mkdir(parents=True)
    write_dump(
        root / "wiki" / "a.xml",
        [
            page_xml(10, "Alpha", f"Alpha article first sentence here. Alpha second sentence here.\n\n{BOILER}"),
            page_xml(12, "Only boiler", BOILER),
        ],
    )
    write_dump(
        root / "wiki" / "b.xml",
        [
            page_xml(11, "Beta", f"{BOILER}\n\nBeta article first sentence here. Beta second sentence here."),
            page_xml(13, "Gamma", f"Gamma has a single sentence here.\n\n{BOILER}"),
        ],
    )
    (root / "books").mkdir()
    (root / "books" / "delta.txt").write_text(  # books:delta < wiki:..., so the book keeps it
        "Delta book first sentence here. Delta book second sentence here.\n\n"
        + BOILER.replace("article uses", "ARTICLE   uses")
        + "\n"
    )
    return {"wiki": str(root / "wiki"), "books": str(root / "books")}


def test_corpus_paragraph_dedup_in_the_job(tmp_path):
    inputs = make_inputs(tmp_path / "raw")
    outputs = []
    for workers in (1, 2):
        cfg = dataclasses.replace(CFG, beam=BeamConfig(num_workers=workers))
        out = tmp_path / f"out{workers}"
        m = run_corpus(cfg, inputs, str(out))
        rejects = pq.read_table(str(out / "rejects")).to_pylist()
        outputs.append(
            ({f.path: f.sha256 for f in m.files}, m.counts, sorted(tuple(sorted(r.items())) for r in rejects))
        )
    assert outputs[0] == outputs[1]  # same bytes, counts and rejects at 1 and 2 workers
    out = tmp_path / "out2"
    docs = {
        r["doc_id"]: r["sentences"]
        for r in pq.read_table(str(out / "wiki")).to_pylist() + pq.read_table(str(out / "books")).to_pylist()
    }
    assert docs == {
        "books:delta": [
            "Delta book first sentence here.",
            "Delta book second sentence here.",
            "This ARTICLE uses material from a shared source.",
            "It is licensed freely.",
        ],
        "wiki:10": ["Alpha article first sentence here.", "Alpha second sentence here."],
        "wiki:11": ["Beta article first sentence here.", "Beta second sentence here."],
    }
    c = read_manifest(str(out)).counts
    assert c["duplicate_paragraph_corpus"] == 4
    assert c["all_paragraphs_duplicate"] == 1 and c["too_few_sentences"] == 1
    assert c["read"] == 5 == c["documents"] + c["records_rejected"]
    assert c["sentences"] == 8 and c["parts_dropped"] == 4
    rejects = pq.read_table(str(out / "rejects")).to_pylist()
    assert (
        len(rejects)
        == c["rejects_written"]
        == (c["records_rejected"] + c["file_faults"] + c["duplicate_paragraph_corpus"])
    )
    by = collections.Counter((r["record_id"], r["reason"]) for r in rejects)
    assert by == {(f"wiki:{i}", "duplicate_paragraph_corpus"): 1 for i in (10, 11, 12, 13)} | {
        ("wiki:12", "all_paragraphs_duplicate"): 1,
        ("wiki:13", "too_few_sentences"): 1,
    }
    para = next(r for r in rejects if r["record_id"] == "wiki:11" and r["reason"] == "duplicate_paragraph_corpus")
    assert para["detail"] == "paragraph 0 same as books:delta" and para["sample"] == BOILER

    off = dataclasses.replace(CFG, dedup_paragraphs=False)
    m = run_corpus(off, inputs, str(tmp_path / "off"))
    assert m.counts["documents"] == 5 and m.counts["duplicate_paragraph_corpus"] == 0
    no_doc_dedup = dataclasses.replace(CFG, dedup_sentences=False)  # paragraphs still deduplicated
    m = run_corpus(no_doc_dedup, inputs, str(tmp_path / "no_doc_dedup"))
    assert m.counts["documents"] == 3 and m.counts["duplicate_paragraph_corpus"] == 4


def test_merging_many_runs_in_groups_gives_the_same_shards(tmp_path, monkeypatch):
    import pipeline.corpus.dedup as cd
    from pipeline.beam.shards import KEY, RunWriter
    from pipeline.corpus.filters import reject_row

    rng = random.Random(0)
    runs = []
    for r in range(7):  # 7 runs of 30 rows, some rows repeated across runs
        writer = RunWriter(cd.REJECT_SCHEMA, lambda k, r=r: str(tmp_path / "runs" / f"r{r}-{k}.parquet"))
        for _ in range(30):
            row = reject_row("wiki", "redirect", record_id=f"wiki:{rng.randrange(150)}", sample="x" * rng.randrange(50))
            row[KEY] = cd.sort_key(row["reject_id"] + row["sample"])
            writer.add(row)
        runs += writer.close()
    outputs = []
    for fan_in in (16, 2):
        monkeypatch.setattr(cd, "MAX_FAN_IN", fan_in)
        out = tmp_path / f"out{fan_in}"
        merge = cd._MergeFolder(str(out), str(tmp_path / f"work{fan_in}"), 3)
        assert list(merge.process(("rejects", list(reversed(runs))))) == [("rejects", [70, 70, 70])]
        outputs.append([(out / "rejects" / f"part-0000{i}-of-00003.parquet").read_bytes() for i in range(3)])
    assert outputs[0] == outputs[1]
    assert len(list((tmp_path / "work2" / "merge" / "rejects").iterdir())) == 4 + 2  # two levels


def test_spread_units_hands_off_only_files_that_cannot_be_split():
    from pipeline.corpus.read import HANDOFF, spread_units

    whole, ranged, book = (
        ("wiki", "a.xml.bz2", None, None, 0, 1),
        ("wiki", "m.bz2", 0, 9, 0, 1),
        ("books", "b.txt", None, None, 0, 1),
    )
    assert spread_units([whole, ranged, book], 1) == [whole, ranged, book]
    # One reader of the whole file, its records handed to every worker through batch files.
    assert spread_units([whole, ranged, book], 2) == [("wiki", "a.xml.bz2", None, None, 0, HANDOFF), ranged, book]
    assert spread_units([whole], 64) == [("wiki", "a.xml.bz2", None, None, 0, HANDOFF)]
    many = [("wiki", f"{i}.xml", None, None, 0, 1) for i in range(4)]
    assert spread_units(many, 2) == many  # two units per worker already


def test_single_file_handed_off_gives_the_same_corpus(tmp_path, monkeypatch):
    """A single-stream dump at 2 workers: one reader writes its records to batch files (tiny
    here, so many), every worker cleans some; same bytes, counts and rejects as 1 worker."""
    import glob

    import pipeline.corpus.read as corpus_read

    wiki = sorted(glob.glob("data/sample/wiki/*.xml.bz2"))
    assert len(wiki) == 1
    monkeypatch.setattr(corpus_read, "BATCH_BYTES", 20_000)  # forked workers inherit it
    outputs = []
    for workers in (1, 2):
        cfg = dataclasses.replace(CFG, sources=("wiki",), beam=BeamConfig(num_workers=workers))
        out = tmp_path / f"out{workers}"
        m = run_corpus(cfg, {"wiki": wiki[0]}, str(out))
        rejects = pq.read_table(str(out / "rejects")).to_pylist()
        outputs.append(
            ({f.path: f.sha256 for f in m.files}, m.counts, sorted(tuple(sorted(r.items())) for r in rejects))
        )
    assert outputs[0] == outputs[1]
    assert outputs[0][1]["wiki_documents"] > 300
    unit = corpus_read.spread_units(corpus_read.plan_units("wiki", wiki, cfg), 2)
    assert unit == [("wiki", wiki[0], None, None, 0, corpus_read.HANDOFF)]
    # The batches round-trip: what a reader writes is what the cleaners read.
    records = [{"doc_id": f"wiki:{i}", "source": "wiki", "title": f"T{i}", "text": "x" * 9000} for i in range(5)]
    writer = corpus_read._RecordBatches(str(tmp_path / "work"))
    urls = [u for r in records for u in writer.add(r)] + writer.close()
    assert len(urls) == 2  # written once 20,000 characters are held: 3 records, then the last 2
    assert [r for u in urls for r in corpus_read._ReadBatch().process(u)] == records


def test_dedup_partitions_follow_the_input_size_and_the_workers():
    """Each dedup pass writes up to producers x partitions run files: the sample (424 KB as given) gets
    one partition whatever the workers (it got 64 on every non-local runner, thousands of small
    objects on gs://); a big input one per worker, up to one per PARTITION_BYTES."""
    from pipeline.corpus.inputs import check_corpus_inputs
    from pipeline.corpus.job import PARTITION_BYTES, dedup_partitions, input_bytes, job_workers

    sample_dir = Path(__file__).resolve().parents[2] / "data" / "sample"
    files = check_corpus_inputs(CFG, {name: str(sample_dir / name) for name in ("wiki", "books")})
    sample = input_bytes(files)
    assert 100_000 < sample < PARTITION_BYTES
    assert dedup_partitions(CFG, 64, sample) == 1
    assert dedup_partitions(CFG, 64, 20 << 30) == 64  # a 20 GB dump: one per worker
    assert dedup_partitions(CFG, 64, 3 * PARTITION_BYTES) == 3
    assert dedup_partitions(CFG, 2, None) == 2  # size not known: one per worker
    assert dedup_partitions(dataclasses.replace(CFG, near_dup_threshold=0.8), 64, 20 << 30) == 1
    assert job_workers(BeamConfig(runner="PortableRunner")) == 1
    assert job_workers(BeamConfig(runner="FnApiRunner", num_workers=3)) == 3
    assert job_workers(BeamConfig(**DATAFLOW_SCALE)) == 100


DATAFLOW_SCALE = {
    "runner": "DataflowRunner",
    "project": "p",
    "region": "r",
    "temp_location": "gs://b/tmp",
    "sdk_container_image": "img",
    "num_workers": 10,
    "max_num_workers": 100,
}


def test_letters_and_visible_counts_every_character_as_str_does():
    """The byte-translation count of ASCII inside non-ASCII text (a UTF-8 encoding, the other
    characters found by a regex) equals str.isalpha / str.isspace character by character: every
    code point (lone surrogates included) between ASCII, and random mixes of any share."""
    import random

    from pipeline.corpus.filters import letters_and_visible

    def by_char(text):
        return sum(map(str.isalpha, text)), len(text) - sum(map(str.isspace, text))

    for c in range(0x110000):
        text = "ab " + chr(c) + " 1."
        assert letters_and_visible(text) == by_char(text), hex(c)
    rng = random.Random(2)
    for _ in range(3000):
        share = rng.random()
        text = "".join(
            chr(rng.randrange(0x80, 0x110000)) if rng.random() < share else chr(rng.randrange(0, 0x80))
            for _ in range(rng.randrange(0, 80))
        )
        assert letters_and_visible(text) == by_char(text), repr(text)


def test_an_output_folder_merge_holds_a_bounded_amount_of_arrow_memory(tmp_path):
    """The last phase of the job merges each folder's runs into shards: 16 runs of 3 MB of
    documents (10 KB rows) merge with under 40 MiB of Arrow memory at once (29 MiB measured;
    64 MiB with the former 16 MiB merge budget), into the same shards as the producers' rows in
    key order."""
    import pyarrow as pa

    from pipeline.beam.shards import KEY, RunWriter
    from pipeline.corpus.dedup import _MergeFolder, sort_key
    from pipeline.schema.parquet import DOCUMENT_SCHEMA

    rng = random.Random(9)
    runs, docs = [], []
    for p in range(16):
        writer = RunWriter(DOCUMENT_SCHEMA, lambda r, p=p: str(tmp_path / "runs" / f"p{p:02d}-{r}.parquet"), 1 << 30)
        for i in range(300):
            sentences = [rng.randbytes(50).hex() + " ." for _ in range(100)]
            doc = {"doc_id": f"wiki:{p}-{i}", "source": "wiki", "title": f"T{p}-{i}", "sentences": sentences,
                   "num_sentences": 100, "num_chars": sum(map(len, sentences))}  # fmt: skip
            docs.append(doc)
            writer.add({**doc, KEY: sort_key(doc["doc_id"])})
        runs += writer.close()
    pool, default = pa.proxy_memory_pool(pa.system_memory_pool()), pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        [(folder, rows)] = _MergeFolder(str(tmp_path / "out"), str(tmp_path / "work"), 4).process(("wiki", runs))
    finally:
        pa.set_memory_pool(default)
    assert folder == "wiki" and sum(rows) == len(docs)
    assert pool.max_memory() < 40 << 20, pool.max_memory()
    written = [r for j in range(4) for r in pq.read_table(tmp_path / "out" / "wiki" / shard_name(j, 4)).to_pylist()]
    assert written == sorted(docs, key=lambda d: sort_key(d["doc_id"]))
