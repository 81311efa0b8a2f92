"""The corpus source registry walked row by row: every row resolves, has a sample in its layout,
and its reader reads that sample into records its paragraphs function and the cleaning turn into
documents; the config, the input check and the run config's data URLs know every row."""

import collections
import dataclasses
import re
from pathlib import Path

import pytest

from pipeline.corpus import sources as S
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.documents import build_document, paragraphs_of
from pipeline.corpus.inputs import check_corpus_inputs
from pipeline.corpus.read import plan_units

DATA = Path(__file__).resolve().parents[2] / "data"
ROWS = list(S.SOURCES.values())


class FakeDoFn:
    """What a reader is given: the config, counters and reject rows, kept here to look at."""

    def __init__(self, config: CorpusConfig):
        self.config = config
        self.counts: collections.Counter = collections.Counter()
        self.rejects: list[tuple[str, str, dict]] = []

    def count(self, name: str, value: int = 1) -> None:
        self.counts[name] += value

    def reject(self, source: str, reason: str, **fields) -> None:
        self.rejects.append((source, reason, fields))


def read_all(reader, dofn, unit) -> tuple[list[dict], int]:
    records, gen = [], reader(dofn, unit)
    while True:
        try:
            records.append(next(gen))
        except StopIteration as done:
            return records, done.value


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_every_row_reads_its_sample_into_documents(row):
    config = CorpusConfig(sources=(row.name,), beam=dataclasses.replace(CorpusConfig().beam, num_workers=1))
    sample = DATA / row.sample
    assert sample.exists(), f"{row.name}: its sample data/{row.sample} is missing"
    files = check_corpus_inputs(config, {row.name: str(sample)})[row.name]
    assert files and all(f.lower().endswith(row.suffixes) for f in files)

    dofn, records, read = FakeDoFn(config), [], 0
    for unit in plan_units(row.name, files, config):
        assert unit[0] == row.name
        got, n = read_all(S.resolve(row.read), dofn, unit)
        records += got
        read += n
    assert records, f"{row.name}: its reader read no record of its sample"
    assert read == len(records) + len(dofn.rejects), "records read = records + rejects"
    for record in records:
        assert record["source"] == row.name and record["doc_id"].startswith(f"{row.name}:")
        assert isinstance(record["text"], str) and "title" in record
    assert len({r["doc_id"] for r in records}) == len(records)

    assert S.resolve(row.paragraphs)(records[0]["text"], config) == paragraphs_of(records[0], config)
    documents = [build_document(r, config)[0] for r in records]
    assert any(d is not None and d["num_sentences"] >= 2 for d in documents)


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_every_row_is_complete(row):
    assert row.hint and row.kind and row.rejects
    assert row.suffixes and all(s == s.lower() and s.startswith(".") for s in row.suffixes)
    for ref in (row.read, row.paragraphs, row.plan):
        if ref:
            assert callable(S.resolve(ref)), ref
    if row.companions:
        re.compile(row.companions)
    assert S.reader_for(f"x{row.suffixes[0]}") is row  # no two rows claim one file name


def test_the_config_and_the_run_config_know_every_row():
    from flows.presets import DataConfig, load_config, resolve_data

    assert set(S.CORPUS_SOURCES) == set(S.SOURCES)
    assert set(CorpusConfig().sources) == set(S.DEFAULT_SOURCES)
    data = load_config("tiny").data
    assert set(data.source_urls()) == set(S.SOURCES)
    resolved = resolve_data(data)
    for row in ROWS:  # a bundled source is filled with the sample, another stays the user's
        url = resolved.source_urls()[row.name]
        assert (url == str(Path(url).parent / row.name)) if row.bundled else url == ""
    # resolve_data keeps every field it does not fill (none is copied by hand and so forgotten)
    odd = DataConfig(finetune_model="/m", required=True, downstream_urls={"sst2": "/s"}, text="/t.jsonl")
    kept = resolve_data(odd)
    for f in dataclasses.fields(DataConfig):
        if f.name not in {r.name for r in ROWS if r.bundled} | {"downstream", "sources"}:
            assert getattr(kept, f.name) == getattr(odd, f.name), f.name


def test_data_sources_takes_only_rows_without_a_field_of_their_own():
    from flows.presets import DataConfig
    from pipeline.schema.config import ConfigError

    with pytest.raises(ConfigError, match=r"data.sources.news: unknown corpus source"):
        DataConfig(sources={"news": "/n"})
    with pytest.raises(ConfigError, match=r"data.sources.wiki: the wiki source's URL is data.wiki"):
        DataConfig(sources={"wiki": "/w"})
    assert DataConfig(wiki="/w").source_field("wiki") == "data.wiki"


def test_text_suffixes_match_the_text_module():
    from pipeline.corpus.text import TEXT_SUFFIXES

    assert set(S.SOURCES["text"].suffixes) == set(TEXT_SUFFIXES)
