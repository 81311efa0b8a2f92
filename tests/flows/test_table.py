"""The stage table: one row per stage drives folders, inputs, code versions, skipping, the CLI, the flows
and the deployments."""

import json
import os

import pytest

from flows.presets import load_config
from flows.runner import check_inputs_ready, stage_code_version, stage_state
from flows.table import CHAIN, STAGES, get_stage, model_config, stage_inputs, stage_names, stage_url, stages_after
from pipeline.schema.config import ConfigError
from pipeline.schema.manifest import ManifestError, fingerprint_input, read_manifest, save_manifest, write_manifest


def test_every_consumer_reads_the_one_table():
    """The CLI's choices, the per-stage flows and prefect.yaml's stage deployments are the table's
    groups; every downstream task of the registry is a row of its own."""
    import yaml

    from flows.cli import build_parser
    from flows.stage_flows import STAGE_FLOWS
    from tasks.registry import TASKS

    assert CHAIN == (*STAGES, "finetune")
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert tuple(next(a for a in sub["stage"]._actions if a.dest == "name").choices) == CHAIN
    assert tuple(next(a for a in sub["run"]._actions if a.dest == "force").choices) == CHAIN
    assert tuple(STAGE_FLOWS) == CHAIN
    deployments = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "../../prefect.yaml")))["deployments"]
    stage_entrypoints = [d["entrypoint"] for d in deployments if "stage_flows.py" in d["entrypoint"]]
    assert stage_entrypoints == [f"flows/stage_flows.py:{g}" for g in CHAIN]  # one deployment per group, in order
    cfg = load_config("tiny")
    assert stage_names(cfg) == [*STAGES, "finetune/sst2", "finetune/squad1", "finetune/conll2003"]
    for task in TASKS:  # every downstream task is a row of its own
        row = get_stage(f"finetune/{task}")
        assert row.folder == f"finetune/{task}" and row.where == "process" and row.retries >= 1
        assert row.task.name == task and row.units is not None and TASKS[task].metric in row.figures
    assert get_stage("pretrain").where == "training" and get_stage("pretrain").resumable
    assert [n for n, row in STAGES.items() if row.publishes_model] == ["export"]
    with pytest.raises(KeyError, match="unknown downstream task 'bogus'"):
        get_stage("finetune/bogus")


def _reached(module: str) -> set[str]:
    """Every module of ours ``module`` imports, transitively (lazy imports included), by reading files."""
    import ast

    from flows.versions import source_file

    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        path = source_file(name)
        if name in seen or path is None:  # `from pkg import a_function`: not a module
            continue
        seen.add(name)
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        todo = [n for n in todo if n.split(".")[0] in ("pipeline", "model", "tasks")]
    return seen


@pytest.mark.parametrize("stage", [*STAGES, "finetune/sst2", "finetune/squad2", "finetune/conll2003_features"])
def test_each_rows_code_list_covers_what_its_run_function_reaches(stage):
    """The code version digests the row's explicit module list; every module of ours the stage's
    run function imports (transitively, lazily included) must be in it, or an edit there would
    not rerun the stage."""
    import inspect

    from flows.versions import module_files

    row = get_stage(stage)
    covered = set(module_files(row.code))
    entry = {
        "corpus": ["pipeline.corpus.job"],
        "vocab": ["pipeline.vocab.job"],
        "examples": ["pipeline.examples.job"],
        "pretrain": ["model.train", "pipeline.examples.masking"],  # the training process's masking rule
        "export": ["model.export"],
    }.get(stage)
    if entry is None:  # a downstream task: the units and its family's module
        entry = ["tasks.units", "tasks.driver", row.task.module]
    assert "import" in inspect.getsource(row.run)  # the run function imports its package when called
    reached = set().union(*(_reached(m) for m in entry))
    missing = sorted(reached - covered - {"pipeline", "model", "tasks"})
    assert not missing, f"{stage}: its code list {row.code} misses {missing}"


def test_a_code_version_changes_with_its_sources_and_nothing_else(tmp_path, monkeypatch):
    """Digest of the listed modules' files: an edit to one of them changes it, an edit elsewhere does not."""
    import sys

    from flows import versions

    pkg = tmp_path / "zzpkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "zzother.py").write_text("z = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(versions, "_VERSIONS", {})
    assert set(versions.module_files(("zzpkg",))) == {"zzpkg", "zzpkg.a", "zzpkg.sub", "zzpkg.sub.b"}
    before = versions.code_version(("zzpkg",))
    (tmp_path / "zzother.py").write_text("z = 4\n")
    versions._VERSIONS.clear()
    assert versions.code_version(("zzpkg",)) == before
    (pkg / "sub" / "b.py").write_text("y = 3\n")
    versions._VERSIONS.clear()
    assert versions.code_version(("zzpkg",)) != before
    with pytest.raises(ModuleNotFoundError, match="zzmissing"):
        versions.module_files(("zzmissing",))
    assert "zzpkg" not in sys.modules  # read as files, never imported


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


def _finished_corpus(cfg, root) -> str:
    """A corpus folder whose manifest matches ``cfg`` (made by hand: no Beam needed)."""
    url = stage_url(root, "corpus")
    os.makedirs(f"{url}/wiki")
    with open(f"{url}/wiki/part-00000.parquet", "wb") as f:
        f.write(b"PAR1" + b"\0" * 100)
    inputs = {k: fingerprint_input(u) for k, u in stage_inputs("corpus", cfg, root).items()}
    m = write_manifest("corpus", url, STAGES["corpus"].config(cfg, inputs), inputs, {"documents": 3.0})
    m.code_version = stage_code_version("corpus")
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
    m.code_version = stage_code_version("corpus")
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
    """Unset (None, every preset) is the trained vocabulary's size, read from the vocab stage's typed
    output; a number is kept, and must hold the vocabulary; equal to vocab.vocab_size is a number."""
    from pipeline.schema.outputs import VocabOutput, vocab_record

    vocab = str(tmp_path / "vocab")
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(3479)]
    outputs = vocab_record(VocabOutput.of(pieces, lowercase=True, word_tokenizer="none", subword="wordpiece"))
    write_manifest("vocab", vocab, {}, {}, {"vocab_size": 3484.0}, files=[], outputs=outputs)
    cfg = load_config("tiny")
    assert cfg.model.vocab_size is None and model_config(cfg, vocab).vocab_size == 3484
    assert model_config(load_config("tiny", {"model.vocab_size": 4096}), vocab).vocab_size == 4096  # kept as set
    assert model_config(load_config("tiny", {"model.vocab_size": None}), vocab).vocab_size == 3484
    assert model_config(load_config("tiny", {"model.vocab_size": 3520}), vocab).vocab_size == 3520
    with pytest.raises(ConfigError, match="model.vocab_size: 3000 is smaller than the trained vocabulary"):
        model_config(load_config("tiny", {"model.vocab_size": 3000}), vocab)


def test_pretraining_on_changed_examples_says_it_restarts_before_and_after_a_failed_attempt(tmp_path):
    """What ``status`` says of a resumable stage whose input changed: "restarts", with or without
    the manifest that a failed attempt removes (``_attempt.json`` says what its checkpoints come from)."""
    from pipeline.schema.manifest import write_attempt

    cfg, root = load_config("tiny"), str(tmp_path)
    write_manifest("vocab", stage_url(root, "vocab"), {}, {}, {"vocab_size": 990.0}, files=[])
    examples = stage_url(root, "examples")
    write_manifest("examples", examples, {"dump": 1}, {}, {}, files=[])
    old_fp = fingerprint_input(examples)
    pretrain = stage_url(root, "pretrain")
    inputs = stage_inputs("pretrain", cfg, root)
    recorded = {"examples": old_fp, "vocab": fingerprint_input(inputs["vocab"])}  # every input the table declares
    m = write_manifest("pretrain", pretrain, STAGES["pretrain"].config(cfg, inputs), recorded, {}, files=[])
    m.code_version = stage_code_version("pretrain")
    save_manifest(m)
    write_attempt(pretrain, {"examples": old_fp})
    assert stage_state("pretrain", cfg, root).state == "done"
    restarts = ["examples changed — restarts (its checkpoints, made from other examples, are set aside)"]

    write_manifest("examples", examples, {"dump": 2}, {}, {}, files=[])  # a new dump went through
    s = stage_state("pretrain", cfg, root)
    assert (s.state, s.reasons) == ("stale", restarts)
    os.remove(f"{pretrain}/_manifest.json")  # what an attempt that then failed leaves
    s = stage_state("pretrain", cfg, root)
    assert (s.state, s.reasons) == ("stale", restarts)
    write_attempt(pretrain, {"examples": fingerprint_input(examples)})  # it had started on the new examples
    s = stage_state("pretrain", cfg, root)
    assert (s.state, s.reasons) == ("stale", ["unfinished: a rerun resumes from its last checkpoint"])
    os.remove(f"{pretrain}/_attempt.json")
    assert stage_state("pretrain", cfg, root).state == "missing"


def test_init_from_previous_is_the_roots_last_export_once_there_is_one(tmp_path):
    from flows.table import init_from_url

    root = str(tmp_path)
    cfg = load_config("tiny", {"pretrain.init_from": "previous"})
    assert init_from_url(cfg, root) == ""  # the first run starts from scratch
    write_manifest("export", stage_url(root, "export"), {}, {}, {}, files=[])
    assert init_from_url(cfg, root) == stage_url(root, "export")
    assert init_from_url(load_config("tiny", {"pretrain.init_from": "/models/bert"}), root) == "/models/bert"


def _finished(stage, cfg, root, given=None, url=None) -> str:
    """A stage folder whose manifest matches ``cfg`` and its inputs (made by hand: no Beam, no torch)."""
    url = url or stage_url(root, stage)
    inputs = stage_inputs(stage, cfg, root, given)
    fingerprints = {k: fingerprint_input(u) for k, u in inputs.items()}
    config = {"vocab_size": 100} if stage != "vocab" else STAGES["vocab"].config(cfg, inputs)
    m = write_manifest(stage, url, config, fingerprints, {"vocab_size": 100.0})
    m.code_version = stage_code_version(stage)
    save_manifest(m)
    return url


def test_a_manifest_listing_fewer_inputs_than_the_table_is_stale(tmp_path):
    """Staleness reads the inputs the stage table declares: a manifest edited to record no input
    (``"inputs": {}``) is not believed, whatever its stage's upstream did since."""
    cfg = load_config("tiny")
    root = str(tmp_path)
    _finished_corpus(cfg, root)
    url = _finished("vocab", cfg, root)
    assert stage_state("vocab", cfg, root).state == "done"
    path = f"{url}/_manifest.json"
    with open(path) as f:
        edited = json.load(f)
    edited["inputs"] = {}  # the lie: "made from nothing"
    with open(path, "w") as f:
        json.dump(edited, f)
    s = stage_state("vocab", cfg, root)
    assert s.state == "stale" and s.reasons == ["input corpus not recorded in its manifest"]


def test_inputs_that_do_not_belong_together_are_refused_naming_both(tmp_path):
    """Examples made with another vocabulary: pretraining (and export, for checkpoints trained on
    another vocabulary) refuses before any work, naming both fingerprints and both folders."""
    from pipeline.schema.manifest import InputsDisagreeError

    cfg = load_config("tiny")
    root = str(tmp_path / "a")
    other = str(tmp_path / "b")
    _finished_corpus(cfg, root)
    _finished("vocab", cfg, root)
    _finished("examples", cfg, root)
    check_inputs_ready("pretrain", cfg, root)  # the root's own examples: made from its vocabulary
    # another root's vocabulary (another size) and the examples made from it
    other_vocab = _finished("vocab", load_config("tiny", {"vocab.vocab_size": 1000}), root, url=f"{other}/vocab")
    other_examples = _finished("examples", cfg, root, given={"vocab": other_vocab}, url=f"{other}/examples")
    ours, theirs = fingerprint_input(stage_url(root, "vocab")), fingerprint_input(other_vocab)
    assert ours != theirs
    with pytest.raises(InputsDisagreeError) as refused:
        check_inputs_ready("pretrain", cfg, root, given={"examples": other_examples})
    message = str(refused.value)
    for named in (theirs[:12], ours[:12], other_examples, stage_url(root, "vocab")):
        assert named in message
    from flows.checks import preflight

    with pytest.raises(InputsDisagreeError):  # `bertflow stage pretrain --input examples=...`: before any server
        preflight(cfg, root, ["pretrain"], None, given={"examples": other_examples})
    # checkpoints recording another vocabulary: export refuses to ship them with this one
    _finished("pretrain", cfg, root, given={"vocab": other_vocab, "examples": other_examples})
    with pytest.raises(InputsDisagreeError, match=f"pretrain at .* {theirs[:12]}.* {ours[:12]}"):
        check_inputs_ready("export", cfg, root)
