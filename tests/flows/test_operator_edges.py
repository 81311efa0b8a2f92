"""What an operator meets at the edges: a closed pipe, a switch written as a boolean, a flow
refused before it starts (the deployment path says it in one line, as the CLI does)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flows.overrides import parse_overrides
from flows.presets import load_config
from pipeline.schema.config import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_a_closed_pipe_ends_quietly():
    """``bertflow config --preset base | head``: the reader is gone before the write (closed
    here before the process writes, so the write always meets it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "config", "--preset", "base"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err  # 128 + SIGPIPE, what `yes | head` answers
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.parametrize(
    "written, read", [("true", "on"), ("false", "off"), ('"True"', "on"), ('"FALSE"', "off"), ("on", "on")]
)
def test_switches_read_true_and_false_as_on_and_off(written, read):
    cfg = load_config("tiny", parse_overrides([f"pretrain.unpad={written}", f"pretrain.compile={written}"]))
    assert cfg.pretrain.unpad == read and cfg.pretrain.compile == read


def test_a_switch_that_is_no_switch_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"pretrain.unpad: auto\|on\|off \(or true\|false\), got 'maybe'"):
        load_config("tiny", parse_overrides(["pretrain.unpad=maybe"]))


def test_a_flow_session_refuses_a_remote_root_without_a_tracking_uri_in_one_line(monkeypatch, tmp_path):
    from flows.prefect_tasks import SetupError, session

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(SetupError) as err:
        with session("stage-corpus", "tiny", "gs://CHANGE-ME/bertflow/large", None, None, ("corpus",)):
            pytest.fail("the session started")
    assert str(err.value).startswith(
        "stage-corpus: configuration error: --root gs://CHANGE-ME/bertflow/large is remote: give --mlflow-uri"
    )
    assert "\n" not in str(err.value) and err.value.__cause__ is None
    with pytest.raises(SetupError, match="stage-corpus: configuration error: preset: unknown preset 'tinyy'"):
        with session("stage-corpus", "tinyy", str(tmp_path), None, None, ("corpus",)):
            pytest.fail("the session started")


@pytest.mark.slow
@pytest.mark.ci
def test_the_deployment_path_fails_a_remote_root_in_one_line_not_a_traceback(tmp_path):
    """The stage flow a deployment runs, through Prefect's engine (its own ephemeral server):
    the run ends Failed with the CLI's one-line message, and no traceback in its log. In CI (one
    Prefect temporary server start)."""
    script = textwrap.dedent(
        """
        from flows.stage_flows import STAGE_FLOWS
        state = STAGE_FLOWS["corpus"](preset="tiny", root="gs://CHANGE-ME/bertflow/large", return_state=True)
        print("STATE", state.type.value, state.message)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env |= {
        "PYTHONPATH": str(REPO),
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    }
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    assert "STATE FAILED stage-corpus: configuration error: --root gs://CHANGE-ME/bertflow/large is remote" in log
    assert "Traceback" not in log, log


def test_a_forked_beam_worker_sends_no_log_to_prefect_and_prints_no_warning():
    """Beam's local workers are forked from the process whose flow sends the ``bertflow``
    loggers to Prefect's API; they run no flow, and each of their lines came with Prefect's
    "attempted to send logs to the API without a flow run id" warning. The handler only acts in
    the process that added it: here the parent (no flow run either) still warns, the child not."""
    import logging
    import warnings

    from flows.prefect_tasks import _prefect_logs

    def warned() -> int:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            logging.getLogger("bertflow.corpus").info("corpus: 1000 documents processed by this worker")
        return sum("without a flow run id" in str(w.message) for w in caught)

    with _prefect_logs():
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                os.write(write, str(warned()).encode())
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        os.close(write)
        child = os.read(read, 16)
        parent = warned()
    assert parent == 1
    assert child == b"0"
