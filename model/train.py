"""MLM + NSP pretraining in three calls: ``setup`` -> ``fit`` -> ``finish`` (``run_pretrain``).

For each phase (e.g. 90% of steps at length 128, then 10% at 512) the loop streams the example
stage's ``seq{N}/`` shards (``model/stream.py``), accumulates gradients over micro-batches up to
the phase's global batch, clips at ``max_grad_norm``, steps AdamW (or LAMB) under one warm-up +
linear-decay schedule spanning all phases, and writes resumable checkpoints every
``checkpoint_every`` steps, at each phase end and when SIGTERM/SIGINT arrives (then raises
:class:`Preempted`). ``finish`` writes HF-layout weights in ``{output}/final/`` and the manifest.

Global-batch semantics: the MLM loss of a step is the sum over every masked token of the global
batch divided by their total count (all-reduced before the backward passes), whatever the number
of processes and micro-batches; so 2 processes x B/2, 1 process x B and 1 process x 2 micro-batches
of B/2 compute the same gradient up to float rounding (tested), where a mean of per-process means
would weight the tokens differently.

Exact resume: a checkpoint holds everything the next step depends on (weights, optimizer and
scheduler state, the RNG states that drive dropout, the loader's position, phase and step), so N
steps straight and N/2 + crash + resume + N/2 give bit-identical weights on CPU (tested). What a
checkpoint of a different config may do is decided in ``model/resume.py``.

Backend-neutral: the loop asks a :class:`model.backend.Backend` every question whose answer
differs between CPU, CUDA (one process, DDP, FSDP) and XLA — the micro-batches' loss weights,
gradient sync during accumulation, the global gradient norm, the whole model and optimizer state
for checkpoints, batch widths, the MLM head, the end of a step — and never branches on which
one runs. It gets its batches from a :class:`model.feed.StepFeed` (XLA SPMD: ``MpDeviceLoader``).
Metrics stay on the device between log steps. Rank 0 (on a TPU pod slice: host 0) alone logs
and writes; every process calls whatever may be collective (gathering weights and optimizer
state), in the same order. The orchestrator passes ``log_fn`` (e.g. to MLflow, rank 0 only),
``callbacks`` (``model/callbacks.py``: every process; e.g. the data trace of the tests) and
``mask_fn`` (the one masking rule); this module imports neither a tracker nor ``pipeline.examples.masking``
and reads no environment variable.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import signal
import time
from collections.abc import Callable
from typing import Any

import fsspec
import torch

from model.backend import Backend, choose, setup_backend
from model.bert import BertForPreTraining, count_parameters, mlm_correct, pretraining_class
from model.callbacks import Callbacks
from model.checkpoint import checkpoint_url, prune_checkpoints, save_checkpoint
from model.config import BertConfig, PhaseConfig, PretrainConfig
from model.contract import (
    DEFAULT_OBJECTIVE,
    Manifest,
    Objective,
    clear_stage,
    describe_file,
    example_lengths,
    fingerprint_input,
    get_objective,
    join_url,
    manifest_url,
    objective_of,
    read_manifest,
    write_manifest,
)
from model.data import MaskFn, shard_urls, stable_seed
from model.export import load_hf_state_dict, save_pretrained
from model.feed import StepFeed
from model.metrics import Window, peak_tflops, step_flops, summary
from model.optim import build_optimizer, warmup_linear_schedule
from model.resume import (
    ResumeError,
    TrainState,
    check_resume,
    exact_digest,
    remove_set_aside,
    restore,
    resume_point,
    run_record,
)
from model.signals import Preempted, StopSignals
from model.stage_configs import pretrain_manifest_config as manifest_config
from model.stream import LoaderSpec, StreamingLoader
from model.warmstart import init_weights

log = logging.getLogger("bertflow.pretrain")

LogFn = Callable[[dict[str, float], int], None]

__all__ = [
    "run_pretrain",
    "setup",
    "fit",
    "evaluate",
    "finish",
    "Session",
    "TrainState",
    "Callbacks",
    "Preempted",
    "ResumeError",
    "manifest_config",
]


@dataclasses.dataclass
class Session:
    """Everything ``fit``/``evaluate``/``finish`` share: configs, model, optimiser, state."""

    config: PretrainConfig
    model_config: BertConfig
    backend: Backend
    examples: Manifest
    examples_fp: str
    output_url: str
    model: BertForPreTraining
    train_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    state: TrainState
    data_parts: int
    pad_id: int
    mask_fn: MaskFn | None = None
    log_fn: LogFn | None = None
    callbacks: Callbacks = dataclasses.field(default_factory=Callbacks)
    peak: float = 0.0
    """The device's peak TFLOP/s for MFU (0: unknown, no MFU logged)."""
    unpad: bool = False
    """Packed batches of real tokens (``pretrain.unpad`` resolved for the backend)."""
    t_start: float = dataclasses.field(default_factory=time.time)
    fit_started: float = 0.0
    """``time.perf_counter()`` when this session's ``fit`` started."""
    seconds_before: float = 0.0
    """Training seconds of the sessions before this one (from the checkpoint)."""
    vocab_fp: str = ""
    """The fingerprint of the vocabulary the embeddings are sized by (empty: none given)."""
    objective: Objective = dataclasses.field(default_factory=lambda: get_objective(DEFAULT_OBJECTIVE))
    """The examples' pretraining objective: their columns, the heads and the losses trained."""

    @property
    def inputs(self) -> dict[str, str]:
        """The input fingerprints its manifest records."""
        return {"examples": self.examples_fp, **({"vocab": self.vocab_fp} if self.vocab_fp else {})}

    @property
    def phase_ends(self) -> set[int]:
        """The global steps that end a phase (their checkpoints are never pruned)."""
        return {sum(p.steps for p in self.config.phases[: i + 1]) for i in range(len(self.config.phases))}

    def training_seconds(self) -> float:
        """Training time over all sessions, up to now."""
        return self.seconds_before + time.perf_counter() - self.fit_started


def run_pretrain(
    config: PretrainConfig,
    model_config: BertConfig,
    examples_url: str,
    output_url: str,
    log_fn: LogFn | None = None,
    restart: bool = False,
    mask_fn: MaskFn | None = None,
    init_from: str = "",
    pad_id: int | None = None,
    callbacks: Callbacks | None = None,
    vocab_url: str = "",
) -> Manifest:
    """Pretrain BERT on the example stage at ``examples_url``; write checkpoints and final weights.

    Continues from the latest good checkpoint under ``output_url`` when its config allows
    (``model/resume.py``); ``restart=True`` clears ``output_url`` first. ``init_from``: a BERT
    folder in Hugging Face layout whose weights start the run (continued pretraining; with
    ``vocab_url``, the run's vocabulary, a folder of another vocabulary too: ``model/warmstart.py``).
    ``mask_fn`` is needed for dynamic masking. ``log_fn(metrics, step)`` runs on rank 0;
    ``callbacks`` (``model.callbacks.Callbacks``) on every process. ``vocab_url``: the
    vocabulary the model's embeddings are sized by; its fingerprint is recorded beside the
    examples' (so export can check that it ships the vocabulary the weights were trained on).
    """
    session = setup(
        config,
        model_config,
        examples_url,
        output_url,
        log_fn=log_fn,
        restart=restart,
        mask_fn=mask_fn,
        init_from=init_from,
        pad_id=pad_id,
        callbacks=callbacks,
        vocab_url=vocab_url,
    )
    fit(session)
    return finish(session)


# -- setup ----------------------------------------------------------------------------------------
def _dynamic(config: PretrainConfig, examples: Manifest) -> bool:
    return config.dynamic_masking or any(x.masking == "dynamic" for x in example_lengths(examples).values())


def _max_predictions(examples: Manifest, length: int) -> int:
    return example_lengths(examples)[length].max_predictions


def setup(
    config: PretrainConfig,
    model_config: BertConfig,
    examples_url: str,
    output_url: str,
    *,
    log_fn: LogFn | None = None,
    restart: bool = False,
    mask_fn: MaskFn | None = None,
    init_from: str = "",
    pad_id: int | None = None,
    callbacks: Callbacks | None = None,
    vocab_url: str = "",
) -> Session:
    """Check everything that can fail before training, build the model and resume or start."""
    t_start = time.time()
    backend = setup_backend(config.backend, config.precision, config.parallel, config.xla_cache)
    unpad = choose(config.unpad, backend.unpad_default)
    compiled = choose(config.compile, backend.compile_default and unpad)
    examples = read_manifest(examples_url)
    examples_fp = fingerprint_input(examples_url)
    data_world = backend.data_world  # processes (torchrun ranks, or the hosts of a TPU pod slice)
    data_parts = config.data_parts or data_world * max(1, config.loader_workers)
    if data_parts % data_world:
        raise ValueError(f"pretrain.data_parts {data_parts} is not divisible by {data_world} processes")
    for p in config.phases:  # fail before any work
        urls = shard_urls(examples, p.max_seq_length)
        if p.max_seq_length > model_config.max_position_embeddings:
            raise ValueError(
                f"pretrain.phases[{p.name}].max_seq_length {p.max_seq_length} > "
                f"model.max_position_embeddings {model_config.max_position_embeddings}"
            )
        if config.eval_every and len(urls) < 2:
            raise ValueError(
                f"pretrain.eval_every: phase {p.name} has {len(urls)} shard(s); held-out "
                "evaluation reserves the last shard and needs at least 2"
            )
        _micro_batches(p, data_world, data_parts)
    if backend.devices > 1:  # SPMD splits every host's micro-batch over the host's devices
        for p in config.phases:
            micro = p.micro_batch_size or p.batch_size // data_world
            if micro % backend.local_devices:
                raise ValueError(
                    f"pretrain.phases[{p.name}]: micro-batch {micro} per host does not split over "
                    f"the host's {backend.local_devices} XLA devices"
                )
    if _dynamic(config, examples) and mask_fn is None:
        raise ValueError("dynamic masking needs mask_fn (flows.proc.train_entry builds it from the vocabulary)")
    counts = examples.counts
    pad_id = pad_id if pad_id is not None else int(counts.get("pad_id", model_config.pad_token_id))

    if backend.is_main:
        if restart:
            clear_stage(output_url)
        fs, mpath = fsspec.core.url_to_fs(manifest_url(output_url))
        if fs.exists(mpath):  # a rerun: the folder is unfinished again until the end
            fs.rm(mpath)
    backend.barrier()

    random.seed(config.seed)
    torch.manual_seed(config.seed)
    objective = objective_of(examples)
    model = pretraining_class(bool(objective.sentence_loss))(model_config)
    if init_from:  # shared tokens' rows carried over when the vocabulary differs (model/warmstart.py)
        init_weights(model, init_from, vocab_url)
        log.info("initialised from %s", init_from)
    model.to(backend.device)
    model.tie_weights()
    model.sparse_prediction = backend.sparse_head  # XLA wants static shapes: the dense head
    if compiled:  # lazily, at the first step; the modules and their state_dict keys stay
        backend.compile(model)
    # what binds is what was asked for: init_from=previous stays "previous" as the root's export changes
    record = run_record(config, model_config, examples_fp, data_parts, config.init_from or init_from)
    state = TrainState(run_digest=exact_digest(record), record=record)
    found = resume_point(output_url, record, examples_fp, backend)  # None: start (over)
    if found is not None:  # weights before wrapping: DDP broadcasts rank 0's, FSDP shards them
        state = check_resume(found[0], found[2], state)
        load_hf_state_dict(model, found[1], source=found[0])
    train_model = backend.wrap(model)  # FSDP swaps in sharded parameters: build the optimizer after
    optimizer = build_optimizer(
        model, config.learning_rate, config.weight_decay, (config.beta1, config.beta2), config.eps, config.optimizer
    )
    scheduler = warmup_linear_schedule(optimizer, config.warmup_steps, config.total_steps)
    if backend.rank:  # distinct dropout per DDP rank (weights: rank 0's); XLA hosts share one program
        torch.manual_seed(stable_seed(config.seed, "rank", backend.rank))
    if found is not None:
        restore(found, model, optimizer, scheduler, backend, state, config)
    train_model.train()
    return Session(
        config,
        model_config,
        backend,
        examples,
        examples_fp,
        output_url,
        model,
        train_model,
        optimizer,
        scheduler,
        state,
        data_parts,
        pad_id,
        mask_fn,
        log_fn,
        callbacks or Callbacks(),
        peak_tflops(config.peak_tflops, backend.device, backend.precision),
        unpad,
        t_start,
        vocab_fp=fingerprint_input(vocab_url) if vocab_url else "",
        objective=objective,
    )


def _micro_batches(phase: PhaseConfig, world_size: int, data_parts: int) -> int:
    name = f"pretrain.phases[{phase.name}]"
    if phase.batch_size % data_parts:
        raise ValueError(f"{name}.batch_size {phase.batch_size} is not divisible by the {data_parts} data parts")
    local = phase.batch_size // world_size
    micro = phase.micro_batch_size or local
    if local % micro:
        raise ValueError(
            f"{name}.micro_batch_size {micro} does not divide the per-process batch {local} "
            f"(batch_size {phase.batch_size} / {world_size} processes)"
        )
    return local // micro


def make_loader(s: Session, phase: PhaseConfig, held_out: bool = False) -> StreamingLoader:
    """The phase's training loader (all shards but the reserved one) or its held-out loader."""
    urls = shard_urls(s.examples, phase.max_seq_length)
    if s.config.eval_every:
        urls = urls[-1:] if held_out else urls[:-1]
    spec = LoaderSpec(
        urls=tuple(urls),
        batch_size=phase.batch_size,
        max_seq_length=phase.max_seq_length,
        seed=s.config.seed,
        key=phase.name + ("/held-out" if held_out else ""),
        num_parts=s.data_parts,
        buffer_size=s.config.loader_buffer,
        vocab_size=s.model_config.vocab_size,
        pad_id=s.pad_id,
        buckets=s.backend.buckets(phase.max_seq_length),
        unpad=s.unpad,
        shuffle=not held_out,
        max_predictions=_max_predictions(s.examples, phase.max_seq_length),
        objective=s.objective.name,
    )
    mask_fn = s.mask_fn if _dynamic(s.config, s.examples) else None
    be = s.backend
    return StreamingLoader(
        spec,
        be.data_rank,
        be.data_world,
        0 if held_out else s.config.loader_workers,
        mask_fn,
        micro_batches=_micro_batches(phase, be.data_world, s.data_parts),
    )


# -- fit --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class PhaseRun:
    """One phase being trained: what ``_fit_phase`` and its steps share."""

    phase: PhaseConfig
    index: int
    feed: StepFeed
    window: Window
    stop: StopSignals


def fit(s: Session) -> None:
    """Train every remaining step of every phase; on SIGTERM/SIGINT checkpoint, then raise Preempted."""
    cfg, st, be = s.config, s.state, s.backend
    s.fit_started, s.seconds_before = time.perf_counter(), st.seconds
    s.callbacks.on_fit_start(be.data_rank)
    with StopSignals() as stop:
        for phase_index in range(st.phase_index, len(cfg.phases)):
            phase = cfg.phases[phase_index]
            if phase_index != st.phase_index:
                st.phase_index, st.phase_step, st.loader_position = phase_index, 0, 0
            if st.phase_step >= phase.steps:
                continue
            loader = make_loader(s, phase)
            loader.set_position(st.loader_position)
            log.info(
                "phase %s: %d examples of length %d in %d data parts, batch %d (%d x %d micro-batch(es) "
                "on %d process(es)), steps %d..%d",
                phase.name,
                loader.examples_per_epoch,
                phase.max_seq_length,
                s.data_parts,
                phase.batch_size,
                loader.micro_batches,
                loader.local_batch_size // loader.micro_batches,
                be.data_world,
                st.global_step + 1,
                st.global_step + phase.steps - st.phase_step,
            )
            feed = StepFeed(loader, be, ahead=be.feed_ahead)
            try:
                _fit_phase(s, PhaseRun(phase, phase_index, feed, Window(be.device, s.objective.sentence_loss), stop))
            finally:
                feed.close()
    st.seconds = s.training_seconds()
    cb = s.callbacks
    cb.on_fit_end(be.replica(s.model, s.model_config) if cb.wants_weights else None)


def _fit_phase(s: Session, run: PhaseRun) -> None:
    """The remaining steps of one phase."""
    cfg, st, be, phase = s.config, s.state, s.backend, run.phase
    while st.phase_step < phase.steps:
        lr = s.optimizer.param_groups[0]["lr"]
        _train_step(s, run)
        s.callbacks.on_step(run.feed.last_keys)
        st.global_step += 1
        st.phase_step += 1
        st.examples_seen += phase.batch_size
        st.loader_position = run.feed.position
        phase_end = st.phase_step == phase.steps
        if st.global_step % cfg.log_every == 0 or phase_end:
            metrics = summary(run.window, be, lr, run.index, s.peak)
            metrics["epoch"] = run.feed.epoch
            _report(s, metrics, phase)
            run.window.reset()
        if cfg.eval_every and (st.global_step % cfg.eval_every == 0 or phase_end):
            st.last_eval = evaluate(s, phase)
            if be.is_main and s.log_fn is not None:
                s.log_fn(st.last_eval, st.global_step)
        stopping = be.any_rank(run.stop.requested is not None)
        if st.global_step % cfg.checkpoint_every == 0 or phase_end or stopping:
            st.seconds = s.training_seconds()
            _checkpoint(s, phase.name)
        if stopping:
            raise Preempted(run.stop.requested or signal.SIGTERM, st.global_step)


def _train_step(s: Session, run: PhaseRun) -> None:
    """One optimizer step over the micro-batches of this process's share of the global batch."""
    be, cfg = s.backend, s.config
    micro = run.feed.next_step()
    weights = be.loss_weights(micro)  # global-batch MLM mean (see the module docstring)
    for i, (batch, info) in enumerate(micro):
        with be.grad_sync(s.train_model, last=i == len(micro) - 1):
            with be.autocast():
                out = s.train_model(**batch)
            loss = out.mlm_loss * weights[i]
            if out.nsp_loss is not None:  # the sentence-level loss (NSP, SOP), when the objective has one
                loss = loss + out.nsp_loss / len(micro)
            loss.backward()
        flops = step_flops(s.model_config, info.rows, info.width, info.masked, info.packed_tokens, info.pairs)
        run.window.add_micro(out, batch, flops, info.tokens, examples=info.rows)
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
    norm = be.grad_norm(torch.nn.utils.clip_grad_norm_(s.model.parameters(), max_norm))
    s.optimizer.step()
    s.scheduler.step()
    s.optimizer.zero_grad(set_to_none=True)
    be.step_done()
    run.window.add_step(norm)


def evaluate(s: Session, phase: PhaseConfig) -> dict[str, float]:
    """Held-out losses and accuracies on the phase's reserved shard (the same batches each time)."""
    be = s.backend
    loader = make_loader(s, phase, held_out=True)
    sums = torch.zeros(6, dtype=torch.float64, device=be.device)
    s.train_model.eval()
    with torch.no_grad():
        for _ in range(s.config.eval_batches):
            for batch in loader.next_step():
                batch = be.put_batch(batch)
                with be.autocast():
                    out = s.train_model(**batch)
                labels = out.mlm_labels if out.mlm_labels is not None else batch["labels"]
                correct, total = mlm_correct(out.prediction_logits, labels)
                sums[:3] += torch.stack([out.mlm_loss.double() * total, total.double(), correct.double()])
                if out.nsp_loss is not None:
                    label = batch["next_sentence_label"]
                    sums[3:] += torch.stack(
                        [
                            out.nsp_loss.double() * label.numel(),
                            (out.seq_relationship_logits.argmax(-1) == label).sum().double(),
                            torch.tensor(float(label.numel()), dtype=torch.float64, device=be.device),
                        ]
                    )
    s.train_model.train()
    mlm_sum, n_mlm, mlm_ok, sent_sum, sent_ok, n = be.all_reduce_sum(sums).tolist()
    metrics = {"eval_mlm_loss": mlm_sum / max(n_mlm, 1), "eval_mlm_accuracy": mlm_ok / max(n_mlm, 1)}
    metrics["eval_loss"] = metrics["eval_mlm_loss"]
    if name := s.objective.sentence_loss:
        metrics[f"eval_{name}_loss"] = sent_sum / max(n, 1)
        metrics[f"eval_{name}_accuracy"] = sent_ok / max(n, 1)
        metrics["eval_loss"] = metrics["eval_mlm_loss"] + metrics[f"eval_{name}_loss"]
    if be.is_main:
        log.info(
            "held-out %s step %d: loss %.4f (%s)",
            phase.name,
            s.state.global_step,
            metrics["eval_loss"],
            ", ".join(f"{k[5:]} {v:.4f}" for k, v in metrics.items() if k != "eval_loss"),
        )
    return metrics


def _report(s: Session, metrics: dict[str, float], phase: PhaseConfig) -> None:
    st = s.state
    if not math.isfinite(metrics["loss"]):
        raise FloatingPointError(f"loss is {metrics['loss']} at step {st.global_step} (phase {phase.name})")
    if st.first_window is None:
        st.first_window = metrics
    st.last_window = metrics
    if not s.backend.is_main:
        return
    losses = ", ".join(f"{name} {metrics[f'{name}_loss']:.4f}" for name in s.objective.losses)
    log.info(
        "phase %s step %d/%d loss %.4f (%s) mlm_acc %.3f |g| %.3g lr %.3g %.1f seq/s %.0f tok/s %.3g TFLOP/s%s",
        phase.name,
        st.global_step,
        s.config.total_steps,
        metrics["loss"],
        losses,
        metrics["mlm_accuracy"],
        metrics["grad_norm"],
        metrics["lr"],
        metrics["examples_per_sec"],
        metrics["tokens_per_sec"],
        metrics["model_tflops_per_sec"],
        f" MFU {metrics['mfu']:.1%}" if "mfu" in metrics else "",
    )
    if s.log_fn is not None:
        s.log_fn(metrics, st.global_step)


def _checkpoint(s: Session, phase_name: str) -> None:
    be = s.backend
    # every process: collectives under FSDP, transfers on every host of a pod slice
    model, optim_state = be.full_model(s.model, s.model_config), be.optimizer_state(s.model, s.optimizer)
    if be.is_main:
        url = checkpoint_url(s.output_url, phase_name, s.state.global_step)
        save_checkpoint(
            url,
            model,
            {
                "train": dataclasses.asdict(s.state),
                "optimizer": optim_state,
                "scheduler": s.scheduler.state_dict(),
                "rng": {"python": random.getstate(), "torch": torch.get_rng_state(), "device": be.rng_state()},
            },
        )
        prune_checkpoints(s.output_url, s.config.keep_checkpoints, keep=s.phase_ends)
    be.barrier()


# -- finish ---------------------------------------------------------------------------------------
def finish(s: Session) -> Manifest:
    """Write ``final/`` (HF layout) and the stage manifest, last."""
    be, st = s.backend, s.state
    final_url = join_url(s.output_url, "final")
    model = be.full_model(s.model, s.model_config)
    if be.is_main:
        save_pretrained(model, final_url)
    be.barrier()
    first, last = st.first_window or {}, st.last_window or {}
    counts: dict[str, float] = {
        "steps": st.global_step,
        "examples_seen": st.examples_seen,
        **{
            f"{when}_{name}_loss": window.get(f"{name}_loss", float("nan"))
            for name in s.objective.losses
            for when, window in (("first", first), ("last", last))
        },
        **{f"{name}_accuracy": last.get(f"{name}_accuracy", float("nan")) for name in s.objective.losses},
        "seconds": st.seconds,
        "parameters": count_parameters(s.model),  # DTensor numel is the global size
        **(st.last_eval or {}),
    }
    stage_config = manifest_config(s.config, s.model_config)
    if not be.is_main:
        return Manifest("pretrain", s.output_url, stage_config, s.inputs, counts, [])
    files = [describe_file(s.output_url, f"final/{name}") for name in ("config.json", "model.safetensors")]
    manifest = write_manifest(
        "pretrain",
        s.output_url,
        config=stage_config,
        inputs=s.inputs,
        counts=counts,
        files=files,
        seconds=time.time() - s.t_start,
    )
    for url in remove_set_aside(s.output_url):  # the run they were kept for has finished
        log.info("removed the set-aside earlier run %s", url)
    return manifest
