"""The run configuration: each layer's typed config composed in one place, and the presets.

``tiny`` runs the whole chain on a laptop CPU in minutes on the bundled sample; ``small`` sits
between it and ``base`` (benchmarks/bench_transfer.py); ``base`` and ``large`` are the paper's
shapes and schedule (not run here). Overrides are dotted paths (``pretrain.phases.0.steps=50``)
applied to a preset (``flows.overrides``); every value goes back through the dataclasses' own
validation, so a bad override fails before any work starts and names the field.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.overrides import apply_overrides, build, suggest
from model.card import CardConfig
from model.config import BertConfig, PhaseConfig, PretrainConfig
from pipeline.beam.config import BeamConfig
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.sources import SOURCES
from pipeline.examples.config import ExamplesConfig
from pipeline.schema.config import ConfigError
from pipeline.vocab.config import VocabConfig
from tasks.config import PAPER_GRID, FinetuneConfig, GridConfig, SquadConfig
from tasks.registry import TASKS

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DATA = REPO_ROOT / "data" / "sample"


@dataclass(frozen=True)
class DataConfig:
    """Where the raw inputs are: URLs (local paths or gs://) of the corpora and downstream sets."""

    wiki: str = ""
    """A MediaWiki export (.xml/.xml.bz2), a folder of dump parts, or a glob. Empty: bundled sample."""
    books: str = ""
    """A folder with one UTF-8 .txt file per book. Empty: bundled sample."""
    text: str = ""
    """Documents as records: JSON Lines (.jsonl, .jsonl.gz, .jsonl.zst), Parquet, or a Hugging Face
    datasets folder (save_to_disk's Arrow files, or its Parquet export); a file, folder or glob,
    local or gs://. Read when corpus.sources includes "text" (fields: corpus.text_field,
    text_id_field, text_title_field). Empty: none."""
    sources: dict[str, str] = field(default_factory=dict)
    """URLs of the corpus sources (``pipeline.corpus.sources.SOURCES``) that have no field of their
    own here, by source name: ``--set data.sources.<name>=URL``. Empty: none."""
    downstream: str = ""
    """A folder with the official layouts: glue/<Task>/*.tsv, squad/*.json, conll2003/eng.*, swag/*.csv
    (see docs/downstream.md). Empty: bundled sample."""
    finetune_model: str = ""
    """A BERT folder in Hugging Face layout to fine-tune instead of the export stage's model
    (ours or a released one, e.g. /models/bert-base-uncased). Empty: the export stage."""
    downstream_urls: dict[str, str] = field(default_factory=dict)
    """Per-task data URLs that replace ``downstream``/<task folder>, e.g.
    ``--set data.downstream_urls.mrpc=gs://bucket/glue/MRPC`` (see tasks.registry.TASKS)."""
    required: bool = False
    """The run needs the user's corpora: an empty ``wiki`` or ``books`` is an error before any
    work (flows.checks.preflight), never the bundled sample (the base and large presets)."""
    sample: str = ""
    """Which bundled sample fills the empty URLs: "" (English, data/sample/), "ja" or "zh"
    (data/sample-ja/, data/sample-zh/: a jawiki/zhwiki-style export, books, JGLUE or CLUE sets).
    Default "" (tiny-ja and tiny-zh set it)."""

    def __post_init__(self):
        for name in SOURCES:
            if hasattr(self, name) and not isinstance(getattr(self, name), str):
                raise ConfigError(f"data.{name}: expected a URL string, got {getattr(self, name)!r}")
        for name, url in self.sources.items():
            if name not in SOURCES:
                raise ConfigError(
                    f"data.sources.{name}: unknown corpus source{suggest(name, SOURCES)}; known: {sorted(SOURCES)}"
                )
            if hasattr(self, name):
                raise ConfigError(f"data.sources.{name}: the {name} source's URL is data.{name}; set that instead")
            if not isinstance(url, str):
                raise ConfigError(f"data.sources.{name}: expected a URL string, got {url!r}")
        for name, url in self.downstream_urls.items():
            if name not in TASKS:
                raise ConfigError(
                    f"data.downstream_urls.{name}: unknown task{suggest(name, TASKS)}; known: {sorted(TASKS)}"
                )
            if not isinstance(url, str) or not url:
                raise ConfigError(f"data.downstream_urls.{name}: expected a URL string, got {url!r}")

    def source_field(self, name: str) -> str:
        """Where a corpus source's URL is set: ``data.<name>`` or ``data.sources.<name>``."""
        return f"data.{name}" if hasattr(self, name) else f"data.sources.{name}"

    def source_urls(self) -> dict[str, str]:
        """The URL of every corpus source, by name (empty: not given): the one mapping the corpus
        stage, the preflight checks and the model card read."""
        return {name: getattr(self, name) if hasattr(self, name) else self.sources.get(name, "") for name in SOURCES}


@dataclass(frozen=True)
class RunConfig:
    """One run: the preset it started from and every layer's config."""

    preset: str = "tiny"
    """The preset these values came from (--preset; one of flows.presets.PRESETS); names the
    default root ./runs/<preset>."""
    data: DataConfig = field(default_factory=DataConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    examples: ExamplesConfig = field(default_factory=ExamplesConfig)
    model: BertConfig = field(default_factory=BertConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    finetune_tasks: tuple[str, ...] = ("sst2",)
    """Downstream tasks run after export, in parallel (see tasks.registry.TASKS)."""
    model_name: str = "bert-tiny"
    """Registered model name in MLflow."""
    keep_outputs: int = 1
    """How many replaced outputs of each stage a root keeps under ``history/<folder>/<fingerprint>/``
    (a refresh moves the previous corpus, vocab, shards, checkpoints and export there, so that the
    versions registered from them still lead to their data; ``flows/lineage.py``). 0: replaced
    outputs are deleted."""
    card: CardConfig = field(default_factory=CardConfig)
    """What the exported model's card (README.md) says that the run cannot know: language, licence."""

    def __post_init__(self):
        lengths = set(self.examples.max_seq_lengths)
        for p in self.pretrain.phases:
            if p.max_seq_length not in lengths:
                raise ConfigError(
                    f"pretrain.phases[{p.name}].max_seq_length: {p.max_seq_length} has no example "
                    f"shards; examples.max_seq_lengths is {sorted(lengths)}"
                )
            if p.max_seq_length > self.model.max_position_embeddings:
                raise ConfigError(
                    f"pretrain.phases[{p.name}].max_seq_length: {p.max_seq_length} exceeds "
                    f"model.max_position_embeddings={self.model.max_position_embeddings}"
                )
        if self.finetune.max_seq_length > self.model.max_position_embeddings:
            raise ConfigError(
                f"finetune.max_seq_length: {self.finetune.max_seq_length} exceeds "
                f"model.max_position_embeddings={self.model.max_position_embeddings}"
            )
        if self.finetune.squad.max_seq_length > self.model.max_position_embeddings:
            raise ConfigError(
                f"finetune.squad.max_seq_length: {self.finetune.squad.max_seq_length} exceeds "
                f"model.max_position_embeddings={self.model.max_position_embeddings}"
            )
        for t in self.finetune_tasks:
            if t not in TASKS:
                raise ConfigError(f"finetune_tasks: unknown task {t!r}{suggest(t, TASKS)}; known: {sorted(TASKS)}")
        if self.vocab.word_tokenizer != "none" and self.examples.segmenter != "none":
            raise ConfigError(
                f"examples.segmenter: {self.examples.segmenter!r} with vocab.word_tokenizer="
                f"{self.vocab.word_tokenizer!r}: the vocabulary's words already are the whole words; set it to none"
            )
        for name, url in self.data.source_urls().items():  # a bundled source is always passed
            if url and not SOURCES[name].bundled and name not in self.corpus.sources:
                raise ConfigError(
                    f"{self.data.source_field(name)}: set to {url}, but corpus.sources {list(self.corpus.sources)} "
                    f"leaves the {name} source out: add it "
                    f"(--set corpus.sources={','.join([*self.corpus.sources, name])})"
                )
        if any(TASKS[t].family == "squad" or TASKS[t].options.get("kind") == "qa" for t in self.finetune_tasks):
            self.finetune.squad.check_window(self.finetune.max_seq_length)


def _tiny() -> RunConfig:
    return RunConfig(
        preset="tiny",
        corpus=CorpusConfig(num_shards=2, beam=BeamConfig(num_workers=1)),
        vocab=VocabConfig(vocab_size=4096, min_frequency=2),
        examples=ExamplesConfig(
            max_seq_lengths=(64, 128),  # masked positions at most 10 and 20: derived from the 15% rate
            dupe_factor=5,
            num_shards=2,
        ),
        model=BertConfig(
            vocab_size=None,  # the trained vocabulary's size
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=512,
            max_position_embeddings=128,
        ),
        pretrain=PretrainConfig(
            phases=(PhaseConfig("phase1", 64, 800, 32), PhaseConfig("phase2", 128, 100, 32)),
            learning_rate=1e-3,
            warmup_steps=80,
            log_every=20,
            checkpoint_every=200,
        ),
        finetune=FinetuneConfig(
            learning_rate=5e-4,
            batch_size=32,
            epochs=3,
            max_seq_length=64,
            grid=GridConfig(learning_rates=(5e-4, 1e-3), seeds=(1,)),
            # a 64-token window holds a question of up to 16 pieces (the sample's are at most 13)
            # + 3 + 32-token strides of context (the reference's 64/128 in a 384 window, scaled)
            squad=SquadConfig(max_query_length=16, doc_stride=32),
        ),
        finetune_tasks=("sst2", "squad1", "conll2003"),
        model_name="bert-tiny",
    )


def _small() -> RunConfig:
    """Between tiny and base: L=4, H=256, A=4 on a generated corpus of tens of MB (point
    ``data.wiki``/``data.books`` at ``bertflow synth-corpus --size 30MB`` output, seed 0, whose
    world the bundled downstream sets speak of). ~2,000 steps of 64 sequences: under an hour of
    CPU here; ``benchmarks/bench_transfer.py`` runs it and compares with a random init. What it
    does not set is tiny's (lengths, masking, the tasks)."""
    tiny = _tiny()
    beam = dataclasses.replace(tiny.corpus.beam, num_workers=2)
    return dataclasses.replace(
        tiny,
        preset="small",
        corpus=dataclasses.replace(tiny.corpus, num_shards=4, beam=beam),
        vocab=dataclasses.replace(tiny.vocab, vocab_size=8192),
        examples=dataclasses.replace(tiny.examples, num_shards=8),
        model=dataclasses.replace(
            tiny.model, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024
        ),  # fmt: skip
        pretrain=PretrainConfig(
            phases=(PhaseConfig("phase1", 64, 1800, 64), PhaseConfig("phase2", 128, 200, 64)),
            learning_rate=1e-3,
            warmup_steps=200,
            log_every=50,
            checkpoint_every=500,
            eval_every=500,
            eval_batches=5,
        ),
        # the bundled sets are small (1,000-2,000 training rows): more epochs than the paper's 2-4,
        # the best epoch on dev kept (measured: SQuAD F1 31.6 at 10 epochs vs 25.7 at 3, 800 steps)
        finetune=FinetuneConfig(
            learning_rate=2e-4,
            batch_size=32,
            epochs=10,
            max_seq_length=128,
            squad=SquadConfig(max_query_length=32, doc_stride=64),  # 32 + 3 + 64 fits the 128 window
        ),
        model_name="bert-small",
    )


ENV_BACKEND = "BERTFLOW_BACKEND"
"""The paper-scale presets' backend where the host says so (the TPU/GPU work pools set it)."""


def accelerator_backend(env: dict[str, str] | None = None) -> str:
    """The backend of ``base``/``large`` by where they run: ``$BERTFLOW_BACKEND`` when set, else
    ``xla`` on a TPU host (``PJRT_DEVICE=TPU``, or a TPU VM's ``TPU_ACCELERATOR_TYPE``/``TPU_NAME``),
    else ``cuda``. Never ``cpu``: that they can run here is checked by flows.checks.preflight, in
    seconds, naming what is missing (no GPU, no torch_xla)."""
    env = os.environ if env is None else env
    if env.get(ENV_BACKEND):
        if env[ENV_BACKEND] not in ("cpu", "cuda", "xla"):
            raise ConfigError(f"pretrain.backend: ${ENV_BACKEND}={env[ENV_BACKEND]!r}, expected cpu|cuda|xla")
        return env[ENV_BACKEND]
    if env.get("PJRT_DEVICE", "").upper() == "TPU" or env.get("TPU_ACCELERATOR_TYPE") or env.get("TPU_NAME"):
        return "xla"
    return "cuda"


def _paper(name: str, layers: int, hidden: int, heads: int, parallel: str = "ddp") -> RunConfig:
    """The paper's shapes, data (URLs the user sets: ``data.wiki``, ``data.books``), schedule,
    bf16 on the accelerator of the host (:func:`accelerator_backend`)."""
    return RunConfig(
        preset=name,
        data=DataConfig(required=True),
        corpus=CorpusConfig(num_shards=256),
        # the trainer's memory bounded whatever the corpus: a stable sample of about Wikitext-103's
        # size, and at most 200,000 distinct words held (the rarest dropped past it)
        vocab=VocabConfig(vocab_size=30522, sample_sentences=4_000_000, max_words=200_000),
        examples=ExamplesConfig(max_seq_lengths=(128, 512), dupe_factor=10, num_shards=1024),
        model=BertConfig(
            vocab_size=None,  # the trained vocabulary's size
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
        ),
        pretrain=PretrainConfig(
            phases=(PhaseConfig("phase1", 128, 900_000, 256), PhaseConfig("phase2", 512, 100_000, 256)),
            learning_rate=1e-4,
            warmup_steps=10_000,
            log_every=100,
            checkpoint_every=10_000,
            backend=accelerator_backend(),
            precision="bf16",
            parallel=parallel,
        ),
        finetune=FinetuneConfig(
            learning_rate=2e-5,
            batch_size=32,
            epochs=3,
            max_seq_length=128,
            grid=PAPER_GRID,
            squad=SquadConfig(max_seq_length=384),
        ),
        finetune_tasks=("sst2",),
        model_name=f"bert-{name}",
    )


def _language(base: RunConfig, lang: str, name: str, vocab_size: int, tasks: tuple[str, ...]) -> RunConfig:
    """A Japanese or Chinese preset on the shape and schedule of ``base``: whole-word masking,
    and the reference models' tokenisation (docs/languages.md). Japanese: MeCab with unidic-lite
    before WordPiece, cased, as cl-tohoku's bert-base-japanese-v3 (32,768 pieces); Chinese:
    BERT's one token per ideograph, lower-cased, as bert-base-chinese (21,128 pieces), with
    jieba's words used only to mask whole words (HFL's Chinese BERT-wwm)."""
    cjk_alphabet = 1000 if vocab_size < 10_000 else 8000  # kanji and hanzi: thousands of characters
    if lang == "ja":
        vocab = dataclasses.replace(
            base.vocab,
            vocab_size=vocab_size,
            lowercase=False,
            word_tokenizer="mecab",
            max_alphabet=cjk_alphabet,
            max_words=0,  # MeCab's words are counted by the trainer (vocab.max_words: BERT's words only)
        )
        segmenter = "none"
    else:
        vocab = dataclasses.replace(base.vocab, vocab_size=vocab_size, max_alphabet=cjk_alphabet)
        segmenter = "jieba"
    return dataclasses.replace(
        base,
        preset=name,
        data=dataclasses.replace(base.data, sample="" if base.data.required else lang),
        card=dataclasses.replace(base.card, language=(lang,)),
        # a Japanese or Chinese character carries about what three English ones do: "南野村出身。"
        corpus=dataclasses.replace(base.corpus, min_sentence_chars=6),
        vocab=vocab,
        examples=dataclasses.replace(base.examples, whole_word_mask=True, segmenter=segmenter),
        finetune_tasks=tasks,
        model_name=f"bert-{name}",
    )


PRESETS = {
    "tiny": _tiny,
    "small": _small,
    "base": lambda: _paper("base", 12, 768, 12),
    "large": lambda: _paper("large", 24, 1024, 16, parallel="fsdp"),
    "tiny-ja": lambda: _language(_tiny(), "ja", "tiny-ja", 4096, ("jnli", "jsquad", "marc_ja")),
    "tiny-zh": lambda: _language(_tiny(), "zh", "tiny-zh", 4096, ("tnews", "afqmc", "cmrc2018")),
    "base-ja": lambda: _language(_paper("base", 12, 768, 12), "ja", "base-ja", 32768, ("jnli", "jsquad", "jsts")),
    "base-zh": lambda: _language(_paper("base", 12, 768, 12), "zh", "base-zh", 21128, ("tnews", "afqmc", "cmrc2018")),
}


def load_config(preset: str, overrides: dict[str, Any] | None = None) -> RunConfig:
    """A preset with dotted-path overrides applied and validated (``flows.overrides``): all the
    overrides are set before anything is built, so coupled fields such as
    ``examples.max_seq_lengths`` and ``examples.max_predictions_per_seq`` can change at once."""
    if preset not in PRESETS:
        raise ConfigError(
            f"preset: unknown preset {preset!r}{suggest(preset, PRESETS)}; choose one of {sorted(PRESETS)}"
        )
    data = apply_overrides(RunConfig, dataclasses.asdict(PRESETS[preset]()), share_beam(overrides or {}))
    return build(RunConfig, data)


SHARED_BEAM = "beam"
"""The one place for the Beam stages' options: ``beam.<field>`` sets ``<field>`` of every Beam
stage's ``beam`` (``corpus.beam``, ``examples.beam``); a stage's own path wins over it."""


def beam_sections() -> tuple[str, ...]:
    """The sections of the run config that run a Beam job: those with a ``beam`` field."""
    hints = typing.get_type_hints(RunConfig)
    return tuple(
        name
        for name, hint in hints.items()
        if dataclasses.is_dataclass(hint) and "beam" in {f.name for f in dataclasses.fields(hint)}
    )


def share_beam(overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` with each ``beam.*`` one set on every Beam stage (``corpus.beam.*``,
    ``examples.beam.*``); a stage's own override of the same path wins whatever the order."""
    shared = {k: v for k, v in overrides.items() if k == SHARED_BEAM or k.startswith(SHARED_BEAM + ".")}
    if not shared:
        return overrides
    out: dict[str, Any] = {}
    for key, value in shared.items():
        for section in beam_sections():
            out[f"{section}.{key}"] = value
    out.update({k: v for k, v in overrides.items() if k not in shared})
    return out


def as_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def resolve_data(cfg: DataConfig) -> DataConfig:
    """Fill empty data URLs with the bundled sample (or $BERTFLOW_SAMPLE_DATA): each source whose
    row is ``bundled`` (a text corpus is the user's) and the downstream sets. Every other field is
    kept as it is (a copy with the filled ones replaced, never a field list written out here)."""
    sample = Path(os.environ.get("BERTFLOW_SAMPLE_DATA", SAMPLE_DATA))
    if cfg.sample:
        sample = sample.parent / f"{sample.name}-{cfg.sample}"
    filled = {name: str(sample / name) for name, url in cfg.source_urls().items() if SOURCES[name].bundled and not url}
    own = {name: url for name, url in filled.items() if hasattr(cfg, name)}
    others = {name: url for name, url in filled.items() if name not in own}
    return dataclasses.replace(cfg, **own, sources={**cfg.sources, **others}, downstream=cfg.downstream or str(sample))


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """A :class:`RunConfig` rebuilt from ``dataclasses.asdict`` output (a JSON spec): every value
    goes back through the dataclasses' own validation."""
    return build(RunConfig, data)
