"""Entry point of a stage's own process: ``python -m flows.proc.stage_entry --spec FILE``.

The flow starts it for the rows of the stage table that run in a process of their own (each
downstream unit). The spec is JSON (``flows.proc.protocol.ProcessSpec``, the training process's
shape too): the run config, the row's name, its input and output URLs, the unit. When the flow
passed an MLflow run id through the environment, the stage logs its metrics to that run; only
rank 0 logs. Its exit code says how it ended (``flows.proc.protocol``): 2 for bad input or config
(never retried), 1 for the rest.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from flows.calls import StageCall
from flows.noise import silence_library_noise
from flows.proc.protocol import (
    CHILD_LOG_FORMAT,
    describe_disk_full,
    disk_full,
    exit_code_for,
    progress_reporter,
    read_spec,
)
from flows.table import get_stage
from flows.tracker_sqlite import log_fn_from_env
from pipeline.runtime import economical_gc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run one row of the stage table in this process")
    parser.add_argument("--spec", required=True, help="JSON file: stage, root, url, inputs, restart, config")
    args = parser.parse_args(argv)
    economical_gc()
    spec = read_spec(args.spec)
    silence_library_noise()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(CHILD_LOG_FORMAT))  # the parent adds the time
    logger = logging.getLogger("bertflow")  # every module of ours logs under bertflow.*
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    rank = int(os.environ.get("RANK", "0"))
    log_fn = progress_reporter(log_fn_from_env()) if rank == 0 else None
    call = StageCall.from_spec(spec, log_fn)
    try:
        get_stage(call.stage).run(call)
    except BaseException as exc:  # the traceback for the log, the kind of failure in the exit code
        full = disk_full(exc)
        if full is not None:
            logging.getLogger("bertflow.stage").error("%s failed: %s", call.stage, describe_disk_full(full, call.url))
            return exit_code_for(exc)
        logging.getLogger("bertflow.stage").error("%s failed: %s: %s", call.stage, type(exc).__name__, exc)
        if not isinstance(exc, KeyboardInterrupt):
            import traceback

            traceback.print_exc()
        return exit_code_for(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
