"""The stage table: one row per stage drives folders, inputs, skipping, the CLI and the flows."""

import os

import pytest

from flows.presets import ConfigError, load_config
from flows.stages import (
    CHAIN,
    STAGES,
    check_inputs_ready,
    code_modules,
    code_version,
    digest_sources,
    get_stage,
    model_config,
    stage_inputs,
    stage_names,
    stage_state,
    stage_url,
    stages_after,
)
from pipeline.schema.manifest import ManifestError, fingerprint_input, read_manifest, save_manifest, write_manifest


def test_one_table_drives_the_cli_and_the_flows():
    from flows.cli import CHAIN as CLI_CHAIN
    from flows.downstream import TASKS
    from flows.stage_flows import STAGE_FLOWS

    assert CLI_CHAIN == CHAIN
    assert set(STAGE_FLOWS) == set(CHAIN) == set(STAGES) | {"finetune"}
    cfg = load_config("tiny")
    assert stage_names(cfg) == [
        "corpus",
        "vocab",
        "examples",
        "pretrain",
        "export",
        "finetune/sst2",
        "finetune/squad1",
        "finetune/conll2003",
    ]
    for task in TASKS:  # every downstream task is a row of its own
        row = get_stage(f"finetune/{task}")
        assert row.folder == f"finetune/{task}" and row.where == "process" and row.retries >= 1
    assert get_stage("pretrain").where == "training"
    with pytest.raises(KeyError, match="unknown downstream task 'bogus'"):
        get_stage("finetune/bogus")


def test_stage_folders_follow_the_design(tmp_path):
    root = str(tmp_path)
    assert stage_url(root, "pretrain") == f"{root}/checkpoints"
    assert stage_url(root, "export") == f"{root}/model"
    assert stage_url(root, "finetune/sst2") == f"{root}/finetune/sst2"
    assert stage_url("gs://bucket/run", "corpus") == "gs://bucket/run/corpus"
    cfg = load_config("tiny")
    assert stage_inputs("examples", cfg, root) == {"corpus": f"{root}/corpus", "vocab": f"{root}/vocab"}
    assert stage_inputs("finetune/sst2", cfg, root)["data"].endswith("glue/SST-2")


def test_given_urls_replace_the_roots_folders(tmp_path):
    cfg = load_config("tiny")
    inputs = stage_inputs("vocab", cfg, str(tmp_path), {"corpus": "gs://other/run/corpus"})
    assert inputs == {"corpus": "gs://other/run/corpus"}
    with pytest.raises(KeyError, match="no input 'vocab'"):
        stage_inputs("vocab", cfg, str(tmp_path), {"vocab": "x"})


def test_force_reaches_every_later_stage():
    assert stages_after("examples") == ["examples", "pretrain", "export", "finetune"]
    assert stages_after("finetune/sst2") == ["finetune"]
    with pytest.raises(KeyError, match="unknown stage"):
        stages_after("bogus")


def test_missing_upstream_is_named_before_work(tmp_path):
    cfg = load_config("tiny")
    with pytest.raises(ManifestError, match="bertflow stage corpus"):
        check_inputs_ready("vocab", cfg, str(tmp_path))
    with pytest.raises(ManifestError, match="bertflow stage export"):
        check_inputs_ready("finetune/sst2", cfg, str(tmp_path))
    missing = load_config("tiny", {"data.wiki": str(tmp_path / "no-such-dump.xml.bz2")})
    with pytest.raises(FileNotFoundError, match="no-such-dump"):
        check_inputs_ready("corpus", missing, str(tmp_path))


def test_code_version_covers_the_modules_a_stage_reaches():
    corpus = set(code_modules("corpus"))
    assert {"pipeline.corpus", "pipeline.wikitext", "pipeline.sentences", "pipeline.schema"} <= corpus
    assert not any(m.startswith(("model", "tasks")) for m in corpus)
    pretrain = set(code_modules("pretrain"))
    assert {"model.train", "model.bert", "pipeline.schema"} <= pretrain and "pipeline.corpus" not in pretrain
    assert "tasks.glue" in code_modules("finetune/sst2")
    sources = dict(code_modules("vocab"))
    before = digest_sources(sources)
    sources["pipeline.wordpiece"] += b"\n# an edit\n"
    assert digest_sources(sources) != before
    assert code_version("vocab") == before


def _finished_corpus(cfg, root) -> str:
    """A corpus folder whose manifest matches ``cfg`` (made by hand: no Beam needed)."""
    url = stage_url(root, "corpus")
    os.makedirs(f"{url}/wiki")
    with open(f"{url}/wiki/part-00000.parquet", "wb") as f:
        f.write(b"PAR1" + b"\0" * 100)
    inputs = {k: fingerprint_input(u) for k, u in stage_inputs("corpus", cfg, root).items()}
    m = write_manifest("corpus", url, STAGES["corpus"].config(cfg, inputs), inputs, {"documents": 3.0})
    m.code_version = code_version("corpus")
    save_manifest(m)
    return url


def test_a_stage_is_done_only_when_config_inputs_code_and_files_match(tmp_path):
    cfg = load_config("tiny")
    root = str(tmp_path)
    url = _finished_corpus(cfg, root)
    assert stage_state("corpus", cfg, root).state == "done"

    how_it_runs = load_config(
        "tiny",
        {
            "corpus.beam.num_workers": 2,
            "corpus.beam.options": {"flink_master": "h:8081"},
            "corpus.beam.extra_args": ["--parallelism=8"],
        },
    )
    assert stage_state("corpus", how_it_runs, root).state == "done"  # same output whatever the runner
    changed = load_config("tiny", {"corpus.min_sentence_chars": 20})
    s = stage_state("corpus", changed, root)
    assert s.state == "stale" and "min_sentence_chars: 12 -> 20" in s.reasons[0]

    m = read_manifest(url)
    m.code_version = "an-older-version"
    save_manifest(m)
    assert stage_state("corpus", cfg, root).reasons == ["code changed"]
    m.code_version = code_version("corpus")
    save_manifest(m)

    with open(f"{url}/wiki/part-00000.parquet", "r+b") as f:  # a truncated shard
        f.truncate(10)
    s = stage_state("corpus", cfg, root)
    assert s.state == "stale" and s.reasons == ["wiki/part-00000.parquet: 10 bytes, manifest says 104"]
    with open(f"{url}/wiki/part-00000.parquet", "r+b") as f:  # same size, other bytes
        f.write(b"X" * 104)
    assert stage_state("corpus", cfg, root).state == "done"  # sizes only, unless asked
    assert stage_state("corpus", cfg, root, checksums=True).reasons == ["wiki/part-00000.parquet: checksum differs"]
    os.remove(f"{url}/wiki/part-00000.parquet")
    assert stage_state("corpus", cfg, root).reasons == ["wiki/part-00000.parquet: missing"]


def test_model_vocab_size_follows_the_vocabulary_unless_set(tmp_path):
    vocab = str(tmp_path / "vocab")
    write_manifest("vocab", vocab, {}, {}, {"vocab_size": 3484.0}, files=[])
    cfg = load_config("tiny")
    assert model_config(cfg, vocab).vocab_size == 3484
    assert model_config(load_config("tiny", {"model.vocab_size": 3520}), vocab).vocab_size == 3520
    with pytest.raises(ConfigError, match="model.vocab_size: 3000 is smaller than the trained vocabulary"):
        model_config(load_config("tiny", {"model.vocab_size": 3000}), vocab)
