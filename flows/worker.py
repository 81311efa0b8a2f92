"""The worker's side of ``bertflow run`` and ``bertflow stage``: the flow run, under the stop
protocol of ``flows.proc.supervisor`` (the supervisor is the command itself, ``flows.cli``).

:func:`serve` installs the SIGINT/SIGTERM handler before anything else runs (a stop is never a
traceback) and leaves at once after a stop; :func:`run_flow` runs the flow against Prefect's
temporary server (``flows.prefect_server``; the flow's imports are done while it starts), with a
progress bar per training stage, and ends in one closing line for the supervisor to print last.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import sys
from collections.abc import Callable

from flows.exits import failure_code
from flows.summary_table import print_summary


def serve(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run the command line ``main(argv)`` as the supervised worker."""
    from flows.proc.launch import stop_children  # imported before the handler can run
    from flows.proc.protocol import STOP

    handler = functools.partial(_stop, STOP, stop_children)
    for sig in (signal.SIGINT, signal.SIGTERM):  # from the first instruction: a stop is never a traceback
        signal.signal(sig, handler)
    try:
        return main(argv)
    except KeyboardInterrupt:
        _exit_now(_stopped_code())
        raise  # not reached


def run_flow(args, overrides, root: str, tracking_uri: str, given: dict[str, str], lock, console) -> int:
    """The flow of ``args.command`` on ``root`` (whose ``lock`` the caller acquired; released
    here), its closing table on stdout; the exit code."""
    from flows.secrets import ENV_SECRET_OVERRIDES, split_secret_overrides

    public, secret = split_secret_overrides(overrides)
    if secret:
        os.environ[ENV_SECRET_OVERRIDES] = json.dumps(secret)
    kwargs = dict(preset=args.preset, root=root, overrides=public, mlflow_uri=tracking_uri)
    failure = None
    try:
        from flows.prefect_db import prepare_prefect_database
        from flows.prefect_server import temporary_server

        prepare_prefect_database()  # before Prefect's temporary server starts: one migration at a time
        meanwhile = functools.partial(_flow_imports, args.command, tracking_uri)
        with temporary_server(meanwhile), _progress_bars(console):
            if args.command == "run":
                from flows.pretrain_flow import pretrain

                summary = pretrain(force=args.force, **kwargs)
            else:
                from flows.stage_flows import STAGE_FLOWS

                summary = STAGE_FLOWS[args.name](**{f"{k}_url": v for k, v in given.items()}, **kwargs)
    except KeyboardInterrupt:
        pass  # the stop request says which signal
    except Exception as exc:  # Prefect has logged the traceback; end with one clear line
        failure = exc
    finally:
        lock.release()
    from flows.proc.protocol import STOP
    from flows.proc.supervisor import say_last

    if STOP.requested is not None:
        say_last(f"bertflow: {args.command} stopped; finished stages are kept, a rerun resumes")
        _exit_now(_stopped_code())
    if failure is not None:  # the supervisor prints it after everything else: the last line on stderr
        code = failure_code(failure)
        say_last(f"bertflow: {args.command} failed (exit {code}): {type(failure).__name__}: {failure}")
        return code
    print_summary(summary)
    return 0


def _flow_imports(command: str, tracking_uri: str) -> None:
    """What every flow run imports before its first stage: the flow's module (Prefect's engine)
    and MLflow's client where its runs need it (``flows.tracker_sqlite``); done while Prefect's
    temporary server starts."""
    import flows.tracker_sqlite
    import flows.tracking

    if not flows.tracker_sqlite.without_mlflow(tracking_uri):  # else no MLflow at all (its runs: sqlite3)
        flows.tracking.import_client(tracking_uri)
    if command == "run":
        import flows.pretrain_flow  # noqa: F401
    else:
        import flows.stage_flows  # noqa: F401


def _stop(stop, stop_children, signum, frame):
    """The worker's SIGINT/SIGTERM handler: record the stop (nothing starts or retries after it),
    pass SIGTERM to every stage process and training tree, and unwind the flow. Later signals
    change nothing here: the supervisor kills the tree when asked twice."""
    if not stop.request(signum):
        return
    logging.getLogger("bertflow.flow").warning(
        "%s: stopping: %d stage process(es) asked to stop, nothing more starts", signal.Signals(signum).name,
        stop_children(signal.SIGTERM),
    )  # fmt: skip
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def _stopped_code() -> int:
    from flows.proc.protocol import STOP

    return 128 + (STOP.requested or signal.SIGINT)


def _exit_now(code: int) -> None:
    """Leave at once after a stop (threads of Beam or Prefect may never end by themselves); the
    supervisor sweeps what is left of the session (Prefect's temporary server)."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


class _progress_bars:
    """A rich progress bar per training stage, fed by the training process's progress lines."""

    def __init__(self, console):
        self.console = console
        self.progress = None
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        from flows.proc.protocol import LISTENERS

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.progress.start()
        LISTENERS.append(self.update)
        return self

    def update(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(f"{stage} steps", total=total)
        self.progress.update(self.tasks[stage], completed=done, total=total)

    def __exit__(self, *exc):
        from flows.proc.protocol import LISTENERS

        LISTENERS.remove(self.update)
        self.progress.stop()
