"""What a stage produced, as small typed records: written into its manifest (``Manifest.outputs``)
and read back by the stages after it through one function each, never from the producing
stage's config with defaults of their own.

- :class:`VocabOutput` (the vocab stage): casing, segmentation, size and special ids;
  :func:`vocab_output` reads it.
- :class:`ExampleLength` (the examples stage, one per sequence length): its folder,
  ``max_predictions``, masking mode and rate, whole-word masking, objective;
  :func:`example_lengths` reads them.
- :func:`seq_folder` / :func:`parse_seq_folder`: the one place the ``seq{N}`` folder name of the
  data contract is built and parsed.

A manifest written before ``outputs`` existed is read from its config here, in this one place.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pipeline.schema.objectives import DEFAULT_OBJECTIVE, Objective, derive_max_predictions, get_objective

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


LENGTHS_KEY = "lengths"
"""The key of ``Manifest.outputs`` under which the examples stage lists its :class:`ExampleLength` s."""


def lengths_record(lengths: list[ExampleLength]) -> dict[str, Any]:
    """What the examples stage writes into its manifest's ``outputs``."""
    return {LENGTHS_KEY: {x.folder: dataclasses.asdict(x) for x in lengths}}


def example_lengths(manifest) -> dict[int, ExampleLength]:
    """The lengths of an examples manifest (``pipeline.schema.manifest.Manifest``), by max_seq_length.

    A manifest written before ``outputs`` existed describes MLM + NSP examples by its config;
    its lengths are rebuilt from it here, in this one place."""
    record = (manifest.outputs or {}).get(LENGTHS_KEY)
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


# -- what the vocab stage produced ----------------------------------------------------------------
VOCAB_KEY = "vocab"


@dataclasses.dataclass(frozen=True)
class VocabOutput:
    """A finished vocabulary: how text is cased and segmented before its pieces, its size and special ids."""

    lowercase: bool
    word_tokenizer: str  # "none" | "mecab" | "jieba"
    subword: str  # "wordpiece" | "character"
    vocab_size: int
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int

    @classmethod
    def of(cls, vocab: list[str], lowercase: bool, word_tokenizer: str, subword: str) -> VocabOutput:
        ids = {t: i for i, t in enumerate(vocab)}
        missing = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t not in ids]
        if missing:
            raise ValueError(f"vocabulary lacks the special tokens {missing}")
        return cls(
            lowercase, word_tokenizer, subword, len(vocab),
            ids["[PAD]"], ids["[UNK]"], ids["[CLS]"], ids["[SEP]"], ids["[MASK]"],
        )  # fmt: skip


def vocab_record(vocab: VocabOutput) -> dict[str, Any]:
    """What the vocab stage writes into its manifest's ``outputs``."""
    return {VOCAB_KEY: dataclasses.asdict(vocab)}


def vocab_output(manifest, vocab: list[str] | None = None) -> VocabOutput:
    """The vocabulary a vocab manifest describes. A manifest written before ``outputs`` existed is
    read from its config (the vocab stage's fields, which it always recorded) and ``vocab``."""
    record = (manifest.outputs or {}).get(VOCAB_KEY)
    if record is not None:
        return VocabOutput(**record)
    if vocab is None:
        raise ValueError(f"{manifest.url}: an older vocab manifest without outputs; pass its vocab.txt")
    c = manifest.config
    return VocabOutput.of(vocab, bool(c["lowercase"]), str(c["word_tokenizer"]), str(c["subword"]))
