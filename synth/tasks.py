"""Small downstream sets about the invented world, in the official SST-2 and SQuAD v1.1/v2.0 formats.

(The other GLUE tasks are in :mod:`synth.glue_sets`, CoNLL-2003 and SWAG in :mod:`synth.tagging`.)

Both draw on the first :data:`DOWNSTREAM_BLOCKS` blocks of the world, which every corpus of the
same seed describes (the world is prefix-stable and the sample corpus covers them), so a model
pretrained on the corpus has seen the names and facts.

- SST-2: short lowercased, tokenised review sentences about the world's places, ships and works,
  with the corpus's positive and negative adjectives (a third of them only in a third of the dev
  and test rows). Negation ("not", "never", "hardly",
  "nobody") flips the label and contrast ("although ..., ...", "... but ...") makes the last
  clause decide it in 30% of rows, so a bag of adjectives is not enough for the best scores.
  Labels alternate, so they are balanced.
- SQuAD v1.1: contexts are plain-text paragraphs about one entity (its facts in varied phrasings,
  filler, and a distractor fact about a neighbour); questions ask for a fact's object and the
  answer span is located by construction (:func:`~synth.phrases.phrase` returns the
  offset), never by searching the context. Dev questions carry three answers like the official
  dev set: the span, a wider or narrower variant where one exists, and the span again. Train and
  dev split by entity, so dev contexts are unseen paragraphs.
"""

from __future__ import annotations

import hashlib
from typing import Any

from synth.phrases import QUESTIONS, fact_object, facts, phrase
from synth.wiki import Article
from synth.words import NEGATIVE, POSITIVE
from synth.world import Entity, World, derive_rng

DOWNSTREAM_BLOCKS = 10
FILLER_SECTION = {
    "town": "history",
    "region": "region",
    "river": "river",
    "mountain": "mountain",
    "person": "life",
    "guild": "guild",
    "ship": "ship",
    "species": "species",
}


# -- SST-2 ----------------------------------------------------------------------------------------
def _tokenise(sentence: str) -> str:
    """SST-2 style: lowercase, punctuation and clitics split off by spaces."""
    s = sentence.lower().replace("n't", " n't").replace("'s", " 's")
    for p in ",.;!?":
        s = s.replace(p, f" {p}")
    return " ".join(s.split())


def _subjects(world: World, rng) -> str:
    b = world.block(rng.randrange(DOWNSTREAM_BLOCKS))
    town = rng.choice(b.towns)
    person = rng.choice([p for p in b.people if "work" in p.attrs] or b.people)
    work = person.get("work", "letters")
    return rng.choice(
        (
            f"the town of {town.name}",
            town.name,
            f"the old bridge at {town.name}",
            f"the market in {town.name}",
            f"the inn at {town.name}",
            f"the {town['river'].name} valley",
            f"{person.name}'s {person.get('work_kind', 'diary')} {work}",
            f"the voyage on the {rng.choice(b.ships).name}",
            f"the festival of {town.name}",
            f"the food in {b.region.name}",
            f"the museum in {town.name}",
            f"the road to {town.name}",
            f"the {person.get('work_kind', 'book')} by {person.name}",
        )
    )


# (template, flips): {a} takes polarity label XOR flips; {b}, where present, the opposite of {a}'s
# clause-level polarity, so the label follows the last clause.
SST_TEMPLATES = (
    ("{s} is {a}", 0),
    ("{s} is very {a}", 0),
    ("{s} is truly {a} .", 0),
    ("{s} is rather {a}", 0),
    ("{s} is not {a}", 1),
    ("{s} is never {a}", 1),
    ("{s} is hardly {a}", 1),
    ("{s} was {a} and {a2}", 0),
    ("i found {s} {a} .", 0),
    ("we did not find {s} {a}", 1),
    ("nothing about {s} was {a}", 1),
    ("{s} is {b} but {a}", 0),
    ("although {s} is {b} , it is {a}", 0),
    ("{p} wrote that {s} was {a}", 0),
    ("{p} never thought {s} was {a}", 1),
    ("everyone says {s} is {a}", 0),
    ("nobody would call {s} {a}", 1),
    ("{s} is {b} , but the people are {a}", 0),
    ("{s} could not be more {a}", 0),
)


# Most rows state the polarity plainly, so a small model can learn the task from the corpus's
# adjectives; the rest need negation and contrast, so the best scores need more than a bag of words.
PLAIN_SHARE = 0.7
PLAIN_TEMPLATES = tuple(t for t in SST_TEMPLATES if t[1] == 0 and "{b}" not in t[0])
HARD_TEMPLATES = tuple(t for t in SST_TEMPLATES if t not in PLAIN_TEMPLATES)


DEV_ADJECTIVES = 4  # of each polarity's 12
DEV_WORD_SHARE = 1 / 3  # of dev and test rows


def dev_adjectives(seed: int) -> set[str]:
    """The adjectives no training row has. As in the real set, some dev reviews turn on a word
    fine-tuning never saw, whose polarity only pretraining (the corpus's "felt almost happy",
    "turned dreary and grey" ...) can tell; a third of the dev and test rows use these."""
    rng = derive_rng(seed, "sst2-words")
    return set(rng.sample(POSITIVE, DEV_ADJECTIVES)) | set(rng.sample(NEGATIVE, DEV_ADJECTIVES))


def sst2_rows(world: World, count: int, rng, seen: set[str], split: str = "train") -> list[tuple[str, int]]:
    """``count`` (sentence, label) rows, labels alternating, no sentence repeated across ``seen``;
    train rows never use :func:`dev_adjectives`, a third of the others only those."""
    dev = dev_adjectives(world.seed)
    lists = {
        held: tuple([w for w in words if (w in dev) == held] for words in (POSITIVE, NEGATIVE))
        for held in (False, True)
    }
    rows: list[tuple[str, int]] = []
    while len(rows) < count:
        label = len(rows) % 2
        template, flips = rng.choice(PLAIN_TEMPLATES if rng.random() < PLAIN_SHARE else HARD_TEMPLATES)
        polarity = label ^ flips
        pos, neg = lists[split != "train" and rng.random() < DEV_WORD_SHARE]
        words, other = (pos, neg) if polarity else (neg, pos)
        a, a2 = rng.sample(words, 2)
        b = world.block(rng.randrange(DOWNSTREAM_BLOCKS))
        text = template.format(s=_subjects(world, rng), a=a, a2=a2, b=rng.choice(other), p=rng.choice(b.people).name)
        sentence = _tokenise(text)
        if sentence not in seen:
            seen.add(sentence)
            rows.append((sentence, label))
    rng.shuffle(rows)
    return rows


# -- SQuAD v1.1 -----------------------------------------------------------------------------------
def _qid(seed: int, *parts: Any) -> str:
    text = "\x1f".join(str(p) for p in (seed,) + parts)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def _variant(context: str, start: int, answer: str) -> tuple[str, int]:
    """A wider or narrower answer another annotator might mark, or the answer itself."""
    for prefix in ("the river ", "the ", "the year "):
        if context[max(0, start - len(prefix)) : start] == prefix:
            return context[start - len(prefix) : start + len(answer)], start - len(prefix)
    if " " in answer and not answer.startswith(("The ", "Sea of ", "Mount ")):
        last = answer.rsplit(" ", 1)[1]  # a surname alone
        return last, start + len(answer) - len(last)
    return answer, start


def _paragraphs(world: World, entity: Entity) -> list[tuple[str, list[tuple[str, str, int]]]]:
    """One or two plain-text paragraphs about ``entity``: (context, [(rel, answer, start)])."""
    art = Article(world, entity, plain=True)
    rng = art.rng
    fs = facts(entity)
    rng.shuffle(fs)
    half = max(2, (len(fs) + 1) // 2)
    section = FILLER_SECTION[entity.kind]
    block = world.block(entity.block)
    neighbours = [e for e in block.entities() if e.kind == entity.kind and e is not entity and facts(e)]
    out = []
    for part, chunk in enumerate((fs[:half], fs[half:])):
        if not chunk:
            continue
        items: list[tuple[str, tuple[str, str, int] | None]] = []
        for rel, value in chunk:
            obj = fact_object(value)
            sentence, at = phrase(rel, entity.name, obj, rng)
            items.append((sentence, (rel, obj, at)))
        for filler in art.fill(section, 3):
            items.insert(rng.randrange(1, len(items) + 1), (filler, None))
        if part == 1 and neighbours:  # a distractor: the same relation about another entity
            n = rng.choice(neighbours)
            rel, value = rng.choice(facts(n))
            items.insert(rng.randrange(len(items) + 1), (phrase(rel, n.name, fact_object(value), rng)[0], None))
        context, spans = "", []
        for sentence, span in items:
            if context:
                context += " "
            if span is not None:
                spans.append((span[0], span[1], len(context) + span[2]))
            context += sentence
        out.append((context, spans))
    return out


def squad_sets(world: World, train_questions: int, dev_questions: int) -> tuple[dict, dict]:
    """(train, dev) SQuAD v1.1 dictionaries; every 6th entity goes to dev."""
    sets = {"train": [], "dev": []}
    counts = {"train": 0, "dev": 0}
    limits = {"train": train_questions, "dev": dev_questions}
    index = 0
    for b in range(DOWNSTREAM_BLOCKS):
        for entity in world.block(b).entities():
            split = "dev" if index % 6 == 5 else "train"
            index += 1
            if counts[split] >= limits[split]:
                continue
            rng = derive_rng(world.seed, "squad", entity.key)
            paragraphs = []
            for p, (context, spans) in enumerate(_paragraphs(world, entity)):
                qas = []
                for rel, answer, start in spans:
                    if counts[split] >= limits[split]:
                        break
                    assert context[start : start + len(answer)] == answer, (entity.key, rel)
                    answers = [{"text": answer, "answer_start": start}]
                    if split == "dev":
                        text, at = _variant(context, start, answer)
                        answers += [{"text": text, "answer_start": at}, {"text": answer, "answer_start": start}]
                    question = rng.choice(QUESTIONS[rel]).format(s=entity.name)
                    qas.append(
                        {"answers": answers, "question": question, "id": _qid(world.seed, split, entity.key, p, rel)}
                    )
                    counts[split] += 1
                if qas:
                    paragraphs.append({"context": context, "qas": qas})
            if paragraphs:
                sets[split].append({"title": entity.title.replace(" ", "_"), "paragraphs": paragraphs})
        if all(counts[s] >= limits[s] for s in counts):
            break
    return ({"data": sets["train"], "version": "1.1"}, {"data": sets["dev"], "version": "1.1"})


# -- SQuAD v2.0 -----------------------------------------------------------------------------------
def squad_v2_sets(world: World, train_questions: int, dev_questions: int) -> tuple[dict, dict]:
    """(train, dev) SQuAD v2.0 dictionaries: each paragraph's answerable questions (dev with two
    answers, the span and a variant) plus up to two unanswerable ones: questions about facts of
    the same entity that only its *other* paragraph states (``is_impossible``, empty
    ``answers``). Such a question whose answer text occurs in this context anyway, or whose
    relation this paragraph answers, is left out."""
    sets = {"train": [], "dev": []}
    counts = {"train": 0, "dev": 0}
    limits = {"train": train_questions, "dev": dev_questions}
    index = 0
    for b in range(DOWNSTREAM_BLOCKS):
        for entity in world.block(b).entities():
            split = "dev" if index % 6 == 5 else "train"
            index += 1
            if counts[split] >= limits[split]:
                continue
            rng = derive_rng(world.seed, "squad2", entity.key)
            paras = _paragraphs(world, entity)
            paragraphs = []
            for p, (context, spans) in enumerate(paras):
                qas = []
                for rel, answer, start in spans:
                    answers = [{"text": answer, "answer_start": start}]
                    if split == "dev":
                        text, at = _variant(context, start, answer)
                        answers += [{"text": text, "answer_start": at}]
                    qas.append(
                        {
                            "question": rng.choice(QUESTIONS[rel]).format(s=entity.name),
                            "id": _qid(world.seed, "v2", split, entity.key, p, rel),
                            "answers": answers,
                            "is_impossible": False,
                        }
                    )
                elsewhere = [s for q, (_, other) in enumerate(paras) if q != p for s in other]
                rng.shuffle(elsewhere)
                for rel, answer, _ in elsewhere[:2]:
                    if answer in context or any(rel == r for r, _, _ in spans):
                        continue
                    qas.append(
                        {
                            "question": rng.choice(QUESTIONS[rel]).format(s=entity.name),
                            "id": _qid(world.seed, "v2", split, entity.key, p, rel, "none"),
                            "answers": [],
                            "is_impossible": True,
                        }
                    )
                qas = qas[: max(0, limits[split] - counts[split])]
                counts[split] += len(qas)
                if qas:
                    paragraphs.append({"context": context, "qas": qas})
            if paragraphs:
                sets[split].append({"title": entity.title.replace(" ", "_"), "paragraphs": paragraphs})
        if all(counts[s] >= limits[s] for s in counts):
            break
    return ({"version": "v2.0", "data": sets["train"]}, {"version": "v2.0", "data": sets["dev"]})
