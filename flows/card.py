"""The exported model's card (``model.card``), from what the run knows: its config, the manifests
of the stages that made the model, and the downstream results once they are there.

Written twice (``model/card.py`` says why): by the export stage (data, network, pretraining; "not
evaluated yet") and by the registry step after fine-tuning (the same, plus every task's dev score
and where its fine-tuned weights are), before the folder is logged as the registered version's
artifact. A run whose downstream tasks did not run leaves the export's card as it is.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass

from flows.calls import StageResult
from flows.presets import RunConfig
from model.card import CardFacts, CardPretraining, CardScore, CardVocabulary, write_card
from model.config import load_bert_config
from pipeline.schema.manifest import Manifest, ManifestError, fingerprint_input, read_manifest
from pipeline.schema.objectives import get_objective
from pipeline.schema.outputs import VOCAB_KEY, example_lengths, objective_of, vocab_output

log = logging.getLogger("bertflow.flow")

# the Hub's dataset ids (and config names) of the downstream families; a task's own name is its config
_DATASETS = {"glue": "glue", "squad": "squad", "ner": "conll2003", "swag": "swag", "jglue": "shunk031/JGLUE",
             "clue": "clue"}  # fmt: skip
_TASK_TYPES = {
    "BertForSequenceClassification": "text-classification",
    "BertForQuestionAnswering": "question-answering",
    "BertForTokenClassification": "token-classification",
    "FeatureBasedTagger": "token-classification",
    "BertForMultipleChoice": "multiple-choice",
}
_METRICS = {"mcc": "matthews_correlation", "pearson": "pearsonr", "spearman": "spearmanr"}


@dataclass(frozen=True)
class CardSources:
    """Where a card's facts are: the corpus, vocab, examples and pretrain stages' folders, and the corpus's
    raw inputs (source -> URL). Made from the stage table (``flows.table.card_sources``)."""

    corpus: str
    vocab: str
    examples: str
    pretrain: str
    raw: dict[str, str]


def _manifest_or_none(url: str) -> Manifest | None:
    try:
        return read_manifest(url)
    except (ManifestError, FileNotFoundError):
        return None


def _file_names(url: str, shown: int = 4) -> str:
    """A raw input by its file names (a folder's files, a glob's matches), never its path."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    try:
        names = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in (fs.glob(path) if any(c in path for c in "*?[")
                       else fs.find(path) if fs.isdir(path) else [path]))  # fmt: skip
    except OSError:
        names = []
    names = names or [os.path.basename(url.rstrip("/"))]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(f"`{n}`" for n in names[:shown]) + more


def data_lines(corpus_url: str, raw: dict[str, str]) -> list[tuple[str, str]]:
    """(source, its files by name and content fingerprint, documents and sentences kept) per corpus source."""
    corpus = _manifest_or_none(corpus_url)
    counts = corpus.counts if corpus else {}
    out = []
    for source, url in raw.items():
        what = [_file_names(url)]
        try:
            what.append(f"content fingerprint `{fingerprint_input(url)[:16]}`")
        except (FileNotFoundError, ManifestError):
            pass
        docs, sentences = counts.get(f"{source}_documents"), counts.get(f"{source}_sentences")
        if docs is not None:
            what.append(f"{int(docs):,} documents, {int(sentences or 0):,} sentences kept")
        out.append((source, ", ".join(what)))
    return out


def card_score(task_name: str, result: StageResult) -> CardScore | None:
    """A finished downstream task's result as the card shows it (None: it has no score)."""
    from tasks.registry import get_task

    c = result.counts
    if "dev_median" not in c:
        return None
    task = get_task(task_name)
    family = {"glue": "GLUE", "jglue": "JGLUE", "clue": "CLUE"}.get(task.family)
    dataset = {"ner": "CoNLL-2003", "swag": "SWAG"}.get(task.family, task.name)
    if family:
        dataset = f"{family} {task.layout.folder if task.layout else task.name}"
    dataset_type = _DATASETS.get(task.family, task.family)
    config = {"ner": "conll2003", "swag": "regular"}.get(task.family, task.name)
    if task.family == "squad":
        v2 = task.options.get("version") == "2.0"
        dataset_type, config = ("squad_v2", "squad_v2") if v2 else ("squad", "plain_text")
        dataset = "SQuAD v2.0" if v2 else "SQuAD v1.1"
    metric = task.metric.removeprefix("eval_")
    kept = c.get("model_kept", 0) >= 1
    return CardScore(
        task=task.name,
        task_type=_TASK_TYPES[task.head.rsplit(":", 1)[1]],
        dataset=dataset,
        dataset_type=dataset_type,
        dataset_config=config,
        metric=_METRICS.get(metric, metric),
        value=float(c["dev_median"]),
        low=float(c.get("dev_min", c["dev_median"])),
        high=float(c.get("dev_max", c["dev_median"])),
        seeds=int(c.get("seeds", 1)),
        model_path=f"finetune/{task.name}/model" if kept else "",
    )


def card_vocabulary(cfg: RunConfig, url: str, network_size: int) -> CardVocabulary:
    """The vocabulary of the vocab stage's folder ``url``, from its typed output (the run's config
    and the network's size for a model from elsewhere, with no vocab stage)."""
    manifest = _manifest_or_none(url)
    if manifest is None:
        return CardVocabulary(network_size, cfg.vocab.lowercase, cfg.vocab.word_tokenizer)
    if VOCAB_KEY in (manifest.outputs or {}):
        vocab = vocab_output(manifest)
    else:  # a vocab manifest from before typed outputs: its config and vocab.txt
        from pipeline.vocab.tokenizer import read_vocab

        vocab = vocab_output(manifest, read_vocab(f"{url.rstrip('/')}/vocab.txt"))
    return CardVocabulary(vocab.vocab_size, vocab.lowercase, vocab.word_tokenizer)


def card_facts(cfg: RunConfig, model_url: str, sources: CardSources,
               downstream: list[tuple[str, StageResult]] = ()) -> CardFacts:  # fmt: skip
    """Everything the card of the model at ``model_url`` says, read from the run's manifests
    (``downstream``: (task, its result) per task run)."""
    export = _manifest_or_none(model_url)
    network = dataclasses.asdict(load_bert_config(model_url))
    if export is not None:
        network["parameters"] = export.counts.get("parameters")
    pretrain = _manifest_or_none(sources.pretrain)
    counts = pretrain.counts if pretrain else {}
    examples = _manifest_or_none(sources.examples)
    # what the examples were made with, from their manifest (the run's config for a model from elsewhere)
    lengths = list(example_lengths(examples).values()) if examples else []
    objective = objective_of(examples) if examples else get_objective(cfg.examples.objective)
    losses = {loss: counts.get(f"last_{loss}_loss") for loss in objective.losses}
    pretraining = CardPretraining(
        phases=tuple(dataclasses.asdict(p) for p in cfg.pretrain.phases),
        learning_rate=cfg.pretrain.learning_rate,
        objective=objective.card,
        losses=objective.short,
        masked_lm_prob=lengths[0].masked_lm_prob if lengths else cfg.examples.masked_lm_prob,
        steps=int(counts["steps"]) if "steps" in counts else None,
        last_losses={k: float(v) for k, v in losses.items() if v is not None and not math.isnan(v)},
        heads=bool(objective.sentence_loss),
    )
    scores = [s for s in (card_score(t, r) for t, r in downstream) if s is not None]
    return CardFacts(
        name=cfg.model_name,
        preset=cfg.preset,
        card=cfg.card,
        network=network,
        data=data_lines(sources.corpus, sources.raw),
        vocabulary=card_vocabulary(cfg, sources.vocab, network["vocab_size"]),
        pretraining=pretraining,
        scores=scores,
        sample_data=not any(cfg.data.source_urls().values()),
        sample_downstream=not cfg.data.downstream and not cfg.data.downstream_urls,
        fingerprint=export.fingerprint if export else "",
    )


def write_model_card(cfg: RunConfig, model_url: str, sources: CardSources,
                     downstream: list[tuple[str, StageResult]] = ()) -> str | None:  # fmt: skip
    """Write the model's ``README.md``; a card that cannot be made (a model from elsewhere) is
    logged, never an error of the run. Returns its URL."""
    try:
        return write_card(model_url, card_facts(cfg, model_url, sources, downstream))
    except (OSError, ManifestError, KeyError, ValueError) as exc:
        log.warning("model card of %s not written: %s", model_url, exc)
        return None
