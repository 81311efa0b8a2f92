"""The pretrain stage on several hosts: one command for every host of a GPU cluster or TPU pod.

``python -m flows.proc.cluster --preset large --root gs://b/large [--set F=V ...]`` runs on every
host (``infra/gpu/launch.sh``, the Kubernetes indexed Job, ``infra/tpu/launch.sh``). Host 0 runs
the stage as a flow (``bertflow stage pretrain``: preflight, MLflow run, manifest written last),
and its launcher (``flows.proc.launch``) joins the torchrun rendezvous as node 0. Every other host runs
the same training process with the same spec (``flows.calls.StageCall.spec``), built from the same
preset, overrides and root: it joins the rendezvous and neither logs nor writes (rank != 0).
On a TPU pod slice (XLA) there is no torchrun: every host runs one process that drives the
slice's devices through SPMD, and ``model/backend.py`` takes its data share and its right to
write from the XLA runtime's process index (host 0 alone writes; docs/pretraining.md, "TPU pods").

Design choice: one stage owner. A flow on every host would start N MLflow runs and race on the
manifest; here only host 0 records anything, the others are pure trainers. The node layout comes
from the environment (``BERTFLOW_NNODES``, ``BERTFLOW_NODE_RANK`` or a Kubernetes indexed Job's
``JOB_COMPLETION_INDEX``, ``BERTFLOW_RDZV_ENDPOINT``), so the same image and command serve every
host; ``--dry-run`` prints what this host would run and reads nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from flows.proc.launch import ENV_NODE_RANK, build_command, nodes_from_env
from flows.proc.protocol import ProcessSpec


def host_index(env: dict[str, str] | None = None) -> int:
    """This host's index: ``BERTFLOW_NODE_RANK``, else ``JOB_COMPLETION_INDEX``, else
    ``TPU_WORKER_ID`` (set by ``infra/tpu/launch.sh`` from the TPU VM's metadata), else 0."""
    env = os.environ if env is None else env
    for name in (ENV_NODE_RANK, "JOB_COMPLETION_INDEX", "TPU_WORKER_ID"):
        if env.get(name, "") != "":
            try:
                return int(env[name])
            except ValueError:
                raise ValueError(f"{name}: expected an integer host index, got {env[name]!r}") from None
    return 0


def flow_argv(args: argparse.Namespace) -> list[str]:
    """``bertflow`` arguments of host 0: the pretrain stage as a flow."""
    argv = ["stage", "pretrain", "--preset", args.preset, "--root", args.root]
    for item in args.overrides:
        argv += ["--set", item]
    for item in args.input:
        argv += ["--input", item]
    if args.mlflow_uri:
        argv += ["--mlflow-uri", args.mlflow_uri]
    return argv


def trainer_spec(args: argparse.Namespace) -> ProcessSpec:
    """The training spec host 0's flow builds, rebuilt here from the same preset/overrides/root."""
    from flows.calls import StageCall
    from flows.overrides import parse_overrides
    from flows.presets import load_config
    from flows.secrets import merge_secret_overrides
    from flows.table import stage_inputs, stage_url

    cfg = load_config(args.preset, merge_secret_overrides(parse_overrides(args.overrides)))
    given = dict(item.split("=", 1) for item in args.input)
    inputs = stage_inputs("pretrain", cfg, args.root, given)
    call = StageCall("pretrain", cfg, args.root, stage_url(args.root, "pretrain"), inputs, None)
    return call.spec()


def _dry_run_nproc(args: argparse.Namespace) -> int:
    """Training processes on this host for ``--dry-run``: from the config, which is checked (a bad
    preset or override fails here too; no input is read). Where the project's dependencies are not
    installed (a dry run on a laptop with a bare ``python3``) the config cannot be built: then from
    ``--nproc-per-node`` (or 1), with a line saying the config was not checked."""
    try:
        from flows.overrides import parse_overrides
        from flows.presets import load_config
    except ImportError as exc:
        print(f"config not checked: {exc.name or exc} is not installed here")
        return args.nproc_per_node or 1
    try:
        return load_config(args.preset, parse_overrides(args.overrides)).pretrain.nproc
    except ValueError as exc:  # ConfigError is a ValueError
        raise ValueError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flows.proc.cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", required=True, help="tiny | small | base | large")
    p.add_argument("--root", required=True, help="run root URL (gs://bucket/path on a cluster)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="replace an input of the stage (examples=..., vocab=...)",
    )
    p.add_argument("--mlflow-uri", default=None, help="tracking server (host 0); default $MLFLOW_TRACKING_URI")
    p.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="training processes on this host (default: pretrain.nproc of the config)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what this host would run; read and start nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        nodes = nodes_from_env()
        host = host_index()
    except ValueError as exc:
        print(f"flows.proc.cluster: {exc}", file=sys.stderr)
        return 2
    if args.nproc_per_node is not None:
        args.overrides = [*args.overrides, f"pretrain.nproc={args.nproc_per_node}"]
    role = "flow" if host == 0 else "trainer"
    if args.dry_run:
        try:
            nproc = _dry_run_nproc(args)
        except ValueError as exc:
            print(f"flows.proc.cluster: configuration error: {exc}", file=sys.stderr)
            return 2
        print(f"host {host} of {nodes.nnodes}: {role}")
        if role == "flow":
            print("would run: bertflow " + shlex.join(flow_argv(args)))
        cmd = build_command("<spec file: the pretrain call from the preset, overrides and root>", nproc, nodes)
        print("training command: " + shlex.join(cmd))
        return 0
    if role == "flow":
        from flows.cli import main as cli_main

        return cli_main(flow_argv(args))
    from flows.proc.launch import launch_pretrain

    try:
        spec = trainer_spec(args)
    except (OSError, ValueError, KeyError) as exc:
        print(f"flows.proc.cluster: host {host}: {exc}", file=sys.stderr)
        return 2
    print(f"host {host} of {nodes.nnodes}: trainer of {spec.url} on {json.dumps(spec.inputs)}", flush=True)
    return launch_pretrain(spec)


if __name__ == "__main__":
    sys.exit(main())
