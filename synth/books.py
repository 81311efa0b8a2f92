"""Synthetic books: plain-text novels set in the invented world, one UTF-8 file per book.

A book follows one person of a block on a journey through the block's towns, with a companion.
Its chapters mix narration, exposition and dialogue in which the characters state the world's
facts (the same facts the wiki articles state, in other words and inside quotes) and give their
opinions of places with the adjectives the sentiment task uses. Paragraphs are wrapped at 70
columns like a Project Gutenberg text, with blank lines between them, under "Chapter N" headings.

The design choice: a book is grown paragraph by paragraph against a byte budget, so the books of
a corpus hit their share of the requested size closely whatever the size, at the cost of the last
book of a corpus ending mid-journey.
"""

from __future__ import annotations

import unicodedata

from synth.phrases import fact_object, fix_articles, phrase, pick_fact
from synth.words import NEGATIVE, POSITIVE
from synth.world import Block, Entity, World, derive_rng

WILDLIFE = (
    "A {a} went past them, looking for {d}.",
    "{h} watched a {a} hunting for {d} near the {river}.",
    '"Every {a} feeds on {d}," said {f}.',
    "There were many {a}s here, and {h} saw one catch {d}.",
    "The {s} came out at dusk to look for {d}, as every {a} does.",
    "{h} knew that a {a} eats mostly {d}.",
)
NARRATION = (
    "It was {time} when {h} reached {town}.",
    "The road followed the {river} for many miles, and the water was {water} under a {sky} sky.",
    "{h} had not slept well, and {pron} was tired of the cold wind that came down from {mount}.",
    "They walked in silence for a long time, each thinking about what had happened the night before.",
    "The inn was small and warm, and the woman who kept it gave them bread, cheese and a jug of beer.",
    "From the window {h} could see the boats on the {river} and the lights of the houses on the far bank.",
    "There was a smell of smoke and wet leaves in the air, and somewhere a dog was barking.",
    "{f} laughed, but {h} could tell that {fpron} was worried.",
    "In the morning the rain had stopped, and the whole valley shone in the sun.",
    "Nobody in {town} seemed to remember the old house, or the family who had lived there.",
    "{h} thought of {poss} mother, and of the long summers by the river when {pron} was a child.",
    "The market was full of people selling fish, apples, wool and copper pots.",
    "At the bridge an old man was mending a net, and he did not look up when they passed.",
    "The {ship} lay at anchor below the town, her sails folded and her deck empty.",
    "They took a room above the bakery and stayed there for three days.",
    "It began to snow as they climbed the last hill before {town}.",
    "{h} wrote a long letter that night, but in the morning {pron} tore it up.",
    "The river was high after the spring rains, brown and fast and full of branches.",
    "For a while neither of them spoke. Then {f} stood up and went to the door.",
    "They found the house at the end of a narrow street, behind a wall covered with ivy.",
    "The streets of {town} were {pos} in the evening light, and {h} felt almost happy.",
    "The weather turned {neg} and grey, and the journey seemed longer than it was.",
    "On the far side of the valley the snow still lay on {mount}.",
    "A boy ran beside them for a while, asking questions they could not answer.",
    "{h} bought a map of {region} from a stall near the church and studied it by candlelight.",
    "The ferryman wanted two coins each, and he would not take less.",
    "When the bells rang for the evening service, the square slowly emptied.",
    "Nothing {h} had read in books had prepared {obj} for the size of the {river}.",
    "The fields on either side of the road were {pos} with {colour} flowers.",
    "A cart loaded with {cargo} passed them, and the driver raised his hat.",
    "{f} had been to {town} once before, years ago, and said that it had hardly changed.",
    "They ate their supper by the fire while the rain beat against the shutters.",
    "The church clock struck {hour}, and {h} realised how late it was.",
    "Below the walls the {river} turned slowly towards the {direction}.",
    "{h} was not used to walking so far, and {poss} feet hurt.",
    "The people of {town} were {pos} to strangers, though the town itself looked {neg}.",
    "It was colder than {h} had expected, and {pron} wished {pron} had brought a heavier coat.",
    "In a shop near the river {h} found an old copy of a book about {region}.",
    "Somewhere across the water a woman was singing, and they stopped to listen.",
    "The path became steep and narrow, and they had to lead the horse.",
    "By noon they could see the roofs of {town} and the smoke of its chimneys.",
    "{f} knew every story about the {river}, and told most of them twice.",
    "The captain of a barge offered to take them as far as {town} for the price of a meal.",
)
COLOURS = ("yellow", "white", "blue", "red", "violet")
CARGOES = ("timber", "barrels of wine", "sacks of salt", "wool", "copper pots", "glass")
HOURS = ("nine", "ten", "eleven", "midnight")
DIRECTIONS = ("north", "south", "east", "west", "sea")
ASIDES = ("said {s}", "{s} said", "replied {s}", "{s} answered", "{s} said quietly", "{s} said, without looking up")
TIMES = (
    "late in the afternoon",
    "almost midnight",
    "early in the morning",
    "nearly dark",
    "market day",
    "the first warm day of spring",
    "the end of a long, wet week",
)
SKIES = ("grey", "clear", "low", "heavy", "pale", "cloudless")
WATERS = ("dark", "clear", "still", "brown", "cold", "quick")


def slugify(text: str) -> str:
    ascii_ = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return "-".join("".join(c if c.isalnum() else " " for c in ascii_.lower()).split())


def wrap(paragraph: str, width: int = 70) -> str:
    """Greedy wrap at ``width`` columns between words (like textwrap.fill, several times faster)."""
    lines, line = [], ""
    for word in paragraph.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return "\n".join(lines)


def _lower_start(sentence: str) -> str:
    return "t" + sentence[1:] if sentence.startswith("The ") else sentence


class Book:
    """One book about ``block``: the cast, then paragraphs on demand."""

    def __init__(self, world: World, block: Block, index: int):
        self.rng = rng = derive_rng(world.seed, "book", index)
        self.block, self.index = block, index
        self.hero, self.friend = rng.sample(block.people, 2)
        self.route = rng.sample(block.towns, len(block.towns))
        town = self.route[0]
        patterns = (
            "The {a} {n} of {t}",
            "Down the {r}",
            "{h} of {t}",
            "A Winter in {t}",
            "The Road to {t}",
            "Letters from {g}",
            "Beyond {m}",
        )
        self.title = rng.choice(patterns).format(
            a=rng.choice(("Quiet", "Last", "Silver", "Long", "Lost", "Bright")),
            n=rng.choice(("Summer", "Bridge", "Harbour", "Garden", "Voyage", "Bells")),
            t=town.name,
            r=town["river"].name,
            h=self.hero.name,
            g=block.region.name,
            m=block.mountains[0].name,
        )
        self.slug = f"{index:05d}-{slugify(self.title)}"

    def _ctx(self, town: Entity) -> dict[str, str]:
        rng, h, f = self.rng, self.hero, self.friend
        pron = h["pronoun"]
        return {
            "h": h.name.split(" ")[0],
            "f": f.name.split(" ")[0],
            "town": town.name,
            "river": town["river"].name,
            "mount": self.block.mountains[0].name,
            "region": self.block.region.name,
            "ship": rng.choice(self.block.ships).name,
            "pron": pron,
            "poss": "her" if pron == "she" else "his",
            "obj": "her" if pron == "she" else "him",
            "fpron": f["pronoun"],
            "time": rng.choice(TIMES),
            "sky": rng.choice(SKIES),
            "water": rng.choice(WATERS),
            "pos": rng.choice(POSITIVE),
            "neg": rng.choice(NEGATIVE),
            "colour": rng.choice(COLOURS),
            "cargo": rng.choice(CARGOES),
            "hour": rng.choice(HOURS),
            "direction": rng.choice(DIRECTIONS),
        }

    def _fact(self, town: Entity) -> str:
        """A fact about the chapter's town or something near it, phrased plainly."""
        rng = self.rng
        pool = [town, town["river"], self.block.region] + [
            e for e in self.block.entities() if e.kind in ("species", "ship", "guild", "person")
        ]
        subject = rng.choice(pool)
        rel, value = pick_fact(subject, rng)
        name = subject.name
        return phrase(rel, name, fact_object(value), rng)[0]

    def paragraph(self, town: Entity) -> str:
        rng = self.rng
        c = self._ctx(town)
        roll = rng.random()
        speaker, other = (c["h"], c["f"]) if rng.random() < 0.5 else (c["f"], c["h"])
        aside = rng.choice(ASIDES).format(s=speaker)
        if roll < 0.45:
            n = rng.randrange(2, 6)
            sentences = [t.format(**c) for t in rng.sample(NARRATION, n)]
            if rng.random() < 0.5:  # what the animals of the valley eat, said of their kind
                sp = rng.choice(self.block.species)
                sentences.insert(
                    rng.randrange(len(sentences) + 1),
                    rng.choice(WILDLIFE).format(a=sp["animal"], d=sp["diet"], s=sp.name, **c),
                )
            for _ in range(rng.choice((0, 1, 1, 2))):
                sentences.insert(rng.randrange(len(sentences) + 1), self._fact(town))
            return " ".join(sentences)
        if roll < 0.65:
            fact = self._fact(town)
            return rng.choice(
                (
                    f'"{fact[:-1]}," {aside}.',
                    f'"Is it true that {_lower_start(fact[:-1])}?" asked {other}.',
                    f'"{fact[:-1]}," {aside}. "My grandfather told me that when I was a child."',
                    f'{other} looked at the map. "{fact}"',
                )
            )
        if roll < 0.85:
            pos, neg = c["pos"], c["neg"]
            return rng.choice(
                (
                    f'"{town.name} is {pos}," {aside}. "I could live here."',
                    f'"I find it {neg}," {aside}. "The streets are dirty and the people are not {pos}."',
                    f'"The inn was not {pos} at all," {aside}.',
                    f'"It is a {pos} place," {aside}, "but the winters must be {neg}."',
                    f'"Nothing here is {neg}," {aside}. "You only have to look."',
                    f"{other} said nothing, but thought the town {neg} and the river {neg}.",
                )
            )
        town2 = rng.choice(self.route)
        return rng.choice(
            (
                f'"How far is it to {town2.name}?" asked {other}.\n\n"Two days, if the weather holds," {aside}.',
                f'"We should have stayed in {town2.name}," {aside}.\n\n"Perhaps," said {other}. "But we did not."',
                f'"Where are you going?" the ferryman asked.\n\n"To {town2.name}," {aside}.',
            )
        )

    def write(self, budget: int, width: int = 70) -> str:
        """The whole book text, grown until it reaches ``budget`` UTF-8 bytes."""
        rng = self.rng
        head = f"{self.title}\n\nby {self.friend.name}\n\n"
        parts, size, chapter = [head], len(head.encode()), 0
        while size < budget:
            chapter += 1
            town = self.route[(chapter - 1) % len(self.route)]
            heading = f"\nChapter {chapter}\n\n"
            parts.append(heading)
            size += len(heading)
            chapter_end = size + rng.randrange(3000, 9000)
            while size < min(budget, chapter_end):
                text = fix_articles(self.paragraph(town))
                para = "\n".join(wrap(p, width) for p in text.split("\n"))
                para += "\n\n"
                parts.append(para)
                size += len(para.encode())
        return "".join(parts).rstrip("\n") + "\n"


def book_for(world: World, index: int, blocks_used: int) -> Book:
    """Book ``index`` is set in block ``index % blocks_used``: the blocks the wiki described."""
    return Book(world, world.block(index % max(1, blocks_used)), index)
