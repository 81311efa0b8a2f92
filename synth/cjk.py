"""Japanese and Chinese samples: a small invented world of towns and people, written as a
MediaWiki export in that language, books, and the downstream sets (JGLUE, CLUE, CMRC 2018).

The language itself lives in :mod:`synth.ja` and :mod:`synth.zh` (a :class:`Language`: name
morphemes with readings, sentence templates, the site's namespace names and templates); this
module builds the world from a language and writes the files: ``wiki/<db>-<seed>-pages-articles.xml.bz2``
(with the localized namespaces in its ``<siteinfo>``), ``books/*.txt``, and each task's files
in its official layout (the language module's ``downstream``). Same seed: byte-identical files
(every generator is seeded from a stable digest; bz2 at a fixed level).
"""

from __future__ import annotations

import bz2
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

import fsspec

from synth.mediawiki import XMLNS, _sha1_base36
from synth.world import derive_rng

SAMPLE_ROOT = Path(__file__).resolve().parent.parent / "data"


@dataclass(frozen=True)
class Town:
    key: int
    name: str  # with its kind suffix (町, 镇, ...)
    reading: str  # kana or pinyin of the name
    region: str
    river: str
    population: int
    founded: int
    product: str
    mayor: str
    twin: str  # another town's name
    feature: str  # a landmark


@dataclass(frozen=True)
class Person:
    key: int
    name: str
    reading: str
    born: int
    town: str
    occupation: str
    work: str  # the title of a work (a book, a song)


@dataclass
class Language:
    """What differs between the Japanese and the Chinese sample."""

    code: str  # "ja", "zh"
    dbname: str  # "jawiki"
    sitename: str
    namespaces: tuple[tuple[int, str], ...]
    name_parts: tuple[tuple[str, str], ...]  # (written, reading) morphemes of place and person names
    surnames: tuple[tuple[str, str], ...]
    given: tuple[tuple[str, str], ...]
    town_kinds: tuple[tuple[str, str], ...]  # (suffix, its reading)
    regions: tuple[str, ...]
    rivers: tuple[str, ...]
    products: tuple[str, ...]
    features: tuple[str, ...]
    occupations: tuple[str, ...]
    article: Callable  # (world, town, rng) -> wikitext
    person_article: Callable  # (world, person, rng) -> wikitext
    extra_pages: Callable  # (world, rng) -> [(title, ns, text)]
    book: Callable  # (world, index, rng) -> (slug, text)
    redirect: str = "#REDIRECT"
    extra: dict = field(default_factory=dict)


class CJKWorld:
    """Towns and people drawn from a language's morphemes; same seed, same world."""

    def __init__(self, lang: Language, seed: int, towns: int, people: int):
        self.lang, self.seed = lang, seed
        rng = derive_rng(seed, lang.code, "world")
        names: set[str] = set()
        self.towns: list[Town] = []
        while len(self.towns) < towns:
            a, b = rng.choice(lang.name_parts), rng.choice(lang.name_parts)
            kind, kind_reading = rng.choice(lang.town_kinds)
            name = a[0] + b[0] + kind
            if a[0] == b[0] or name in names:
                continue
            names.add(name)
            k = len(self.towns)
            self.towns.append(
                Town(
                    k,
                    name,
                    lang.extra.get("join_reading", "".join)((a[1], b[1], kind_reading)),
                    rng.choice(lang.regions),
                    rng.choice(lang.rivers),
                    rng.randrange(20, 900) * 100,
                    rng.randrange(1600, 1990),
                    lang.products[k % len(lang.products)] if k < len(lang.products) else rng.choice(lang.products),
                    "",
                    "",
                    rng.choice(lang.features),
                )
            )
        if people > len(lang.surnames) * len(lang.given) or towns > len(lang.name_parts) ** 2:
            raise ValueError(f"{lang.code}: not enough name parts for {towns} towns and {people} people")
        self.people: list[Person] = []
        seen: set[str] = set()
        while len(self.people) < people:
            s, g = rng.choice(lang.surnames), rng.choice(lang.given)
            if s[0] + g[0] in seen:
                continue
            seen.add(s[0] + g[0])
            k = len(self.people)
            town = self.towns[k % len(self.towns)]
            self.people.append(
                Person(
                    k,
                    s[0] + g[0],
                    lang.extra.get("join_reading", "".join)((s[1], g[1])),
                    rng.randrange(1850, 1995),
                    town.name,
                    rng.choice(lang.occupations),
                    lang.extra["work_title"](rng),
                )
            )
        # mayors and twin towns once everyone exists
        fixed = []
        for t in self.towns:
            mayor = self.people[(t.key * 7 + 3) % len(self.people)].name
            twin = self.towns[(t.key * 5 + 1) % len(self.towns)].name
            if twin == t.name:
                twin = self.towns[(t.key + 1) % len(self.towns)].name
            fixed.append(Town(**{**t.__dict__, "mayor": mayor, "twin": twin}))
        self.towns = fixed

    def town(self, name: str) -> Town:
        return next(t for t in self.towns if t.name == name)


# -- the export XML ------------------------------------------------------------------------------
def xml_header(lang: Language, seed: int) -> str:
    ns = "\n".join(
        f'      <namespace key="{k}" case="first-letter">{escape(v)}</namespace>'
        if v
        else f'      <namespace key="{k}" case="first-letter" />'
        for k, v in lang.namespaces
    )
    return (
        f'<mediawiki xmlns="{XMLNS}" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        f'xsi:schemaLocation="{XMLNS} http://www.mediawiki.org/xml/export-0.10.xsd" '
        f'version="0.10" xml:lang="{lang.code}">\n  <siteinfo>\n    <sitename>{escape(lang.sitename)}</sitename>\n'
        f"    <dbname>{lang.dbname}</dbname>\n"
        f"    <base>http://{lang.code}.synthwiki.example.org/wiki/Main_Page</base>\n"
        "    <generator>MediaWiki 1.35.0-synth</generator>\n    <case>first-letter</case>\n"
        f"    <namespaces>\n{ns}\n    </namespaces>\n  </siteinfo>\n"
    )


def page_xml(title: str, ns: int, page_id: int, text: str, redirect: str | None = None) -> str:
    red = f"    <redirect title={json.dumps(redirect, ensure_ascii=False)} />\n" if redirect else ""
    rev = 700000 + page_id * 11
    return (
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{page_id}</id>\n"
        f"{red}    <revision>\n      <id>{rev}</id>\n      <parentid>{rev - 3}</parentid>\n"
        f"      <timestamp>2020-{page_id % 12 + 1:02d}-{page_id % 28 + 1:02d}T12:00:00Z</timestamp>\n"
        "      <contributor>\n        <username>Synth</username>\n        <id>1000</id>\n      </contributor>\n"
        "      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
        f'      <text bytes="{len(text.encode())}" xml:space="preserve">{escape(text, {chr(34): "&quot;"})}</text>\n'
        f"      <sha1>{_sha1_base36(text)}</sha1>\n    </revision>\n  </page>\n"
    )


def wiki_pages(world: CJKWorld) -> list[tuple[str, int, str, str | None]]:
    """(title, ns, text, redirect target) of every page, in dump order."""
    lang = world.lang
    pages = []
    for t in world.towns:
        rng = derive_rng(world.seed, lang.code, "town", t.key)
        pages.append((t.name, 0, lang.article(world, t, rng), None))
        if t.key % 3 == 0:  # the reading as a redirect, as real wikis have
            pages.append((t.reading, 0, f"{lang.redirect} [[{t.name}]]\n", t.name))
    for p in world.people:
        rng = derive_rng(world.seed, lang.code, "person", p.key)
        pages.append((p.name, 0, lang.person_article(world, p, rng), None))
    rng = derive_rng(world.seed, lang.code, "extra")
    pages += [(title, ns, text, None) for title, ns, text in lang.extra_pages(world, rng)]
    return pages


def write_wiki(world: CJKWorld, path: str) -> dict:
    lang = world.lang
    counts = {"pages": 0, "articles": 0, "redirects": 0, "other_namespace_pages": 0}
    fs, p = fsspec.core.url_to_fs(path)
    with fs.open(p, "wb") as raw, bz2.open(raw, "wb", compresslevel=9) as out:
        out.write(xml_header(lang, world.seed).encode())
        for i, (title, ns, text, redirect) in enumerate(wiki_pages(world)):
            # page ids apart per seed, so samples of several seeds make one corpus (benchmarks)
            out.write(page_xml(title, ns, 10 + world.seed * 1_000_000 + i, text, redirect).encode())
            counts["pages"] += 1
            if ns:
                counts["other_namespace_pages"] += 1
            elif redirect:
                counts["redirects"] += 1
            else:
                counts["articles"] += 1
        out.write(b"</mediawiki>\n")
    return counts


# -- downstream files ----------------------------------------------------------------------------
def jsonl(rows: list[dict]) -> bytes:
    """JSON lines as JGLUE and CLUE publish them: one object a line, UTF-8, not ASCII-escaped."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def squad_json(articles: list[dict], version: str | None = "v1.1") -> bytes:
    data = {"data": articles} if version is None else {"version": version, "data": articles}
    return (json.dumps(data, ensure_ascii=False) + "\n").encode("utf-8")


def qa_article(title: str, paragraphs: list[tuple[str, list[tuple[str, str, str]]]], ids: Callable) -> dict:
    """A SQuAD article: paragraphs of (context, [(qid, question, answer)]); answer_start is the
    answer's first occurrence in the context (the generator writes it once)."""
    out = []
    for context, qas in paragraphs:
        rows = []
        for qid, question, answer in qas:
            start = context.index(answer)
            rows.append(ids(qid, question, [{"text": answer, "answer_start": start}]))
        out.append({"qas": rows, "context": context})
    return {"title": title, "paragraphs": out}


def split_rows(rows: list, dev: int, rng: random.Random) -> tuple[list, list]:
    rows = list(rows)
    rng.shuffle(rows)
    return rows[dev:], rows[:dev]


def write_files(out_dir: str, files: dict[str, bytes]) -> None:
    fs, root = fsspec.core.url_to_fs(out_dir)
    root = root.rstrip("/")
    for rel, data in sorted(files.items()):
        fs.makedirs(f"{root}/{rel.rsplit('/', 1)[0]}", exist_ok=True)
        fs.pipe_file(f"{root}/{rel}", data)


def write_language_sample(lang: Language, downstream: Callable, out_dir: str, seed: int = 0,
                          towns: int = 48, people: int = 40, books: int = 4) -> dict:  # fmt: skip
    """The whole sample of one language under ``out_dir``: wiki, books, downstream sets."""
    world = CJKWorld(lang, seed, towns, people)
    fs, root = fsspec.core.url_to_fs(out_dir)
    root = root.rstrip("/")
    for sub in ("wiki", "books"):
        fs.makedirs(f"{root}/{sub}", exist_ok=True)
    for old in sorted(fs.glob(f"{root}/books/*.txt") + fs.glob(f"{root}/wiki/*.xml.bz2")):
        fs.rm(old)  # a smaller rerun leaves no stale parts
    counts = write_wiki(world, f"{root}/wiki/{lang.dbname}-{seed}-pages-articles.xml.bz2")
    book_bytes = 0
    for i in range(books):
        slug, text = lang.book(world, i, derive_rng(seed, lang.code, "book", i))
        data = text.encode("utf-8")
        fs.pipe_file(f"{root}/books/{i:05d}-{slug}.txt", data)
        book_bytes += len(data)
    counts.update(books=books, book_bytes=book_bytes)
    files = downstream(world)
    write_files(out_dir, files)
    counts.update({f"file:{k}": len(v) for k, v in sorted(files.items())})
    return counts
