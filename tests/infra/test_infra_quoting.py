"""No value reaches a shell unquoted: every infra script's dry run, given $(...), backticks,
quotes, ``;`` and spaces in every option it takes, prints lines that, pasted into bash, run
exactly the commands shown and nothing smuggled in.

The printed lines are run for real, by bash, with the cloud and system commands (gcloud, git,
docker, sudo, rm, ...) replaced on PATH by stubs that record their arguments; the stub gcloud
also runs the ``--command`` of an ``ssh`` with bash in a throwaway home, as the TPU host would.
A smuggled command would ``touch`` a file named ``PWNED*``: the test looks for any, and checks
that each hostile value arrived whole, as one argument, where it was meant to go."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STUBBED = (
    "gcloud",
    "git",
    "docker",
    "sudo",
    "bertflow",
    "python3",
    "python3.11",
    "env",
    "rm",
    "mkdir",
    "cp",
    "curl",
    "tail",
)
MARK = "\x1e"


def hostile(pwned: Path, tag: str) -> str:
    """A value that runs ``touch`` three ways if any shell reads it as code."""
    return f"v{tag} $(touch {pwned}/PWNED-{tag}-1) `touch {pwned}/PWNED-{tag}-2` '\"; touch {pwned}/PWNED-{tag}-3; #"


def hostile_name(tag: str) -> str:
    """The same for a file name (no ``/``): the touch lands in the current folder."""
    return f"f{tag} $(touch PWNED-{tag}-1) `touch PWNED-{tag}-2` '\"; touch PWNED-{tag}-3; #"


def stub(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


LOG = '{ printf \'%s\\0\' "${0##*/}" "$@"; printf \'\\36\\0\'; } >> "$STUB_LOG"\n'
RUN_REMOTE = """args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [[ "${args[i]}" == --command ]]; then (cd "$HOME" && bash -c "${args[i + 1]}"$'\\nwait'); fi
done
"""


class Sandbox:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.pwned = tmp / "pwned"
        self.pwned.mkdir()
        self.work = tmp / "work"
        self.work.mkdir()
        self.home = tmp / "home"
        self.log = tmp / "stub.log"
        bin_ = tmp / "bin"
        for name in STUBBED:
            stub(bin_ / name, LOG + (RUN_REMOTE if name == "gcloud" else ""))
        stub(self.home / "bertflow/.venv/bin/python", LOG)  # the TPU host's interpreter
        self.env = {
            **os.environ,
            "PATH": f"{bin_}:{os.environ['PATH']}",
            "HOME": str(self.home),
            "STUB_LOG": str(self.log),
            "PYTHONPATH": str(REPO),
        }
        self.env.pop("JOB_COMPLETION_INDEX", None)
        self.env.pop("MLFLOW_TRACKING_URI", None)

    def dry_run(self, script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        """The script's dry run, with the real interpreter and no stubs (it must run nothing)."""
        full = {**self.env, "PATH": os.environ["PATH"], **(env or {})}
        return subprocess.run(
            ["bash", str(REPO / script), *args, "--dry-run"],
            capture_output=True,
            text=True,
            env=full,
            cwd=self.work,
            timeout=60,
        )

    def paste(self, lines: list[str]) -> subprocess.CompletedProcess:
        """Run the lines as a person pasting them would: bash, one after the other."""
        return subprocess.run(
            ["bash"],
            input="\n".join(lines) + "\n",
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.work,
            timeout=60,
        )

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        words = self.log.read_bytes().decode().split("\0")
        calls, call = [], []
        for word in words:
            if word == MARK:
                calls.append(call)
                call = []
            elif word or call:
                call.append(word)
        return calls

    def smuggled(self) -> list[str]:
        return sorted(str(p.relative_to(self.tmp)) for p in self.tmp.rglob("PWNED*"))


def printed(out: str) -> list[str]:
    """The commands of a dry run: its "+ " lines, and a "# follow ...: CMD" it suggests."""
    lines = [line[2:] for line in out.splitlines() if line.startswith("+ ")]
    lines += [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("# follow host 0: ")]
    return lines


def check(box: Sandbox, out: subprocess.CompletedProcess, values: dict[str, str], *, expect_rc: int = 0) -> None:
    assert out.returncode == expect_rc, out.stderr
    lines = printed(out.stdout)
    assert lines, out.stdout
    pasted = box.paste(lines)
    assert box.smuggled() == [], (pasted.stdout, pasted.stderr)
    words = [w for call in box.calls() for w in call]
    for flag, value in values.items():  # each value arrived whole (inside a remote command or a NAME=VALUE too)
        assert any(value in w for w in words), (flag, value, box.calls())


@pytest.fixture
def box(tmp_path):
    return Sandbox(tmp_path)


def test_gpu_launch_dry_run_pasted_runs_nothing_smuggled(box):
    py = stub(  # an interpreter at a hostile path: runs the dry run's plan, records any other call
        box.tmp / "py" / hostile_name("python"),
        f'if [[ "${{*: -1}}" == --dry-run ]]; then exec {sys.executable} "$@"; fi\n' + LOG,
    )
    h = {
        flag: hostile(box.pwned, flag.strip("-"))
        for flag in ("--rdzv-endpoint", "--root", "--mlflow-uri", "--examples", "--vocab", "--rdzv-id", "--set")
    }
    args = {**h, "--rdzv-endpoint": h["--rdzv-endpoint"] + ":29500", "--set": "pretrain.x=" + h["--set"]}
    args = {**args, "--nnodes": "2", "--node-rank": "1", "--nproc-per-node": "2", "--python": str(py)}
    out = box.dry_run("infra/gpu/launch.sh", *[w for kv in args.items() for w in kv])
    # the config check of the plan refuses the unknown field, after the commands were printed
    called = {f: v for f, v in h.items() if not f.startswith("--rdzv")}  # those two are exported, below
    check(box, out, called, expect_rc=2)
    assert [c[:3] for c in box.calls() if c[0] == py.name] == [[py.name, "-m", "flows.proc.cluster"]]
    assert "unknown" in out.stderr or "pretrain.x" in out.stderr
    exported = box.paste(
        [*printed(out.stdout)[:1], 'printf "%s\\0" "$BERTFLOW_RDZV_ID" "$BERTFLOW_RDZV_ENDPOINT"']
    ).stdout.split("\0")
    assert exported[:2] == [h["--rdzv-id"], h["--rdzv-endpoint"] + ":29500"]  # exported as given, one word each


def test_tpu_launch_and_its_remote_command_run_nothing_smuggled(box):
    env_file = box.tmp / hostile_name("envfile")
    env_file.write_text("MLFLOW_TRACKING_PASSWORD=hunter2\n")
    h = {f: hostile(box.pwned, f.strip("-")) for f in ("--name", "--zone", "--project", "--mlflow-uri", "--preset")}
    h |= {f: "gs://b/" + hostile(box.pwned, f.strip("-")) for f in ("--root", "--examples", "--vocab")}
    h["--set"] = "pretrain.x=" + hostile(box.pwned, "set")
    out = box.dry_run("infra/tpu/launch.sh", *[w for kv in h.items() for w in kv], "--env-file", str(env_file))
    check(box, out, {**h, "--env-file": str(env_file)})
    remote = [c for c in box.calls() if c[0] == "python"]  # what the host ran, through its login shell
    assert len(remote) == 1 and remote[0][remote[0].index("--mlflow-uri") + 1] == h["--mlflow-uri"]
    assert "hunter2" not in out.stdout + out.stderr
    follow = next(c for c in box.calls() if c[0] == "gcloud" and "--worker=0" in c)
    assert follow[5] == h["--name"] and follow[follow.index("--project") + 1] == h["--project"]


def test_tpu_stop_create_delete_install_and_host_setup_run_nothing_smuggled(box):
    tpu = {f: hostile(box.pwned, f.strip("-")) for f in ("--name", "--zone", "--project")}
    flat = [w for kv in tpu.items() for w in kv]
    check(box, box.dry_run("infra/tpu/launch.sh", *flat, "--stop"), tpu)
    extra = {f: hostile(box.pwned, f.strip("-")) for f in ("--version", "--service-account")}
    create = box.dry_run("infra/tpu/create.sh", *flat, *[w for kv in extra.items() for w in kv], "--spot")
    check(box, create, {**tpu, **extra})
    check(box, box.dry_run("infra/tpu/delete.sh", *flat), tpu)
    tmpdir = box.tmp / hostile_name("tmpdir")
    tmpdir.mkdir()
    ref = {"--ref": hostile(box.pwned, "ref")}
    install = box.dry_run("infra/tpu/install.sh", *flat, "--ref", ref["--ref"], env={"TMPDIR": str(tmpdir)})
    check(box, install, {**tpu, **ref, "TMPDIR": str(tmpdir)})
    src = box.tmp / hostile_name("src")
    src.mkdir()
    (src / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    venv = str(box.tmp / hostile_name("venv"))
    stub(Path(venv) / "bin/python", LOG)  # what `python3.11 -m venv` would have made
    check(box, box.dry_run("infra/tpu/host_setup.sh", "--src", str(src), "--venv", venv), {"--src": str(src)})
    assert any(c[0] == "python3.11" and c[-1] == venv for c in box.calls())  # python3.11 -m venv VENV
    check(box, box.dry_run("infra/tpu/host_setup.sh", "--src", str(src), "--system-python"), {"--src": str(src)})


@pytest.mark.parametrize("ship", ["image", "setup-file"])
def test_dataflow_run_dry_run_pasted_runs_nothing_smuggled(box, ship):
    h = {f: hostile(box.pwned, f.strip("-")) for f in ("--project", "--region", "--mlflow-uri", "--preset")}
    h |= {f: hostile(box.pwned, f.strip("-")) for f in ("--wiki", "--books", "--machine-type")}
    h |= {f: "gs://b/" + hostile(box.pwned, f.strip("-")) for f in ("--root", "--temp")}
    h["--set"] = "corpus.x=" + hostile(box.pwned, "set")
    if ship == "image":
        h["--image"] = hostile(box.pwned, "image")
        more, env = ["--build"], {}
    else:
        tmpdir = box.tmp / hostile_name("tmpdir")
        tmpdir.mkdir()
        more, env = ["--setup-file"], {"TMPDIR": str(tmpdir)}
    out = box.dry_run("infra/dataflow/run.sh", *[w for kv in h.items() for w in kv], *more, env=env)
    check(box, out, {**h, **env})
    stages = [c for c in box.calls() if c[0] == "bertflow"]
    assert len(stages) == 3 and all(c[c.index("--root") + 1] == h["--root"] for c in stages)
