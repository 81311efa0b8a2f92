"""The tiny chain run once through the real CLI, shared by the end-to-end and fault tests.

Beam on FnApiRunner, Prefect's ephemeral server, MLflow on SQLite, torch on CPU: nothing mocked.
Shorter schedules than the tiny preset (overrides) keep it to a few minutes; the preset itself is
what the README's command runs.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

OVERRIDES = [
    "pretrain.phases.0.steps=300",  # 150 left the [CLS] features of some corpora near-constant (SST-2 at chance)
    "pretrain.phases.1.steps=30",
    "pretrain.warmup_steps=20",
    "pretrain.checkpoint_every=50",
    "examples.dupe_factor=2",
    "finetune.epochs=2",
    'corpus.beam.extra_args=["--api_key=not-for-the-logs"]',
]


def cli_command(args, root):
    cmd = [sys.executable, "-m", "flows.cli", *args, "--root", str(root)]
    for o in OVERRIDES:
        cmd += ["--set", o]
    return cmd


def run_cli(args, root, env):
    return subprocess.run(cli_command(args, root), env=env, capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="session")
def cli():
    """``cli(args, root)``: the command line of the shared runs' config."""
    return cli_command


@pytest.fixture(scope="session")
def chain_overrides():
    """The ``--set`` overrides of the shared runs."""
    return list(OVERRIDES)


@pytest.fixture(scope="session")
def cli_env(tmp_path_factory):
    return {**os.environ, "PREFECT_HOME": str(tmp_path_factory.mktemp("prefect-home"))}


@pytest.fixture(scope="session")
def chain(tmp_path_factory, cli_env):
    """A full tiny run, a second run (skips everything) and `bertflow stage export`."""
    root = tmp_path_factory.mktemp("run")
    first = run_cli(["run", "--preset", "tiny"], root, cli_env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-6000:]
    second = run_cli(["run", "--preset", "tiny"], root, cli_env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-6000:]
    third = run_cli(["stage", "export", "--preset", "tiny"], root, cli_env)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-6000:]
    return root, first, second, third


@pytest.fixture(scope="session")
def prefect_server():
    """One Prefect test server for the session's flow tests (``prefect_test_harness``)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


# -- the quick tier: the chain in-process on a small config (tests/flows/in_process.py) ------------------
@pytest.fixture(scope="session")
def quick_chain(tmp_path_factory):
    """``(cfg, root, results)``: the tiny preset with ``in_process.QUICK_OVERRIDES``, run in-process
    (``in_process.run_chain_in_process``) once per session: corpus -> vocab -> examples -> pretrain ->
    export -> one SST-2 unit. The quick tier's tests share it (``-m quick``)."""
    from in_process import QUICK_OVERRIDES, run_chain_in_process

    from flows.presets import load_config

    cfg = load_config("tiny", QUICK_OVERRIDES)
    root = tmp_path_factory.mktemp("quick")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the chain's processes run (one thread each): OpenMP spins on a loaded box
    try:
        results = run_chain_in_process(cfg, str(root))
    finally:
        torch.set_num_threads(threads)
    return cfg, root, results


# -- what a command imports (tests/flows/test_command_imports.py) -----------------------------
LIBRARIES = ("torch", "apache_beam", "prefect", "mlflow", "pyarrow", "pandas", "sqlalchemy", "transformers")

_PROBE = """
import json, sys
from flows.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
loaded = sorted(m for m in {libraries} if m in sys.modules)
print("\\n" + json.dumps({{"code": code, "loaded": loaded}}), file=sys.stderr)
"""


def _run_command(args: list[str], env: dict[str, str] | None = None) -> tuple[int, list[str], str, str]:
    """(exit code, which of LIBRARIES the command imported, stdout, stderr) of ``bertflow ARGS``
    run in a new interpreter."""
    probe = _PROBE.format(libraries=repr(LIBRARIES))
    out = subprocess.run(
        [sys.executable, "-c", probe, *args],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    *rest, last = out.stderr.rstrip("\n").split("\n")
    result = json.loads(last)
    return result["code"], result["loaded"], out.stdout, "\n".join(rest)


@pytest.fixture(scope="session")
def run_command():
    """``run_command(args, env=None)``: (exit code, which of LIBRARIES it imported, stdout,
    stderr) of ``bertflow ARGS`` in a new interpreter."""
    return _run_command
