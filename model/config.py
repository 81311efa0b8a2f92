"""Typed configuration of the network and of pretraining.

``BertConfig`` uses Hugging Face's field names, so ``config.json`` of an exported model is this
dataclass as JSON (plus ``model_type`` and ``architectures``).
"""

from __future__ import annotations

from dataclasses import dataclass

from model.contract import LIMITS, check, check_at_most

SWITCH = ("auto", "on", "off")
"""The values of an option whose default depends on the backend."""


def as_switch(value):
    """A switch as written: ``true``/``false`` (a JSON boolean from ``--set``, or the word in any
    case) read as on/off; anything else left for the check to name."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return "on" if value.strip().lower() == "true" else "off"
    return value


@dataclass(frozen=True)
class BertConfig:
    """The encoder's shape (Hugging Face names). Base: 12/768/12/3072; Large: 24/1024/16/4096."""

    vocab_size: int | None = 30522
    """Rows of the word embeddings. ``null`` (every preset): the size the trained vocabulary came
    out at, filled in from the vocab stage's output before a network is built (a small corpus
    gives fewer pieces than ``vocab.vocab_size`` asks). A number is kept as set (e.g. rounded up
    to a multiple of 64) and must hold the vocabulary."""
    hidden_size: int = 768
    """Width of every layer (H), a multiple of num_attention_heads."""
    num_hidden_layers: int = 12
    """Transformer layers (L)."""
    num_attention_heads: int = 12
    """Attention heads per layer (A); each has hidden_size / A dimensions."""
    intermediate_size: int = 3072
    """Width of each layer's feed-forward block (4 H in the paper)."""
    hidden_act: str = "gelu"
    """Feed-forward activation: gelu (the exact erf form) | relu | gelu_new (the tanh form)."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings and after each attention and feed-forward block, in [0, 1)."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on the attention probabilities, in [0, 1)."""
    max_position_embeddings: int = 512
    """Longest input, in tokens (rows of the position embeddings)."""
    type_vocab_size: int = 2
    """Segment (token type) embeddings: A and B."""
    initializer_range: float = 0.02
    """Standard deviation of the truncated-normal initialisation of the weights."""
    layer_norm_eps: float = 1e-12
    """LayerNorm's epsilon (BERT's 1e-12)."""
    pad_token_id: int = 0
    """Id of [PAD] in the vocabulary (0 in Google's layout)."""

    def __post_init__(self):
        if self.vocab_size is not None:  # None: the trained vocabulary's size, known after the vocab stage
            check(self.vocab_size > 0, "model.vocab_size", "must be > 0")
            check_at_most(self.vocab_size, LIMITS.vocab_size, "model.vocab_size", "embedding rows")
        check(self.max_position_embeddings >= 1, "model.max_position_embeddings", "must be >= 1")
        check_at_most(self.max_position_embeddings, LIMITS.positions, "model.max_position_embeddings", "positions")
        check(self.hidden_size > 0, "model.hidden_size", "must be > 0")
        check(self.num_attention_heads > 0, "model.num_attention_heads", "must be > 0")
        check(
            self.hidden_size % self.num_attention_heads == 0,
            "model.hidden_size",
            f"{self.hidden_size} is not divisible by model.num_attention_heads={self.num_attention_heads}",
        )
        check(self.num_hidden_layers > 0, "model.num_hidden_layers", "must be > 0")
        check(self.intermediate_size > 0, "model.intermediate_size", "must be > 0")
        check(self.hidden_act in ("gelu", "relu", "gelu_new"), "model.hidden_act", "gelu|relu|gelu_new")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            v = getattr(self, name)
            check(0.0 <= v < 1.0, f"model.{name}", f"must lie in [0, 1), got {v}")
        check(self.type_vocab_size >= 2, "model.type_vocab_size", "must be >= 2 (segments A, B)")


@dataclass(frozen=True)
class PhaseConfig:
    """One pretraining phase: a sequence length, a number of steps and a batch size."""

    name: str = "phase1"
    """The phase's name: its checkpoints' folder (checkpoints/<name>/) and log lines."""
    max_seq_length: int = 128
    """Sequence length in tokens; the examples of that length (examples.max_seq_lengths) are read."""
    steps: int = 900_000
    """Optimizer steps in this phase."""
    batch_size: int = 256
    """Global batch: sequences per optimizer step over all devices and accumulation micro-batches."""
    micro_batch_size: int = 0
    """Sequences per forward/backward on one device; 0: the whole per-device batch (no
    accumulation). Gradients accumulate over ``batch_size / (devices * micro_batch_size)`` steps."""

    def __post_init__(self):
        check(self.steps >= 0, f"pretrain.phases[{self.name}].steps", "must be >= 0")
        check(self.batch_size >= 1, f"pretrain.phases[{self.name}].batch_size", "must be >= 1")
        check_at_most(self.batch_size, LIMITS.pretrain_batch, f"pretrain.phases[{self.name}].batch_size", "a step")
        check(self.micro_batch_size >= 0, f"pretrain.phases[{self.name}].micro_batch_size", "must be >= 0")
        check(self.max_seq_length >= 16, f"pretrain.phases[{self.name}].max_seq_length", ">= 16")
        check_at_most(
            self.max_seq_length, LIMITS.positions, f"pretrain.phases[{self.name}].max_seq_length", "positions"
        )


@dataclass(frozen=True)
class PretrainConfig:
    """MLM + NSP pretraining: phases, Adam(W) with warm-up then linear decay."""

    phases: tuple[PhaseConfig, ...] = (
        PhaseConfig("phase1", 128, 900_000, 256),
        PhaseConfig("phase2", 512, 100_000, 256),
    )
    learning_rate: float = 1e-4
    """Peak learning rate, reached at the end of warm-up."""
    beta1: float = 0.9
    """Adam's first-moment decay, in [0, 1)."""
    beta2: float = 0.999
    """Adam's second-moment decay, in [0, 1)."""
    eps: float = 1e-6
    """Adam's epsilon (the paper's 1e-6)."""
    weight_decay: float = 0.01
    """Not applied to biases and LayerNorm weights."""
    warmup_steps: int = 10_000
    """Linear warm-up over the first steps of the whole run, then linear decay to 0."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global L2 norm; 0: no clipping."""
    seed: int = 42
    """Seed of the initialisation, dropout and the loader's shuffle; a run resumes with the same."""
    backend: str = "cpu"
    """cpu | cuda | xla"""
    log_every: int = 10
    """Log losses, accuracy and throughput (and MLflow metrics) every N steps."""
    checkpoint_every: int = 1000
    """Save resumable state every N steps (and at the end of each phase)."""
    dynamic_masking: bool = False
    """Re-mask at load time instead of using the static masks in the shards (always on when the
    examples stage wrote unmasked rows, ``masking="dynamic"``)."""
    optimizer: str = "adamw"
    """adamw (the paper's) | lamb (layer-wise trust ratio, for batches of 32k-64k)."""
    precision: str = "auto"
    """auto (bf16 autocast on cuda/xla, fp32 on cpu) | fp32 | bf16. Master weights stay fp32."""
    parallel: str = "ddp"
    """How several processes share the model: ddp (replicated) | fsdp (sharded, for large)."""
    eval_every: int = 0
    """Held-out evaluation every N steps on the phase's last shard, kept out of training; 0: off."""
    eval_batches: int = 10
    """Batches (of the phase's batch size) per held-out evaluation."""
    loader_buffer: int = 10_000
    """Shuffle buffer: examples held in memory per data part (the loader's memory bound)."""
    loader_workers: int = 0
    """Loader worker processes per training process (0: build batches in the training process)."""
    data_parts: int = 0
    """Disjoint data parts the shards are dealt into; 0: processes x max(1, loader_workers).
    The batches depend on this number only, not on the number of processes or workers."""
    peak_tflops: float = 0.0
    """The device's peak TFLOP/s for model-FLOPs utilisation; 0: known GPUs, else MFU not logged."""
    keep_checkpoints: int = 2
    """Periodic checkpoints kept (phase-end ones are always kept)."""
    nproc: int = 1
    """Training processes on this host (``torchrun --nproc_per_node``: one per GPU; gloo on CPU)."""
    init_from: str = ""
    """A BERT folder in Hugging Face layout whose weights start the run (continued pretraining), or
    "previous": the root's last export, so that a refresh continues the last model on the new data
    (the first run starts from scratch). Another vocabulary is fine: the rows of the pieces both
    hold carry over by their string (model/warmstart.py)."""
    unpad: str = "auto"
    """auto | on | off (true/false read as on/off): drop [PAD] before the encoder and run it on the
    real tokens only, attention over the packed sequences (flash ``varlen_attn`` on CUDA in bf16
    without attention dropout, a reference elsewhere), the MLM head on the masked tokens whose
    count comes from the loader: no host sync in the step. auto: on for cuda, off for xla
    (static shapes: padded buckets) and cpu (where the padded step measured faster:
    docs/pretraining.md). The same maths either way."""
    compile: str = "auto"
    """auto | on | off (true/false read as on/off): ``torch.compile`` the embeddings, each encoder layer and the heads
    (fullgraph, dynamic shapes; model/compile.py). Needs the unpadded path. auto: on for cuda
    (on CPU inductor needs a C++ compiler; XLA compiles by itself: refused)."""
    xla_cache: str = "~/.cache/bertflow/xla"
    """torch-xla's persistent compilation cache (a local folder): each bucket's graph is compiled
    once and reused by later runs and resumes; empty: no cache."""

    def __post_init__(self):
        for name in ("unpad", "compile"):  # --set pretrain.unpad=true reads as on
            object.__setattr__(self, name, as_switch(getattr(self, name)))
        check(len(self.phases) >= 1, "pretrain.phases", "needs at least one phase")
        names = [p.name for p in self.phases]
        check(len(set(names)) == len(names), "pretrain.phases", f"names must be unique: {names}")
        check(self.learning_rate > 0, "pretrain.learning_rate", "must be > 0")
        check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "pretrain.beta1/beta2", "in [0, 1)")
        check(self.weight_decay >= 0, "pretrain.weight_decay", "must be >= 0")
        check(self.warmup_steps >= 0, "pretrain.warmup_steps", "must be >= 0")
        check(self.backend in ("cpu", "cuda", "xla"), "pretrain.backend", "cpu|cuda|xla")
        check(self.log_every >= 1, "pretrain.log_every", "must be >= 1")
        check(self.checkpoint_every >= 1, "pretrain.checkpoint_every", "must be >= 1")
        check(self.optimizer in ("adamw", "lamb"), "pretrain.optimizer", "adamw|lamb")
        check(self.precision in ("auto", "fp32", "bf16"), "pretrain.precision", "auto|fp32|bf16")
        check(self.parallel in ("ddp", "fsdp"), "pretrain.parallel", "ddp|fsdp")
        check(self.eval_every >= 0, "pretrain.eval_every", "must be >= 0")
        check(self.nproc >= 1, "pretrain.nproc", "must be >= 1")
        check(self.eval_batches >= 1, "pretrain.eval_batches", "must be >= 1")
        check(self.loader_buffer >= 1, "pretrain.loader_buffer", "must be >= 1")
        check_at_most(self.loader_buffer, LIMITS.loader_buffer, "pretrain.loader_buffer", "examples held in memory")
        check(self.loader_workers >= 0, "pretrain.loader_workers", "must be >= 0")
        check(self.data_parts >= 0, "pretrain.data_parts", "must be >= 0")
        check(self.peak_tflops >= 0, "pretrain.peak_tflops", "must be >= 0")
        check(self.keep_checkpoints >= 1, "pretrain.keep_checkpoints", "must be >= 1")
        check(self.max_grad_norm >= 0, "pretrain.max_grad_norm", "must be >= 0 (0: no clipping)")
        check(self.unpad in SWITCH, "pretrain.unpad", f"{'|'.join(SWITCH)} (or true|false), got {self.unpad!r}")
        check(self.compile in SWITCH, "pretrain.compile", f"{'|'.join(SWITCH)} (or true|false), got {self.compile!r}")
        check(
            not (self.compile == "on" and self.unpad == "off"),
            "pretrain.compile",
            "on needs the unpadded path (pretrain.unpad on or auto): the compiled step is the packed one, "
            "whose shapes and indices all come from the loader",
        )
        check(
            self.backend != "xla" or (self.unpad != "on" and self.compile != "on"),
            "pretrain.unpad/compile",
            "xla keeps the padded bucketed path and compiles each bucket by itself: leave them auto or off",
        )

    @property
    def total_steps(self) -> int:
        return sum(p.steps for p in self.phases)


def load_bert_config(model_url: str) -> BertConfig:
    """The BertConfig in ``{model_url}/config.json`` (HF's extra fields ignored). Here, not in
    ``model.export``, so that reading it costs no torch (the model card of a finished root's run,
    ``flows.card``); ``model.export`` uses it too."""
    import dataclasses
    import json

    import fsspec

    from model.contract import join_url

    fs, path = fsspec.core.url_to_fs(join_url(model_url, "config.json"))
    if not fs.exists(path):
        raise FileNotFoundError(f"{model_url} has no config.json")
    with fs.open(path, "r") as f:
        raw = json.load(f)
    if raw.get("model_type", "bert") != "bert":
        raise ValueError(f"{model_url}/config.json: model_type {raw['model_type']!r} is not 'bert'")
    names = {f.name for f in dataclasses.fields(BertConfig)}
    return BertConfig(**{k: v for k, v in raw.items() if k in names})
