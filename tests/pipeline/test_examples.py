"""The examples Beam job end to end: counts, contents, and byte-identical output whatever the
worker count, the corpus file layout or the run."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.beam.config import BeamConfig
from pipeline.examples.config import ExamplesConfig
from pipeline.examples.job import example_key, num_buckets_for, run_examples
from pipeline.examples.tokens import plan_token_work, token_work
from pipeline.examples.view import decode_examples, histogram_bin, histogram_bins
from pipeline.schema.manifest import ManifestError, read_manifest, write_manifest
from pipeline.schema.parquet import DOCUMENT_SCHEMA, example_schema
from pipeline.vocab.config import VocabConfig
from pipeline.vocab.job import run_vocab
from pipeline.vocab.tokenizer import read_vocab

WORDS = (
    "river town guild salt ship heron mountain north south poet merchant weaving copper "
    "harbour bridge lantern the a of in and was is by its from to near beside founded old "
    "new great small grey silver painted wrote sailed built crossed"
).split()
NUM_DOCS = 300
CONFIG = ExamplesConfig(
    max_seq_lengths=(32, 64),
    max_predictions_per_seq=(5, 10),
    dupe_factor=2,
    num_shards=3,
    seed=7,
    docs_per_bucket=128,
)


def make_docs(num_docs: int) -> list[dict]:
    rng = random.Random(11)
    docs = []
    for i in range(num_docs):
        sentences = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))).capitalize() + "."
            for _ in range(rng.randint(1, 12))
        ]
        docs.append(
            {
                "doc_id": f"synth:{i:05d}",
                "source": "books",
                "title": f"Doc {i}",
                "sentences": sentences,
                "num_sentences": len(sentences),
                "num_chars": sum(map(len, sentences)),
            }
        )
    # Two documents that tokenize to nothing, and a doc_id seen twice.
    for i, text in enumerate(["   ", "\u200b"]):
        docs.append(
            {
                "doc_id": f"empty:{i}",
                "source": "books",
                "title": "",
                "sentences": [text],
                "num_sentences": 1,
                "num_chars": len(text),
            }
        )
    docs.append(dict(docs[0], sentences=["A duplicate of the first id."]))
    return docs


def write_corpus(path, docs, shards: int, row_group_size: int | None = None) -> str:
    path.mkdir(parents=True)
    for k in range(shards):
        table = pa.Table.from_pylist(docs[k::shards], schema=DOCUMENT_SCHEMA)
        pq.write_table(table, path / f"part-{k:05d}-of-{shards:05d}.parquet", row_group_size=row_group_size)
    write_manifest("corpus", str(path), {}, {}, {"documents": len(docs)})
    return str(path)


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    docs = make_docs(NUM_DOCS)
    corpus = write_corpus(root / "corpus", docs, shards=2)
    vocab = str(root / "vocab")
    run_vocab(VocabConfig(vocab_size=300, min_frequency=2), corpus, vocab)
    out = str(root / "examples")
    manifest = run_examples(CONFIG, corpus, vocab, out)
    return root, docs, corpus, vocab, manifest


def read_rows(manifest, length):
    return [
        row
        for url in manifest.file_urls(".parquet")
        if f"/seq{length}/" in url
        for row in pq.read_table(url).to_pylist()
    ]


def test_manifest_counts_match_the_files(stages):
    root, docs, _, vocab, manifest = stages
    assert read_manifest(manifest.url).fingerprint == manifest.fingerprint
    assert sorted(f.path for f in manifest.files) == sorted(
        [f"seq{n}/part-{k:05d}-of-00003.parquet" for n in (32, 64) for k in range(3)] + ["vocab.txt"]
    )
    assert read_vocab(manifest.url + "/vocab.txt") == read_vocab(vocab + "/vocab.txt")
    for n in (32, 64):
        rows = read_rows(manifest, n)
        c = manifest.counts
        assert c[f"seq{n}.examples"] == len(rows) > NUM_DOCS
        shard_rows = [f.rows for f in manifest.files if f.path.startswith(f"seq{n}/")]
        assert sum(shard_rows) == len(rows) and max(shard_rows) - min(shard_rows) <= 1  # balanced
        assert c[f"seq{n}.tokens"] == sum(len(r["input_ids"]) for r in rows)
        assert c[f"seq{n}.eligible_tokens"] == sum(len(r["input_ids"]) - 3 for r in rows)
        assert c[f"seq{n}.masked_tokens"] == sum(len(r["masked_ids"]) for r in rows)
        assert c[f"seq{n}.random_next"] == sum(r["is_random_next"] for r in rows)
        assert 0.45 < c[f"seq{n}.random_next_share"] < 0.7
        assert 0.35 < c[f"seq{n}.random_next_share_multi_sentence"] < 0.65
        assert c[f"seq{n}.random_next_multi"] <= c[f"seq{n}.multi_sentence_chunk"] < len(rows)
        assert c[f"seq{n}.masked_share"] == pytest.approx(0.15, abs=0.02)
        hist = {k: v for k, v in c.items() if k.startswith(f"seq{n}.length_hist.")}
        assert sum(hist.values()) == len(rows)
        lengths = [len(r["input_ids"]) for r in rows]
        for lo in histogram_bins(n):
            assert hist[f"seq{n}.length_hist.{lo:04d}"] == sum(
                histogram_bin(x, n) == histogram_bins(n).index(lo) for x in lengths
            )
    assert manifest.counts["documents"] == len(docs)
    assert manifest.counts["docs_skipped_too_short"] == 2
    assert manifest.counts["duplicate_doc_ids_dropped"] == 1
    assert manifest.counts["num_buckets"] == num_buckets_for(len(docs), 0, CONFIG) == 3
    v = read_vocab(vocab + "/vocab.txt")
    assert [manifest.counts[k] for k in ("pad_id", "cls_id", "sep_id", "mask_id")] == [
        v.index(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
    ]
    assert manifest.counts["vocab_fingerprint"] == read_manifest(vocab).fingerprint
    assert manifest.config["masking"] == "static" and manifest.config["whole_word_mask"] is False
    assert manifest.inputs == {
        "corpus": read_manifest(stages[2]).fingerprint,
        "vocab": read_manifest(vocab).fingerprint,
    }
    assert manifest.config["dupe_factor"] == 2


def test_example_contents(stages):
    _, _, _, vocab_url, manifest = stages
    vocab = read_vocab(vocab_url + "/vocab.txt")
    cls, sep, mask = (vocab.index(t) for t in ("[CLS]", "[SEP]", "[MASK]"))
    for n, cap in ((32, 5), (64, 10)):
        table = pq.read_table(manifest.file_urls(".parquet")[0 if n == 32 else 3])
        assert table.schema.equals(example_schema(len(vocab), n))  # the transient key is gone
        for row in table.to_pylist():
            ids = row["input_ids"]
            assert len(ids) <= n and ids[0] == cls and ids[-1] == sep
            assert ids[row["len_a"] - 1] == sep and ids.count(sep) == 2
            assert 1 <= len(row["masked_positions"]) <= cap
            assert row["masked_positions"] == sorted(row["masked_positions"])
            assert all(ids[p] != cls and ids[p] != sep for p in row["masked_positions"])
            assert all(t not in (cls, sep, mask) for t in row["masked_ids"])
            assert max(ids) < len(vocab)


def test_byte_identical_across_workers_layouts_and_runs(stages, tmp_path):
    root, docs, corpus, vocab, manifest = stages
    # Another file layout of the same documents (small row groups: the local runner's workers
    # share them out, see plan_token_work), two and three worker processes.
    other_corpus = write_corpus(tmp_path / "corpus3", list(reversed(docs)), shards=3, row_group_size=37)
    checksums = lambda m: sorted((f.path, f.sha256) for f in m.files)
    for workers in (2, 3):
        many = run_examples(
            ExamplesConfig(**{**CONFIG.__dict__, "beam": BeamConfig(num_workers=workers)}),
            other_corpus,
            vocab,
            str(tmp_path / f"examples{workers}"),
        )
        assert checksums(many) == checksums(manifest)
    again = run_examples(CONFIG, corpus, vocab, manifest.url)  # rerun in place: clears first
    assert again.fingerprint == manifest.fingerprint


def test_token_work_is_balanced_and_complete(stages, tmp_path):
    _, docs, _, _, _ = stages
    # Files of very different sizes: one file of long documents, two of short ones.
    long_docs = [dict(d, sentences=d["sentences"] * 6) for d in docs[:60]]
    write_corpus(tmp_path / "uneven", docs[60:], shards=2, row_group_size=25)
    big = write_corpus(tmp_path / "big", long_docs, shards=1, row_group_size=10)
    urls = sorted(str(p) for p in (tmp_path / "uneven").glob("*.parquet")) + [big + "/part-00000-of-00001.parquet"]
    groups = {u: pq.ParquetFile(u).metadata.num_row_groups for u in urls}
    sizes = {(u, g): pq.ParquetFile(u).metadata.row_group(g).total_byte_size for u in urls for g in range(groups[u])}
    for workers in (2, 3, 4):
        parts = plan_token_work(urls, workers)
        assert [p for p, _ in parts] == list(range(workers))
        covered = [(u, g) for _, units in parts for u, first, end in units for g in range(first, end)]
        assert sorted(covered) == sorted(sizes)  # every row group exactly once
        loads = [sum(sizes[u, g] for u, first, end in units for g in range(first, end)) for _, units in parts]
        assert max(loads) <= 1.3 * sum(loads) / workers
    assert token_work(urls, BeamConfig(num_workers=1)) == [(i, [(u, 0, -1)]) for i, u in enumerate(urls)]


def test_refuses_unfinished_inputs(stages, tmp_path):
    _, _, corpus, _, _ = stages
    (tmp_path / "vocab").mkdir()
    with pytest.raises(ManifestError):
        run_examples(CONFIG, corpus, str(tmp_path / "vocab"), str(tmp_path / "out"))


def test_example_key_is_unique_and_stable():
    keys = {example_key(d, c, i) for d in ("a", "a|1", "b") for c in range(3) for i in range(12)}
    assert len(keys) == 3 * 3 * 12
    assert example_key("wiki:1", 2, 3) == example_key("wiki:1", 2, 3) < 1 << 64


def test_dynamic_masking_writes_unmasked_pairs(stages, tmp_path):
    _, _, corpus, vocab, static = stages
    cfg = ExamplesConfig(**{**CONFIG.__dict__, "masking": "dynamic"})
    dyn = run_examples(cfg, corpus, vocab, str(tmp_path / "dyn"))
    assert dyn.config["masking"] == "dynamic"
    mask = read_vocab(vocab + "/vocab.txt").index("[MASK]")
    for n in (32, 64):
        rows = read_rows(dyn, n)
        assert dyn.counts[f"seq{n}.masked_tokens"] == 0
        assert all(r["masked_positions"] == [] and r["masked_ids"] == [] for r in rows)
        assert all(mask not in r["input_ids"] for r in rows)
        assert len(rows) > NUM_DOCS


def test_decode_examples_shows_masks(stages):
    _, _, _, vocab, manifest = stages
    lines = decode_examples(manifest.url, 4)
    assert len(lines) == 4
    for line in lines:
        assert line.startswith("(actual-next") or line.startswith("(random-next")
        assert "[CLS]" in line and line.count("[SEP]") == 2
        assert "→" in line  # every static example has a masked position
    assert len(decode_examples(manifest.url, 3, max_seq_length=64)) == 3


def test_no_examples_never_ends_done(stages, tmp_path):
    """A corpus stage that finished with 0 documents (corpus.allow_empty_sources) gives the vocab
    stage nothing to learn and the examples stage nothing to write: both fail, no manifest."""
    from pipeline.schema.manifest import has_manifest

    _, _, _, vocab, _ = stages
    empty = write_corpus(tmp_path / "empty", [], shards=1)
    with pytest.raises(ValueError, match="no sentences"):
        run_vocab(VocabConfig(vocab_size=300, min_frequency=2), empty, str(tmp_path / "v"))
    assert not has_manifest(str(tmp_path / "v"))
    with pytest.raises(ValueError, match="examples: 0 examples of length 32 from the 0 documents"):
        run_examples(CONFIG, empty, vocab, str(tmp_path / "ex"))
    assert not has_manifest(str(tmp_path / "ex"))
