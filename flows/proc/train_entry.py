"""Entry point of the pretraining process: where model/ meets tracking and the masking rule.

``flows.proc.launch.launch_pretrain`` starts this module (``python -m flows.proc.train_entry --spec
FILE``, under torchrun for several processes). The spec is a stage process's
(``flows.proc.protocol.ProcessSpec``, built by ``flows.calls.StageCall.spec``): the run config, the
output URL and the inputs, from which :func:`training_setup` derives, as the stage table does:

- the pretraining config and the network's (``flows.table.model_config``: its vocabulary size the
  trained vocabulary's unless set; without a ``vocab`` input, the config's as it is);
- ``inputs["examples"]``; ``inputs["vocab"]`` (optional): its ``vocab.txt`` gives the special ids
  ([PAD] for padding) and, through ``pipeline.examples.masking``, the one masking rule for
  dynamic masking, at the rate the examples stage recorded;
- ``restart``: clear existing checkpoints and start over (``--force pretrain``);
- the folder to start from (``pretrain.init_from``, ``previous`` resolved against the root).

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
import dataclasses
import logging
import os
import sys
from typing import Any

from flows.proc.protocol import (
    CHILD_LOG_FORMAT,
    EXIT_BAD_INPUT,
    EXIT_DISK_FULL,
    EXIT_DIVERGED,
    EXIT_OK,
    EXIT_RESUME_REFUSED,
    EXIT_TRACKING_GONE,
    ProcessSpec,
    describe_disk_full,
    disk_full,
    is_deterministic,
    progress_reporter,
    read_spec,
    set_parent_death_signal,
    tracking_gone,
)
from flows.tracker_sqlite import log_fn_from_env
from pipeline.runtime import economical_gc

log = logging.getLogger("bertflow.pretrain")


@dataclasses.dataclass(frozen=True)
class TrainingSetup:
    """What the training process runs, derived from its spec."""

    pretrain: Any  # model.config.PretrainConfig
    model: Any  # model.config.BertConfig
    examples_url: str
    output_url: str
    vocab_url: str
    init_from: str
    restart: bool


def training_setup(spec: ProcessSpec) -> TrainingSetup:
    """The pretraining run a spec asks for (the same derivation on every host of a cluster)."""
    from flows.presets import config_from_dict
    from flows.table import init_from_url, model_config
    from pipeline.schema.config import ConfigError

    cfg = config_from_dict(spec.config)
    vocab_url = spec.inputs.get("vocab", "")
    model = model_config(cfg, vocab_url) if vocab_url else cfg.model
    if model.vocab_size is None:
        raise ConfigError("model.vocab_size: unset, and the spec has no vocab input to take it from")
    return TrainingSetup(
        pretrain=cfg.pretrain,
        model=model,
        examples_url=spec.inputs["examples"],
        output_url=spec.url,
        vocab_url=vocab_url,
        init_from=init_from_url(cfg, spec.root),
        restart=spec.restart,
    )


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


def masking_from(vocab_url: str, examples_url: str) -> tuple[MaskRule | None, int | None]:
    """(mask_fn, pad id) from the vocabulary and what the examples stage recorded; (None, None)
    without a vocabulary."""
    if not vocab_url:
        return None, None
    from pipeline.schema.manifest import read_manifest
    from pipeline.schema.outputs import example_lengths

    vocab = read_vocab(vocab_url)
    if "[PAD]" not in vocab:
        raise ValueError(f"{vocab_url}/vocab.txt has no [PAD] token")
    lengths = example_lengths(read_manifest(examples_url))
    first = lengths[min(lengths)]  # every length of one examples stage shares its masking rule
    return MaskRule(vocab, first.masked_lm_prob, first.whole_word_mask), vocab.index("[PAD]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bertflow pretraining process")
    parser.add_argument("--spec", required=True, help="JSON file: stage, root, url, inputs, restart, config")
    args = parser.parse_args(argv)
    economical_gc()
    spec = read_spec(args.spec)
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
    from model.callbacks import DataTrace
    from model.resume import ResumeError
    from model.train import Preempted, run_pretrain

    trace = os.environ.get("BERTFLOW_TRACE_DATA")  # tests: what each rank saw and holds
    try:
        run = training_setup(spec)  # a config or vocabulary the run cannot use is bad input, named
        mask_fn, pad_id = masking_from(run.vocab_url, run.examples_url)
        log_fn = progress_reporter(log_fn_from_env()) if rank == 0 else None
        run_pretrain(
            run.pretrain,
            run.model,
            run.examples_url,
            run.output_url,
            log_fn=log_fn,
            restart=run.restart,
            mask_fn=mask_fn,
            init_from=run.init_from,
            vocab_url=run.vocab_url,
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

        log.error("%s", describe_divergence(spec.url, exc))
        return EXIT_DIVERGED
    except Exception as exc:
        full = disk_full(exc)
        if full is not None:  # named as the disk, and never retried
            log.error("%s", describe_disk_full(full, spec.url))
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
