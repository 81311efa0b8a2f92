"""Synthetic Wikipedia: wikitext articles about the invented world, written as a MediaWiki export.

Each entity of a :class:`~synth.world.Block` gets an article whose text is drawn from a
generator seeded by ``(seed, entity key)``, so an article never depends on the order of the others.
Articles carry the markup a real dump has and a cleaner must survive: nested templates, infoboxes,
``<ref>`` with citation templates and named re-use, tables, lists, files with linked captions,
categories, comments, entities, external links, See also / References / External links sections.
Around them come redirects, talk pages, templates, categories and project pages (ns != 0).

The design choice: prose is assembled from sentence templates (facts from
:data:`~synth.phrases.PHRASES` plus section-specific filler) rather than a grammar, which
keeps 50 MB well under a minute at the cost of a smaller syntactic variety than real text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from synth.mediawiki import EDITORS
from synth.phrases import fact_object, facts, fix_articles, phrase, pick_fact
from synth.words import FILLER, MONTHS, NEGATIVE, ORDINALS, POSITIVE, WEEKDAYS
from synth.world import Block, Entity, World, derive_rng


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
