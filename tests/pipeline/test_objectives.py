"""The pretraining objectives: the table, the builders (sop's swaps, mlm's packing across
documents), the columns of each objective's shards, and the typed lengths a manifest records."""

from __future__ import annotations

import dataclasses

import pyarrow.parquet as pq
import pytest

from pipeline.examples.config import ExamplesConfig
from pipeline.examples.job import run_examples
from pipeline.examples.masking import VocabIds
from pipeline.examples.objectives import builder_of, full_sentences, sentence_order
from pipeline.examples.view import decode_examples
from pipeline.schema.config import ConfigError
from pipeline.schema.manifest import read_manifest
from pipeline.schema.objectives import DEFAULT_OBJECTIVE, OBJECTIVES, derive_max_predictions, get_objective
from pipeline.schema.outputs import (
    VocabOutput,
    example_lengths,
    objective_of,
    parse_seq_folder,
    seq_folder,
    vocab_output,
)
from pipeline.schema.parquet import example_schema
from pipeline.vocab.config import VocabConfig
from pipeline.vocab.job import run_vocab
from pipeline.vocab.tokenizer import read_vocab
from tests.pipeline.test_examples import NUM_DOCS, make_docs, write_corpus

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(5, 2000)]
IDS = VocabIds.from_vocab(VOCAB)
CLS, SEP = IDS.cls_id, IDS.sep_id
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def numbered_docs(num_docs: int, sentences: int = 6, words: int = 5):
    """Document d's sentence s is the run of ids 5 + d*100 + s*words ...: every token says where it came from."""
    ids = [f"d{d:03d}" for d in range(num_docs)]
    docs = [[[5 + d * 100 + s * words + w for w in range(words)] for s in range(sentences)] for d in range(num_docs)]
    return ids, docs


def test_the_table_default_and_unknown_names():
    assert DEFAULT_OBJECTIVE == "mlm+nsp" and set(OBJECTIVES) == {"mlm+nsp", "mlm", "sop"}
    assert get_objective("mlm").columns == ("input_ids", "masked_positions", "masked_ids")
    assert get_objective("mlm+nsp").columns == (
        "input_ids",
        "len_a",
        "masked_positions",
        "masked_ids",
        "is_random_next",
    )
    assert get_objective("sop").columns == ("input_ids", "len_a", "masked_positions", "masked_ids", "is_swapped")
    assert [get_objective(n).losses for n in ("mlm+nsp", "mlm", "sop")] == [("mlm", "nsp"), ("mlm",), ("mlm", "sop")]
    for name, o in OBJECTIVES.items():
        assert builder_of(name).__name__ == o.builder
        assert example_schema(3000, 64, name).names == list(o.columns)
    with pytest.raises(ConfigError, match=r"examples.objective: unknown objective 'nsp'.*'mlm', 'mlm\+nsp', 'sop'"):
        ExamplesConfig(objective="nsp")


def test_masking_rate_any_value_in_0_1_and_max_predictions_derived_unless_set():
    assert [derive_max_predictions(n, 0.15) for n in (64, 128, 512)] == [10, 20, 80]  # the presets' and paper's
    assert [derive_max_predictions(n, 0.3) for n in (64, 128, 512)] == [20, 40, 155]
    assert ExamplesConfig(masked_lm_prob=0.3, max_seq_lengths=(128,)).max_predictions(128) == 40
    assert (
        ExamplesConfig(masked_lm_prob=0.3, max_seq_lengths=(128,), max_predictions_per_seq=(7,)).max_predictions(128)
        == 7
    )
    assert ExamplesConfig(masked_lm_prob=0.99, max_seq_lengths=(16,)).max_predictions(16) == 15  # below the length
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ConfigError, match="examples.masked_lm_prob: must lie in \\(0, 1\\)"):
            ExamplesConfig(masked_lm_prob=bad)


def test_seq_folder_built_and_parsed_in_one_place():
    assert seq_folder(128) == "seq128" and parse_seq_folder("seq128") == 128
    for bad in ("seq", "seq0", "seqx", "128", "examples"):
        with pytest.raises(ValueError, match="not a sequence-length folder"):
            parse_seq_folder(bad)


def test_sop_pairs_are_consecutive_spans_of_one_document_swapped_about_half_the_time():
    ids, docs = numbered_docs(40, sentences=4)  # 20 tokens: mostly no truncation
    cfg = ExamplesConfig(objective="sop", max_seq_lengths=(32,), dupe_factor=3, short_seq_prob=0.0)
    rows = list(sentence_order(ids, docs, 32, 5, cfg, IDS))
    assert rows and {tuple(sorted(r)) for _, _, _, r in rows} == {
        ("input_ids", "is_swapped", "len_a", "masked_ids", "masked_positions", "multi_sentence_chunk", "special_tokens")
    }
    keys = [(d, c, k) for d, c, k, _ in rows]
    assert len(set(keys)) == len(keys)
    swapped = adjacent = 0
    for doc_id, _, _, row in rows:
        tokens = list(row["input_ids"])
        for p, orig in zip(row["masked_positions"], row["masked_ids"], strict=True):
            tokens[p] = orig
        la = row["len_a"]
        a, b = tokens[1 : la - 1], tokens[la:-1]
        assert tokens[0] == CLS and tokens[la - 1] == SEP and tokens[-1] == SEP and a and b
        doc = (a[0] - 5) // 100
        assert f"d{doc:03d}" == doc_id and all((t - 5) // 100 == doc for t in a + b)  # one document
        first, second = (b, a) if row["is_swapped"] else (a, b)
        # in order: the second span follows the first; adjacent unless truncation cut a side
        assert first[-1] < second[0] and (first[-1] + 1 == second[0] or len(a) + len(b) == 32 - 3)
        adjacent += first[-1] + 1 == second[0]
        assert all(x + 1 == y for x, y in zip(first, first[1:])) and all(x + 1 == y for x, y in zip(second, second[1:]))
        swapped += row["is_swapped"]
    assert 0.4 < swapped / len(rows) < 0.6 and adjacent > len(rows) / 2


def test_mlm_packs_whole_sentences_across_documents_with_sep():
    ids, docs = numbered_docs(30, sentences=3, words=7)  # 21-token documents, 62 tokens of room
    cfg = ExamplesConfig(objective="mlm", max_seq_lengths=(64,), dupe_factor=2, short_seq_prob=0.0)
    rows = list(full_sentences(ids, docs, 64, 10, cfg, IDS))
    keys = [(d, c, k) for d, c, k, _ in rows]
    assert len(set(keys)) == len(keys)
    crossing = 0
    seen = {0: [], 1: []}
    for doc_id, copy, _, row in rows:
        assert set(row) == {"input_ids", "masked_positions", "masked_ids", "special_tokens"}  # no len_a, no label
        tokens = list(row["input_ids"])
        for p, orig in zip(row["masked_positions"], row["masked_ids"], strict=True):
            assert tokens[p] not in (CLS, SEP) and orig not in (CLS, SEP)
            tokens[p] = orig
        assert tokens[0] == CLS and tokens[-1] == SEP and len(tokens) <= 64
        assert row["special_tokens"] == tokens.count(CLS) + tokens.count(SEP)
        parts = [[]]
        for t in tokens[1:-1]:
            parts[-1].append(t) if t != SEP else parts.append([])
        docs_in = [(p[0] - 5) // 100 for p in parts]
        assert f"d{docs_in[0]:03d}" == doc_id  # keyed by the document it starts in
        assert all(len({(t - 5) // 100 for t in p}) == 1 for p in parts)  # a [SEP] between any two documents
        assert all(len(p) % 7 == 0 for p in parts)  # whole sentences only
        crossing += len(parts) > 1
        seen[copy] += [t for p in parts for t in p]
    assert crossing > len(rows) / 2  # 21-token documents: most examples hold several
    for copy in (0, 1):  # every sentence once per copy, none twice
        assert sorted(seen[copy]) == sorted(t for d in docs for s in d for t in s)
    assert [r["input_ids"] for *_, r in rows] == [
        r["input_ids"] for *_, r in full_sentences(ids, docs, 64, 10, cfg, IDS)
    ]


def test_a_sentence_longer_than_the_length_is_cut_and_starts_its_own_example():
    ids, docs = ["a", "b"], [[[5] * 3], [list(range(10, 90))]]
    cfg = ExamplesConfig(objective="mlm", max_seq_lengths=(32,), dupe_factor=1, short_seq_prob=0.0, masking="dynamic")
    rows = [r["input_ids"] for *_, r in full_sentences(ids, docs, 32, 5, cfg, IDS)]
    assert sorted(rows, key=len) == sorted([[CLS, 5, 5, 5, SEP], [CLS, *range(10, 40), SEP]], key=len)


@pytest.fixture(scope="module")
def objective_stages(tmp_path_factory):
    root = tmp_path_factory.mktemp("objectives")
    corpus = write_corpus(root / "corpus", make_docs(NUM_DOCS), shards=2)
    vocab = str(root / "vocab")
    run_vocab(VocabConfig(vocab_size=300, min_frequency=2), corpus, vocab)
    out = {}
    for name in ("mlm", "sop"):
        cfg = ExamplesConfig(
            objective=name, max_seq_lengths=(32,), masked_lm_prob=0.3, dupe_factor=1, num_shards=2, seed=7
        )
        out[name] = run_examples(cfg, corpus, vocab, str(root / f"examples-{name.replace('+', '_')}"))
    out["vocab"] = read_manifest(vocab)
    return out


def test_the_vocab_stage_records_what_it_produced_and_it_is_read_back_once(objective_stages):
    manifest = objective_stages["vocab"]
    vocab = read_vocab(manifest.url + "/vocab.txt")
    produced = vocab_output(manifest)
    assert produced == VocabOutput(True, "none", "wordpiece", len(vocab), *(vocab.index(t) for t in SPECIALS))
    assert vocab_output(read_manifest(manifest.url)) == produced
    older = dataclasses.replace(manifest, outputs={})  # written before outputs existed: read from its config
    assert vocab_output(older, vocab) == produced
    with pytest.raises(ValueError, match="without outputs; pass its vocab.txt"):
        vocab_output(older)


def test_each_objectives_shards_carry_its_columns_and_the_manifest_its_lengths(objective_stages):
    for name in ("mlm", "sop"):
        manifest = objective_stages[name]
        o = get_objective(name)
        rows = 0
        for url in manifest.file_urls(".parquet"):
            table = pq.read_table(url)
            assert table.column_names == list(o.columns), url
            rows += table.num_rows
        c = manifest.counts
        assert c["seq32.examples"] == rows > 0
        assert c["seq32.masked_share"] == pytest.approx(0.3, abs=0.04)  # the 30% rate, not capped at 15%
        lengths = example_lengths(read_manifest(manifest.url))
        assert lengths == {32: example_lengths(manifest)[32]}
        assert dataclasses.asdict(lengths[32]) == {
            "max_seq_length": 32,
            "max_predictions": 10,
            "masking": "static",
            "masked_lm_prob": 0.3,
            "whole_word_mask": False,
            "objective": name,
        }
        assert objective_of(manifest) is o
        assert decode_examples(manifest.url, 2) and all("[CLS]" in line for line in decode_examples(manifest.url, 2))
    assert "seq32.random_next_share" not in objective_stages["mlm"].counts
    assert 0.4 < objective_stages["sop"].counts["seq32.swapped_share"] < 0.6
    assert decode_examples(objective_stages["sop"].url, 1)[0].startswith(("(in-order, len_a=", "(swapped, len_a="))
    line = decode_examples(objective_stages["mlm"].url, 1)[0]
    assert line.startswith("(") and line.split(" ", 2)[1:] == ["masked)", line.split(" ", 2)[2]]
    assert "len_a" not in line and line.split(" ", 2)[2].startswith("[CLS]")


def test_a_manifest_without_outputs_reads_as_mlm_nsp(objective_stages):
    m = dataclasses.replace(objective_stages["sop"], outputs={}, config={**objective_stages["sop"].config})
    m.config.update(max_predictions_per_seq=[], masked_lm_prob=0.15)
    (x,) = example_lengths(m).values()
    assert (x.objective, x.max_predictions, x.masked_lm_prob) == (DEFAULT_OBJECTIVE, 5, 0.15)
