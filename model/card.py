"""The model card: ``README.md`` of an exported folder, in the Hugging Face Hub's conventions.

A YAML metadata block (``language``, ``license``, ``library_name: transformers``, ``tags``,
``datasets``, ``model-index`` with the downstream scores and their metrics) and a body: the data,
the network and its pretraining, the downstream scores, how to load it, its limits. It reads with
``huggingface_hub.ModelCard.load`` and shows as the model's page when the folder is uploaded.

Choices, and what they cost:

1. The card is rendered from plain values (:class:`CardFacts`), gathered by the orchestrator
   from the stages' manifests and the run's config: this module reads no manifest and imports
   neither ``huggingface_hub`` nor a YAML library (YAML is written by hand, every scalar as a JSON
   string or number, which YAML reads as the same value).
2. The card is not part of the export's manifest (it is written after it): the scores are known
   only after fine-tuning, so the card is written at export with the data and config and written
   again, with the scores, when the model is registered. The export's fingerprint (what the
   registry keys a version on) does not move when the card does.
3. No local path enters the card: data sources are named by their file names and fingerprints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

CARD_NAME = "README.md"


@dataclass(frozen=True)
class CardConfig:
    """What the model card says that the run cannot know by itself."""

    language: tuple[str, ...] = ("en",)
    """The languages of the pretraining text (ISO 639-1 codes), the card's ``language``."""
    license: str = "apache-2.0"
    """The model's licence on the Hub (an id of its licence list, e.g. apache-2.0, cc-by-sa-4.0)."""
    datasets: tuple[str, ...] = ()
    """Hub ids of the pretraining corpora (e.g. wikimedia/wikipedia); empty: none named (the
    bundled synthetic sample has none)."""
    limits: str = ""
    """A paragraph added to the card's limits (what the model must not be used for)."""


@dataclass(frozen=True)
class CardScore:
    """One downstream result, as the card and the Hub's ``model-index`` show it."""

    task: str
    """The task's name in bertflow (sst2, squad1, ...)."""
    task_type: str
    """The Hub's task id: text-classification, question-answering, token-classification, multiple-choice."""
    dataset: str
    """The dataset's name as shown (``GLUE SST-2``)."""
    dataset_type: str
    """The dataset's id (``glue``, ``squad``, ``conll2003``)."""
    dataset_config: str
    metric: str
    """The metric's id (accuracy, f1, matthews_correlation, ...)."""
    value: float
    """In percent: the median over seeds of the best grid point on the dev split."""
    low: float
    high: float
    seeds: int
    model_path: str = ""
    """Where the fine-tuned weights of the best grid point are, relative to the run's root."""


@dataclass(frozen=True)
class CardVocabulary:
    """The vocabulary as the card names it (from the vocab stage's typed output)."""

    size: int
    lowercase: bool
    word_tokenizer: str
    """How words are split before their pieces: "none" (whitespace and punctuation), "mecab", "jieba"."""


@dataclass(frozen=True)
class CardPretraining:
    """The pretraining as the card names it: the run's config and the pretrain stage's counts."""

    phases: tuple[dict[str, Any], ...]
    """(name, steps, max_seq_length, batch_size) per phase."""
    learning_rate: float | None
    objective: str
    """The objective's words (``pipeline.schema.objectives.Objective.card``)."""
    losses: str
    """Its losses as written short: ``MLM + NSP``, ``MLM``."""
    masked_lm_prob: float
    steps: int | None = None
    """Steps done, when pretraining finished."""
    last_losses: dict[str, float] = field(default_factory=dict)
    """The last value of each loss trained (``mlm``, ``nsp``/``sop``)."""
    heads: bool = True
    """Whether the export has the sentence-level head (``BertForPreTraining`` loads it whole)."""


@dataclass(frozen=True)
class CardFacts:
    """Everything a card says, as plain values."""

    name: str
    preset: str
    card: CardConfig
    network: dict[str, Any]
    """The network's config (config.json's BERT fields) and ``parameters``."""
    data: list[tuple[str, str]]
    """(source, what it is: file names, documents, sentences) per pretraining source."""
    vocabulary: CardVocabulary
    pretraining: CardPretraining
    scores: list[CardScore] = field(default_factory=list)
    sample_data: bool = False
    """The bundled synthetic sample was the pretraining corpus."""
    sample_downstream: bool = False
    """The bundled synthetic samples were the downstream sets."""
    fingerprint: str = ""
    """The export's manifest fingerprint (the registry's key)."""


# -- YAML, by hand -----------------------------------------------------------------------------------
def _yaml(value: Any, indent: int = 0) -> list[str]:
    """Block-style YAML lines of dicts and lists of JSON scalars (strings quoted, as JSON writes them)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:")
                lines += _yaml(v, indent + 2)
            else:
                lines.append(f"{pad}{k}: {json.dumps(v, ensure_ascii=False)}")
    else:
        for item in value:
            if isinstance(item, (dict, list)) and item:
                sub = _yaml(item, indent + 2)
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines += sub[1:]
            else:
                lines.append(f"{pad}- {json.dumps(item, ensure_ascii=False)}")
    return lines


def metadata(facts: CardFacts) -> dict[str, Any]:
    """The card's metadata block, as the Hub reads it."""
    tags = ["bert", "fill-mask", "pretraining", "bertflow", f"bertflow-{facts.preset}"]
    if facts.sample_data:
        tags.append("synthetic-data")
    meta: dict[str, Any] = {
        "language": list(facts.card.language),
        "license": facts.card.license,
        "library_name": "transformers",
        "pipeline_tag": "fill-mask",
        "tags": tags,
    }
    datasets = list(facts.card.datasets) + sorted({s.dataset_type for s in facts.scores} - set(facts.card.datasets))
    if datasets and not facts.sample_downstream:
        meta["datasets"] = datasets
    elif facts.card.datasets:
        meta["datasets"] = list(facts.card.datasets)
    if facts.scores:
        meta["model-index"] = [
            {
                "name": facts.name,
                "results": [
                    {
                        "task": {"type": s.task_type},
                        "dataset": {
                            "name": s.dataset,
                            "type": s.dataset_type,
                            "config": s.dataset_config,
                            "split": "validation",
                        },  # fmt: skip
                        "metrics": [
                            {
                                "type": s.metric,
                                "value": round(s.value, 2),
                                "name": f"dev {s.metric} (percent, median of {s.seeds} seed(s))",
                            }
                        ],
                    }
                    for s in facts.scores
                ],
            }
        ]
    return meta


# -- the body -------------------------------------------------------------------------------------
def _network_table(n: dict[str, Any]) -> list[str]:
    rows = [
        ("layers", n.get("num_hidden_layers")),
        ("hidden size", n.get("hidden_size")),
        ("attention heads", n.get("num_attention_heads")),
        ("feed-forward size", n.get("intermediate_size")),
        ("max positions", n.get("max_position_embeddings")),
        ("vocabulary", n.get("vocab_size")),
        ("parameters", f"{int(n['parameters']):,}" if n.get("parameters") else None),
    ]
    return ["| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows if v is not None]]


def _scores(facts: CardFacts) -> list[str]:
    if not facts.scores:
        return [
            "Not evaluated yet: the card is written again with the scores when the downstream tasks have run "
            "and the model is registered (`bertflow run`)."
        ]
    lines = [
        "Dev split, in percent: the median (min-max) over seeds of the best point of the fine-tuning grid.",
        "",
        "| task | dataset | metric | median | min | max | seeds | fine-tuned weights |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in facts.scores:
        lines.append(
            f"| {s.task} | {s.dataset} | {s.metric} | {s.value:.2f} | {s.low:.2f} | {s.high:.2f} | {s.seeds} "
            f"| {f'`{s.model_path}`' if s.model_path else '-'} |"
        )
    if facts.sample_downstream:
        lines += ["", "These sets are bertflow's bundled synthetic samples, not the official ones: the figures "
                      "test the pipeline and say nothing of the model's quality."]  # fmt: skip
    return lines


def _how_to_load(facts: CardFacts) -> list[str]:
    lines = [
        "```python",
        "from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline",
        "",
        'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        'model = AutoModelForMaskedLM.from_pretrained("path/to/this/folder")  # or '
        + ("BertForPreTraining, AutoModel" if facts.pretraining.heads else "AutoModel (no pooler was trained)"),
        'print(pipeline("fill-mask", model=model, tokenizer=tokenizer)("the capital of france is [MASK]."))',
        "```",
    ]
    if any(s.model_path for s in facts.scores):
        lines += [
            "",
            "A task's fine-tuned model (the best grid point) is a folder of the same layout under the run's root:",
            "",
            "```python",
            "from transformers import AutoModelForSequenceClassification",
            "",
            'model = AutoModelForSequenceClassification.from_pretrained("<root>/finetune/sst2/model")',
            "```",
        ]
    return lines


def render(facts: CardFacts) -> str:
    """The card's text: the metadata block, then the body."""
    n, v, p = facts.network, facts.vocabulary, facts.pretraining
    data = [f"- **{source}**: {what}" for source, what in facts.data] or ["- (not recorded)"]
    phases = [
        f"- phase `{ph['name']}`: {ph['steps']:,} steps at sequence length {ph['max_seq_length']}, "
        f"batch {ph['batch_size']}"
        for ph in p.phases
    ]
    done = [f"{p.steps:,} steps done"] if p.steps is not None else []
    done += [f"final {loss.upper()} loss {value:.3f}" for loss, value in sorted(p.last_losses.items())]
    limits = [
        "- Pretrained from scratch by bertflow on the data above only: it knows what that text holds, "
        "and its biases (Wikipedia's and the books' coverage, their time and their authors).",
        f"- Inputs longer than {n.get('max_position_embeddings')} tokens are cut; the tokenizer "
        + ("lower-cases its input." if v.lowercase else "keeps case."),
        "- A pretrained encoder, not a generator: fine-tune it for a task before use; the scores above are "
        "for the tasks named, on their dev splits.",
    ]
    if facts.sample_data:
        limits.insert(0, "- **Trained on bertflow's bundled synthetic sample** (invented words and places): a "
                         "smoke test of the pipeline, of no use as a language model.")  # fmt: skip
    if facts.card.limits:
        limits.append(f"- {facts.card.limits}")
    body = [
        f"# {facts.name}",
        "",
        f"BERT ({p.objective}) pretrained from scratch by bertflow with the `{facts.preset}` preset.",
        "",
        "## Training data",
        "",
        *data,
        "",
        f"Vocabulary: WordPiece, {v.size:,} entries"
        + (f", words split by {v.word_tokenizer} first" if v.word_tokenizer != "none" else "")
        + (", lower-cased" if v.lowercase else ", cased")
        + ".",
        "",
        "## Configuration",
        "",
        *_network_table(n),
        "",
        f"Pretraining ({p.losses}, {p.masked_lm_prob * 100:g}% of tokens masked, AdamW, linear warm-up then decay):",
        "",
        *phases,
        *([f"- learning rate {p.learning_rate:g}"] if p.learning_rate is not None else []),
        *([f"- {', '.join(done)}"] if done else []),
        "",
        "## Downstream results",
        "",
        *_scores(facts),
        "",
        "## How to load",
        "",
        *_how_to_load(facts),
        "",
        "## Limits",
        "",
        *limits,
        "",
    ]
    if facts.fingerprint:
        body += [f"Export fingerprint: `{facts.fingerprint}` (the registry's key for this model).", ""]
    return "---\n" + "\n".join(_yaml(metadata(facts))) + "\n---\n\n" + "\n".join(body)


def write_card(folder_url: str, facts: CardFacts) -> str:
    """Write ``README.md`` into an exported folder (replacing the one there); returns its URL."""
    # imported here: the presets import CardConfig, and the contract would bring pyarrow and numpy
    # into every command (``--help``, ``status``) that never writes a card
    from model.contract import join_url, write_atomically

    url = join_url(folder_url, CARD_NAME)
    write_atomically(url, render(facts))
    return url
