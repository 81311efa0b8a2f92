"""Small GLUE sets about the invented world, in each task's official TSV layout.

Every pair task is built from the world's facts (subject, relation, object) and their varied
phrasings (:data:`synth.phrases.PHRASES`, :data:`synth.phrases.QUESTIONS`):
- the *same fact* in two phrasings: a paraphrase (MRPC 1, STS-B 4-5, QQP duplicate, entailment);
- the *same relation with another object*, taken from another entity of the same relation:
  a contradiction (MNLI), not a paraphrase, STS-B 2-3;
- *another fact* of the same subject: neutral (MNLI), not entailed (QNLI/RTE), STS-B 1-2;
- CoLA: a fact sentence (acceptable) or the same with two words swapped, a function word
  dropped or a word doubled, never giving another phrasing of the fact (unacceptable), in CoLA's
  headerless ``source, label, original mark, sentence`` rows;
- WNLI: "The A followed the B because it was looking for X." (a species and a ship) with "it"
  resolved by what X is, food or cargo, which only the corpus tells for dev words (:func:`wnli_rows`).
Column layouts are the GLUE download's (MNLI's parse columns carry a flat bracketing, enough for
a reader that looks columns up by name). Train, dev and test split by subject entity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from synth.books import CARGOES
from synth.phrases import QUESTIONS, fact_object, facts, phrase, phrasings
from synth.world import ANIMALS, OCCUPATIONS, Entity, World, derive_rng

DOWNSTREAM_BLOCKS = 10


def fact_pool(world: World) -> list[tuple[Entity, str, Any]]:
    """(subject, relation, object) of every phrased fact in the downstream blocks, in world order."""
    return [
        (e, rel, value) for b in range(DOWNSTREAM_BLOCKS) for e in world.block(b).entities() for rel, value in facts(e)
    ]


def by_relation(pool) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for _, rel, value in pool:
        obj = fact_object(value)
        if obj not in out.setdefault(rel, []):
            out[rel].append(obj)
    return out


def _split_of(entity: Entity, seed: int = 0) -> str:
    """train / dev / test by a stable digest of the subject, so no subject crosses splits."""
    r = derive_rng(seed, "glue-split", entity.key).random()
    return "dev" if r < 0.15 else "test" if r < 0.25 else "train"


def _sentence(rel: str, subject: str, obj: str, rng, avoid: str | None = None) -> str:
    for _ in range(8):
        text = phrase(rel, subject, obj, rng)[0]
        if text != avoid:
            return text
    return text


def _pairs(world: World, seed_name: str) -> Callable[[str, int], list[dict]]:
    """A function ``make(split, n)`` giving n pair records {kind, s1, s2, q1, q2, rel, subject}."""
    pool = fact_pool(world)
    objects = by_relation(pool)
    splits: dict[str, list] = {"train": [], "dev": [], "test": []}
    for item in pool:
        splits[_split_of(item[0], world.seed)].append(item)
    by_subject: dict[str, list] = {}
    for item in pool:
        by_subject.setdefault(item[0].key, []).append(item)

    def make(split: str, n: int) -> list[dict]:
        rng = derive_rng(world.seed, seed_name, split)
        items = splits[split]
        out = []
        kinds = ("same", "other_object", "other_fact", "unrelated")
        while len(out) < n:
            entity, rel, value = rng.choice(items)
            obj = fact_object(value)
            kind = kinds[len(out) % 4]
            s1 = _sentence(rel, entity.name, obj, rng)
            q1 = rng.choice(QUESTIONS[rel]).format(s=entity.name)
            if kind == "same":
                s2 = _sentence(rel, entity.name, obj, rng, avoid=s1)
                q2 = rng.choice(QUESTIONS[rel]).format(s=entity.name)
                if len(QUESTIONS[rel]) > 1:
                    while q2 == q1:
                        q2 = rng.choice(QUESTIONS[rel]).format(s=entity.name)
            elif kind == "other_object":
                others = [o for o in objects[rel] if o != obj]
                if not others:
                    continue
                s2 = _sentence(rel, entity.name, rng.choice(others), rng)
                other = rng.choice(items)
                q2 = rng.choice(QUESTIONS[rel]).format(s=other[0].name)
                if other[0] is entity:
                    continue
            elif kind == "other_fact":
                rest = [f for f in by_subject[entity.key] if f[1] != rel]
                if not rest:
                    continue
                _, rel2, value2 = rng.choice(rest)
                s2 = _sentence(rel2, entity.name, fact_object(value2), rng)
                q2 = rng.choice(QUESTIONS[rel2]).format(s=entity.name)
            else:
                other, rel2, value2 = rng.choice(items)
                if other is entity:
                    continue
                s2 = _sentence(rel2, other.name, fact_object(value2), rng)
                q2 = rng.choice(QUESTIONS[rel2]).format(s=other.name)
            out.append({"kind": kind, "s1": s1, "s2": s2, "q1": q1, "q2": q2, "rel": rel})
        rng.shuffle(out)
        return out

    return make


def _parse(sentence: str) -> tuple[str, str]:
    words = sentence.replace(".", " .").replace(",", " ,").replace("?", " ?").split()
    return "( " + " ".join(words) + " )", "(ROOT (S " + " ".join(f"(X {w})" for w in words) + "))"


# Words whose loss leaves a sentence ungrammatical (a "the" before a name is not one of them:
# "the Silver Star sailed" and "Silver Star sailed" are both English).
DROPPABLE = frozenset({"of", "in", "on", "a", "an", "was", "is", "to", "by", "its", "at", "for", "the"})


def _corrupt(words: list[str], rng) -> list[str] | None:
    """Two adjacent words swapped, a function word dropped or a word doubled: ``None`` where the
    drawn change could leave the sentence grammatical (two names swapped: "Tolvi Maren")."""
    how = rng.randrange(3)
    i = rng.randrange(len(words) - 1)
    if how == 0:
        if words[i][:1].isupper() and words[i + 1][:1].isupper() or words[i] == words[i + 1]:
            return None
        return words[:i] + [words[i + 1], words[i]] + words[i + 2 :]
    if how == 1:
        droppable = [
            k
            for k, w in enumerate(words)
            if w.lower() in DROPPABLE and not (w.lower() == "the" and k + 1 < len(words) and words[k + 1][:1].isupper())
        ]
        if not droppable:
            return None
        k = rng.choice(droppable)
        return words[:k] + words[k + 1 :]
    return words[:i] + [words[i]] + words[i:]


def cola_rows(world: World, split: str, n: int) -> list[tuple]:
    """(source, label, mark, sentence): half acceptable fact sentences, half corrupted ones. A
    corruption that gives another phrasing of the fact ("X died in the year 1827" less "the
    year") is drawn again: unacceptable rows must be ungrammatical, as CoLA's are."""
    pool = [f for f in fact_pool(world) if _split_of(f[0], world.seed) == split]
    rng = derive_rng(world.seed, "cola", split)
    rows = []
    while len(rows) < n:
        entity, rel, value = rng.choice(pool)
        sentence = _sentence(rel, entity.name, fact_object(value), rng)
        source = f"syn{rng.randrange(1, 10):02d}"
        if len(rows) % 2 == 0:
            rows.append((source, 1, "", sentence))
            continue
        words = sentence.rstrip(".").split()
        if len(words) < 3:
            continue
        bad = _corrupt(words, rng)
        if bad is None:
            continue
        text = " ".join(bad) + "."
        if text not in phrasings(rel, entity.name, fact_object(value)):
            rows.append((source, 0, "*", text))
    return rows


# -- what kinds of words are: the knowledge WNLI and SWAG rest on --------------------------------
# Their real sets test commonsense, which a pretrained model brings and fine-tuning on a few
# hundred rows does not teach. Here the commonsense is which words are food (what animals look
# for) and which are cargo or passengers (what ships look for): the corpus uses each in its own
# slots thousands of times. The words are split between train and dev/test, so the fine-tuning
# rows never show a dev word: only what pretraining learnt about it tells a dev row. (Knowing
# *which* food each animal eats, or each first name's pronoun, was beyond the `small` model: after
# its 2,000 steps, masked-word probes picked the right diet for 2 of 16 animals and the right
# pronoun for 40 of 80 people, as chance does; benchmarks/probe_knowledge.py.)
KIND_BLOCKS = 40
DEV_DIETS = 5
SHIP_WANTS = CARGOES + tuple(o + "s" for o in OCCUPATIONS)


def diet_split(seed: int) -> dict[str, str]:
    """Animal -> "train" or "dev" (dev and test share the dev kinds); animals that eat the same
    thing share a split, so no dev diet is a train answer."""
    diets = sorted(set(ANIMALS.values()))
    dev = set(derive_rng(seed, "diet-split").sample(diets, DEV_DIETS))
    return {a: "dev" if d in dev else "train" for a, d in ANIMALS.items()}


def kind_species(world: World, split: str) -> list[Entity]:
    """The species of the first :data:`KIND_BLOCKS` blocks whose animal falls in ``split``."""
    side = diet_split(world.seed)
    want = "train" if split == "train" else "dev"
    return [s for b in range(KIND_BLOCKS) for s in world.block(b).species if side[s["animal"]] == want]


def ship_wants(seed: int, split: str) -> list[str]:
    """The cargoes and passengers of ``split``: a third of them dev/test only."""
    dev = set(derive_rng(seed, "ship-wants").sample(sorted(SHIP_WANTS), len(SHIP_WANTS) // 3))
    return sorted(w for w in SHIP_WANTS if (w in dev) == (split != "train"))


WNLI_FRAMES = (
    ("The {s} followed the {o} because it was looking for {x}.", "The {h} was looking for {x}."),
    ("The {s} waited near the {o} because it wanted {x}.", "The {h} wanted {x}."),
    ("The {s} passed the {o} slowly, since it had come for {x}.", "The {h} had come for {x}."),
)


def wnli_rows(world: World, split: str, n: int) -> list[tuple[str, str, int]]:
    """Winograd pairs: a species and a ship, and "it" wanting food (the animal) or a cargo or
    passengers (the ship), with the hypothesis naming one of them."""
    rng = derive_rng(world.seed, "wnli-wants", split)
    species = kind_species(world, split)
    ships = [s for b in range(KIND_BLOCKS) for s in world.block(b).ships]
    cargo = ship_wants(world.seed, split)
    rows = []
    while len(rows) < n:
        animal, ship = rng.choice(species), rng.choice(ships)
        animal_wants = rng.random() < 0.5
        want = animal["diet"] if animal_wants else rng.choice(cargo)
        subject, obj = (animal, ship) if rng.random() < 0.5 else (ship, animal)
        first, then = rng.choice(WNLI_FRAMES)
        hyp = rng.choice((animal, ship))
        rows.append(
            (
                first.format(s=subject.name, o=obj.name, x=want),
                then.format(h=hyp.name, x=want),
                int((hyp is animal) == animal_wants),
            )
        )
    return rows


SIZES = {"train": 400, "dev": 100, "test": 50}


def _balanced(pairs: list[dict], n: int) -> list[dict]:
    """The first ``n`` pairs with as many "same" pairs as others, in their order: RTE's two
    classes are balanced like the real set's (a quarter of the pairs are "same")."""
    same = [p for p in pairs if p["kind"] == "same"][: n // 2]
    other = [p for p in pairs if p["kind"] != "same"][: n - len(same)]
    keep = {id(p) for p in same + other}
    return [p for p in pairs if id(p) in keep]


def glue_files(world: World) -> dict[str, dict[str, tuple[str, list[tuple]]]]:
    """GLUE folder -> file name -> (header line or "" for none, rows)."""
    out: dict[str, dict[str, tuple[str, list[tuple]]]] = {}
    pairs = _pairs(world, "glue-pairs")
    data = {split: pairs(split, SIZES[split] * (2 if split == "test" else 1)) for split in SIZES}

    def labelled(split):
        return data[split][: SIZES[split]]

    # CoLA: headerless train/dev, a headed test
    out["CoLA"] = {f"{s}.tsv": ("", cola_rows(world, s, SIZES[s])) for s in ("train", "dev")}
    out["CoLA"]["test.tsv"] = ("index\tsentence", [(i, r[3]) for i, r in enumerate(cola_rows(world, "test", 50))])

    mrpc = {"same": 1, "other_object": 0, "other_fact": 0, "unrelated": 0}
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    out["MRPC"] = {
        f"{s}.tsv": (
            header,
            [(mrpc[p["kind"]], 1000 + 2 * i, 1001 + 2 * i, p["s1"], p["s2"]) for i, p in enumerate(labelled(s))],
        )
        for s in ("train", "dev")
    }
    out["MRPC"]["test.tsv"] = (
        "index\t#1 ID\t#2 ID\t#1 String\t#2 String",
        [(i, 5000 + 2 * i, 5001 + 2 * i, p["s1"], p["s2"]) for i, p in enumerate(data["test"][: SIZES["test"]])],
    )

    ranges = {"same": (4.0, 5.0), "other_object": (2.0, 3.2), "other_fact": (1.0, 2.2), "unrelated": (0.0, 0.8)}
    sts_header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    rng = derive_rng(world.seed, "stsb-scores")
    out["STS-B"] = {}
    for s in ("train", "dev"):
        rows = []
        for i, p in enumerate(labelled(s)):
            lo, hi = ranges[p["kind"]]
            rows.append(
                (
                    i,
                    "main-captions",
                    "MSRvid",
                    "2012test",
                    f"{i:04d}",
                    "none",
                    "none",
                    p["s1"],
                    p["s2"],
                    f"{rng.uniform(lo, hi):.3f}",
                )
            )
        out["STS-B"][f"{s}.tsv"] = (sts_header + "\tscore", rows)
    out["STS-B"]["test.tsv"] = (
        sts_header,
        [
            (i, "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", p["s1"], p["s2"])
            for i, p in enumerate(data["test"][50:100])
        ],
    )

    out["QQP"] = {
        f"{s}.tsv": (
            "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
            [(i, 2 * i + 1, 2 * i + 2, p["q1"], p["q2"], int(p["kind"] == "same")) for i, p in enumerate(labelled(s))],
        )
        for s in ("train", "dev")
    }
    out["QQP"]["test.tsv"] = (
        "id\tquestion1\tquestion2",
        [(i, p["q1"], p["q2"]) for i, p in enumerate(data["test"][:50])],
    )

    nli = {"same": "entailment", "other_object": "contradiction", "other_fact": "neutral", "unrelated": "neutral"}
    cols = (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse"
        "\tsentence1_parse\tsentence2_parse\tsentence1\tsentence2"
    )

    def mnli(rows, genre, labels):
        body = []
        for i, p in enumerate(rows):
            (b1, p1), (b2, p2) = _parse(p["s1"]), _parse(p["s2"])
            row = (i, 10000 + i, f"{10000 + i}{'ecn'[i % 3]}", genre, b1, b2, p1, p2, p["s1"], p["s2"])
            if labels == 1:
                row += (nli[p["kind"]], nli[p["kind"]])
            elif labels == 5:
                row += (nli[p["kind"]],) * 6
            body.append(row)
        return body

    out["MNLI"] = {
        "train.tsv": (cols + "\tlabel1\tgold_label", mnli(labelled("train"), "fiction", 1)),
        "dev_matched.tsv": (
            cols + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
            mnli(labelled("dev")[:50], "fiction", 5),
        ),
        "dev_mismatched.tsv": (
            cols + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
            mnli(labelled("dev")[50:], "letters", 5),
        ),
        "test_matched.tsv": (cols, mnli(data["test"][:25], "fiction", 0)),
        "test_mismatched.tsv": (cols, mnli(data["test"][25:50], "letters", 0)),
        "diagnostic.tsv": (
            "index\tsentence1\tsentence2",  # GLUE's diagnostic set: AX.tsv
            [(i, p["s1"], p["s2"]) for i, p in enumerate(data["test"][50:75])],
        ),
    }

    out["QNLI"] = {
        f"{s}.tsv": (
            "index\tquestion\tsentence\tlabel",
            [
                (
                    i,
                    p["q1"],
                    p["s1"] if p["kind"] in ("same", "other_object") else p["s2"],
                    "entailment" if p["kind"] in ("same", "other_object") else "not_entailment",
                )
                for i, p in enumerate(labelled(s))
            ],
        )
        for s in ("train", "dev")
    }
    out["QNLI"]["test.tsv"] = (
        "index\tquestion\tsentence",
        [(i, p["q1"], p["s2"]) for i, p in enumerate(data["test"][:50])],
    )

    rte = {
        "same": "entailment",
        "other_object": "not_entailment",
        "other_fact": "not_entailment",
        "unrelated": "not_entailment",
    }
    out["RTE"] = {
        f"{s}.tsv": (
            "index\tsentence1\tsentence2\tlabel",
            [(i, p["s1"], p["s2"], rte[p["kind"]]) for i, p in enumerate(_balanced(labelled(s), SIZES[s] // 2))],
        )
        for s in ("train", "dev")
    }
    out["RTE"]["test.tsv"] = (
        "index\tsentence1\tsentence2",
        [(i, p["s1"], p["s2"]) for i, p in enumerate(data["test"][:50])],
    )

    out["WNLI"] = {
        f"{s}.tsv": (
            "index\tsentence1\tsentence2\tlabel",
            [(i, *r) for i, r in enumerate(wnli_rows(world, s, SIZES[s]))],
        )
        for s in ("train", "dev")
    }
    out["WNLI"]["test.tsv"] = (
        "index\tsentence1\tsentence2",
        [(i, a, b) for i, (a, b, _) in enumerate(wnli_rows(world, "test", 40))],
    )
    return out
