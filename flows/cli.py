"""The ``bertflow`` command line: run the chain or one stage, see where a root stands, look at any
stage's output, write a synthetic corpus, print the configuration.

Heavy imports (Prefect, MLflow, Beam, torch) happen inside the commands, so ``--help``, config
errors and the checks that run before Prefect's server starts answer at once. Every failure ends in
one line on stderr and a non-zero exit code (:data:`EXIT_CODES`, also in ``--help`` and the README).
A mistyped preset, field, task or stage name is answered with the closest one. ``run`` and ``stage``
run the flow in a worker process under a supervisor that owns the signals
(``flows.proc.supervisor``); a ``run`` that finds nothing to do is answered from the manifests and
the tracking store in the command's own process, without Prefect (``flows.finished``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable

from flows.exits import CLOSED_PIPE, EXIT_CODES, exit_codes_help, failure_code  # noqa: F401 (EXIT_CODES, failure_code: read from here too)
from flows.overrides import suggest
from flows.presets import PRESETS
from flows.summary_table import print_summary  # noqa: F401 (print_summary: read from here too)
from flows.table import CHAIN  # the stage table imports no torch, Beam, Prefect or MLflow
from pipeline.runtime import economical_gc


def _choice(kind: str, choices) -> Callable[[str], str]:
    """An argparse ``type`` that accepts one of ``choices`` and answers anything else with the
    closest one (argparse's own ``choices`` lists them but suggests none)."""
    choices = tuple(choices)

    def parse(value: str) -> str:
        if value in choices:
            return value
        raise argparse.ArgumentTypeError(
            f"unknown {kind} {value!r}{suggest(value, choices)}; choose from {', '.join(choices)}"
        )

    parse.__name__ = kind  # argparse names the type in its messages
    return parse


PRESET_HELP = f"{' | '.join(PRESETS)} (default: tiny; flows/presets.py)"


def _offline_defaults() -> None:
    """Settings that let Prefect's ephemeral server and MLflow run with no network, and no library
    message that is nobody's to act on (``flows.noise``)."""
    from flows.noise import silence_library_noise

    silence_library_noise()
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _setup_logging(verbose: bool):
    from rich.console import Console
    from rich.logging import RichHandler

    console = Console(stderr=True)
    if console.is_terminal:
        handler = RichHandler(console=console, show_path=False, markup=False, log_time_format="%H:%M:%S")
        handler.setFormatter(logging.Formatter("%(name)s | %(message)s"))
    else:  # a log file: one plain line per record, never wrapped
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s | %(message)s", "%H:%M:%S"))
    logger = logging.getLogger("bertflow")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    return console


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help=PRESET_HELP)
    p.add_argument(
        "--root", default=None, help="run root URL: a local folder or gs://bucket/path (default: ./runs/<preset>)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field (repeatable), e.g. --set pretrain.phases.0.steps=50 "
        "--set data.wiki=/dumps/enwiki.xml.bz2; `bertflow config --help` lists every field",
    )
    p.add_argument(
        "--mlflow-uri", default=None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else <root>/mlflow.db)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _version() -> str:
    """The installed distribution's version, and the commit of the checkout it runs from when known."""
    import importlib.metadata

    from flows.tracking import git_commit

    try:
        version = importlib.metadata.version("bertflow")
    except importlib.metadata.PackageNotFoundError:
        version = "(not installed)"
    commit = git_commit()
    return f"{version} (git {commit[:12]})" if commit and commit != "unknown" else version


class _VersionAction(argparse.Action):
    """``--version``, computed only when asked (it asks git for the commit)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"bertflow {_version()}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose epilog may be a function, called only when help is printed:
    ``config``'s list of every field reads the config classes' source (0.7 CPU-s), which no other
    command, refusal or ``--help`` should pay for."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="bertflow",
        description="Raw text to a registered, evaluated BERT. `bertflow run` runs the whole chain "
        "(finished stages are skipped); the other commands run or look at one part of it.",
        epilog=exit_codes_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction, help="print bertflow's version (and commit) and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser(
        "run",
        help="run the whole chain (finished stages are skipped)",
        description="Run every stage of the chain (Prefect flow `pretrain`); a stage whose output is "
        "up to date with its config, inputs and code is skipped.",
    )
    _add_common(run)
    run.add_argument(
        "--force",
        action="append",
        default=[],
        type=_choice("stage", CHAIN),
        choices=CHAIN,
        metavar="STAGE",
        help=f"rerun this stage and every stage after it (pretraining starts over): {', '.join(CHAIN)}",
    )

    stage = sub.add_parser(
        "stage",
        help="run one stage alone (its inputs must exist)",
        description="Run one stage (Prefect flow `stage-NAME`), reading the root's earlier "
        "outputs or the URLs given with --input.",
    )
    stage.add_argument(
        "name", type=_choice("stage", CHAIN), choices=CHAIN, metavar="STAGE", help="the stage: " + ", ".join(CHAIN)
    )
    stage.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="read this input from URL instead of the root, e.g. --input vocab=gs://b/run/vocab",
    )
    _add_common(stage)

    status = sub.add_parser(
        "status",
        help="list every stage of a root: done, stale and why, missing",
        description="Where a run root stands, stage by stage, without running anything. Exit code 0: "
        "every stage done; 3: the root exists and some stage is not; 2: there is no root at that URL "
        "(nothing has run there, or --root is mistyped).",
    )
    _add_common(status)
    status.add_argument("--verify", action="store_true", help="also check every output file's sha256 (reads all)")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")

    insp = sub.add_parser(
        "inspect",
        help="show a few rows of any stage's output, decoded",
        description="Documents with their sentences, examples with masks visible, the vocab, "
        "predictions: the first rows of a stage folder (or a subfolder such as examples/seq128).",
    )
    insp.add_argument("url", help="a stage folder, e.g. runs/tiny/examples/seq64")
    insp.add_argument("-n", type=int, default=5, help="how many rows (default 5)")

    fetch = sub.add_parser(
        "fetch-wiki",
        help="download a Wikipedia dump's pages-articles files, checksum-verified",
        description="Download {lang}wiki-{date}-pages-articles files (multistream with their index "
        "by default) with resume, verified against the dump's published sha1sums/md5sums; a corrupt "
        "file is fetched again. Then: bertflow run --set data.wiki=OUT.",
    )
    fetch.add_argument("--lang", required=True, help="wiki language code, e.g. en, bg, ja")
    fetch.add_argument("--date", required=True, help="dump date YYYYMMDD, or latest")
    fetch.add_argument("--out", required=True, help="folder URL to write to (local or gs://)")
    fetch.add_argument("--base-url", default=None, help="dump mirror (default: the Wikimedia dumps site)")
    fetch.add_argument(
        "--single-stream", action="store_true", help="the plain pages-articles files instead of multistream"
    )

    synth = sub.add_parser(
        "synth-corpus",
        help="write a synthetic corpus (Wikipedia XML + books) and downstream sets",
        description="A corpus of any size in the real formats, for tests and benchmarks.",
    )
    synth.add_argument("--out", required=True, help="output folder")
    synth.add_argument("--size", default="50MB", help="approximate uncompressed text size, e.g. 200KB, 50MB, 2GB")
    synth.add_argument("--seed", type=int, default=0, help="generator seed (the same seed writes the same bytes)")

    show = sub.add_parser(
        "config",
        help="print the resolved configuration as JSON",
        description="The preset with its overrides applied, as JSON.",
        epilog=_fields_help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show.add_argument("--preset", default="tiny", help=PRESET_HELP)
    show.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field (repeatable)",
    )
    return parser


def _fields_help() -> str:
    from flows.config_docs import describe_fields
    from flows.presets import RunConfig

    lines = [
        "every field (--set FIELD=VALUE; a list as JSON or comma-separated: --set finetune_tasks=sst2,squad1);",
        "the default shown is the field's own: presets change many (`bertflow config --preset P` prints them):",
    ]
    for name, kind, default, doc in describe_fields(RunConfig):
        lines.append(f"  {name} ({kind}, default {default})" + (f": {doc}" if doc else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    economical_gc()
    try:
        code = _dispatch(argv)
        sys.stdout.flush()  # a closed pipe is met here, not in the interpreter's exit
        return code
    except BrokenPipeError:  # the reader has what it wanted: end quietly, no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the exit's own flush then writes nowhere
        return CLOSED_PIPE


def _dispatch(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from flows.proc.supervisor import is_worker

    if not is_worker():
        return _main(argv)
    from flows.worker import serve

    return serve(_main, argv)


def beam_words(words: list[str]) -> list[str]:
    """Beam's own option words (``--runner=DataflowRunner --project=p --flink_master=h:8081``),
    as ``--set`` overrides of the shared ``beam`` config: a field of ``BeamConfig`` by its name,
    any other option Beam knows into ``beam.options``. A word Beam does not know either is an
    error (a misspelt option of ours is not passed to Beam to be ignored)."""
    import dataclasses

    from pipeline.beam.config import BeamConfig

    fields = {f.name for f in dataclasses.fields(BeamConfig)} - {"options", "extra_args"}
    known: set[str] | None = None
    out, i = [], 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--") or len(word) == 2:
            raise ValueError(f"unrecognized argument {word!r}")
        name, eq, value = word[2:].partition("=")
        if not eq:  # --name value, or a bare flag
            if i + 1 < len(words) and not words[i + 1].startswith("--"):
                value, i = words[i + 1], i + 1
            else:
                value = "true"
        if name not in fields:
            if known is None:
                from pipeline.beam.io import beam_option_names

                known = beam_option_names()
            if name not in known:
                raise ValueError(f"unrecognized argument --{name}: not an option of bertflow nor of Beam")
            name = f"options.{name}"
        out.append(f"beam.{name}={value}")
        i += 1
    return out


def _main(argv: list[str]) -> int:
    args, rest = build_parser().parse_known_args(argv)
    args.argv = argv
    if rest:  # Beam's own option words: only where a Beam stage can run
        try:
            if args.command not in ("run", "stage", "config"):
                raise ValueError(f"unrecognized arguments: {' '.join(rest)}")
            args.overrides = beam_words(rest) + list(args.overrides)  # an explicit --set wins
        except ValueError as exc:
            print(f"bertflow: {args.command}: {exc}", file=sys.stderr)
            return 2
    _offline_defaults()
    if args.command == "synth-corpus":
        return _synth(args)
    if args.command == "inspect":
        return _inspect(args)
    if args.command == "fetch-wiki":
        return _fetch(args)
    from flows.overrides import parse_overrides
    from flows.presets import load_config
    from pipeline.schema.config import ConfigError

    try:
        overrides = parse_overrides(args.overrides)
        cfg = load_config(args.preset, overrides)  # fail fast, before any server starts
    except (ConfigError, ValueError) as exc:
        print(f"bertflow: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        import dataclasses

        print(json.dumps(dataclasses.asdict(cfg), indent=2))
        return 0
    if args.command == "status":
        return _status(args, cfg)
    return _run(args, cfg, overrides)


def _run(args, cfg, overrides) -> int:
    from flows.checks import RootBusyError, RootLock, absolute_root, preflight
    from flows.table import stage_names, stages_after
    from flows.tracking import default_tracking_uri
    from pipeline.schema.manifest import ManifestError

    console = _setup_logging(args.verbose)
    root = absolute_root(args.root or os.path.join("runs", args.preset))
    given = dict(item.split("=", 1) for item in getattr(args, "input", []) if "=" in item)
    groups = (args.name,) if args.command == "stage" else CHAIN
    try:
        tracking_uri = args.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(root)
        forced = {g for f in args.force for g in stages_after(f)} if args.command == "run" else None
        preflight(cfg, root, stage_names(cfg, groups), tracking_uri, given, forced)
        lock = RootLock(root)
        lock.acquire()
    except (OSError, ValueError, KeyError, RootBusyError, ManifestError) as exc:
        print(f"bertflow: {args.command}: {exc}", file=sys.stderr)
        return 2
    from flows.proc.supervisor import is_worker, supervise

    if not is_worker():  # checked here to fail in seconds; the worker takes the lock for the run
        from flows.finished import answer_finished_run  # a finished root's run: answered without Prefect

        answerable = args.command == "run" and not args.force
        try:
            summary = answer_finished_run(cfg, args.preset, root, tracking_uri) if answerable else None
        finally:
            lock.release()
        if summary is not None:
            print_summary(summary)
            return 0
        return supervise(args.argv, args.command)
    from flows.worker import run_flow

    return run_flow(args, overrides, root, tracking_uri, given, lock, console)


def _status(args, cfg) -> int:
    from flows.checks import absolute_root
    from flows.status import collect_status, print_status, root_missing

    root = absolute_root(args.root or os.path.join("runs", args.preset))
    missing = root_missing(root)
    if missing:
        print(f"bertflow: status: {missing}", file=sys.stderr)
        return 2
    # the store the runs used: --mlflow-uri, else MLFLOW_TRACKING_URI (as `run` takes it), else the root's own
    uri = args.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
    rows = collect_status(cfg, root, uri, verify=args.verify)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        print_status(rows, root)
    return 0 if all(r["state"] == "done" for r in rows) else 3


def _inspect(args) -> int:
    from flows.inspect import inspect_url
    from pipeline.schema.manifest import ManifestError

    try:
        print(inspect_url(args.url, args.n))
    except (ManifestError, FileNotFoundError) as exc:
        print(f"bertflow: inspect: {exc}", file=sys.stderr)
        return 2
    return 0


def _fetch(args) -> int:
    from pipeline.corpus.fetch import FetchError, fetch_wiki

    kwargs = {"multistream": not args.single_stream}
    if args.base_url:
        kwargs["base_url"] = args.base_url
    try:
        files = fetch_wiki(args.lang, args.date, args.out, **kwargs)
    except (FetchError, OSError) as exc:
        print(f"bertflow: fetch-wiki: {exc}", file=sys.stderr)
        return 1
    print("\n".join(files))
    print(f"then: bertflow run --set data.wiki={args.out}")
    return 0


def _synth(args) -> int:
    from synth.corpus import parse_size, write_corpus, write_downstream

    start = time.time()
    counts = write_corpus(args.out, parse_size(args.size), args.seed)
    counts.update({f"downstream_{k}": v for k, v in write_downstream(args.out, args.seed).items()})
    print(json.dumps(counts, indent=2, default=str))
    print(f"wrote {args.out} in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
