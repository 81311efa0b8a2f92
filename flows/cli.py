"""The ``bertflow`` command line: run the chain, one stage, or write a synthetic corpus.

Heavy imports (Prefect, MLflow, Beam, torch) happen inside the commands, so ``bertflow --help``
and config errors answer at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

STAGE_NAMES = ("corpus", "vocab", "examples", "pretrain", "export", "finetune")


def _offline_defaults() -> None:
    """Settings that let Prefect's ephemeral server and MLflow run with no network."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s | %(message)s", "%H:%M:%S"))
    logger = logging.getLogger("bertflow")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help="tiny | base | large (default: tiny)")
    p.add_argument("--root", default=None, help="run root URL: a local folder or gs://bucket/path (default: ./runs/<preset>)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field, e.g. --set pretrain.phases.0.steps=50 --set data.wiki=/dumps/enwiki.xml.bz2",
    )
    p.add_argument("--mlflow-uri", default=None, help="MLflow tracking URI (default: sqlite:///<root>/mlflow.db)")
    p.add_argument("-v", "--verbose", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertflow", description="Raw text to a registered, evaluated BERT: run the chain, one stage, or write a synthetic corpus."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the whole chain (finished stages are skipped)")
    _add_common(run)
    run.add_argument(
        "--force", action="append", default=[], choices=STAGE_NAMES, help="rerun this stage and every stage after it"
    )

    stage = sub.add_parser("stage", help="run one stage alone (its inputs must exist)")
    stage.add_argument("name", choices=STAGE_NAMES)
    _add_common(stage)

    synth = sub.add_parser("synth-corpus", help="write a synthetic corpus (Wikipedia XML + books) and downstream sets")
    synth.add_argument("--out", required=True, help="output folder")
    synth.add_argument("--size", default="50MB", help="approximate uncompressed text size, e.g. 200KB, 50MB, 2GB")
    synth.add_argument("--seed", type=int, default=0)

    show = sub.add_parser("config", help="print the resolved configuration as JSON")
    show.add_argument("--preset", default="tiny")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _offline_defaults()
    from flows.presets import ConfigError, load_config, parse_overrides

    try:
        if args.command == "synth-corpus":
            return _synth(args)
        overrides = parse_overrides(args.overrides)
        cfg = load_config(args.preset, overrides)  # fail fast, before any server starts
    except (ConfigError, ValueError) as exc:
        print(f"bertflow: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        import dataclasses

        print(json.dumps(dataclasses.asdict(cfg), indent=2))
        return 0
    _setup_logging(args.verbose)
    from flows.pretrain_flow import pretrain

    kwargs = dict(preset=args.preset, root=args.root, overrides=overrides, mlflow_uri=args.mlflow_uri)
    try:
        if args.command == "run":
            summary = pretrain(force=args.force, **kwargs)
        else:
            summary = pretrain(stages=[args.name], **kwargs)
    except Exception as exc:  # noqa: BLE001 - Prefect has logged the traceback; end with one clear line
        print(f"bertflow: {args.command} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print_summary(summary)
    return 0


def _synth(args) -> int:
    from synth.corpus import parse_size, write_corpus, write_downstream

    start = time.time()
    counts = write_corpus(args.out, parse_size(args.size), args.seed)
    counts.update({f"downstream_{k}": v for k, v in write_downstream(args.out, args.seed).items()})
    print(json.dumps(counts, indent=2, default=str))
    print(f"wrote {args.out} in {time.time() - start:.1f} s")
    return 0


def print_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from flows.pretrain_flow import format_figure

    table = Table(title=f"bertflow {summary['preset']}: {summary['seconds']:.0f} s")
    for col in ("stage", "status", "time (s)", "key figures", "output"):
        table.add_column(col, overflow="fold")
    for s in summary["stages"]:
        figs = "\n".join(f"{k}={format_figure(v)}" for k, v in s["figures"].items())
        table.add_row(s["stage"], s["status"], f"{s['seconds']:.1f}", figs, s["url"])
    console = Console(width=max(120, Console().width))
    console.print(table)
    console.print(f"results: {summary['root']}")
    if summary.get("model_version"):
        console.print(f"registered model: {summary['model_name']} version {summary['model_version']}")
    console.print(f"MLflow: mlflow ui --backend-store-uri {summary['tracking_uri']}")


if __name__ == "__main__":
    sys.exit(main())
