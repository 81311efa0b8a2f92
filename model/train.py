"""MLM + NSP pretraining: phases of sequence lengths, one LR schedule, checkpoints, exact resume.

``run_pretrain`` is the stage entry point. For each phase (e.g. 90% of steps at length 128,
then 10% at 512) it reads the example stage's ``seq{N}/`` shards, trains with AdamW under one
warm-up + linear-decay schedule spanning all phases, writes resumable checkpoints every
``checkpoint_every`` steps and at each phase end, and finally the HF-layout weights in
``{output}/final/`` and the stage manifest (last).

Exact resume: a checkpoint holds everything the next step depends on (weights, optimizer and
scheduler state, the CPU / python / device RNG states that drive dropout, the data loader's
(epoch, batch) position, phase and step). Batches are a pure function of (seed, phase, epoch,
index), so N steps straight and N/2 + crash + resume + N/2 give bit-identical weights on CPU
(tested). A checkpoint from a run with a different config or different examples is refused.

Backend-neutral: the loop talks to a :class:`model.backend.Backend` (device, XLA step sync,
autocast, DDP wrap, rank). Metrics stay on the device between log steps, so the loop does not
force a host sync per step (beyond what the sparse MLM gather needs on CUDA). Rank 0 alone
logs, checkpoints and writes outputs. The orchestrator passes ``log_fn`` (e.g. to MLflow);
this module never imports a tracker.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from typing import Any, Callable

import fsspec
import torch

from model.backend import Backend, setup_backend, unwrap
from model.bert import BertForPreTraining, count_parameters, mlm_correct
from model.checkpoint import (
    checkpoint_url,
    find_latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from model.config import BertConfig, PretrainConfig
from model.data import DynamicMasking, ExampleLoader, LoaderPosition, infer_mask_token_id, read_examples, shard_urls, stable_seed
from model.export import save_pretrained
from model.optim import build_optimizer, warmup_linear_schedule
from pipeline.schema import (
    Manifest,
    clear_stage,
    config_digest,
    describe_file,
    fingerprint_input,
    join_url,
    manifest_url,
    read_manifest,
    write_manifest,
)

log = logging.getLogger("bertflow.pretrain")

LogFn = Callable[[dict[str, float], int], None]
KEEP_LAST_CHECKPOINTS = 2
"""Periodic checkpoints kept (phase-end ones are always kept)."""
# Fields that change neither the weights nor the data order: a resume may change them.
_RESUME_FREE = ("log_every", "checkpoint_every", "backend")


@dataclasses.dataclass
class TrainState:
    """Where training stands; saved in every checkpoint."""

    global_step: int = 0
    phase_index: int = 0
    phase_step: int = 0  # steps done in the current phase
    epoch: int = 0  # the loader's next batch
    batch: int = 0
    examples_seen: int = 0
    seconds: float = 0.0  # training time over all sessions
    first_window: dict[str, float] | None = None
    last_window: dict[str, float] | None = None
    run_digest: str = ""


class Window:
    """Metric sums over the steps since the last log, kept on the device."""

    KEYS = ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_total", "nsp_correct", "nsp_total")

    def __init__(self, device: torch.device):
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.sums = torch.zeros(len(self.KEYS), dtype=torch.float64, device=self.device)
        self.steps = self.examples = self.tokens = 0
        self.started = time.perf_counter()

    def add(self, out, batch: dict[str, torch.Tensor], examples: int, tokens: int) -> None:
        correct, total = mlm_correct(out.prediction_logits.detach(), batch["labels"])
        nsp_label = batch["next_sentence_label"]
        nsp_correct = (out.seq_relationship_logits.detach().argmax(-1) == nsp_label).sum()
        self.sums += torch.stack([
            out.loss.detach().double(), out.mlm_loss.detach().double(), out.nsp_loss.detach().double(),
            correct.double(), total.double(), nsp_correct.double(),
            torch.tensor(float(nsp_label.numel()), dtype=torch.float64, device=self.device),
        ])
        self.steps += 1
        self.examples += examples
        self.tokens += tokens

    def summary(self, backend: Backend, lr: float, phase_index: int) -> dict[str, float]:
        backend.wait()
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        s = dict(zip(self.KEYS, backend.all_reduce_sum(self.sums).tolist()))
        n = self.steps * backend.world_size
        return {
            "loss": s["loss"] / n,
            "mlm_loss": s["mlm_loss"] / n,
            "nsp_loss": s["nsp_loss"] / n,
            "mlm_accuracy": s["mlm_correct"] / max(s["mlm_total"], 1.0),
            "nsp_accuracy": s["nsp_correct"] / max(s["nsp_total"], 1.0),
            "lr": lr,
            "examples_per_sec": self.examples * backend.world_size / elapsed,
            "tokens_per_sec": self.tokens * backend.world_size / elapsed,
            "phase_index": float(phase_index),
        }


def _run_digest(config: PretrainConfig, model_config: BertConfig, examples_fp: str) -> str:
    pretrain = {k: v for k, v in dataclasses.asdict(config).items() if k not in _RESUME_FREE}
    return config_digest({"pretrain": pretrain, "model": dataclasses.asdict(model_config), "examples": examples_fp})


def _mask_token_id(examples: Manifest, data) -> int:
    for key in ("mask_token_id", "mask_id"):
        if isinstance(examples.config.get(key), int):
            return examples.config[key]
    return infer_mask_token_id(data)


def run_pretrain(
    config: PretrainConfig,
    model_config: BertConfig,
    examples_url: str,
    output_url: str,
    log_fn: LogFn | None = None,
    resume: bool = True,
) -> Manifest:
    """Pretrain BERT on the example stage at ``examples_url``; write checkpoints and final weights.

    ``resume=True`` continues from the latest complete checkpoint under ``output_url`` (a run
    already finished just rewrites ``final/`` and the manifest); ``resume=False`` deletes
    ``output_url`` first. ``log_fn(metrics, global_step)`` is called on rank 0 every
    ``config.log_every`` steps and at each phase end; ``tokens_per_sec`` counts real (non-pad)
    tokens. The [MASK] id for dynamic masking comes from the example manifest's config
    (``mask_token_id``) when it has one, else it is read off the static masks.
    """
    t_start = time.time()
    backend = setup_backend(config.backend)
    examples = read_manifest(examples_url)
    examples_fp = fingerprint_input(examples_url)
    for p in config.phases:  # fail before any work: every length present and within positions
        shard_urls(examples, p.max_seq_length)
        if p.max_seq_length > model_config.max_position_embeddings:
            raise ValueError(
                f"pretrain.phases[{p.name}].max_seq_length {p.max_seq_length} > "
                f"model.max_position_embeddings {model_config.max_position_embeddings}"
            )

    if backend.is_main:
        if not resume:
            clear_stage(output_url)
        fs, mpath = fsspec.core.url_to_fs(manifest_url(output_url))
        if fs.exists(mpath):  # a rerun: the folder is unfinished again until the end
            fs.rm(mpath)
    backend.barrier()

    random.seed(config.seed)
    torch.manual_seed(config.seed)
    model = BertForPreTraining(model_config)
    model.to(backend.device)
    model.tie_weights()
    model.sparse_prediction = backend.name != "xla"  # XLA wants static shapes
    optimizer = build_optimizer(
        model, config.learning_rate, config.weight_decay, (config.beta1, config.beta2), config.eps
    )
    scheduler = warmup_linear_schedule(optimizer, config.warmup_steps, config.total_steps)
    if backend.rank:  # distinct dropout per rank; the weights are rank 0's (DDP broadcasts)
        torch.manual_seed(stable_seed(config.seed, "rank", backend.rank))

    state = TrainState(run_digest=_run_digest(config, model_config, examples_fp))
    latest = find_latest_checkpoint(output_url) if resume else None
    if latest is not None:
        state = _restore(latest, model, optimizer, scheduler, backend, state.run_digest, config.seed)
        log.info("resuming from %s (step %d)", latest, state.global_step)
    train_model = backend.wrap(model)
    train_model.train()

    phase_ends = {sum(p.steps for p in config.phases[: i + 1]) for i in range(len(config.phases))}
    session_start = time.perf_counter()
    seconds_before = state.seconds

    for phase_index in range(state.phase_index, len(config.phases)):
        phase = config.phases[phase_index]
        if phase_index != state.phase_index:
            state.phase_index, state.phase_step, state.epoch, state.batch = phase_index, 0, 0, 0
        if state.phase_step >= phase.steps:
            continue
        data = read_examples(shard_urls(examples, phase.max_seq_length), phase.max_seq_length,
                             model_config.vocab_size)
        masking = None
        if config.dynamic_masking:
            masking = DynamicMasking(_mask_token_id(examples, data), model_config.vocab_size)
            log.info("dynamic masking with [MASK] id %d", masking.mask_token_id)
        loader = ExampleLoader(
            data, phase.batch_size, phase.max_seq_length, config.seed, key=phase.name,
            rank=backend.rank, world_size=backend.world_size, dynamic_masking=masking,
        )
        loader.set_position(LoaderPosition(state.epoch, state.batch))
        log.info("phase %s: %d examples of length %d, %d batches of %d per epoch, steps %d..%d",
                 phase.name, len(data), phase.max_seq_length, loader.batches_per_epoch,
                 phase.batch_size, state.global_step + 1, state.global_step + phase.steps - state.phase_step)
        window = Window(backend.device)

        while state.phase_step < phase.steps:
            batch = next(loader)
            tokens = int(batch["attention_mask"].sum())
            batch = {k: v.to(backend.device, non_blocking=True) for k, v in batch.items()}
            lr = optimizer.param_groups[0]["lr"]
            with backend.autocast():
                out = train_model(**batch)
            out.loss.backward()
            if config.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            backend.step_done()

            state.global_step += 1
            state.phase_step += 1
            state.examples_seen += phase.batch_size
            state.epoch, state.batch = loader.position.epoch, loader.position.batch
            window.add(out, batch, loader.local_batch_size, tokens)

            phase_end = state.phase_step == phase.steps
            if state.global_step % config.log_every == 0 or phase_end:
                metrics = window.summary(backend, lr, phase_index)
                _report(metrics, state, phase, config, backend, log_fn)
                window.reset()
            if state.global_step % config.checkpoint_every == 0 or phase_end:
                state.seconds = seconds_before + time.perf_counter() - session_start
                _checkpoint(output_url, phase.name, model, optimizer, scheduler, backend, state, phase_ends)

    state.seconds = seconds_before + time.perf_counter() - session_start
    return _finish(config, model_config, model, output_url, examples_fp, state, backend, t_start)


def _report(metrics, state: TrainState, phase, config: PretrainConfig, backend: Backend, log_fn) -> None:
    if not math.isfinite(metrics["loss"]):
        raise FloatingPointError(f"loss is {metrics['loss']} at step {state.global_step} (phase {phase.name})")
    if state.first_window is None:
        state.first_window = metrics
    state.last_window = metrics
    if not backend.is_main:
        return
    log.info(
        "phase %s step %d/%d loss %.4f (mlm %.4f, nsp %.4f) mlm_acc %.3f lr %.3g %.1f ex/s %.0f tok/s",
        phase.name, state.global_step, config.total_steps, metrics["loss"], metrics["mlm_loss"],
        metrics["nsp_loss"], metrics["mlm_accuracy"], metrics["lr"], metrics["examples_per_sec"],
        metrics["tokens_per_sec"],
    )
    if log_fn is not None:
        log_fn(metrics, state.global_step)


def _checkpoint(output_url, phase_name, model, optimizer, scheduler, backend: Backend, state, phase_ends) -> None:
    if backend.is_main:
        url = checkpoint_url(output_url, phase_name, state.global_step)
        save_checkpoint(url, model, {
            "train": dataclasses.asdict(state),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": {"python": random.getstate(), "torch": torch.get_rng_state(), "device": backend.rng_state()},
        })
        prune_checkpoints(output_url, KEEP_LAST_CHECKPOINTS, keep=phase_ends)
    backend.barrier()


def _restore(url: str, model, optimizer, scheduler, backend: Backend, run_digest: str, seed: int) -> TrainState:
    saved = load_checkpoint(url, model)
    state = TrainState(**saved["train"])
    if state.run_digest != run_digest:
        raise ValueError(
            f"checkpoint {url} was written by a run with a different config or different examples; "
            "rerun with resume=False to start over"
        )
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    if backend.is_main:  # the saved RNG states are rank 0's
        rng = saved["rng"]
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
        backend.set_rng_state(rng["device"])
    else:  # other ranks: a fresh dropout stream per (rank, step); exact resume is for rank 0's
        torch.manual_seed(stable_seed(seed, "rank", backend.rank, state.global_step))
    return state


def _finish(config, model_config, model, output_url, examples_fp, state: TrainState, backend, t_start) -> Manifest:
    final_url = join_url(output_url, "final")
    if backend.is_main:
        save_pretrained(unwrap(model), final_url)
    backend.barrier()
    first, last = state.first_window or {}, state.last_window or {}
    counts: dict[str, float] = {
        "steps": state.global_step,
        "examples_seen": state.examples_seen,
        "first_mlm_loss": first.get("mlm_loss", float("nan")),
        "last_mlm_loss": last.get("mlm_loss", float("nan")),
        "first_nsp_loss": first.get("nsp_loss", float("nan")),
        "last_nsp_loss": last.get("nsp_loss", float("nan")),
        "mlm_accuracy": last.get("mlm_accuracy", float("nan")),
        "nsp_accuracy": last.get("nsp_accuracy", float("nan")),
        "seconds": state.seconds,
        "parameters": count_parameters(unwrap(model)),
    }
    stage_config = manifest_config(config, model_config)
    if not backend.is_main:
        return Manifest("pretrain", output_url, stage_config, {"examples": examples_fp}, counts, [])
    files = [describe_file(output_url, f"final/{name}") for name in ("config.json", "model.safetensors")]
    return write_manifest(
        "pretrain", output_url, config=stage_config, inputs={"examples": examples_fp},
        counts=counts, files=files, seconds=time.time() - t_start,
    )


def manifest_config(config: PretrainConfig, model_config: BertConfig) -> dict[str, Any]:
    """The config run_pretrain records in its manifest (the flow compares it to skip a finished run)."""
    return {**dataclasses.asdict(config), "model": dataclasses.asdict(model_config)}
