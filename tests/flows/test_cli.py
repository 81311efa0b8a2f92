"""The command line's quick paths: synthetic corpora, config printing, early config errors."""

import bz2
import json
from pathlib import Path

import pytest

from flows.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_synth_corpus_writes_both_formats_and_downstream_sets(tmp_path, capsys):
    out = tmp_path / "corpus"
    assert main(["synth-corpus", "--out", str(out), "--size", "300KB", "--seed", "3"]) == 0
    counts = json.loads(capsys.readouterr().out.split("\nwrote ")[0])
    assert counts["articles"] > 0 and counts["books"] > 0
    dumps = list((out / "wiki").glob("*.xml.bz2"))
    assert len(dumps) == 1
    assert b"<mediawiki" in bz2.decompress(dumps[0].read_bytes())[:500]
    assert list((out / "books").glob("*.txt"))
    assert (out / "glue" / "SST-2" / "train.tsv").read_text().startswith("sentence\tlabel\n")
    assert json.loads((out / "squad" / "dev-v1.1.json").read_text())["version"] == "1.1"
    total = sum(f.stat().st_size for f in (out / "books").glob("*.txt"))
    assert 0.15 * 300_000 < total < 0.35 * 300_000  # a quarter of the text is books


def test_config_prints_resolved_json(capsys):
    assert main(["config", "--preset", "base", "--set", "pretrain.phases.0.steps=10"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["model"]["hidden_size"] == 768 and cfg["pretrain"]["phases"][0]["steps"] == 10


def test_bad_config_fails_before_any_work(tmp_path, capsys):
    code = main(["run", "--root", str(tmp_path / "r"), "--set", "model.num_attention_heads=3"])
    assert code == 2
    assert "model.hidden_size" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # nothing started: no folder, no server, no MLflow db


@pytest.mark.parametrize(
    "argv, wrong, closest",
    [
        (["config", "--preset", "tinyy"], "tinyy", "tiny"),
        (["config", "--set", "pretrain.lerning_rate=1"], "lerning_rate", "learning_rate"),
        (["config", "--set", "finetune_tasks=[sst3]"], "sst3", "sst2"),
        (["config", "--set", "finetune_tasks=sst2,squad3"], "squad3", "squad2"),
        (["config", "--set", "data.downstream_urls.sst3=/data/SST-2"], "sst3", "sst2"),
        (["config", "--set", "corpus.sources=wiki,bokos"], "bokos", "books"),
        (["stage", "corpsu"], "corpsu", "corpus"),
        (["run", "--force", "vocabb"], "vocabb", "vocab"),
        (["stage", "vocab", "--input", "corpsu=/x"], "corpsu", "corpus"),
    ],
)
def test_a_mistyped_name_is_answered_with_the_closest(tmp_path, capsys, argv, wrong, closest):
    if argv[0] in ("run", "stage"):
        argv = [*argv, "--root", str(tmp_path / "r")]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal (a stage name): also exit code 2
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert f"did you mean {closest!r}?" in err and wrong in err, err
    assert f"'[{wrong}]'" not in err  # a list's brackets are not part of a name
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("value", ["sst2,squad1", "[sst2,squad1]", "[sst2, squad1]", '["sst2", "squad1"]'])
def test_list_values_are_json_or_comma_separated(capsys, value):
    assert main(["config", "--set", f"finetune_tasks={value}", "--set", "finetune.grid.learning_rates=5e-4,1e-3"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["finetune_tasks"] == ["sst2", "squad1"]
    assert cfg["finetune"]["grid"]["learning_rates"] == [5e-4, 1e-3]


def test_help_lists_every_preset_and_every_exit_code(capsys):
    from flows.cli import EXIT_CODES, build_parser
    from flows.presets import PRESETS

    run_help = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    for preset in PRESETS:
        assert preset in run_help.split("--preset PRESET", 2)[-1].split("--root")[0], preset
    top = build_parser().format_help()
    readme = (REPO / "README.md").read_text()
    for code in EXIT_CODES:
        assert f"\n  {code:>3}  " in top, code
        assert f"`{code}`" in readme, f"README does not list exit code {code}"


def test_config_help_describes_every_field_with_its_default(capsys):
    """Every leaf field of RunConfig has an attribute docstring (it is the CLI help) and its default."""
    from flows.config_docs import describe_fields
    from flows.presets import RunConfig

    fields = describe_fields(RunConfig)
    assert len(fields) > 140
    assert [name for name, _, _, doc in fields if not doc] == []
    with pytest.raises(SystemExit):
        main(["config", "--help"])
    out = capsys.readouterr().out
    assert "pretrain.learning_rate (float, default 0.0001): Peak learning rate" in out
    assert "examples.max_seq_lengths (tuple[int, ...], default [128, 512])" in out
    for name, _, default, _ in fields:
        assert f"  {name} (" in out and f"default {default})" in out, name


def test_version(capsys):
    import importlib.metadata

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"bertflow {importlib.metadata.version('bertflow')}")


def test_status_reads_the_store_of_mlflow_tracking_uri(tmp_path, capsys, monkeypatch):
    """A run against a store named by MLFLOW_TRACKING_URI (a server, a shared database): status
    shows its runs without --mlflow-uri, as `run` took the store from the environment."""
    from flows.tracking import Tracker

    root = tmp_path / "root"
    root.mkdir()
    uri = f"sqlite:///{tmp_path}/shared.db"
    tracker = Tracker(uri)
    tracker.use_experiment("bertflow", artifact_root=str(tmp_path / "artifacts"))
    run = tracker.start_run("corpus", tags={"bertflow.stage": "corpus", "bertflow.root": str(root)})
    tracker.end_run(run, True)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["status", "--root", str(root), "--json"]) == 3
    rows = {r["stage"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["corpus"]["mlflow_run"] == f"{run} (finished)"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert main(["status", "--root", str(root), "--json"]) == 3
    assert {r["mlflow_run"] for r in json.loads(capsys.readouterr().out)} == {""}


def test_status_tells_a_missing_root_from_an_empty_one(tmp_path, capsys):
    assert main(["status", "--root", str(tmp_path / "no-such-root")]) == 2
    assert "no run root at" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("x")
    assert main(["status", "--root", str(tmp_path / "a-file")]) == 2
    assert "is a file" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["status", "--root", str(empty), "--json"]) == 3
    rows = json.loads(capsys.readouterr().out)
    assert rows and {r["state"] for r in rows} == {"missing"}


def test_beam_options_in_one_place_and_beams_own_words(capsys):
    """`beam.*` sets both Beam stages (a stage's own path wins); Beam's own option words pass
    through as Beam reads them: BeamConfig's fields by name, any other Beam option into
    beam.options; a word neither bertflow nor Beam knows is refused."""
    from flows.presets import load_config

    cfg = load_config("tiny", {"beam.num_workers": 2, "examples.beam.num_workers": 3, "beam.options.x": 1})
    assert (cfg.corpus.beam.num_workers, cfg.examples.beam.num_workers) == (2, 3)
    assert cfg.corpus.beam.options == cfg.examples.beam.options == {"x": 1}

    words = ["--runner=DataflowRunner", "--project", "p", "--region=us-central1", "--temp_location=gs://b/tmp",
             "--sdk_container_image=img", "--flink_master=h:8081", "--save_main_session"]  # fmt: skip
    assert main(["config", *words, "--set", "corpus.beam.region=europe-west4"]) == 0
    out = json.loads(capsys.readouterr().out)
    for section, region in (("corpus", "europe-west4"), ("examples", "us-central1")):
        beam = out[section]["beam"]
        assert (beam["runner"], beam["project"], beam["region"]) == ("DataflowRunner", "p", region)
        assert beam["options"] == {"flink_master": "h:8081", "save_main_session": True}
    assert main(["config", "--runnr=DataflowRunner"]) == 2
    assert "not an option of bertflow nor of Beam" in capsys.readouterr().err
    assert main(["status", "--runner=DataflowRunner"]) == 2


def test_a_failed_run_exits_with_its_stage_process_code():
    """``bertflow run``/``stage`` exit with the failed stage process's code (4: the trainer's
    divergence), through Prefect's re-raise and the units' wrapping; a code that is not one of
    ``EXIT_CODES`` (a SIGKILL, a retryable failure) is 1."""
    from flows.cli import EXIT_CODES, failure_code
    from flows.proc.protocol import StageProcessError
    from pipeline.schema.config import ConfigError

    for code, expected in ((4, 4), (3, 3), (2, 2), (1, 1), (-9, 1), (143, 1), (7, 1)):
        assert failure_code(StageProcessError("pretrain: the training process", code)) == expected, code
    wrapped = RuntimeError("finetune/sst2 unit u failed")
    wrapped.__cause__ = StageProcessError("unit", 4)
    assert failure_code(wrapped) == 4
    assert failure_code(ConfigError("corpus.sources: no documents")) == 2  # an inline stage's bad input
    assert failure_code(FloatingPointError("loss is nan at step 3")) == 4
    assert failure_code(RuntimeError("connection reset")) == 1
    assert failure_code(StageProcessError("pretrain: the training process", 6)) == 6  # the server gone
    assert failure_code(StageProcessError("pretrain: the training process", 5)) == 5  # a full disk
    from flows.tracking import TrackingServerGone

    gone = RuntimeError("finetune/sst2 failed")
    gone.__cause__ = TrackingServerGone("MLflow tracking server http://127.0.0.1:1 refused connections")
    assert failure_code(gone) == 6  # met in the flow's own process
    assert {6, 5, 4, 3, 2, 1} <= set(EXIT_CODES)


WORKER = """
import atexit, sys
from flows.proc.supervisor import say_last
atexit.register(lambda: print("prefect - Stopping temporary server on http://127.0.0.1:8482", file=sys.stderr))
print("a traceback line", file=sys.stderr)
say_last("bertflow: run failed (exit 4): StageProcessError: the training loss diverged")
print("more noise after the error", file=sys.stderr)
sys.exit(4)
"""


def test_the_supervisor_prints_the_workers_error_last_and_exits_with_its_code(capfd):
    """What the worker prints after its error (Prefect's server stopping at exit) comes before
    it: the supervisor prints the worker's closing line once the worker's session has ended."""
    import sys

    from flows.proc.supervisor import supervise

    rc = supervise([], "run", command=[sys.executable, "-c", WORKER])
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 4
    assert err[-1] == "bertflow: run failed (exit 4): StageProcessError: the training loss diverged"
    assert "prefect - Stopping temporary server on http://127.0.0.1:8482" in err[:-1]
    assert err.count(err[-1]) == 1


def test_the_closing_table_in_a_file_cuts_no_path():
    """Written to a file (not a terminal), the table is as wide as its cells: every output URL
    and key figure whole on one line (at the former fixed 120 columns the URL column folded
    `.../runs/tiny/cor` / `pus`)."""
    import io

    from flows.cli import print_summary

    root = "/home/someone/projects/a-rather-long-folder-name/bertflow/runs/tiny"
    stages = [
        {"stage": name, "status": "done", "seconds": 12.3, "figures": figs, "url": f"{root}/{name}"}
        for name, figs in (
            ("corpus", {"documents": 397.0, "records_rejected": 305.0, "sentences": 8223.0}),
            ("finetune/conll2003", {"eval_f1": 56.56410256410256}),
        )
    ]
    summary = {"preset": "tiny", "seconds": 183.2, "stages": stages, "root": root,
               "tracking_uri": f"sqlite:///{root}/mlflow.db", "model_name": "bert-tiny", "model_version": "1",
               "model_alias": "champion"}  # fmt: skip
    out = io.StringIO()
    print_summary(summary, file=out)
    lines = out.getvalue().splitlines()
    for s in stages:
        assert any(s["url"] in line and s["stage"] in line for line in lines), s["url"]
    assert any("documents=397" in line for line in lines) and any("eval_f1=56.56" in line for line in lines)
    assert f"MLflow: mlflow ui --backend-store-uri sqlite:///{root}/mlflow.db" in lines


BEAM_WITHOUT_APITOOLS = """
import logging, sys
sys.modules["apitools"] = None  # as where the gcp extra is not installed: its import fails
from flows.cli import _offline_defaults
_offline_defaults()  # what every bertflow command does first
import apache_beam
assert "apache_beam.io.gcp.internal.clients.bigquery" in sys.modules  # the module that warns ran
logging.warning("a warning of anyone else's still shows")
"""


def test_beams_apitools_warning_is_silenced_and_nothing_else():
    """Beam's "apitools not found, and bigquery client libraries are not available" (a root-logger
    warning at import when the gcp extra is absent) is not printed by bertflow's processes; other
    root-logger warnings are."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", BEAM_WITHOUT_APITOOLS], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "apitools not found" not in out.stderr
    assert "a warning of anyone else's still shows" in out.stderr


def test_the_readmes_commands_table_lists_every_preset():
    from flows.presets import PRESETS

    row = next(ln for ln in (REPO / "README.md").read_text().splitlines() if ln.startswith("| `bertflow run --preset"))
    listed = row.split("--preset ", 1)[1].split(" ", 1)[0].split("\\|")
    assert listed == list(PRESETS)


_ENDS = """
import atexit, gc, sys
def last():  # registered first: runs last
    print("last handler: frozen", gc.get_freeze_count() > 0, gc.get_threshold()[0], flush=True)
atexit.register(last)
if sys.argv[1] == "cli":
    from flows.cli import main
    code = main(["config", "--preset", "tiny"])
    from pipeline.runtime import economical_gc
    gc.set_threshold(50_000, 10, 10)
    economical_gc()  # again, after a higher threshold of the user's: kept
    print("kept", gc.get_threshold()[0])
    gc.set_threshold(10_000, 10, 10)
else:
    code = 0
atexit.register(lambda: print("a later handler ran", flush=True))
sys.exit(code)
"""


@pytest.mark.parametrize("how", ["cli", "plain python"])
def test_a_bertflow_process_ends_with_every_exit_handler_and_no_shutdown_collection(how, tmp_path):
    """The command's process (supervisor and worker alike) collects its youngest generation
    every 10,000 allocations, not 700, and freezes what is alive when it exits
    (pipeline.runtime.economical_gc: the collector took 0.82 of a worker's 4.32 CPU-s, the
    shutdown's collections ~0.7 more), after the exit handlers registered later and before those
    registered earlier; every handler runs, the exit code is the command's. Plain Python does
    neither."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _ENDS, how], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    if how == "cli":
        assert "kept 50000" in done.stdout.splitlines()
    tail = done.stdout.strip().splitlines()[-2:]
    threshold = 10_000 if how == "cli" else 700
    assert tail == ["a later handler ran", f"last handler: frozen {how == 'cli'} {threshold}"]
