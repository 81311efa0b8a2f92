"""Entry point of the pretraining process: where model/ meets tracking and the masking rule.

``flows.proc.launch.launch_pretrain`` starts this module (``python -m flows.proc.train_entry --spec
JSON``, under torchrun for several processes). The spec carries:

- ``pretrain``, ``model``: the typed configs as dicts; ``examples_url``, ``output_url``;
- ``vocab_url`` (optional): the vocab stage; its ``vocab.txt`` gives the special ids ([PAD] for
  padding) and, through ``pipeline.examples.masking``, the one masking rule for dynamic masking;
- ``restart`` (bool): clear existing checkpoints and start over (``--force pretrain``);
- ``init_from`` (str): a BERT folder in Hugging Face layout to start from;
- ``nproc``: read by the launcher, ignored here.

Only rank 0 logs at INFO (and to MLflow, when the flow passed a run id through the
environment); other ranks log warnings and errors only. Exit codes (``flows.proc.protocol``): 0
done, 143/130 stopped by SIGTERM/SIGINT after writing a checkpoint (rerun to resume), 3 a
checkpoint that cannot continue under this config (the message says to use ``--force
pretrain``), 4 the loss diverged (NaN/inf: the message names the step and the newest good
checkpoint; never retried), 2 bad input (a damaged shard, an example that breaks the contract,
a config the data cannot serve: the message names the file), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from flows.proc.protocol import (
    CHILD_LOG_FORMAT,
    EXIT_BAD_INPUT,
    EXIT_DISK_FULL,
    EXIT_DIVERGED,
    EXIT_OK,
    EXIT_RESUME_REFUSED,
    EXIT_TRACKING_GONE,
    describe_disk_full,
    disk_full,
    is_deterministic,
    progress_reporter,
    set_parent_death_signal,
    tracking_gone,
)
from flows.tracking import log_fn_from_env

log = logging.getLogger("bertflow.pretrain")


def build_configs(spec: dict):
    from model.config import BertConfig, PhaseConfig, PretrainConfig

    pre = dict(spec["pretrain"])
    pre["phases"] = tuple(PhaseConfig(**p) for p in pre["phases"])
    return PretrainConfig(**pre), BertConfig(**spec["model"])


def read_vocab(vocab_url: str) -> list[str]:
    """The tokens of ``{vocab_url}/vocab.txt``, one per line (line number = id)."""
    import fsspec

    from pipeline.schema.storage import join_url

    url = join_url(vocab_url, "vocab.txt")
    fs, path = fsspec.core.url_to_fs(url)
    if not fs.exists(path):
        raise FileNotFoundError(f"vocab_url {vocab_url} has no vocab.txt")
    with fs.open(path, "r", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


class MaskRule:
    """``pipeline.examples.masking.create_masked_lm_predictions`` in the loader's ``mask_fn`` shape."""

    def __init__(self, vocab: list[str], masked_lm_prob: float = 0.15, whole_word_mask: bool = False):
        from pipeline.examples.masking import VocabIds

        self.ids = VocabIds.from_vocab(vocab)
        self.masked_lm_prob, self.whole_word_mask = masked_lm_prob, whole_word_mask

    def __call__(self, tokens, max_predictions, rng):
        from pipeline.examples.masking import create_masked_lm_predictions

        return create_masked_lm_predictions(
            tokens, self.masked_lm_prob, max_predictions, self.ids, rng, whole_word_mask=self.whole_word_mask
        )


def masking_from(spec: dict) -> tuple[MaskRule | None, int | None]:
    """(mask_fn, pad id) from the vocabulary and the examples stage's config; (None, None) without a vocab."""
    if not spec.get("vocab_url"):
        return None, None
    from pipeline.schema.manifest import read_manifest
    from pipeline.schema.outputs import example_lengths

    vocab = read_vocab(spec["vocab_url"])
    if "[PAD]" not in vocab:
        raise ValueError(f"{spec['vocab_url']}/vocab.txt has no [PAD] token")
    lengths = example_lengths(read_manifest(spec["examples_url"]))
    first = lengths[min(lengths)]  # every length of one examples stage shares its masking rule
    return MaskRule(vocab, first.masked_lm_prob, first.whole_word_mask), vocab.index("[PAD]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bertflow pretraining process")
    parser.add_argument(
        "--spec", required=True, help="JSON: pretrain, model, examples_url, output_url, vocab_url, restart, init_from"
    )
    args = parser.parse_args(argv)
    spec = json.loads(args.spec)
    rank = int(os.environ.get("RANK", "0"))
    if "LOCAL_RANK" in os.environ:  # under torchrun: stop with it (its workers run in their own sessions)
        set_parent_death_signal()
        if os.getppid() == 1:  # the parent died before we armed it
            return 1
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        # the parent adds the time; other ranks' lines say which rank they come from
        format=CHILD_LOG_FORMAT.replace(" |", f" [rank {rank}] |") if rank else CHILD_LOG_FORMAT,
    )
    pretrain_cfg, model_cfg = build_configs(spec)
    mask_fn, pad_id = masking_from(spec)

    from model.callbacks import DataTrace
    from model.resume import ResumeError
    from model.train import Preempted, run_pretrain

    trace = os.environ.get("BERTFLOW_TRACE_DATA")  # tests: what each rank saw and holds
    try:
        log_fn = progress_reporter(log_fn_from_env()) if rank == 0 else None
        run_pretrain(
            pretrain_cfg,
            model_cfg,
            spec["examples_url"],
            spec["output_url"],
            log_fn=log_fn,
            restart=bool(spec.get("restart", False)),
            mask_fn=mask_fn,
            init_from=spec.get("init_from") or "",
            vocab_url=spec.get("vocab_url") or "",
            pad_id=pad_id,
            callbacks=DataTrace(trace) if trace else None,
        )
    except Preempted as exc:
        log.warning("%s; rerun to resume", exc)
        return 128 + int(exc.signum)
    except ResumeError as exc:
        log.error("%s", exc)
        return EXIT_RESUME_REFUSED
    except FloatingPointError as exc:  # a divergence: the step and the checkpoint, never a retry
        from model.checkpoint import describe_divergence

        log.error("%s", describe_divergence(spec["output_url"], exc))
        return EXIT_DIVERGED
    except Exception as exc:
        full = disk_full(exc)
        if full is not None:  # named as the disk, and never retried
            log.error("%s", describe_disk_full(full, spec["output_url"]))
            return EXIT_DISK_FULL
        gone = tracking_gone(exc)
        if gone is not None:  # the server named, never retried; the checkpoints are kept
            log.error("%s", gone)
            return EXIT_TRACKING_GONE
        if not is_deterministic(exc):
            raise
        log.exception("bad input: %s", exc)
        return EXIT_BAD_INPUT
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
