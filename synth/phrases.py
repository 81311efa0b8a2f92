"""How the world's facts are said: every phrasing of each relation, the questions that ask for
them, and the renderer that fills one in (with the offset of the object, for SQuAD answers)."""

from __future__ import annotations

import random
import re
from typing import Any

from synth.world import Entity

# -- facts and their phrasings -----------------------------------------------------------------
# {s}: the subject, {o}: the object; each template has exactly one {o} (SQuAD spans rely on it).
PHRASES: dict[str, tuple[str, ...]] = {
    "town.river": (
        "{s} lies on the river {o}.",
        "{s} is a town on the {o}.",
        "The river {o} flows through {s}.",
        "{s} stands on the banks of the {o}.",
        "The town of {s} was built beside the river {o}.",
    ),
    "town.region": (
        "{s} is a town in {o}.",
        "{s} is located in the region of {o}.",
        "{s} belongs to the region of {o}.",
        "The region of {o} includes the town of {s}.",
    ),
    "town.founded": (
        "{s} was founded in {o}.",
        "The town of {s} was established in {o}.",
        "The first houses of {s} were built in {o}.",
        "{s} dates from {o}, when it was founded.",
    ),
    "town.industry": (
        "The main industry of {s} is {o}.",
        "{s} is known for its {o}.",
        "Most people in {s} work in {o}.",
        "{s} grew rich on {o}.",
    ),
    "town.population": (
        "{s} has a population of about {o}.",
        "About {o} people live in {s}.",
        "The population of {s} is about {o}.",
    ),
    "region.capital": (
        "The capital of {s} is {o}.",
        "{o} is the capital of {s}.",
        "{s} is governed from its capital, {o}.",
    ),
    "region.climate": (
        "The climate of {s} is {o}.",
        "{s} has a {o} climate.",
        "Summers in {s} are short and the weather is {o}.",
    ),
    "region.borders": (
        "{s} borders the region of {o}.",
        "To the west, {s} borders {o}.",
        "{s} shares a long border with {o}.",
    ),
    "mountain.region": (
        "{s} is a mountain in {o}.",
        "{s} rises above the valleys of {o}.",
        "The highest peaks of {o} include {s}.",
    ),
    "mountain.height": (
        "{s} is {o} metres high.",
        "{s} reaches a height of {o} metres.",
        "The summit of {s} stands {o} metres above the sea.",
    ),
    "river.source": ("The {s} rises on {o}.", "The source of the {s} is on {o}.", "The river {s} begins high on {o}."),
    "river.mouth": (
        "The {s} flows into the {o}.",
        "The river {s} empties into the {o}.",
        "After a long journey the {s} reaches the {o}.",
    ),
    "river.length": (
        "The {s} is {o} kilometres long.",
        "The river {s} runs for {o} kilometres.",
        "The length of the {s} is {o} kilometres.",
    ),
    "person.birthplace": (
        "{s} was born in {o}.",
        "{s} was a native of {o}.",
        "{s} grew up in the town of {o}.",
        "The town of {o} is the birthplace of {s}.",
    ),
    "person.born": ("{s} was born in {o}.", "{s} was born in the year {o}."),
    "person.died": ("{s} died in {o}.", "{s} died in the year {o}.", "{s} lived until {o}."),
    "person.occupation": (
        "{s} was a {o}.",
        "{s} worked as a {o}.",
        "{s} is remembered as a {o}.",
        "While still young, {s} became a {o}.",
    ),
    "person.work": ("{s} wrote {o}.", "The best known work of {s} is {o}.", "{s} is the author of {o}."),
    "person.guild": ("{s} was a member of the {o}.", "{s} joined the {o}."),
    "person.ship": ("{s} was the captain of the {o}.", "{s} commanded the {o}."),
    "guild.town": (
        "The {s} is based in {o}.",
        "The {s} has its hall in {o}.",
        "The {s} was founded in the town of {o}.",
    ),
    "guild.leader": ("The {s} is led by {o}.", "{o} was the head of the {s}.", "{o} became master of the {s}."),
    "guild.founded": ("The {s} was founded in {o}.", "The {s} received its charter in {o}."),
    "ship.built_at": (
        "The {s} was built at {o}.",
        "The {s} was built in the yards of {o}.",
        "Shipwrights in {o} built the {s}.",
    ),
    "ship.type": ("The {s} is a {o}.", "The {s} was a {o} of the river trade."),
    "ship.captain": ("The captain of the {s} was {o}.", "The {s} sailed under {o}.", "{o} commanded the {s}."),
    "ship.home_port": ("The home port of the {s} is {o}.", "The {s} sailed from {o}."),
    "species.animal": ("The {s} is a kind of {o}.", "The {s} is a {o}."),
    "species.colour": (
        "The {s} is {o} in colour.",
        "The {s} has {o} markings on its back.",
        "Most of the body of the {s} is {o}.",
    ),
    "species.diet": ("The {s} feeds on {o}.", "The {s} eats mostly {o}.", "The diet of the {s} consists of {o}."),
    "species.habitat_river": (
        "The {s} lives along the river {o}.",
        "The {s} is found only in the waters of the {o}.",
        "The habitat of the {s} is the river {o}.",
    ),
    "species.habitat_mountain": (
        "The {s} lives on the slopes of {o}.",
        "The {s} is found only on {o}.",
        "The habitat of the {s} is the high ground of {o}.",
    ),
    "species.described_by": ("The {s} was first described by {o}.", "{o} first described the {s}."),
}

QUESTIONS: dict[str, tuple[str, ...]] = {
    "town.river": (
        "Which river does {s} lie on?",
        "What river flows through {s}?",
        "On which river is the town of {s}?",
    ),
    "town.region": ("In which region is {s}?", "What region is {s} located in?"),
    "town.founded": ("When was {s} founded?", "In what year was {s} established?"),
    "town.industry": ("What is the main industry of {s}?", "What is {s} known for?"),
    "town.population": ("What is the population of {s}?", "How many people live in {s}?"),
    "region.capital": ("What is the capital of {s}?", "Which town is the capital of {s}?"),
    "region.climate": ("What is the climate of {s} like?",),
    "region.borders": ("Which region does {s} border?",),
    "mountain.region": ("In which region is {s}?",),
    "mountain.height": ("How high is {s}?", "What is the height of {s} in metres?"),
    "river.source": ("Where does the {s} rise?", "Where is the source of the {s}?"),
    "river.mouth": ("Into what does the {s} flow?", "Where does the {s} end?"),
    "river.length": ("How long is the {s}?",),
    "person.birthplace": ("Where was {s} born?", "What town was {s} a native of?"),
    "person.born": ("In what year was {s} born?",),
    "person.died": ("When did {s} die?", "In what year did {s} die?"),
    "person.occupation": ("What was the occupation of {s}?", "What did {s} work as?"),
    "person.work": ("What did {s} write?", "What is the best known work of {s}?"),
    "person.guild": ("Which guild did {s} belong to?",),
    "person.ship": ("Which ship did {s} command?",),
    "guild.town": ("Where is the {s} based?",),
    "guild.leader": ("Who led the {s}?",),
    "guild.founded": ("When was the {s} founded?",),
    "ship.built_at": ("Where was the {s} built?",),
    "ship.type": ("What kind of vessel is the {s}?",),
    "ship.captain": ("Who was the captain of the {s}?",),
    "ship.home_port": ("What is the home port of the {s}?",),
    "species.animal": ("What kind of animal is the {s}?",),
    "species.colour": ("What colour is the {s}?",),
    "species.diet": ("What does the {s} eat?", "What does the {s} feed on?"),
    "species.habitat_river": ("Where does the {s} live?", "Along which river is the {s} found?"),
    "species.habitat_mountain": ("Where does the {s} live?", "On which mountain is the {s} found?"),
    "species.described_by": ("Who first described the {s}?",),
}


# The fact that defines each kind best; other documents repeat it more often than the rest.
CORE = {
    "town": "town.river",
    "region": "region.capital",
    "river": "river.mouth",
    "mountain": "mountain.region",
    "person": "person.occupation",
    "guild": "guild.town",
    "ship": "ship.built_at",
    "species": "species.habitat",
}


def fact_object(value: Any) -> str:
    """The plain text of a fact's object: an entity's name, a number with thousands commas."""
    if isinstance(value, Entity):
        return value.name
    if isinstance(value, int) and value >= 10000:
        return f"{value:,}"
    return str(value)


def facts(entity: Entity) -> list[tuple[str, Any]]:
    """(relation, object) for every phrased fact of ``entity``, in a fixed order."""
    out = []
    for attr, value in entity.attrs.items():
        rel = f"{entity.kind}.{attr}"
        if rel == "species.habitat":
            rel += "_" + value.kind
        if rel in PHRASES:
            out.append((rel, value))
    return out


def pick_fact(entity: Entity, rng: random.Random) -> tuple[str, Any]:
    """A fact of ``entity`` for a mention elsewhere: its core fact half the time."""
    all_facts = facts(entity)
    if rng.random() < 0.5:
        core = [f for f in all_facts if f[0].startswith(CORE[entity.kind])]
        if core:
            return core[0]
    return rng.choice(all_facts)


_A_BEFORE_VOWEL = re.compile(r"\b([Aa]) (?=[aeiouAEIOU])")


def fix_articles(text: str) -> str:
    """ "a astronomer" -> "an astronomer": templates meet words they cannot foresee."""
    return _A_BEFORE_VOWEL.sub(r"\1n ", text)


def _render(template: str, subject: str, obj: str) -> tuple[str, int]:
    pre, post = template.split("{o}", 1)
    head = fix_articles(pre.format(s=subject) + obj)  # the fix never touches obj's own letters
    return head + fix_articles(post.format(s=subject)), len(head) - len(obj)


def phrase(rel: str, subject: str, obj: str, rng: random.Random) -> tuple[str, int]:
    """One phrasing of a fact and the offset of ``obj`` in it."""
    return _render(rng.choice(PHRASES[rel]), subject, obj)


def phrasings(rel: str, subject: str, obj: str) -> set[str]:
    """Every phrasing of a fact, as :func:`phrase` writes them."""
    return {_render(t, subject, obj)[0] for t in PHRASES[rel]}
