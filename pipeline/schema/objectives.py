"""The pretraining objectives, one row each, and what the examples stage hands the next stages.

:data:`OBJECTIVES` is the one table of objectives (``examples.objective``): the name, the example
builder that writes the rows (a function of ``pipeline.examples.objectives``, named here so this
module imports nothing of the stages), the Parquet columns the shards carry, and the losses the
model trains with. The masking is shared by all of them (``pipeline.examples.masking``). Adding an
objective is one builder function and one row; no other module names an objective
(``tests/test_architecture.py`` checks it).

:class:`ExampleLength` is what one sequence length of a finished examples stage is (its folder,
``max_predictions``, masking, objective): the examples stage writes it into its manifest
(``Manifest.outputs``) and every later reader takes it from :func:`example_lengths`, never from
the stage's config with defaults of its own. :func:`seq_folder` / :func:`parse_seq_folder` are
the one place the ``seq{N}`` folder name is built and parsed.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from pipeline.schema.config import ConfigError


@dataclasses.dataclass(frozen=True)
class Objective:
    """One pretraining objective: how examples are built, what the shards hold, what is trained."""

    name: str
    builder: str
    """The function of ``pipeline.examples.objectives`` that turns a bucket's documents into rows."""
    segments: bool
    """Whether an example is a pair ``[CLS] A [SEP] B [SEP]`` (the ``len_a`` column), or one
    segment (token type 0 throughout)."""
    sentence_label: str
    """The boolean Parquet column of the sentence-level label, or "" (no sentence-level head)."""
    sentence_loss: str
    """The name of the sentence-level loss and its metrics (``<name>_loss``), or ""."""
    label_stat: str
    """The examples stage's counter of positive sentence labels (``seq{N}.<label_stat>_share``), or ""."""
    doc: str

    @property
    def columns(self) -> tuple[str, ...]:
        """The example columns of this objective's shards, in order."""
        pair = ("len_a",) if self.segments else ()
        label = (self.sentence_label,) if self.sentence_label else ()
        return ("input_ids", *pair, "masked_positions", "masked_ids", *label)

    @property
    def losses(self) -> tuple[str, ...]:
        """The losses trained (their metrics are ``<loss>_loss``, ``<loss>_accuracy``)."""
        return ("mlm", self.sentence_loss) if self.sentence_loss else ("mlm",)


# -- the table: the first row is the default ----------------------------------------------------
OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective(
            "mlm+nsp", builder="nsp_pairs", segments=True, sentence_label="is_random_next", sentence_loss="nsp",
            label_stat="random_next",
            doc="BERT: masked LM + next-sentence prediction (B the real next span, or another document's)",
        ),
        Objective(
            "mlm", builder="full_sentences", segments=False, sentence_label="", sentence_loss="", label_stat="",
            doc="RoBERTa FULL-SENTENCES: masked LM only, sentences packed across documents ([SEP] between)",
        ),
        Objective(
            "sop", builder="sentence_order", segments=True, sentence_label="is_swapped", sentence_loss="sop",
            label_stat="swapped",
            doc="ALBERT: masked LM + sentence-order prediction (two consecutive spans, swapped half the time)",
        ),
    )
}  # fmt: skip
DEFAULT_OBJECTIVE: str = next(iter(OBJECTIVES))


def get_objective(name: str, field: str = "examples.objective") -> Objective:
    """The row of ``name``; an unknown name is a ConfigError naming ``field`` and the choices."""
    if name not in OBJECTIVES:
        raise ConfigError(f"{field}: unknown objective {name!r}; one of {sorted(OBJECTIVES)}")
    return OBJECTIVES[name]


# -- masking budget ------------------------------------------------------------------------------
def derive_max_predictions(max_seq_length: int, masked_lm_prob: float) -> int:
    """The cap of masked positions at a length when none is set: ``length * masked_lm_prob``
    rounded up to a multiple of 5 (the reference's 20 at 128 and 80 at 512 for 15%), below the length."""
    return max(1, min(max_seq_length - 1, math.ceil(max_seq_length * masked_lm_prob / 5 - 1e-9) * 5))


# -- seq{N}: the folder of one sequence length ----------------------------------------------------
_SEQ = re.compile(r"^seq([1-9][0-9]*)$")


def seq_folder(max_seq_length: int) -> str:
    """The folder (under the examples stage) of the examples of one length: ``seq{N}``."""
    return f"seq{int(max_seq_length)}"


def parse_seq_folder(name: str) -> int:
    """``seq128`` -> 128; anything else is a ValueError naming it."""
    m = _SEQ.match(name)
    if not m:
        raise ValueError(f"{name!r} is not a sequence-length folder (seq<N>)")
    return int(m.group(1))


# -- what the examples stage produced, per length -------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ExampleLength:
    """One sequence length of a finished examples stage, as its manifest records it."""

    max_seq_length: int
    max_predictions: int
    masking: str  # "static" | "dynamic"
    masked_lm_prob: float
    whole_word_mask: bool
    objective: str

    @property
    def folder(self) -> str:
        return seq_folder(self.max_seq_length)

    @property
    def objective_row(self) -> Objective:
        return get_objective(self.objective)


OUTPUTS_KEY = "lengths"
"""The key of ``Manifest.outputs`` under which the examples stage lists its :class:`ExampleLength` s."""


def lengths_record(lengths: list[ExampleLength]) -> dict[str, Any]:
    """What the examples stage writes into its manifest's ``outputs``."""
    return {OUTPUTS_KEY: {x.folder: dataclasses.asdict(x) for x in lengths}}


def example_lengths(manifest) -> dict[int, ExampleLength]:
    """The lengths of an examples manifest (``pipeline.schema.manifest.Manifest``), by max_seq_length.

    A manifest written before ``outputs`` existed describes MLM + NSP examples by its config;
    its lengths are rebuilt from it here, in this one place."""
    record = (manifest.outputs or {}).get(OUTPUTS_KEY)
    if record is None:
        record = _legacy_lengths(manifest.config)
    out = {}
    for folder, row in record.items():
        x = ExampleLength(**row)
        if x.folder != folder:
            raise ValueError(f"{manifest.url}: outputs lists {folder} for length {x.max_seq_length}")
        get_objective(x.objective, f"{manifest.url}: objective")
        out[x.max_seq_length] = x
    return out


def _legacy_lengths(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    prob = float(config["masked_lm_prob"])
    caps = list(config.get("max_predictions_per_seq") or [])
    out = {}
    for i, n in enumerate(config["max_seq_lengths"]):
        out[seq_folder(n)] = dataclasses.asdict(
            ExampleLength(
                max_seq_length=int(n),
                max_predictions=int(caps[i]) if caps else derive_max_predictions(n, prob),
                masking=str(config["masking"]),
                masked_lm_prob=prob,
                whole_word_mask=bool(config["whole_word_mask"]),
                objective=DEFAULT_OBJECTIVE,
            )
        )
    return out


def objective_of(manifest) -> Objective:
    """The one objective of an examples manifest (all its lengths share it)."""
    names = {x.objective for x in example_lengths(manifest).values()}
    if len(names) != 1:
        raise ValueError(f"{manifest.url}: lengths of several objectives {sorted(names)}")
    return get_objective(names.pop())
