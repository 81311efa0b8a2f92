"""A deterministic invented world for the synthetic corpus: entities, their facts, their phrasings.

The world is built in *blocks*. Block ``b`` holds one region with its mountains, rivers, towns,
people, guilds, ships and species, all related to each other (a town's river rises on the
region's mountain, a person is born in one of its towns and joins that town's guild ...). Block
``b`` is drawn from its own generator, seeded from ``(seed, b)`` through blake2b, and depends only
on blocks before it (for name uniqueness and borders). So the world is *prefix-stable*: a 1 GB
corpus and the 1 MB sample of the same seed share their first blocks exactly, and the downstream
sets (built from the first blocks) are about entities the corpus describes, at any size. The cost:
blocks are built in order, never in parallel (about a millisecond each).

Facts are ``(subject, relation, object)`` triples. Every relation has several phrasings
(:data:`synth.phrases.PHRASES`) and questions (:data:`synth.phrases.QUESTIONS`), so the same
fact recurs in varied words in wiki articles, books and SQuAD contexts: what a masked language
model can learn.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

# -- names from syllables ----------------------------------------------------------------------
_ONSETS = (
    "b",
    "br",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "sh",
    "st",
    "t",
    "th",
    "tr",
    "v",
    "z",
    "c",
    "ch",
    "j",
    "w",
    "",
    "",
    "",
)
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou", "ae", "ia", "y")
_RARE_VOWELS = ("é", "å", "ö", "ü")
_CODAS = ("", "", "", "", "n", "r", "l", "s", "m", "th", "sk", "nd", "rn", "x", "k", "v")
_SUFFIXES = {
    "town": ("", "", "", "ford", "holm", "wick", "by", "stead", "mouth", "bridge"),
    "region": ("", "ia", "and", "mark", "ora"),
    "river": ("", "", "a", "e"),
}

INDUSTRIES = (
    "weaving",
    "salt mining",
    "shipbuilding",
    "pottery",
    "wine making",
    "fishing",
    "glassmaking",
    "timber",
    "copper mining",
    "brewing",
    "paper making",
    "dyeing",
)
GUILD_MEMBERS = {
    "weaving": "Weavers",
    "salt mining": "Salt Miners",
    "shipbuilding": "Shipwrights",
    "pottery": "Potters",
    "wine making": "Vintners",
    "fishing": "Fishers",
    "glassmaking": "Glassmakers",
    "timber": "Woodcutters",
    "copper mining": "Coppersmiths",
    "brewing": "Brewers",
    "paper making": "Papermakers",
    "dyeing": "Dyers",
}
OCCUPATIONS = (
    "poet",
    "cartographer",
    "merchant",
    "shipwright",
    "naturalist",
    "painter",
    "engineer",
    "physician",
    "historian",
    "composer",
    "astronomer",
    "architect",
)
WORK_KINDS = {
    "poet": "poem",
    "historian": "chronicle",
    "composer": "symphony",
    "painter": "painting",
    "cartographer": "atlas",
    "astronomer": "treatise",
    "naturalist": "field guide",
    "architect": "treatise",
}
COLOURS = ("red", "blue", "green", "yellow", "grey", "black", "white", "brown", "orange", "silver", "golden", "violet")
ANIMALS = {
    "heron": "small fish",
    "trout": "insects",
    "beetle": "rotting wood",
    "moth": "nectar",
    "frog": "insects",
    "finch": "seeds",
    "eel": "worms",
    "newt": "snails",
    "otter": "fish",
    "owl": "mice",
    "carp": "algae",
    "snail": "leaves",
    "lizard": "beetles",
    "salamander": "worms",
    "swallow": "flies",
    "crane": "frogs",
}
WATER_ANIMALS = {"heron", "trout", "eel", "otter", "carp", "crane", "frog", "newt"}
FIRST_NAMES = 60  # per pronoun
CLIMATES = ("mild and wet", "cold and dry", "warm and dry", "cool and windy", "hot and humid")
SHIP_TYPES = ("galley", "barge", "schooner", "brig", "cog", "ferry", "sloop")
SHIP_WORDS = (
    (
        "Silver",
        "Swift",
        "Northern",
        "Red",
        "Quiet",
        "Golden",
        "Brave",
        "Grey",
        "Morning",
        "Evening",
        "Wandering",
        "Patient",
        "Bright",
        "Lucky",
    ),
    (
        "Heron",
        "Star",
        "Lantern",
        "Swallow",
        "Promise",
        "Queen",
        "Wind",
        "Anchor",
        "Otter",
        "Crown",
        "Arrow",
        "Harvest",
        "Rose",
        "Falcon",
    ),
)


def derive_rng(seed: int, *parts: Any) -> random.Random:
    """A generator seeded from a stable digest of (seed, parts): same everywhere, every run."""
    text = "\x1f".join(str(p) for p in (seed,) + parts)
    return random.Random(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big"))


def _syllable(rng: random.Random, after_vowel: bool) -> str:
    vowel = rng.choice(_RARE_VOWELS) if rng.random() < 0.04 else rng.choice(_VOWELS)
    onset = rng.choice(_ONSETS[:-3] if after_vowel else _ONSETS)  # no vowel clusters
    return onset + vowel + rng.choice(_CODAS)


def _raw_name(rng: random.Random, kind: str) -> str:
    while True:
        n = 1 + (rng.random() < 0.8) + (rng.random() < 0.1)
        word = ""
        for _ in range(n):
            word += _syllable(rng, bool(word) and word[-1] in "aeiouyéåöü")
        suffix = rng.choice(_SUFFIXES.get(kind, ("",)))
        if not (suffix[:1] in "aeiouy" and word[-1] in "aeiouyéåöü"):  # no "Piavgeiia"
            word += suffix
        if 3 <= len(word) <= 10 and word[0].isalpha() and len(word) > n + 1:
            return word[0].upper() + word[1:]


# -- entities ----------------------------------------------------------------------------------
@dataclass(eq=False)
class Entity:
    """One thing in the world. ``attrs`` values are strings, ints or other entities."""

    kind: str  # region | mountain | river | town | person | guild | ship | species
    name: str  # how prose calls it: "Kesh", "Almora", "Maren Tolvi"
    title: str  # its wiki page title: "Kesh", "Almora River", "Silver Heron (ship)"
    key: str  # stable id "b3.town.2", seeds its article
    block: int
    attrs: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, item: str) -> Any:
        return self.attrs[item]

    def get(self, item: str, default: Any = None) -> Any:
        return self.attrs.get(item, default)


@dataclass
class Block:
    index: int
    region: Entity
    mountains: list[Entity]
    rivers: list[Entity]
    towns: list[Entity]
    people: list[Entity]
    guilds: list[Entity]
    ships: list[Entity]
    species: list[Entity]

    def entities(self) -> list[Entity]:
        """Article order: the region first, then what it contains."""
        return (
            [self.region]
            + self.mountains
            + self.rivers
            + self.towns
            + self.people
            + self.guilds
            + self.ships
            + self.species
        )


class World:
    """The blocks of one seed, built lazily and in order (block b depends on blocks < b)."""

    def __init__(self, seed: int):
        self.seed = seed
        self.blocks: list[Block] = []
        self._names: set[str] = set()
        rng = derive_rng(seed, "seas")
        self.seas = []
        while len(self.seas) < 5:
            sea = "Sea of " + self._unique(rng, "sea")
            self.seas.append(sea)
        # First names come from one pool per pronoun and recur across people, as real names do,
        # so the corpus carries which pronoun a first name takes. The pools have no spelling
        # pattern: only co-occurrence tells them apart. (The `small` model does not learn it in
        # 2,000 steps: see synth.glue_sets on what WNLI rests on instead.)
        rng = derive_rng(seed, "first-names")
        self.first_names = {p: [self._unique(rng, "person") for _ in range(FIRST_NAMES)] for p in ("she", "he")}

    def block(self, b: int) -> Block:
        while len(self.blocks) <= b:
            self.blocks.append(self._build_block(len(self.blocks)))
        return self.blocks[b]

    def _unique(self, rng: random.Random, kind: str) -> str:
        while True:
            name = _raw_name(rng, kind)
            if name not in self._names:
                self._names.add(name)
                return name

    def _build_block(self, b: int) -> Block:
        rng = derive_rng(self.seed, "block", b)
        uniq = lambda kind: self._unique(rng, kind)
        key = lambda kind, i: f"b{b}.{kind}.{i}"

        rname = uniq("region")
        region = Entity("region", rname, rname, key("region", 0), b, {"climate": rng.choice(CLIMATES)})
        if b > 0:
            region.attrs["borders"] = self.blocks[b - 1].region
        mountains = []
        for i in range(rng.choice((1, 2))):
            n = "Mount " + uniq("mountain")
            mountains.append(
                Entity("mountain", n, n, key("mountain", i), b, {"region": region, "height": rng.randrange(900, 4800)})
            )
        rivers = []
        for i in range(2):
            n = uniq("river")
            rivers.append(
                Entity(
                    "river",
                    n,
                    n + " River",
                    key("river", i),
                    b,
                    {"source": rng.choice(mountains), "region": region, "length": rng.randrange(40, 900)},
                )
            )
        rivers[0].attrs["mouth"] = rng.choice(self.seas)
        rivers[1].attrs["mouth"] = rivers[0]
        towns = []
        for i in range(8):
            n = uniq("town")
            towns.append(
                Entity(
                    "town",
                    n,
                    n,
                    key("town", i),
                    b,
                    {
                        "region": region,
                        "river": rivers[0] if i < 5 else rivers[1],
                        "founded": rng.randrange(880, 1650),
                        "industry": rng.choice(INDUSTRIES),
                        "population": rng.randrange(1500, 90000) if i == 0 else rng.randrange(300, 30000),
                    },
                )
            )
        region.attrs["capital"] = towns[0]
        people = []
        for i in range(8):
            pronoun = rng.choice(("she", "he"))
            first, last = rng.choice(self.first_names[pronoun]), uniq("person")
            home = rng.choice(towns)
            born = min(home["founded"] + rng.randrange(40, 420), 1950)
            occ = rng.choice(OCCUPATIONS)
            attrs: dict[str, Any] = {"birthplace": home, "born": born, "occupation": occ, "pronoun": pronoun}
            if born < 1930:
                attrs["died"] = born + rng.randrange(28, 92)
            if occ in WORK_KINDS:
                attrs["work"] = (
                    "The "
                    + rng.choice(SHIP_WORDS[0])
                    + " "
                    + rng.choice(
                        (
                            "Road",
                            "Harbour",
                            "Winter",
                            "Garden",
                            "Valley",
                            "Tower",
                            "Lake",
                            "Bells",
                            "Orchard",
                            "Voyage",
                            "Meadow",
                            "Shore",
                        )
                    )
                )
                attrs["work_kind"] = WORK_KINDS[occ]
            people.append(Entity("person", f"{first} {last}", f"{first} {last}", key("person", i), b, attrs))
        guilds = []
        for i, town in enumerate(rng.sample(towns, 2)):
            trade = town["industry"]
            n = f"{GUILD_MEMBERS[trade]}' Guild of {town.name}"
            if n in self._names:
                continue
            self._names.add(n)
            leader = rng.choice(people)
            g = Entity(
                "guild",
                n,
                n,
                key("guild", i),
                b,
                {"town": town, "trade": trade, "leader": leader, "founded": town["founded"] + rng.randrange(10, 300)},
            )
            guilds.append(g)
            leader.attrs["leads"] = g
            for p in people:
                if p["birthplace"] is town and "guild" not in p.attrs:
                    p.attrs["guild"] = g
        ships = []
        for i in range(2):
            yard = rng.choice(towns[:5])
            for _ in range(8):
                n = rng.choice(SHIP_WORDS[0]) + " " + rng.choice(SHIP_WORDS[1])
                if n not in self._names:
                    break
            else:  # the two-word names run out after ~100 blocks; town names never do
                n = f"{rng.choice(SHIP_WORDS[1])} of {yard.name}{'' if i == 0 else ' II'}"
            self._names.add(n)
            captain = rng.choice(people)
            ships.append(
                Entity(
                    "ship",
                    n,
                    n + " (ship)",
                    key("ship", i),
                    b,
                    {
                        "built_at": yard,
                        "built": max(yard["founded"] + 20, captain["born"] + 18),
                        "type": rng.choice(SHIP_TYPES),
                        "captain": captain,
                        "home_port": rng.choice(towns[:5]),
                    },
                )
            )
            captain.attrs["ship"] = ships[-1]
        species = []
        naturalists = [p for p in people if p["occupation"] == "naturalist"] or people
        used_kinds: set[str] = set()
        for i in range(5):
            animal = rng.choice([a for a in ANIMALS if a not in used_kinds])
            habitat = rng.choice(rivers if animal in WATER_ANIMALS else rivers + mountains)
            used_kinds.add(animal)
            common = f"{habitat.name.removeprefix('Mount ')} {animal}"
            if common in self._names:
                continue
            self._names.add(common)
            by = rng.choice(naturalists)
            genus = _raw_name(rng, "genus")
            species.append(
                Entity(
                    "species",
                    common,
                    common,
                    key("species", i),
                    b,
                    {
                        "animal": animal,
                        "colour": rng.choice(COLOURS),
                        "diet": ANIMALS[animal],
                        "habitat": habitat,
                        "described_by": by,
                        "described": by["born"] + rng.randrange(20, min(50, by.get("died", 9999) - by["born"])),
                        "latin": f"{genus} {_raw_name(rng, 'epithet').lower()}",
                    },
                )
            )
        return Block(b, region, mountains, rivers, towns, people, guilds, ships, species)
