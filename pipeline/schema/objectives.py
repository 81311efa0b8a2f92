"""The pretraining objectives, one row each, and what the examples stage hands the next stages.

:data:`OBJECTIVES` is the one table of objectives (``examples.objective``): the name, the example
builder that writes the rows (a function of ``pipeline.examples.objectives``, named here so this
module imports nothing of the stages), the Parquet columns the shards carry, and the losses the
model trains with. The masking is shared by all of them (``pipeline.examples.masking``). Adding an
objective is one builder function and one row; no other module names an objective
(``tests/test_architecture.py`` checks it).

What an examples stage produced with them (its lengths, their objective) is recorded and read
back through ``pipeline.schema.outputs``.
"""

from __future__ import annotations

import dataclasses
import math

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
    label_words: tuple[str, ...]
    """How ``bertflow inspect`` shows the sentence label: (False, True), or ()."""
    label_stat: str
    """The examples stage's counter of positive sentence labels (``seq{N}.<label_stat>_share``), or ""."""
    doc: str
    card: str = ""
    """How the model card names what the model was pretrained with."""

    @property
    def columns(self) -> tuple[str, ...]:
        """The example columns of this objective's shards, in order."""
        pair = ("len_a",) if self.segments else ()
        label = (self.sentence_label,) if self.sentence_label else ()
        return ("input_ids", *pair, "masked_positions", "masked_ids", *label)

    @property
    def short(self) -> str:
        """The losses as a card writes them: ``MLM + NSP``, ``MLM``."""
        return " + ".join(loss.upper() for loss in self.losses)

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
            label_stat="random_next", label_words=("actual-next", "random-next"),
            doc="BERT: masked LM + next-sentence prediction (B the real next span, or another document's)",
            card="masked language model + next sentence prediction",
        ),
        Objective(
            "mlm", builder="full_sentences", segments=False, sentence_label="", sentence_loss="",
            label_stat="", label_words=(),
            doc="RoBERTa FULL-SENTENCES: masked LM only, sentences packed across documents ([SEP] between)",
            card="masked language model only, over full sentences packed across documents as RoBERTa's FULL-SENTENCES",
        ),
        Objective(
            "sop", builder="sentence_order", segments=True, sentence_label="is_swapped", sentence_loss="sop",
            label_stat="swapped", label_words=("in-order", "swapped"),
            doc="ALBERT: masked LM + sentence-order prediction (two consecutive spans, swapped half the time)",
            card="masked language model + sentence-order prediction, as ALBERT",
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
