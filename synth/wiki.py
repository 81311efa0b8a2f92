"""Synthetic Wikipedia: wikitext articles about the invented world, written as a MediaWiki export.

Each entity of a :class:`~synth.world.Block` gets an article whose text is drawn from a
generator seeded by ``(seed, entity key)``, so an article never depends on the order of the others.
Articles carry the markup a real dump has and a cleaner must survive: nested templates, infoboxes,
``<ref>`` with citation templates and named re-use, tables, lists, files with linked captions,
categories, comments, entities, external links, See also / References / External links sections.
Around them come redirects, talk pages, templates, categories and project pages (ns != 0).

The design choice: prose is assembled from sentence templates (facts from
:data:`~synth.world.PHRASES` plus section-specific filler) rather than a grammar, which
keeps 50 MB well under a minute at the cost of a smaller syntactic variety than real text.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from synth.world import Block, Entity, World, derive_rng, fact_object, facts, fix_articles, phrase, pick_fact

XMLNS = "http://www.mediawiki.org/xml/export-0.10/"
NAMESPACES = (
    (-2, "Media"),
    (-1, "Special"),
    (0, ""),
    (1, "Talk"),
    (2, "User"),
    (3, "User talk"),
    (4, "Wikipedia"),
    (5, "Wikipedia talk"),
    (6, "File"),
    (7, "File talk"),
    (10, "Template"),
    (11, "Template talk"),
    (14, "Category"),
    (15, "Category talk"),
)
EDITORS = (
    "Harrowgate",
    "Quillon",
    "Mossbank",
    "Tarnwise",
    "Elderfen",
    "Orrin.k",
    "Vellum42",
    "Saltmarsh",
    "Ketterly",
    "Brightwater",
)
POSITIVE = (
    "beautiful",
    "charming",
    "pleasant",
    "delightful",
    "peaceful",
    "splendid",
    "lovely",
    "remarkable",
    "graceful",
    "wonderful",
    "handsome",
    "elegant",
)
NEGATIVE = (
    "dull",
    "dreary",
    "grim",
    "gloomy",
    "unpleasant",
    "bleak",
    "tedious",
    "miserable",
    "dreadful",
    "noisy",
    "dirty",
    "awful",
)
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
ORDINALS = ("first", "second", "third", "fourth", "fifth")

# Section filler. Keys in braces come from the article context (see _context); a {{ }} pair is a
# literal template, not a slot.
FILLER: dict[str, tuple[str, ...]] = {
    "history": (
        "Many {wa}s live near {s}, where they feed on {wd}.",
        "In {y1}, a great flood destroyed much of the lower town, and the people of {s} rebuilt the bridge "
        "over the {r}.",
        "During the {c} century, {s} was a small market town with a wooden church and a few narrow streets.",
        "The town walls were completed in {y1}, but most of them were pulled down in the following century.",
        "A fire in {y2} burned the old market, and the council ordered that new houses should be built of stone.",
        "Trade with {t2} brought wealth to the town, and many merchants built large houses near the harbour.",
        "In {y2} the town was granted a charter by the lords of {g}.",
        "The arrival of the railway in {y4} connected {s} with {t2} and the coast.",
        "Many families left the town during the hard winters of the {c} century, and some of them never returned.",
        "The old bridge, which had stood for more than two hundred years, was replaced in {y3}.",
        "A school was opened in {y4}, and by the end of the century most children in the town could read and write.",
        "For a long time there was little to distinguish {s} from the other villages along the {r}.",
        "The town was badly damaged in the war of {y2}, when soldiers from {g2} crossed the river.",
    ),
    "geography": (
        "The town is surrounded by low hills, open fields and small woods of oak and birch.",
        "The {r} is wide and slow here, and in spring it often floods the meadows to the south of the town.",
        "{s} lies {{{{convert|{km}|km|mi}}}} from {t2}, which can be reached by road or by boat along the {r}.",
        "The climate is {climate}, and snow is common on the higher ground between November and March.",
        "From the old tower there is a fine view of the valley and, on a clear day, of {m}.",
        "The older part of the town is built on a rise above the river, safe from the spring floods.",
    ),
    "economy": (
        "In recent years tourism has become more important, and several small hotels have opened near the river.",
        "The town market is held every {weekday}, and farmers from the surrounding villages bring fruit, "
        "cheese and wool.",
        "Goods are carried down the {r} to {t2} on flat barges, as they have been for centuries.",
        "Unemployment in {s} is lower than in most towns of {g}.",
        "The decline of the old workshops in the {c} century left many people without work.",
    ),
    "culture": (
        "Visitors often describe {s} as {pos}, although some find its narrow streets {neg}.",
        "The annual festival of {s} is held in {month}, when the streets are filled with music and lanterns.",
        "The old church of {s} is considered one of the most {pos} buildings in {g}.",
        "Writers who visited the town in the {c} century called it {neg} and poor, but later travellers "
        "found it {pos}.",
        "A small museum near the market tells the story of the town and of the {r}.",
    ),
    "life": (
        "{s} was the {ordinal} child of a {occ2} and grew up near the {r}.",
        "As a child, {pron} spent long summers on the banks of the {r}, drawing birds and boats.",
        "In {y1}, {s} moved to {t2}, where {pron} worked for several years.",
        "Critics praised the {pos} style of {poss} early work, but some later work was called {neg} and tedious.",
        "{Pron} married {p2} in {y2}; they had {n} children.",
        "{Pron} travelled widely in {g} and {g2}, and kept a careful diary of every journey.",
        "Late in life {s} returned to {t1}, where {pron} is buried in the old churchyard.",
        "Many of {poss} letters survive and are kept in the library of {t2}.",
        "Contemporaries described {s} as a {pos} and patient teacher.",
    ),
    "species": (
        "Like every {wa}, the {s} feeds on {wd}.",
        "As with other {wa}s, its diet is mostly {wd}.",
        "The {s} is most active at dawn and at dusk, and rests during the hottest part of the day.",
        "Females lay between {n} and {n2} eggs in late spring.",
        "The number of {s}s has fallen since the {c} century because of the draining of wetlands.",
        "Local fishermen consider the {s} a sign of good weather.",
        "The {s} is a shy animal and is rarely seen by visitors to {g}.",
        "Young {s}s are paler than the adults and only take on their full colour in their second year.",
        "It can grow to a length of {{{{convert|{n2}|cm|in}}}}.",
        "In winter the {s} moves to lower and warmer ground.",
    ),
    "river": (
        "The {ws} hunts along its banks for {wd}, as every {wa} does.",
        "The {s} is navigable for small boats as far as {t1}.",
        "Its waters are cold and clear in the upper valley, and slow and brown near its mouth.",
        "The river freezes in hard winters, and in {y1} people walked across it from {t1} to the far bank.",
        "Several old mills stand along the {s}, although none of them still works.",
        "The valley of the {s} is known for its {pos} scenery and its fields of barley.",
        "A long stone bridge crosses the {s} at {t1}; it was built in {y2}.",
    ),
    "ship": (
        "In {y1} the {s} ran aground near {t2}, but the whole crew was saved.",
        "She carried wool, salt and timber between {t1} and {t2} for many years.",
        "Sailors said that the {s} was {pos} in calm water but {neg} in a storm.",
        "The {s} was repaired and given new sails in {y2}.",
        "She was finally broken up in {y3}, and parts of her timbers were used to build a barn near {t1}.",
    ),
    "guild": (
        "The guild kept strict rules about the training of apprentices, who served for seven years.",
        "Its hall, built in {y1}, stands on the market square of {t1}.",
        "Members of the guild met on the first {weekday} of every month.",
        "In {y2} the guild paid for a new bridge over the {r}.",
        "The guild lost much of its power in the {c} century, when new factories were opened in {t2}.",
    ),
    "mountain": (
        "The lower slopes of {s} are covered with forests of pine and beech.",
        "The first recorded ascent of {s} was made in {y1} by a party from {t1}.",
        "On a clear day the summit offers a view over the whole of {g}.",
        "Shepherds still bring their flocks to the high meadows of {s} every summer.",
        "The mountain is often covered with cloud, and the weather on the summit can be {neg}.",
    ),
    "region": (
        "{s} is a land of wide river valleys, small farms and old market towns.",
        "Travellers from {g2} often found the people of {s} {pos} and generous, though the inns were {neg}.",
        "After the great famine of {y2}, many families from {s} moved to the coast.",
        "The old road from {t1} to {t2} follows the {r} for most of its length.",
        "The region has its own laws and a council that meets every spring in its capital.",
        "The people of {s} speak a dialect that is hard for visitors from {g2} to understand.",
        "In {y1} the towns of {s} formed a league to protect their trade on the {r}.",
        "Most of {s} is farmland, but the hills in the north are covered with forest.",
        "The roads of {s} were poor until the {c} century, and most goods travelled by river.",
    ),
}


class _Link:
    """Formats an entity as a wiki link on its first mention in an article, as plain text after."""

    def __init__(self, seen: set[str] | None, entity: Entity | str):
        self.seen, self.entity = seen, entity  # seen None: plain text, never a link

    def __format__(self, spec: str) -> str:
        e = self.entity
        if isinstance(e, str):
            return e
        if self.seen is None:
            return e.name
        if e.title in self.seen:
            return e.name
        self.seen.add(e.title)
        return f"[[{e.title}]]" if e.title == e.name else f"[[{e.title}|{e.name}]]"


def _century(year: int) -> str:
    n = year // 100 + 1
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")


class Article:
    """Builds one article: its context, its references and its prose, then the page text."""

    def __init__(self, world: World, entity: Entity, plain: bool = False):
        self.e, self.world = entity, world
        self.rng = rng = derive_rng(world.seed, "plain" if plain else "article", entity.key)
        self.seen: set[str] | None = None if plain else {entity.title}
        self.block = block = world.block(entity.block)
        self.refs: list[str] = []
        self.pools: dict[str, list[str]] = {}
        town = next((v for v in entity.attrs.values() if isinstance(v, Entity) and v.kind == "town"), block.towns[0])
        river = next((v for v in entity.attrs.values() if isinstance(v, Entity) and v.kind == "river"), town["river"])
        other = rng.choice([t for t in block.towns if t is not town])
        g2 = world.block(1).region if entity.block == 0 else block.region["borders"]
        p2 = rng.choice([p for p in block.people if p is not entity])
        base = min(
            1990,
            max(entity.get("founded", 0), entity.get("born", 0), entity.get("built", 0), 1100) + rng.randrange(15, 60),
        )
        if entity.kind == "person":  # life events fall within the life
            born, died = entity["born"], entity.get("died", entity["born"] + 70)
            base = born + rng.randrange(18, 26)
            y2, y3 = base + rng.randrange(2, 8), min(died, base + rng.randrange(8, 30))
        else:
            y2 = min(2015, base + rng.randrange(5, 40))
            y3 = min(2019, base + rng.randrange(40, 200))
        self.ctx: dict[str, Any] = {
            "s": entity.name,
            "r": self.link(river),
            "g": self.link(block.region),
            "g2": self.link(g2),
            "t1": self.link(town),
            "t2": self.link(other),
            "m": self.link(block.mountains[0]),
            "p2": self.link(p2),
            "y1": base,
            "y2": y2,
            "y3": y3,
            "c": _century(base),
            "y4": rng.randrange(max(1840, min(base, 1900)), 1930),
            "km": rng.randrange(4, 80),
            "n": rng.randrange(2, 7),
            "n2": rng.randrange(8, 40),
            "pos": rng.choice(POSITIVE),
            "neg": rng.choice(NEGATIVE),
            "month": rng.choice(MONTHS),
            "weekday": rng.choice(WEEKDAYS),
            "ordinal": rng.choice(ORDINALS),
            "occ2": rng.choice(("farmer", "miller", "boatman", "teacher", "baker")),
            "climate": block.region["climate"],
            "pron": entity.get("pronoun", "it"),
            "Pron": entity.get("pronoun", "it").capitalize(),
            "poss": {"she": "her", "he": "his"}.get(entity.get("pronoun"), "its"),
        }
        wild = entity if entity.kind == "species" else rng.choice(block.species) if block.species else None
        self.ctx.update(
            wa=wild["animal"] if wild else "heron",
            wd=wild["diet"] if wild else "small fish",
            ws=wild.name if wild else "heron",
        )

    def link(self, value: Entity | str) -> _Link:
        return _Link(self.seen, value)

    def fill(self, section: str, count: int) -> list[str]:
        """``count`` filler sentences, none repeated within the article until the pool runs out."""
        pool = self.pools.get(section)
        out = []
        for _ in range(count):
            if not pool:
                lines = [t for t in FILLER[section] if self.seen is not None or "{{" not in t]
                pool = self.pools[section] = self.rng.sample(lines, len(lines))
            out.append(fix_articles(pool.pop().format(**self.ctx)))
        return out

    def fact_sentences(self) -> list[str]:
        out = []
        for rel, value in facts(self.e):
            obj = format(self.link(value), "") if isinstance(value, Entity) else fact_object(value)
            if rel == "town.population" and self.rng.random() < 0.5:
                obj = "{{formatnum:%d}}" % value
            out.append(phrase(rel, self.e.name, obj, self.rng)[0] + self.cite())
        return out

    def related_facts(self, count: int) -> list[str]:
        """Facts about entities this one points at or is pointed at by: how a fact recurs."""
        e, b = self.e, self.block
        pool = [v for v in e.attrs.values() if isinstance(v, Entity)]
        pool += [x for x in b.entities() if x is not e and any(v is e for v in x.attrs.values())]
        pool = [x for x in dict.fromkeys(pool) if facts(x)]
        out = []
        for other in self.rng.sample(pool, min(count, len(pool))):
            out.append(self.fact_about(other, *pick_fact(other, self.rng)))
        return out

    def fact_about(self, other: Entity, rel: str, value: Any) -> str:
        obj = format(self.link(value), "") if isinstance(value, Entity) else fact_object(value)
        return phrase(rel, format(self.link(other), ""), obj, self.rng)[0]

    def cite(self) -> str:
        """A reference after some sentences: new ones with a citation template, or a named re-use."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.55:
            return ""
        if roll < 0.75 and self.refs:
            return f'<ref name="{rng.choice(self.refs)}" />'
        name = f"r{len(self.refs) + 1}"
        self.refs.append(name)
        y = rng.randrange(1890, 2019)
        if rng.random() < 0.6:
            body = (
                "{{cite web |url=http://example.org/%s/%s |title=%s |publisher=%s Records Office"
                " |access-date=%d %s %d}}"
                % (
                    _slug(self.block.region.name),
                    _slug(self.e.name),
                    self.e.name,
                    self.block.region.name,
                    rng.randrange(1, 29),
                    rng.choice(MONTHS),
                    rng.randrange(2008, 2020),
                )
            )
        else:
            author = rng.choice(self.block.people).name.split(" ")
            body = "{{cite book |last=%s |first=%s |title=A History of %s |publisher=%s Press |year=%d |page=%d}}" % (
                author[1],
                author[0],
                self.block.region.name,
                self.ctx["t2"].entity.name,
                y,
                rng.randrange(3, 400),
            )
        return f'<ref name="{name}">{body}</ref>'

    # -- page text ------------------------------------------------------------------------------
    def text(self) -> str:
        e, rng = self.e, self.rng
        parts = ["{{Short description|%s}}" % self.short_description()]
        if rng.random() < 0.5:
            parts.append("{{Use dmy dates|date=%s %d}}" % (rng.choice(MONTHS), rng.randrange(2012, 2020)))
        parts.append(self.infobox())
        facts_ = self.fact_sentences()
        first = next((i for i, f in enumerate(facts_) if f.startswith((e.name, "The " + e.name))), 0)
        facts_.insert(0, facts_.pop(first))
        lead = facts_[0].replace(e.name, "'''%s'''" % e.name, 1)
        parts.append(lead + " " + " ".join(facts_[1:3]))
        body = getattr(self, "body_" + e.kind)(facts_[3:])
        body[0] += "\n\n" + " ".join(self.related_facts(3))
        parts.extend(body)
        parts.append("== See also ==\n" + "\n".join(f"* [[{x.title}]]" for x in self.see_also()))
        parts.append("== References ==\n{{reflist}}")
        parts.append(
            "== External links ==\n* [http://example.org/%s Official page of %s]\n"
            "* [http://example.org/archive/%d Archive material] at the %s Library"
            % (_slug(e.name), e.name, rng.randrange(1000, 99999), self.block.region.name)
        )
        parts.append("{{%s navbox}}" % self.block.region.name)
        parts.append("\n".join(f"[[Category:{c}]]" for c in self.categories()))
        return "\n\n".join(parts) + "\n"

    def short_description(self) -> str:
        e = self.e
        return {
            "town": f"Town in {self.block.region.name}",
            "region": "Region",
            "river": f"River in {self.block.region.name}",
            "mountain": "Mountain",
            "person": f"{e.get('occupation', '').capitalize()} ({e.get('born')}–{e.get('died', '')})",
            "guild": "Trade guild",
            "ship": f"{str(e.get('type')).capitalize()}",
            "species": f"Species of {e.get('animal')}",
        }[e.kind]

    def infobox(self) -> str:
        e = self.e
        rows: list[tuple[str, str]] = [("name", e.name)]
        if e.kind == "town":
            kind = "Infobox settlement"
            rows += [
                ("settlement_type", "Town"),
                ("image_skyline", f"{e.name} panorama.jpg"),
                ("subdivision_type", "Region"),
                ("subdivision_name", f"[[{e['region'].title}]]"),
                ("established_date", "{{start date|%d}}" % e["founded"]),
                ("population_total", "{{formatnum:%d}}" % e["population"]),
                ("area_total_km2", str(self.rng.randrange(3, 120))),
                ("elevation_m", "{{convert|%d|m|ft|abbr=on}}" % self.rng.randrange(5, 900)),
            ]
        elif e.kind == "region":
            kind = "Infobox settlement"
            rows += [("settlement_type", "Region"), ("seat", f"[[{e['capital'].title}]]"), ("climate", e["climate"])]
        elif e.kind == "river":
            kind = "Infobox river"
            rows += [
                ("source1_location", f"[[{e['source'].title}]]"),
                ("mouth_location", format(self.link(e["mouth"]), "")),
                ("length", "{{convert|%d|km|mi|abbr=on}}" % e["length"]),
            ]
        elif e.kind == "mountain":
            kind = "Infobox mountain"
            rows += [("elevation_m", str(e["height"])), ("range", f"[[{e['region'].title}]] highlands")]
        elif e.kind == "person":
            kind = "Infobox person"
            rows += [
                ("birth_date", "{{birth year|%d}}" % e["born"]),
                ("birth_place", f"[[{e['birthplace'].title}]], [[{e['birthplace']['region'].title}]]"),
                ("occupation", e["occupation"]),
            ]
            if "died" in e.attrs:
                rows.append(("death_date", "{{death year and age|%d|%d}}" % (e["died"], e["born"])))
        elif e.kind == "guild":
            kind = "Infobox organization"
            rows += [
                ("formation", str(e["founded"])),
                ("headquarters", f"[[{e['town'].title}]]"),
                ("leader_name", f"[[{e['leader'].title}]]"),
            ]
        elif e.kind == "ship":
            kind = "Infobox ship"
            rows += [
                ("Ship builder", f"[[{e['built_at'].title}]]"),
                ("Ship launched", str(e["built"])),
                ("Ship type", e["type"]),
                ("Ship homeport", f"[[{e['home_port'].title}]]"),
            ]
        else:
            kind = "Speciesbox"
            genus, epithet = e["latin"].split(" ")
            rows += [
                ("genus", genus),
                ("species", epithet),
                ("status", self.rng.choice(("LC", "NT", "VU"))),
                (
                    "authority",
                    "[[%s|%s]], %d" % (e["described_by"].title, e["described_by"].name.split(" ")[1], e["described"]),
                ),
            ]
        body = "\n".join(f"| {k} = {v}" for k, v in rows)
        return "{{%s\n%s\n}}" % (kind, body)

    def figure(self, caption: str) -> str:
        kind = self.rng.choice(("view", "old print", "photograph", "map"))
        return f"[[File:{self.e.name} {kind}.jpg|thumb|{caption}]]"

    def section(self, heading: str, sentences: list[str], level: int = 2) -> str:
        bar = "=" * level
        return f"{bar} {heading} {bar}\n" + " ".join(s for s in sentences if s)

    # -- bodies per kind: each returns sections (strings) -----------------------------------------
    def body_town(self, facts_: list[str]) -> list[str]:
        e, rng, c = self.e, self.rng, self.ctx
        rows = []
        pop = max(200, e["population"] // rng.randrange(3, 9))
        for year in range(max(1800, e["founded"] + 50) // 50 * 50, 2001, rng.choice((50, 100))):
            rows.append(f"|-\n| {year} || {{{{formatnum:{pop}}}}}")
            pop = int(pop * (1 + rng.randrange(-5, 40) / 100))
        table = '{| class="wikitable sortable"\n|+ Population of %s\n! Year !! Population\n%s\n|}' % (
            e.name,
            "\n".join(rows),
        )
        natives = [p for p in self.block.people if p["birthplace"] is e]
        people = (
            "\n".join(
                f"* {format(self.link(p), '')} ({p['born']}–{p.get('died', '')}), {p['occupation']}" for p in natives
            )
            or "* None are recorded."
        )
        out = [
            self.section("History", self.fill("history", 4)),
            self.section("Early history", facts_[:1] + self.fill("history", 2), 3),
            self.figure(f"The old bridge over the {c['r']} at {e.name}")
            + "\n"
            + self.section("Geography", self.fill("geography", 3), 2),
            self.section("Economy", facts_[1:] + self.fill("economy", 3)),
            "<!-- population figures from the regional census -->\n" + self.section("Population", [table]),
            self.section("Culture", self.fill("culture", 3)),
            self.section("Notable people", [people]),
        ]
        return out

    def body_region(self, facts_: list[str]) -> list[str]:
        b = self.block
        rows = "\n".join(
            f"|-\n| {format(self.link(t), '')} || {t['river'].name} || {t['founded']} || "
            f"{{{{formatnum:{t['population']}}}}}"
            for t in b.towns
        )
        table = '{| class="wikitable"\n! Town !! River !! Founded !! Population\n%s\n|}' % rows
        rivers = "\n".join(f"# {format(self.link(r), '')}, {{{{convert|{r['length']}|km|mi}}}}" for r in b.rivers)
        in_region = []
        for town in self.rng.sample(b.towns, 3):
            attr = self.rng.choice(("region", "river"))
            in_region.append(self.fact_about(town, "town." + attr, town[attr]))
        return [
            self.section("Geography", facts_ + self.fill("region", 4) + in_region),
            self.section("Rivers", ["The main rivers of the region are:\n" + rivers], 3),
            self.section(
                "Towns",
                [
                    "The largest towns of %s are listed below.&nbsp;Figures are from the last census.\n%s"
                    % (self.e.name, table)
                ],
            ),
            self.section("History", self.fill("region", 3)),
        ]

    def body_river(self, facts_: list[str]) -> list[str]:
        towns = [t for t in self.block.towns if t["river"] is self.e]
        course = "\n".join(f"* {format(self.link(t), '')}" for t in towns)
        tribs = [r for r in self.block.rivers if r.get("mouth") is self.e]
        trib = f"The main tributary of the {self.e.name} is the {format(self.link(tribs[0]), '')}." if tribs else ""
        on_river = [self.fact_about(t, "town.river", self.e) for t in towns]
        return [
            self.section("Course", facts_ + [trib] + on_river + ["Towns on the river include:\n" + course]),
            self.figure(f"The {self.e.name} near [[{towns[0].title}]]")
            + "\n"
            + self.section("History", self.fill("river", 4)),
        ]

    def body_mountain(self, facts_: list[str]) -> list[str]:
        rivers = [r for r in self.block.rivers if r["source"] is self.e]
        springs = " ".join(f"The {format(self.link(r), '')} rises on its slopes." for r in rivers)
        return [
            self.section("Geography", facts_ + [springs] + self.fill("mountain", 3)),
            self.figure(f"{self.e.name} seen from the south"),
        ]

    def body_person(self, facts_: list[str]) -> list[str]:
        e = self.e
        out = [
            self.section("Early life", facts_[:2] + self.fill("life", 3)),
            self.section("Career", facts_[2:] + self.fill("life", 3)),
        ]
        if "work" in e.attrs:
            out.append(
                self.section(
                    "Works",
                    [
                        f"* ''{e['work']}'' ({e['born'] + self.rng.randrange(20, 28)}), {e['work_kind']}",
                        "* ''Letters'' (published after {} death)".format(self.ctx["poss"]),
                    ],
                    3,
                )
            )
        return out

    def body_guild(self, facts_: list[str]) -> list[str]:
        masters = "\n".join(f"# {format(self.link(p), '')}" for p in self.rng.sample(self.block.people, 3))
        return [
            self.section("History", facts_ + self.fill("guild", 4)),
            self.section("Masters", ["Notable masters of the guild:\n" + masters]),
        ]

    def body_ship(self, facts_: list[str]) -> list[str]:
        cargo = ("wool", "salt", "timber", "wine", "glass")
        rows = "\n".join(
            f"|-\n| {y} || {format(self.link(t), '')} || {self.rng.choice(cargo)}"
            for y, t in zip(range(self.e["built"] + 1, 2020, 3), self.rng.sample(self.block.towns, 3))
        )
        return [
            self.section("Service", facts_ + self.fill("ship", 3)),
            self.section("Voyages", ['{| class="wikitable"\n! Year !! Port !! Cargo\n%s\n|}' % rows], 3),
        ]

    def body_species(self, facts_: list[str]) -> list[str]:
        e = self.e
        return [
            self.section("Description", facts_[:3] + self.fill("species", 3)),
            self.figure(f"A {e['colour']} ''{e['latin']}'' on the [[{e['habitat'].title}|{e['habitat'].name}]]")
            + "\n"
            + self.section("Ecology", facts_[3:] + self.fill("species", 2)),
            self.section("Taxonomy", [f"The scientific name is ''{e['latin']}''."], 3),
        ]

    def see_also(self) -> list[Entity]:
        b = self.block
        pool = [x for x in b.entities() if x is not self.e]
        return self.rng.sample(pool, 3)

    def categories(self) -> list[str]:
        e, r = self.e, self.block.region.name
        cats = {
            "town": [f"Towns in {r}"],
            "region": ["Regions"],
            "river": [f"Rivers of {r}"],
            "mountain": [f"Mountains of {r}"],
            "person": [f"People from {r}", f"{e.get('occupation', '').capitalize()}s"],
            "guild": ["Trade guilds", f"Organisations in {r}"],
            "ship": [f"Ships built in {r}"],
            "species": [f"Fauna of {r}", f"{str(e.get('animal')).capitalize()}s"],
        }[e.kind]
        if e.kind == "town":
            cats.append(f"Populated places on the {e['river'].title}")
        return cats


# -- pages beyond articles ----------------------------------------------------------------------
def _redirect_sources(e: Entity) -> list[str]:
    if e.kind == "town":
        return [f"{e.name}, {e['region'].name}"]
    if e.kind == "river":
        return [f"River {e.name}", e.name] if e.name != e.title else []
    if e.kind == "person":
        first, last = e.name.split(" ", 1)
        return [f"{first[0]}. {last}"]
    if e.kind == "ship":
        return [e.name]
    if e.kind == "species":
        return [e["latin"]]
    return []


def block_pages(world: World, block: Block) -> Iterator[tuple[str, int, str]]:
    """(title, namespace, wikitext) of every page of a block, in dump order."""
    region = block.region.name
    for e in block.entities():
        yield e.title, 0, Article(world, e).text()
        rng = derive_rng(world.seed, "extra", e.key)
        for src in _redirect_sources(e):
            if rng.random() < 0.5:
                yield src, 0, f"#REDIRECT [[{e.title}]]\n\n{{{{R from alternative name}}}}\n"
        if rng.random() < 0.2:
            user = rng.choice(EDITORS)
            yield (
                f"Talk:{e.title}",
                1,
                (
                    "{{WikiProject %s|class=stub|importance=low}}\n\n== Sources ==\nI could not find a second"
                    " source for the founding date. Does anyone have the %s gazetteer? [[User:%s|%s]]"
                    " ([[User talk:%s|talk]])"
                    " 12:%02d, %d %s %d (UTC)\n:It is in the library at %s. ~~~~\n"
                    % (
                        region,
                        region,
                        user,
                        user,
                        user,
                        rng.randrange(60),
                        rng.randrange(1, 29),
                        rng.choice(MONTHS),
                        rng.randrange(2010, 2020),
                        block.region["capital"].name,
                    )
                ),
            )
    links = " &middot; ".join(f"[[{t.title}]]" for t in block.towns)
    yield (
        f"Template:{region} navbox",
        10,
        (
            "{{Navbox\n| name = %s navbox\n| title = [[%s]]\n| list1 = %s\n}}<noinclude>\n"
            "[[Category:Navigational boxes]]\n</noinclude>\n" % (region, region, links)
        ),
    )
    yield (
        f"Category:Towns in {region}",
        14,
        (f"Towns in the region of [[{region}]].\n\n[[Category:Populated places|{region}]]\n"),
    )
    yield (
        f"Wikipedia:WikiProject {region}",
        4,
        (
            f"'''WikiProject {region}''' improves articles about [[{region}]].\n\n== Open tasks ==\n"
            f"* Expand [[{block.towns[-1].title}]]\n* Find sources for [[{block.people[0].title}]]\n"
        ),
    )
    yield (
        f"List of towns in {region}",
        0,
        (
            "This is a '''list of towns in [[%s]]'''.\n\n{| class=\"wikitable\"\n! Town !! River\n%s\n|}\n\n"
            "[[Category:Lists of towns]]\n"
            % (
                region,
                "\n".join(f"|-\n| [[{t.title}]] || [[{t['river'].title}|{t['river'].name}]]" for t in block.towns),
            )
        ),
    )


# -- the export XML ------------------------------------------------------------------------------
def _sha1_base36(text: str) -> str:
    n = int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest(), "big")
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while n:
        n, r = divmod(n, 36)
        out = digits[r] + out
    return out.rjust(31, "0")


def xml_header(seed: int) -> str:
    ns = "\n".join(
        f'      <namespace key="{k}" case="first-letter">{v}</namespace>'
        if v
        else f'      <namespace key="{k}" case="first-letter" />'
        for k, v in NAMESPACES
    )
    return (
        f'<mediawiki xmlns="{XMLNS}" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        f'xsi:schemaLocation="{XMLNS} http://www.mediawiki.org/xml/export-0.10.xsd" '
        'version="0.10" xml:lang="en">\n  <siteinfo>\n    <sitename>SynthWiki</sitename>\n'
        f"    <dbname>synthwiki{seed}</dbname>\n    <base>http://synthwiki.example.org/wiki/Main_Page</base>\n"
        "    <generator>MediaWiki 1.35.0-synth</generator>\n    <case>first-letter</case>\n"
        f"    <namespaces>\n{ns}\n    </namespaces>\n  </siteinfo>\n"
    )


XML_FOOTER = "</mediawiki>\n"
_QUOT = {'"': "&quot;"}  # dumps escape quotes in text too


def page_xml(title: str, ns: int, page_id: int, text: str, rng: random.Random) -> str:
    """One <page> element, its text escaped as a dump escapes it."""
    redirect = ""
    if text.startswith("#REDIRECT [["):
        redirect = f"    <redirect title={quoteattr(text[12 : text.index(']]')])} />\n"
    user = rng.choice(EDITORS)
    stamp = "%d-%02d-%02dT%02d:%02d:%02dZ" % (
        rng.randrange(2015, 2021),
        rng.randrange(1, 13),
        rng.randrange(1, 29),
        rng.randrange(24),
        rng.randrange(60),
        rng.randrange(60),
    )
    rev = 900000 + page_id * 13 + rng.randrange(13)
    return (
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{page_id}</id>\n"
        f"{redirect}    <revision>\n      <id>{rev}</id>\n      <parentid>{rev - 1 - rng.randrange(500)}</parentid>\n"
        f"      <timestamp>{stamp}</timestamp>\n      <contributor>\n        <username>{user}</username>\n"
        f"        <id>{1000 + EDITORS.index(user)}</id>\n      </contributor>\n"
        f"      <comment>{rng.choice(('copyedit', 'add source', 'expand', '/* History */ fix'))}</comment>\n"
        "      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
        f'      <text bytes="{len(text.encode())}" xml:space="preserve">{escape(text, _QUOT)}</text>\n'
        f"      <sha1>{_sha1_base36(text)}</sha1>\n    </revision>\n  </page>\n"
    )
