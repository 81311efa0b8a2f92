"""Running a stage in a process of its own, and keeping that process tied to ours.

Pretraining and each downstream task run outside the flow's process (``where`` in the stage
table): locally a child process, at scale ``torchrun``/the XLA launcher. The child gets one JSON
spec file (never a pickle: any host can read it, nothing of the parent's code is executed) and
runs the same table row (``flows.stage_entry``). Its output lines come back through our loggers,
so they reach the console and, inside a Prefect run, the Prefect API; ``bertflow.progress`` lines
drive progress bars and Prefect's progress artifact instead of being logged.

The child dies with us: it is started with ``PR_SET_PDEATHSIG`` (Linux), so a killed flow process
never leaves an orphan trainer; on Ctrl-C/SIGTERM we pass SIGTERM on and give it time to write a
checkpoint before it is killed.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.schema.manifest import Manifest, read_manifest

if TYPE_CHECKING:
    from flows.stages import StageCall

PROGRESS_PREFIX = "bertflow.progress "
ENV_PROGRESS_TOTAL = "BERTFLOW_PROGRESS_TOTAL"
GRACE_SECONDS = 60.0
"""How long a child has to checkpoint and exit after SIGTERM before it is killed."""


def stage_spec(call: StageCall) -> dict:
    """The JSON a stage process is started from: the whole run config, its URLs, the row."""
    return {
        "stage": call.stage,
        "root": call.root,
        "url": call.url,
        "inputs": call.inputs,
        "restart": call.restart,
        "config": dataclasses.asdict(call.cfg),
        "unit": call.unit,
    }


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def child_threads(parallel: int) -> str:
    """Threads per child when ``parallel`` children share this machine's cores."""
    return str(max(1, (os.cpu_count() or 1) // max(1, parallel)))


def run_in_process(
    call: StageCall,
    where: str,
    env: dict[str, str],
    on_progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Run ``call``'s stage in a child process; return the manifest it wrote."""
    if where == "training":
        return launch_training(call, env, on_progress)
    parallel = len(call.cfg.finetune_tasks) if where == "process" else 1
    _run_entry(call, env, parallel, on_progress)
    return read_manifest(call.url)


def run_unit_in_process(call: StageCall, env: dict[str, str], parallel: int | None = None) -> None:
    """Run the unit ``call.unit`` of a fanned-out stage in a child process. ``parallel``: how
    many such children share this machine (their threads split the cores); default, as many
    as the grid runs at once (``finetune.grid.workers`` per task)."""
    if parallel is None:
        parallel = call.cfg.finetune.grid.workers * len(call.cfg.finetune_tasks)
    _run_entry(call, env, parallel, None)


def _run_entry(
    call: StageCall, env: dict[str, str], parallel: int, on_progress: Callable[[int, int], None] | None
) -> None:
    proc_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    if "OMP_NUM_THREADS" not in os.environ:
        proc_env["OMP_NUM_THREADS"] = child_threads(parallel)
    logger = logging.getLogger(f"bertflow.{call.stage.split('/', 1)[0]}")
    what = f"{call.stage} unit {call.unit['unit_id']}" if call.unit else f"stage {call.stage}"
    with tempfile.TemporaryDirectory(prefix="bertflow-spec-") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # may hold credentials
        with os.fdopen(fd, "w") as f:
            json.dump(stage_spec(call), f)
        cmd = [sys.executable, "-m", "flows.stage_entry", "--spec", spec_path]
        from flows.stages import get_stage

        code = _run_streaming(cmd, proc_env, logger, on_progress, get_stage(call.stage).timeout_s)
    if code != 0:
        raise RuntimeError(f"{what}: its process exited with code {code} (see its log lines above)")


def train_spec(call: StageCall) -> dict:
    """``flows.train_entry``'s JSON spec for the pretrain row."""
    from flows.stages import model_config

    cfg = call.cfg
    return {
        "pretrain": dataclasses.asdict(cfg.pretrain),
        "model": dataclasses.asdict(model_config(cfg, call.inputs["vocab"])),
        "examples_url": call.inputs["examples"],
        "output_url": call.url,
        "vocab_url": call.inputs["vocab"],
        "restart": call.restart,
        "init_from": cfg.pretrain.init_from,
        "nproc": cfg.pretrain.nproc,
    }


def launch_training(call: StageCall, env: dict[str, str], on_progress=None) -> Manifest:
    """Pretraining through ``flows.launch.launch_pretrain`` (one process, or torchrun with
    ``pretrain.nproc``), its output streamed through our loggers like any stage process."""
    from flows.launch import launch_pretrain
    from flows.train_entry import EXIT_RESUME_REFUSED

    proc_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1", ENV_PROGRESS_TOTAL: str(call.cfg.pretrain.total_steps)}
    logger = logging.getLogger("bertflow.pretrain")
    read_fd, write_fd = os.pipe()
    context = contextvars.copy_context()
    reader = threading.Thread(
        target=context.run, daemon=True, args=(_forward, os.fdopen(read_fd, "r", errors="replace"), logger, on_progress)
    )
    reader.start()
    try:
        code = launch_pretrain(train_spec(call), env=proc_env, output=write_fd)
    finally:
        os.close(write_fd)  # the children hold their own copies: EOF once they are gone
        reader.join(timeout=10)
    if code == EXIT_RESUME_REFUSED:
        raise RuntimeError(
            "pretrain: the checkpoints under "
            f"{call.url} cannot continue under this config: rerun with --force pretrain to start over"
        )
    if code != 0:
        raise RuntimeError(
            f"pretrain: the training process exited with code {code}"
            + (" after a signal; its checkpoint is kept and a rerun resumes" if code in (130, 143) else "")
        )
    return read_manifest(call.url)


def _run_streaming(cmd, env, logger: logging.Logger, on_progress, timeout_s: float | None = None) -> int:
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
    context = contextvars.copy_context()  # Prefect's run context: log and artifact calls from the reader
    reader = threading.Thread(target=context.run, args=(_forward, proc.stdout, logger, on_progress), daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        raise TimeoutError(f"{cmd[-1]}: still running after {timeout_s:.0f} s (the stage's timeout); stopped") from None
    except BaseException:  # Ctrl-C, SIGTERM turned into an exception, a Prefect timeout
        stop_process(proc)
        raise
    finally:
        reader.join(timeout=5)
    return code


def stop_process(proc: subprocess.Popen, grace: float = GRACE_SECONDS) -> None:
    """SIGTERM (the trainer checkpoints and exits), then SIGKILL after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _forward(stream, logger: logging.Logger, on_progress) -> None:
    for line in stream:
        line = line.rstrip("\n")
        if line.startswith(PROGRESS_PREFIX):
            if on_progress is not None:
                try:
                    done, total = (int(x) for x in line[len(PROGRESS_PREFIX) :].split()[:2])
                    on_progress(done, total)
                except ValueError:
                    pass
            continue
        if line:
            logger.info("%s", line)


LISTENERS: list[Callable[[str, int, int], None]] = []
"""Called with (stage, done, total) on every progress line (the CLI's progress bar)."""


def notify_progress(stage: str, done: int, total: int) -> None:
    for listener in list(LISTENERS):
        listener(stage, done, total)


def progress_reporter(log_fn):
    """Wrap a stage's ``log_fn`` so that each call also prints a progress line for the parent."""
    total = int(os.environ.get(ENV_PROGRESS_TOTAL, "0") or 0)

    def report(metrics: dict[str, float], step: int) -> None:
        if log_fn is not None:
            log_fn(metrics, step)
        if total:
            print(f"{PROGRESS_PREFIX}{step} {total}", file=sys.stderr, flush=True)

    return report
