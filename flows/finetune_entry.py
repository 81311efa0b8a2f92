"""Entry point of a downstream task's process (see flows.stages.run_downstream_subprocess).

Reads ``(stage, run config, root, output url)`` pickled on stdin from the flow's process (same
code, same machine), logs to the MLflow run named in the environment, and writes the stage's
outputs and manifest; the flow reads the manifest back.
"""

from __future__ import annotations

import logging
import pickle
import sys

from flows.stages import execute_downstream
from flows.tracking import log_fn_from_env


def main() -> int:
    stage, cfg, root, url = pickle.loads(sys.stdin.buffer.read())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s | %(message)s", "%H:%M:%S"))
    logger = logging.getLogger("bertflow")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    execute_downstream(stage, cfg, root, url, log_fn_from_env())
    return 0


if __name__ == "__main__":
    sys.exit(main())
