"""Stop means stop (issue 19 point 1): SIGINT (a terminal's Ctrl-C: the whole foreground process
group) or SIGTERM (``kill``: the command's pid alone) in the examples stage, in pretraining and in
fine-tuning, through the real CLI. Each case asserts the exit code (130 / 143), that no process of
the run's tree survives (walked in /proc: the CLI's descendants, its process group and session,
the worker's session, anything naming the root), that nothing was retried and no new work
started, that MLflow holds no RUNNING run, and that rerunning the stage gives the outputs of the
uninterrupted run (sha256 of every file its manifest lists; fine-tuning: its dev metrics).

Measured before (main c06004b): in the examples stage Beam turned the KeyboardInterrupt into a
RuntimeError and Prefect retried the stage from scratch; the temporary Prefect server was
already gone, a second Ctrl-C ended in ``ConnectError`` after ~3 min and the process never exited
(killed at 5.5 min); SIGTERM the same; in fine-tuning the units exited -2, were retried and new
units started, and the exit needed a second SIGINT 4 minutes later and returned 1.

The default tier runs one case (SIGTERM in the examples stage, ~2 min); the slow tier the rest,
and a second signal that kills the tree at once while the trainer checkpoints. Each case starts
from the shared chain's finished upstream folders (copied), so only its stage runs."""

import glob
import os
import shutil
import signal
import subprocess
import time

import pytest

from flows.proc.supervisor import processes, tree
from pipeline.schema.manifest import read_manifest

# stage group -> (upstream folders copied from the chain, what says it is running, its folders compared)
STAGES = {
    "examples": (("corpus", "vocab"), ("file", "examples/_work/seq*/*.parquet"), ("examples",)),
    "pretrain": (("corpus", "vocab", "examples"), ("log", "pretrain | phase phase1 step 40/"), ("checkpoints",)),
    "finetune": (
        ("corpus", "vocab", "examples", "checkpoints", "model"),
        ("log", "bertflow.finetune | step 10/"),
        ("finetune/sst2", "finetune/squad1", "finetune/conll2003"),
    ),
}  # fmt: skip


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ours(cli_pid: int, worker_pid: int | None, root: str, seen) -> dict[int, str]:
    """Live processes of the run: seen before, in the CLI's or the worker's group or session, or
    naming the root in their command line; pid -> command line."""
    table = processes()
    leaders = {cli_pid, worker_pid} - {None}
    found = {p for p in seen if p in table}
    found |= {p for p, (_pp, pgid, sid, _s) in table.items() if pgid in leaders or sid in leaders}
    found |= {p for p in table if root in _cmdline(p)}
    found -= {os.getpid()}
    return {p: _cmdline(p) for p in found}


def _ready(root, how: tuple[str, str], log_path) -> bool:
    kind, what = how
    if kind == "file":
        return bool(glob.glob(os.path.join(str(root), what)))
    return what in log_path.read_text(errors="replace")


def _interrupt(group: str, signals: list[int], chain_root, cli, env, tmp_path):
    """Run the chain on a root holding the chain's upstream folders; send ``signals`` once the
    stage runs (the first, and the next ones right after it); return (root, rc, log text, the
    processes of the tree at the moment of the first signal)."""
    upstream, how, _ = STAGES[group]
    root = tmp_path / "stopped"
    root.mkdir()
    for folder in upstream:
        shutil.copytree(chain_root / folder, root / folder)
    log_path = tmp_path / "stopped.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cli(["run", "--preset", "tiny"], root), env=env, stdout=log, stderr=log, start_new_session=True
        )
    deadline = time.monotonic() + 900
    while not _ready(root, how, log_path):
        assert proc.poll() is None, f"the run ended before {group} ran:\n{log_path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{group} never ran"
        time.sleep(0.05)
    seen = {p: _cmdline(p) for p in tree(proc.pid)}
    worker = next((p for p in seen if processes().get(p, (0,))[0] == proc.pid), None)
    assert worker is not None, "the CLI runs its flow in a worker process"
    for i, sig in enumerate(signals):
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # a terminal's Ctrl-C: the whole foreground process group
        else:
            proc.send_signal(sig)
        if i + 1 < len(signals):
            time.sleep(0.5)  # the second signal while the first is being handled
    try:
        rc = proc.wait(timeout=150)  # the trainer has 60 s to write its checkpoint
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the CLI did not exit 150 s after {signals}:\n{log_path.read_text()[-4000:]}") from None
    end = time.monotonic() + 10  # the supervisor's sweep has ended the rest: allow the kernel to reap
    while (left := _ours(proc.pid, worker, str(root), seen)) and time.monotonic() < end:
        time.sleep(0.2)
    for p in left:  # leave nothing behind for the next test, then fail
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes of the run survived it: {left}"
    return root, rc, log_path.read_text(errors="replace"), seen


def _check_not_retried_and_runs_ended(root, text: str) -> None:
    assert "Retry " not in text and "Retrying" not in text, "an interrupted stage or unit was retried"
    assert "not retried (the stop request)" in text or "aborted by an interrupt" in text
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id])
    statuses = [r.info.status for r in runs]
    assert "RUNNING" not in statuses and "KILLED" in statuses, statuses


def _check_rerun_equals_uninterrupted(group: str, root, chain_root, cli, env) -> None:
    again = subprocess.run(cli(["stage", group, "--preset", "tiny"], root), env=env, capture_output=True, text=True,
                           timeout=1500)  # fmt: skip
    assert again.returncode == 0, again.stderr[-5000:]
    for folder in STAGES[group][2]:
        mine, ref = read_manifest(str(root / folder)), read_manifest(str(chain_root / folder))
        if folder.startswith("finetune/"):  # the units' files hold times; their scores must be equal
            pick = lambda m: {k: v for k, v in m.counts.items() if k.startswith("eval_")}
            assert pick(mine) == pick(ref), folder
        else:
            assert {f.path: f.sha256 for f in mine.files} == {f.path: f.sha256 for f in ref.files}, folder


def _case(group: str, sig: int, chain, cli, cli_env, tmp_path) -> None:
    root, rc, text, _ = _interrupt(group, [sig], chain[0], cli, cli_env, tmp_path)
    assert rc == 128 + sig, f"exit code {rc}:\n{text[-4000:]}"
    assert f"{signal.Signals(sig).name}: stopping" in text and "a rerun resumes" in text
    _check_not_retried_and_runs_ended(root, text)
    if group == "pretrain":  # the trainer wrote its checkpoint before it stopped
        assert "checkpoint written" in text
    if group == "finetune":  # no unit started after the stop
        assert text.count("not started,") >= 1 and "fine-tuning on" not in text.split(": stopping")[-1]
    _check_rerun_equals_uninterrupted(group, root, chain[0], cli, cli_env)


def test_sigterm_in_the_examples_stage_stops_the_tree_and_the_rerun_equals_a_clean_run(chain, cli, cli_env, tmp_path):
    _case("examples", signal.SIGTERM, chain, cli, cli_env, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "group,sig",
    [("examples", signal.SIGINT), ("pretrain", signal.SIGINT), ("pretrain", signal.SIGTERM),
     ("finetune", signal.SIGINT), ("finetune", signal.SIGTERM)],
)  # fmt: skip
def test_a_signal_in_each_stage_stops_the_tree_and_the_rerun_equals_a_clean_run(
    group, sig, chain, cli, cli_env, tmp_path
):
    _case(group, sig, chain, cli, cli_env, tmp_path)


@pytest.mark.slow
def test_a_second_signal_kills_the_tree_at_once(chain, cli, cli_env, tmp_path):
    """Ctrl-C twice while the trainer writes its checkpoint: everything ends at once (the trainer
    included), exit 130, and the rerun still resumes to the uninterrupted run's weights."""
    root, rc, text, seen = _interrupt("pretrain", [signal.SIGINT, signal.SIGINT], chain[0], cli, cli_env, tmp_path)
    assert rc == 130, text[-4000:]
    assert "asked again: killing every process of the run" in text
    assert any("flows.proc.train_entry" in cmd for cmd in seen.values())  # the trainer was there, and is gone
    _check_rerun_equals_uninterrupted("pretrain", root, chain[0], cli, cli_env)


def test_the_exit_codes_and_the_retry_rule():
    """The mechanism without a run: what a retry can fix, the exit code of each way to end."""
    from flows.proc.protocol import (
        STOP,
        StageProcessError,
        StopRequested,
        describe_exit,
        exit_code_for,
        worth_retrying,
    )
    from pipeline.schema.config import ConfigError
    from pipeline.schema.manifest import ManifestError

    assert worth_retrying(RuntimeError("worker lost")) and worth_retrying(ConnectionError("busy database"))
    assert worth_retrying(StageProcessError("unit", 1))
    for exc in (ConfigError("x"), ValueError("bad row"), ManifestError("no manifest"), FileNotFoundError("f"),
                FloatingPointError("nan"), StageProcessError("unit", -9), StageProcessError("unit", 2),
                StageProcessError("pretrain", 4), StageProcessError("unit", 143), KeyboardInterrupt()):  # fmt: skip
        assert not worth_retrying(exc), exc
    wrapped = RuntimeError("stage failed")
    wrapped.__cause__ = ValueError("the cause")
    assert not worth_retrying(wrapped)  # Beam and our units wrap the error that decides
    assert exit_code_for(ConfigError("x")) == 2 and exit_code_for(RuntimeError("x")) == 1
    assert exit_code_for(FloatingPointError("nan")) == 4
    assert describe_exit(143) == "exited with code 143 (stopped by SIGTERM)"
    assert STOP.request(signal.SIGTERM) and not STOP.request(signal.SIGINT)  # the first one counts
    try:
        assert not worth_retrying(RuntimeError("worker lost"))  # after the stop request: nothing is
        assert exit_code_for(RuntimeError("x")) == 143
        with pytest.raises(StopRequested, match="unit u: not started, SIGTERM asked to stop"):
            STOP.check("unit u")
    finally:
        STOP.clear()
