"""Typed configuration of downstream fine-tuning and evaluation.

:class:`FinetuneConfig` is one run's hyper-parameters plus each task family's options, nested so
that a dotted override reaches them: ``finetune.squad.doc_stride=64``, ``finetune.grid.seeds=[1,2]``,
``finetune.ner.label_scheme=iob1``. The design choice: one config object travels to every task
(a task reads only its own section), so the manifest of a task records all of it and any change
reruns it; the cost is that changing, say, a SQuAD option also reruns the GLUE tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model.contract import LIMITS, check, check_at_most

FINETUNED_FOLDER = "model"
"""Where a fine-tuning run keeps its model (Hugging Face layout) under its output folder; the
gathering copies the best grid point's up to ``finetune/<task>/model/``."""


@dataclass(frozen=True)
class SquadConfig:
    """SQuAD v1.1/v2.0 windowing, decoding and files (the reference run_squad.py's flags)."""

    max_seq_length: int = 0
    """Window length in tokens ([CLS] question [SEP] context [SEP]); 0: ``finetune.max_seq_length``
    (the paper: 384)."""
    doc_stride: int = 128
    """Tokens between the starts of two context windows of one question. The window must hold
    max_query_length + 3 + doc_stride tokens (checked before any work), so every window has at
    least doc_stride tokens of context and consecutive windows overlap or touch."""
    max_query_length: int = 64
    """Question tokens kept, the rest cut (the reference's flag): whatever a question's length,
    its windows keep at least doc_stride tokens of context."""
    n_best_size: int = 20
    """Start and end candidates per window considered when decoding a span."""
    max_answer_length: int = 30
    """Longest answer, in tokens."""
    null_score_diff_threshold: float | None = None
    """v2.0: predict no answer when null score - best span score exceeds this. None: tune it on
    dev (the official script's best-F1 threshold) and report both."""
    train_file: str = ""
    """File name under the task's data URL; empty: the official name (train-v1.1.json ...)."""
    dev_file: str = ""
    """As ``train_file``, for dev (dev-v1.1.json / dev-v2.0.json)."""

    def __post_init__(self):
        check(
            self.max_seq_length == 0 or self.max_seq_length >= 8,
            "finetune.squad.max_seq_length",
            "must be 0 (the run's) or >= 8",
        )
        check(self.doc_stride >= 1, "finetune.squad.doc_stride", "must be >= 1")
        check(self.max_query_length >= 1, "finetune.squad.max_query_length", "must be >= 1")
        check(self.n_best_size >= 1, "finetune.squad.n_best_size", "must be >= 1")
        check(self.max_answer_length >= 1, "finetune.squad.max_answer_length", "must be >= 1")

    def window(self, run_max_seq_length: int) -> int:
        """The window length in tokens: ``max_seq_length``, or the run's (``finetune.max_seq_length``)."""
        return self.max_seq_length or run_max_seq_length

    def check_window(self, run_max_seq_length: int) -> None:
        """Raise a ConfigError naming the fields when the window cannot hold a full-length question,
        [CLS] and two [SEP] and ``doc_stride`` tokens of context."""
        window = self.window(run_max_seq_length)
        need = self.max_query_length + 3 + self.doc_stride
        where = "finetune.squad.max_seq_length" if self.max_seq_length else "finetune.max_seq_length"
        check(
            window >= need,
            where,
            f"a SQuAD window of {window} tokens cannot hold finetune.squad.max_query_length "
            f"{self.max_query_length} + 3 special tokens + finetune.squad.doc_stride {self.doc_stride} "
            f"tokens of context ({need}); lengthen the window or shorten max_query_length/doc_stride",
        )


@dataclass(frozen=True)
class GridConfig:
    """The hyper-parameter grid of a task: every combination, each over every seed.

    An empty tuple means "only the run's own value" (``finetune.learning_rate`` ...). The paper's
    GLUE grid is lr {5e-5, 4e-5, 3e-5, 2e-5} x batch {16, 32} x epochs {2, 3, 4}
    (:data:`PAPER_GRID`), warm-up ``finetune.warmup_proportion`` (10%) of each run's steps.
    """

    learning_rates: tuple[float, ...] = ()
    """Learning rates of the grid (JSON list or comma-separated); empty: finetune.learning_rate."""
    batch_sizes: tuple[int, ...] = ()
    """Batch sizes of the grid; empty: finetune.batch_size."""
    epochs: tuple[float, ...] = ()
    """Epoch counts of the grid; empty: finetune.epochs."""
    seeds: tuple[int, ...] = ()
    """Seeds of every grid point; empty: ``finetune.seed`` alone."""
    workers: int = 1
    """Units run at once by ``run_downstream``, each in a process of its own (torch threads split
    between them); 1: one after another in the calling process. Results do not depend on it."""
    save_models: bool = False
    """Keep every unit's fine-tuned weights after the gathering (one model per unit: large at
    scale). Off: only the best grid point's (its best seed), in ``finetune/<task>/model/`` and
    its unit's folder; the others' are removed when the task is gathered."""
    dispatch: str = "process"
    """Where the flows run each unit: ``process`` (a child process of the flow's process,
    ``workers`` per task at once) or ``deployment`` (a run of the ``deployment`` below, on its
    work pool's infrastructure: a GPU node per unit at scale)."""
    deployment: str = "finetune-unit/default"
    """The deployment (``flow-name/deployment-name``) that runs one unit when ``dispatch`` is
    ``deployment``."""

    def __post_init__(self):
        check(all(lr > 0 for lr in self.learning_rates), "finetune.grid.learning_rates", "must be > 0")
        check(all(b >= 1 for b in self.batch_sizes), "finetune.grid.batch_sizes", "must be >= 1")
        for b in self.batch_sizes:
            check_at_most(b, LIMITS.finetune_batch, "finetune.grid.batch_sizes", "sequences per step")
        check(all(e > 0 for e in self.epochs), "finetune.grid.epochs", "must be > 0")
        check(self.workers >= 1, "finetune.grid.workers", "must be >= 1")
        check(
            self.dispatch in ("process", "deployment"),
            "finetune.grid.dispatch",
            f"must be 'process' or 'deployment', got {self.dispatch!r}",
        )
        check(
            self.deployment.count("/") == 1,
            "finetune.grid.deployment",
            f"must be 'flow-name/deployment-name', got {self.deployment!r}",
        )
        for name in ("learning_rates", "batch_sizes", "epochs", "seeds"):
            values = getattr(self, name)
            check(len(set(values)) == len(values), f"finetune.grid.{name}", f"repeats a value: {values}")


PAPER_GRID = GridConfig(
    learning_rates=(5e-5, 4e-5, 3e-5, 2e-5), batch_sizes=(16, 32), epochs=(2, 3, 4), seeds=(1, 2, 3, 4, 5)
)

LAYER_MIXES = ("embeddings", "last", "second_to_last", "sum_last4", "concat_last4", "sum_all")


@dataclass(frozen=True)
class NerConfig:
    """CoNLL-2003 NER, fine-tuned or feature-based."""

    label_scheme: str = "iob2"
    """Tags the model learns: "iob2" (files in IOB1 are converted; conlleval's chunks are the
    same) or "asis" (the file's own tags)."""
    train_file: str = "eng.train"
    """File name of the training set under the task's data URL (CoNLL-2003's own name)."""
    dev_file: str = "eng.testa"
    """File name of the dev set, scored to pick the best epoch and unit."""
    test_file: str = "eng.testb"
    """Optional: scored and written when present."""

    def __post_init__(self):
        check(self.label_scheme in ("iob2", "asis"), "finetune.ner.label_scheme", "must be iob2 or asis")


@dataclass(frozen=True)
class FeatureConfig:
    """The feature-based NER ablation: frozen encoder, a layer mix, a two-layer BiLSTM."""

    layer_mixes: tuple[str, ...] = ("last", "sum_last4", "concat_last4")
    """Each mix is its own set of units; one of :data:`LAYER_MIXES`."""
    lstm_hidden: int = 768
    """Hidden size of each direction of the BiLSTM (the paper: 768)."""
    lstm_layers: int = 2
    """Layers of the BiLSTM over the frozen features (the paper: 2)."""

    def __post_init__(self):
        check(len(self.layer_mixes) >= 1, "finetune.features.layer_mixes", "name at least one mix")
        for m in self.layer_mixes:
            check(m in LAYER_MIXES, "finetune.features.layer_mixes", f"{m!r} is not one of {LAYER_MIXES}")
        check(self.lstm_hidden >= 1, "finetune.features.lstm_hidden", "must be >= 1")
        check(self.lstm_layers >= 1, "finetune.features.lstm_layers", "must be >= 1")


@dataclass(frozen=True)
class SwagConfig:
    """SWAG multiple choice."""

    train_file: str = "train.csv"
    """File name of the training set under the task's data URL (SWAG's own name)."""
    dev_file: str = "val.csv"
    """File name of the dev set, scored to pick the best epoch and unit."""
    test_file: str = "test.csv"
    """Optional: predictions written when present."""


@dataclass(frozen=True)
class FinetuneConfig:
    """One fine-tune/eval run of a pretrained model on a downstream task, and each task's options."""

    learning_rate: float = 2e-5
    """Peak learning rate of a unit (AdamW, linear warm-up then decay), unless the grid sets it."""
    batch_size: int = 32
    """Training examples per step, unless the grid sets it."""
    epochs: float = 3.0
    """Passes over the training set (a fraction allowed), unless the grid sets it; dev is scored
    after each and the best epoch kept."""
    max_seq_length: int = 128
    """Longest input in tokens of the GLUE, NER and SWAG tasks (longer inputs are cut);
    SQuAD's window too unless finetune.squad.max_seq_length is set."""
    warmup_proportion: float = 0.1
    """Share of a unit's steps spent warming the learning rate up linearly from 0, in [0, 1]."""
    weight_decay: float = 0.01
    """AdamW weight decay (not applied to biases and LayerNorm weights)."""
    seed: int = 42
    """Seed of the head's initialisation, dropout and shuffling when the grid gives no seeds."""
    classifier_dropout: float = 0.1
    """Dropout before the task head, in [0, 1)."""
    squad: SquadConfig = field(default_factory=SquadConfig)
    grid: GridConfig = field(default_factory=GridConfig)
    ner: NerConfig = field(default_factory=NerConfig)
    features: FeatureConfig = field(default_factory=FeatureConfig)
    swag: SwagConfig = field(default_factory=SwagConfig)
    min_eval_examples: int = 1
    """Fewest usable rows a dev or test split may have (default 1): a split with fewer fails the
    task, naming the file and the reader's reject counts, instead of a score of nothing entering
    the averages and the champion decision."""

    def __post_init__(self):
        check(self.learning_rate > 0, "finetune.learning_rate", "must be > 0")
        check(self.min_eval_examples >= 1, "finetune.min_eval_examples", "must be >= 1")
        check(self.batch_size >= 1, "finetune.batch_size", "must be >= 1")
        check_at_most(self.batch_size, LIMITS.finetune_batch, "finetune.batch_size", "sequences per step")
        check(self.epochs > 0, "finetune.epochs", "must be > 0")
        check(self.max_seq_length >= 8, "finetune.max_seq_length", "must be >= 8")
        check(0 <= self.warmup_proportion <= 1, "finetune.warmup_proportion", "must lie in [0, 1]")
        check(0 <= self.classifier_dropout < 1, "finetune.classifier_dropout", "in [0, 1)")
