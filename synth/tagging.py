"""CoNLL-2003 NER and SWAG sets about the invented world, in their official file formats.

- CoNLL-2003: ``eng.train``/``eng.testa``/``eng.testb`` column files (``word POS chunk NER``),
  ``-DOCSTART- -X- -X- O`` before each document, a blank line after each sentence, tags in
  IOB1 as the original release has them (``I-`` everywhere, ``B-`` only where an entity
  follows another of the same type). Sentences are fact phrasings whose entity mentions are
  known by construction: people PER, places (towns, regions, rivers, mountains, seas) LOC,
  guilds ORG, ships and species MISC. POS and chunk columns are a rough guess (NNP/CD/NN/.),
  enough for readers that take the last column. Some sentences list two places with no
  word between them ("... from Kesh Almora ...") so B- tags occur.
- SWAG: ``train.csv``/``val.csv``/``test.csv`` with SWAG's header (``,video-id,fold-ind,
  startphrase,sent1,sent2,gold-source,ending0..3,label``; test without ``label``). ``sent1`` states
  a fact, ``sent2`` begins the next sentence about the same subject, and the gold ending
  mentions the fact's object while the three distractors mention objects of the same relation
  taken from other subjects.
"""

from __future__ import annotations

import csv
import io
import re

from synth.glue_sets import DOWNSTREAM_BLOCKS, _split_of, fact_pool, kind_species
from synth.phrases import fact_object, facts, phrase
from synth.world import COLOURS, OCCUPATIONS, SHIP_TYPES, Entity, World, derive_rng

TYPES = {
    "person": "PER",
    "town": "LOC",
    "region": "LOC",
    "river": "LOC",
    "mountain": "LOC",
    "guild": "ORG",
    "ship": "MISC",
    "species": "MISC",
}
_TOKEN = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")


def _tags_iob1(tokens: list[tuple[str, int, int]], mentions: list[tuple[int, int, str]]) -> list[str]:
    tags, prev = [], None  # prev: (mention index, type) of the previous token
    for _, s, e in tokens:
        hit = next(((i, m) for i, m in enumerate(mentions) if s < m[1] and e > m[0]), None)
        if hit is None:
            tags.append("O")
            prev = None
            continue
        i, (_, _, typ) = hit
        starts_new = prev is None or prev[0] != i
        tags.append(f"B-{typ}" if starts_new and prev is not None and prev[1] == typ else f"I-{typ}")
        prev = (i, typ)
    return tags


def _pos(word: str) -> tuple[str, str]:
    if not word[0].isalnum():
        return ".", "O"
    if word[0].isdigit():
        return "CD", "I-NP"
    return ("NNP" if word[0].isupper() else "NN"), "I-NP"


def _mentions(sentence: str, names: list[tuple[str, str]]) -> list[tuple[int, int, str]]:
    out = []
    for name, typ in names:
        at = sentence.find(name)
        if at >= 0 and not any(at < e and at + len(name) > s for s, e, _ in out):
            out.append((at, at + len(name), typ))
    return sorted(out)


def ner_sentences(world: World, split: str, n: int) -> list[list[tuple[str, str]]]:
    """``n`` sentences of (word, IOB1 tag)."""
    pool = [f for f in fact_pool(world) if _split_of(f[0], world.seed) == split]
    towns = [t for b in range(DOWNSTREAM_BLOCKS) for t in world.block(b).towns]
    rng = derive_rng(world.seed, "conll", split)
    out = []
    while len(out) < n:
        entity, rel, value = rng.choice(pool)
        obj = fact_object(value)
        sentence = phrase(rel, entity.name, obj, rng)[0]
        names = [(entity.name, TYPES[entity.kind])]
        if isinstance(value, Entity):
            names.append((value.name, TYPES[value.kind]))
        elif obj.startswith("Sea of "):
            names.append((obj, "LOC"))
        if len(out) % 7 == 3:  # two adjacent places of one type: B- marks where the second starts
            a, b = rng.sample(towns, 2)
            extra = f" Traders came from {a.name} {b.name} and beyond."
            sentence += extra
            names += [(a.name, "LOC"), (b.name, "LOC")]
        tokens = [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(sentence)]
        tags = _tags_iob1(tokens, _mentions(sentence, names))
        out.append([(w, t) for (w, _, _), t in zip(tokens, tags)])
    return out


def conll_text(sentences: list[list[tuple[str, str]]], per_document: int = 8) -> str:
    lines = []
    for i, sent in enumerate(sentences):
        if i % per_document == 0:
            lines += ["-DOCSTART- -X- -X- O", ""]
        for word, tag in sent:
            pos, chunk = _pos(word)
            lines.append(f"{word} {pos} {chunk} {tag}")
        lines.append("")
    return "\n".join(lines) + "\n"


SWAG_HEADER = [
    "",
    "video-id",
    "fold-ind",
    "startphrase",
    "sent1",
    "sent2",
    "gold-source",
    "ending0",
    "ending1",
    "ending2",
    "ending3",
    "label",
]
CONTINUATIONS = (
    "Each morning the {s}",
    "When it is hungry, the {s}",
    "Like others of its kind, the {s}",
    "In the warm months the {s}",
)
ENDINGS = ("feeds on {o}.", "eats mostly {o}.", "goes looking for {o}.", "searches for {o}.")
# Words the corpus uses in other slots, none of them food: the distractors.
NOT_FOOD = {
    "colour": COLOURS,
    "occupation": tuple(o + "s" for o in OCCUPATIONS),
    "ship": tuple(t[:-1] + "ies" if t.endswith("y") else t + "s" for t in SHIP_TYPES),
}


def word_split(seed: int) -> dict[str, str]:
    """Distractor word -> "train" or "dev": a third of each kind is dev/test only."""
    rng = derive_rng(seed, "swag-words")
    out = {}
    for _kind, words in sorted(NOT_FOOD.items()):
        dev = set(rng.sample(sorted(words), len(words) // 3))
        out.update({w: "dev" if w in dev else "train" for w in words})
    return out


def swag_rows(world: World, split: str, n: int, labelled: bool = True) -> list[list]:
    """Rows whose plausible ending names what the species eats ("feeds on frogs."), after a
    context that states another of its facts; the three distractors put a word of another kind
    in the same slot ("feeds on violet.", "feeds on schooners."). Dev diets and dev distractor
    words never occur in a train row (:func:`~synth.glue_sets.diet_split`, :func:`word_split`),
    so fine-tuning alone cannot tell a dev ending: what tells it is knowing which words are
    food, which the corpus teaches, as SWAG's endings are told by commonsense (see
    :mod:`synth.glue_sets` on why not *which* food each animal eats)."""
    species = kind_species(world, split)
    side = "train" if split == "train" else "dev"
    others = sorted(w for w, s in word_split(world.seed).items() if s == side)
    rng = derive_rng(world.seed, "swag-food", split)
    rows = []
    while len(rows) < n:
        entity = rng.choice(species)
        rel, value = rng.choice([f for f in facts(entity) if f[0] != "species.diet"])
        sent1 = phrase(rel, entity.name, fact_object(value), rng)[0]
        sent2 = rng.choice(CONTINUATIONS).format(s=entity.name)
        template = rng.choice(ENDINGS)
        endings = [template.format(o=o) for o in [entity["diet"]] + rng.sample(others, 3)]
        order = list(range(4))
        rng.shuffle(order)
        label = order.index(0)
        row = [
            len(rows),
            f"synth_{entity.key}",
            len(rows) * 3,
            f"{sent1} {sent2}",
            sent1,
            sent2,
            "gold",
            *[endings[k] for k in order],
        ]
        rows.append(row + [label] if labelled else row)
    return rows


def swag_csv(rows: list[list], labelled: bool = True) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(SWAG_HEADER if labelled else SWAG_HEADER[:-1])
    writer.writerows(rows)
    return buf.getvalue()
