"""Entry point of the pretraining process: where model/ meets tracking.

The flow starts this module as a subprocess (at scale: under torchrun or the XLA launcher on
every host). It rebuilds the typed configs from the JSON spec, and, when the flow passed an
MLflow run id through the environment, hands the training loop a callback that writes metrics
to that run. Only rank 0 logs; model/ itself never imports MLflow.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from flows.tracking import log_fn_from_env


def build_configs(spec: dict):
    from model.config import BertConfig, PhaseConfig, PretrainConfig

    pre = dict(spec["pretrain"])
    pre["phases"] = tuple(PhaseConfig(**p) for p in pre["phases"])
    return PretrainConfig(**pre), BertConfig(**spec["model"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bertflow pretraining process")
    parser.add_argument("--spec", required=True, help="JSON: pretrain, model, examples_url, output_url")
    args = parser.parse_args(argv)
    spec = json.loads(args.spec)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s | %(message)s", datefmt="%H:%M:%S")
    pretrain_cfg, model_cfg = build_configs(spec)

    log_fn = log_fn_from_env()
    from model.train import run_pretrain

    run_pretrain(pretrain_cfg, model_cfg, spec["examples_url"], spec["output_url"], log_fn=log_fn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
