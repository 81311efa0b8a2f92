"""The downstream tasks, one row each: the one place that says what a task is.

A row names the task, its family (the module of ``tasks/`` that holds its steps:
``tasks.<family>`` defines ``Unit``, a :class:`tasks.driver.Family` that
:func:`tasks.driver.run_unit` runs), where its official files are under the downstream data
root, its headline metric and the factor that puts it in percent (the paper's tables, the GLUE
average, the champion's score), the reader of its official files, its head, and the writer of
its benchmark-server files when it has one.
GLUE rows carry their file layout (columns, label set, dev and test files) as ``layout``.

Everything that knows about downstream tasks reads :data:`TASKS`: the stage table (one
``finetune/<task>`` row each), the config's validation, the grid and its aggregation
(``tasks.units``), the results table and the GLUE average (``tasks.results``), the registered
model's score. Adding a task is one row here plus its module (a new GLUE-format task: one
layout). References to code are ``"module:attribute"`` strings, resolved when used
(:func:`resolve`), so reading the registry never imports torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GlueLayout:
    """A GLUE task's files as the GLUE download script leaves them, and its official metrics."""

    name: str  # canonical: "sst2" (the registry row's name)
    folder: str  # GLUE's folder (and submission file) name: "SST-2"
    text_a: str  # column names
    text_b: str | None
    label: str
    labels: tuple[str, ...] | None  # None: regression
    metrics: tuple[str, ...]
    dev_files: tuple[str, ...] = ("dev.tsv",)
    test_files: tuple[str, ...] = ("test.tsv",)
    submissions: tuple[str, ...] | None = None  # one per test file; default (folder,)
    positional_columns: tuple[str, ...] = ()  # train/dev have no header: these names, in order
    skip_malformed: bool = False
    index_column: str = "index"  # in test files

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)


@dataclass(frozen=True)
class Task:
    """One downstream task (a row of :data:`TASKS`)."""

    name: str
    family: str
    """The module that runs it, ``tasks.<family>``: glue | squad | ner | swag | jglue | clue."""
    folder: str
    """Its official files under the downstream data root (``data.downstream``)."""
    metric: str
    """The headline metric: a key of a unit manifest's counts; the grid picks the best point by it."""
    scale: float
    """``metric * scale`` is the metric in percent: 100 for a fraction (accuracy, F1 of GLUE), 1
    for a metric the official script reports in percent (SQuAD, conlleval)."""
    reader: str
    """``module:function`` that reads one split of the official files."""
    head: str
    """``module:class`` of the head on the encoder."""
    submission: str = ""
    """``module:function`` that writes the benchmark server's files (GLUE), or empty."""
    unit: str = ""
    """``module:class`` of its family's steps (:class:`tasks.driver.Family`) that
    :func:`tasks.driver.run_unit` runs; default ``tasks.<family>:Unit``."""
    glue_average: bool = False
    """Counts in the paper's GLUE average (the nine GLUE tasks but WNLI)."""
    feature_based: bool = False
    """The frozen-encoder (feature-based) variant: the grid also spans ``finetune.features.layer_mixes``."""
    layout: GlueLayout | None = None
    """GLUE rows: the file layout."""
    files: str = ""
    """JSON-lines rows: ``module:attr`` of (train file patterns, dev file patterns)."""
    scorer: str = ""
    """JSON-lines span QA rows: ``module:function`` of the benchmark's official scorer
    (question id -> gold texts, predictions -> {"exact_match", "f1", ...})."""
    options: dict[str, Any] = field(default_factory=dict)
    """Family options, e.g. {"version": "2.0"} for SQuAD v2.0."""

    def __post_init__(self):
        if not self.unit:
            object.__setattr__(self, "unit", f"tasks.{self.family}:Unit")

    @property
    def module(self) -> str:
        return f"tasks.{self.family}"

    def percent(self, value: float) -> float:
        """The headline metric ``value`` (as the unit manifests count it) in percent."""
        return value * self.scale

    def run(
        self,
        config,
        data_url: str,
        model_url: str,
        output_url: str,
        log_fn=None,
        save_model: bool = True,
        unit: dict[str, Any] | None = None,
    ):
        """Fine-tune and evaluate once (one unit of the grid): :func:`tasks.driver.run_unit`."""
        run_unit = resolve("tasks.driver:run_unit")
        return run_unit(self, config, data_url, model_url, output_url, log_fn=log_fn, save_model=save_model, unit=unit)


def resolve(ref: str) -> Any:
    """The object a ``module:attribute`` reference names (imports the module)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _glue(metric: str, layout: GlueLayout, average: bool = True) -> Task:
    return Task(layout.name, "glue", f"glue/{layout.folder}", metric, 100.0, "tasks.glue:read_split",
                "tasks.heads:BertForSequenceClassification", "tasks.glue:write_submission",
                glue_average=average, layout=layout)  # fmt: skip


def _squad(name: str, version: str) -> Task:
    return Task(name, "squad", "squad", "eval_f1", 1.0, "tasks.squad:read_squad",
                "tasks.heads:BertForQuestionAnswering", options={"version": version})  # fmt: skip


def _ner(name: str, feature_based: bool = False) -> Task:
    head = "tasks.features:FeatureBasedTagger" if feature_based else "tasks.heads:BertForTokenClassification"
    return Task(name, "ner", "conll2003", "eval_f1", 1.0, "tasks.ner:read_conll", head, feature_based=feature_based)


def _jsonl(
    family: str, name: str, folder: str, metric: str, layout: GlueLayout | None, kind: str = "classification", **options
) -> Task:
    """A JGLUE or CLUE row: JSON-lines classification (its keys in ``layout``), multiple choice or span QA."""
    head = {
        "classification": "tasks.heads:BertForSequenceClassification",
        "choice": "tasks.heads:BertForMultipleChoice",
        "qa": "tasks.heads:BertForQuestionAnswering",
    }[kind]
    scale = 1.0 if kind == "qa" else 100.0
    reader = {"jglue": "tasks.jglue:read_jglue", "clue": "tasks.clue:read_clue"}[family]
    if kind == "qa":
        reader = "tasks.squad:read_squad"
    unit = {"classification": "Classification", "choice": "Choice", "qa": "SpanQa"}[kind]
    files = "tasks.clue:CMRC_FILES" if (family, kind) == ("clue", "qa") else f"tasks.{family}:FILES"
    scorer = (
        {"jglue": "tasks.jglue:jsquad_evaluate", "clue": "tasks.clue:cmrc2018_evaluate"}[family] if kind == "qa" else ""
    )
    return Task(name, family, folder, metric, scale, reader, head, unit=f"tasks.jsonl:{unit}",
                layout=layout, files=files, scorer=scorer, options={"kind": kind, **options})  # fmt: skip


_CLUE_NLI = ("contradiction", "entailment", "neutral")
_TNEWS = ("100", "101", "102", "103", "104", "106", "107", "108", "109", "110", "112", "113", "114", "115", "116")
_JSONL_TASKS = (
    # JGLUE (tasks/jglue.py): JSON lines as the JGLUE repository publishes them; JSQuAD SQuAD JSON
    _jsonl(
        "jglue",
        "marc_ja",
        "jglue/marc_ja-v1.1",
        "eval_accuracy",
        GlueLayout("marc_ja", "MARC-ja", "sentence", None, "label", ("positive", "negative"), ("accuracy",)),
    ),
    _jsonl(
        "jglue",
        "jsts",
        "jglue/jsts-v1.1",
        "eval_pearson",
        GlueLayout("jsts", "JSTS", "sentence1", "sentence2", "label", None, ("pearson", "spearman")),
    ),
    _jsonl(
        "jglue",
        "jnli",
        "jglue/jnli-v1.1",
        "eval_accuracy",
        GlueLayout(
            "jnli", "JNLI", "sentence1", "sentence2", "label", ("entailment", "contradiction", "neutral"), ("accuracy",)
        ),
    ),
    _jsonl("jglue", "jsquad", "jglue/jsquad-v1.1", "eval_f1", None, kind="qa"),
    _jsonl("jglue", "jcommonsenseqa", "jglue/jcommonsenseqa-v1.1", "eval_accuracy", None, kind="choice"),
    # CLUE (tasks/clue.py): <task>_public/{train,dev}.json
    _jsonl(
        "clue",
        "afqmc",
        "clue/afqmc_public",
        "eval_accuracy",
        GlueLayout("afqmc", "AFQMC", "sentence1", "sentence2", "label", ("0", "1"), ("accuracy",)),
    ),
    _jsonl(
        "clue",
        "tnews",
        "clue/tnews_public",
        "eval_accuracy",
        GlueLayout("tnews", "TNEWS", "sentence", None, "label", _TNEWS, ("accuracy",)),
    ),
    _jsonl(
        "clue",
        "iflytek",
        "clue/iflytek_public",
        "eval_accuracy",
        GlueLayout("iflytek", "IFLYTEK", "sentence", None, "label", tuple(str(i) for i in range(119)), ("accuracy",)),
    ),
    _jsonl(
        "clue",
        "cmnli",
        "clue/cmnli_public",
        "eval_accuracy",
        GlueLayout("cmnli", "CMNLI", "sentence1", "sentence2", "label", _CLUE_NLI, ("accuracy",)),
        skip_unlabelled=True,
    ),
    _jsonl(
        "clue",
        "ocnli",
        "clue/ocnli_public",
        "eval_accuracy",
        GlueLayout("ocnli", "OCNLI", "sentence1", "sentence2", "label", _CLUE_NLI, ("accuracy",)),
        skip_unlabelled=True,
    ),
    _jsonl(
        "clue",
        "cluewsc2020",
        "clue/cluewsc2020_public",
        "eval_accuracy",
        GlueLayout("cluewsc2020", "CLUEWSC2020", "text", None, "label", ("true", "false"), ("accuracy",)),
        build="wsc",
    ),
    _jsonl(
        "clue",
        "csl",
        "clue/csl_public",
        "eval_accuracy",
        GlueLayout("csl", "CSL", "keyword", "abst", "label", ("0", "1"), ("accuracy",)),
        build="csl",
    ),
    _jsonl("clue", "cmrc2018", "clue/cmrc2018_public", "eval_f1", None, kind="qa"),
)

# fmt: off
_NLI = ("entailment", "not_entailment")
TASKS: dict[str, Task] = {t.name: t for t in (
    _glue("eval_mcc", GlueLayout("cola", "CoLA", "sentence", None, "label", ("0", "1"), ("mcc",),
                                 positional_columns=("source", "label", "original_label", "sentence"))),
    _glue("eval_accuracy", GlueLayout("sst2", "SST-2", "sentence", None, "label", ("0", "1"), ("accuracy",))),
    _glue("eval_f1", GlueLayout("mrpc", "MRPC", "#1 String", "#2 String", "Quality", ("0", "1"), ("f1", "accuracy"))),
    _glue("eval_spearman", GlueLayout("stsb", "STS-B", "sentence1", "sentence2", "score", None,
                                      ("pearson", "spearman"))),
    _glue("eval_f1", GlueLayout("qqp", "QQP", "question1", "question2", "is_duplicate", ("0", "1"), ("f1", "accuracy"),
                                skip_malformed=True, index_column="id")),
    _glue("eval_accuracy",  # matched dev; mismatched is eval_mm_accuracy
          GlueLayout("mnli", "MNLI", "sentence1", "sentence2", "gold_label", ("contradiction", "entailment", "neutral"),
                     ("accuracy",), dev_files=("dev_matched.tsv", "dev_mismatched.tsv"),
                     test_files=("test_matched.tsv", "test_mismatched.tsv", "diagnostic.tsv"),
                     submissions=("MNLI-m", "MNLI-mm", "AX"))),
    _glue("eval_accuracy", GlueLayout("qnli", "QNLI", "question", "sentence", "label", _NLI, ("accuracy",))),
    _glue("eval_accuracy", GlueLayout("rte", "RTE", "sentence1", "sentence2", "label", _NLI, ("accuracy",))),
    _glue("eval_accuracy", GlueLayout("wnli", "WNLI", "sentence1", "sentence2", "label", ("0", "1"), ("accuracy",)),
          average=False),
    _squad("squad1", "1.1"),
    _squad("squad2", "2.0"),
    _ner("conll2003"),
    _ner("conll2003_features", feature_based=True),
    Task("swag", "swag", "swag", "eval_accuracy", 100.0, "tasks.swag:read_swag", "tasks.heads:BertForMultipleChoice"),
    *_JSONL_TASKS,
)}
# fmt: on


class UnknownTaskError(KeyError):
    """A task name the registry does not have; the message lists the known ones and the closest."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def get_task(name: str) -> Task:
    """A task's row by its name; case, '-' and '_' are ignored when the name itself is not a row
    ("SST-2", "STS-B", "CoLA": GLUE's folder names, as people write them)."""
    if name in TASKS:
        return TASKS[name]
    for task in TASKS.values():
        if _key(task.name) == _key(name):
            return task
    close = difflib.get_close_matches(name, TASKS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UnknownTaskError(f"unknown downstream task {name!r}{hint}; known: {', '.join(sorted(TASKS))}")


def family_tasks(family: str) -> dict[str, Task]:
    return {n: t for n, t in TASKS.items() if t.family == family}


def describe() -> list[dict[str, Any]]:
    """The registry as plain rows (docs, ``bertflow config``)."""
    return [{k: v for k, v in dataclasses.asdict(t).items() if k != "layout"} for t in TASKS.values()]
