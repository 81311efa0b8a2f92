"""What is refused before any work: a busy root, a bad root or input, an unreachable tracking
server, and secrets that would be recorded."""

import json
import signal
import subprocess
import sys

import pytest

from flows.checks import RootBusyError, RootLock
from flows.cli import main
from flows.secrets import ENV_SECRET_OVERRIDES, merge_secret_overrides, split_secret_overrides
from pipeline.schema.config import REDACTED, redact
from pipeline.schema.manifest import read_manifest, write_manifest

HOLD = (
    "import sys, time; from flows.checks import RootLock; RootLock(sys.argv[1]).acquire(); "
    "print('held', flush=True); time.sleep(60)"
)


@pytest.mark.e2e
def test_a_second_run_on_a_root_is_refused_and_a_killed_holder_frees_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RootBusyError, match=f"in use by pid {holder.pid}"):
            RootLock(str(tmp_path)).acquire()
        assert main(["run", "--root", str(tmp_path)]) == 2  # the CLI says so before any server starts
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with RootLock(str(tmp_path)):  # the kernel dropped the dead holder's lock
        with RootLock(str(tmp_path)):  # re-entrant within one process (CLI, then its flow)
            pass


def test_a_root_that_is_a_file_fails_before_prefect_is_even_imported(tmp_path):
    root = tmp_path / "file"
    root.write_text("x")
    code = (
        "import sys; from flows.cli import main; rc = main(['run', '--root', sys.argv[1]]); "
        "print(rc, 'prefect' in sys.modules, 'mlflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False", "False"], out.stderr  # no server could have started
    assert "is a file, not a folder" in out.stderr


def test_a_missing_dump_is_named_before_any_server_starts(tmp_path, capsys):
    missing = tmp_path / "enwiki-20261101-pages-articles.xml.bz2"
    assert main(["run", "--root", str(tmp_path / "r"), "--set", f"data.wiki={missing}"]) == 2
    err = capsys.readouterr().err
    assert "the wiki input" in err and str(missing) in err
    assert not (tmp_path / "r" / "mlflow.db").exists()


def test_an_unreachable_tracking_server_fails_in_seconds(tmp_path, capsys):
    assert main(["run", "--root", str(tmp_path / "r"), "--mlflow-uri", "http://127.0.0.1:9/"]) == 2
    assert "does not answer" in capsys.readouterr().err


def test_secret_overrides_are_split_off_and_redacted(monkeypatch):
    overrides = {
        "corpus.beam.extra_args": ["--runner=X", "--api_key=s3cr3t"],
        "pretrain.learning_rate": 1e-3,
        "data.hf_token": "hf_abc",
        "examples.max_predictions_per_seq": [20, 80],
    }
    public, secret = split_secret_overrides(overrides)
    assert set(secret) == {"corpus.beam.extra_args", "data.hf_token"}
    assert set(public) == {"pretrain.learning_rate", "examples.max_predictions_per_seq"}
    monkeypatch.setenv(ENV_SECRET_OVERRIDES, json.dumps(secret))
    assert merge_secret_overrides(public) == overrides
    assert redact({"extra_args": ["--password", "pw", "--project", "p"], "max_tokens": 5}) == {
        "extra_args": ["--password", REDACTED, "--project", "p"],
        "max_tokens": 5,
    }


def test_manifests_never_hold_secrets(tmp_path):
    config = {"beam": {"extra_args": ["--aws_secret_access_key=zzz", "--runner=DataflowRunner"]}}
    write_manifest("corpus", str(tmp_path), config, {}, {}, files=[])
    text = (tmp_path / "_manifest.json").read_text()
    assert "zzz" not in text and "--runner=DataflowRunner" in text
    assert read_manifest(str(tmp_path)).matches(config, {})  # the skip check compares redacted


def test_the_disk_estimate_is_checked_only_for_stages_that_will_run(tmp_path):
    """A corpus of 10^15 characters: the examples stage would not fit any disk. A run that skips
    the finished examples stage (``--force export``) is not refused for it; one that runs it is."""
    from flows.checks import preflight
    from flows.presets import load_config
    from flows.runner import stage_code_version, stage_state
    from flows.sizes import HostTooSmallError
    from flows.table import STAGES, stage_inputs, stage_url
    from pipeline.schema.manifest import fingerprint_input, save_manifest

    cfg = load_config("tiny")
    root = str(tmp_path)

    def finished(stage, counts):
        inputs = {k: fingerprint_input(u) for k, u in stage_inputs(stage, cfg, root).items()}
        m = write_manifest(stage, stage_url(root, stage), STAGES[stage].config(cfg, stage_inputs(stage, cfg, root)),
                           inputs, counts)  # fmt: skip
        m.code_version = stage_code_version(stage)
        save_manifest(m)

    finished("corpus", {"chars": 1e15, "documents": 3.0})
    finished("vocab", {"vocab_size": 100.0})
    stages = ["corpus", "vocab", "examples", "export"]
    with pytest.raises(HostTooSmallError, match="examples: would write about"):
        preflight(cfg, root, stages, None, forced=set())  # examples has not run: it will
    finished("examples", {})
    assert stage_state("examples", cfg, root).state == "done"
    preflight(cfg, root, stages, None, forced={"export"})  # examples is skipped: not estimated
    with pytest.raises(HostTooSmallError, match="examples: would write about"):
        preflight(cfg, root, stages, None, forced={"examples"})
    with pytest.raises(HostTooSmallError):
        preflight(cfg, root, ["examples"], None)  # `bertflow stage examples` always runs it
