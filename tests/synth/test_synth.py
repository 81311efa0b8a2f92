"""The synthetic data generator: determinism, sizes, dump and book formats, downstream formats,
and that the committed sample under data/sample/ is exactly what the code regenerates."""

from __future__ import annotations

import bz2
import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import fsspec
import pytest

from synth.corpus import SAMPLE_DIR, parse_size, write_corpus, write_downstream, write_sample
from synth.phrases import PHRASES
from synth.world import World

NS = "{http://www.mediawiki.org/xml/export-0.10/}"
SIZE = 300_000


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _pages(dump: Path) -> list[dict]:
    pages = []
    with bz2.open(dump) as f:
        for _, el in ET.iterparse(f):
            if el.tag == NS + "page":
                text = el.find(f"{NS}revision/{NS}text")
                redirect = el.find(NS + "redirect")
                pages.append(
                    {
                        "title": el.findtext(NS + "title"),
                        "ns": int(el.findtext(NS + "ns")),
                        "id": int(el.findtext(NS + "id")),
                        "text": text.text,
                        "bytes": int(text.get("bytes")),
                        "redirect": None if redirect is None else redirect.get("title"),
                    }
                )
                el.clear()
    return pages


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    counts = write_corpus(str(out), SIZE, seed=3)
    return out, counts


@pytest.fixture(scope="module")
def downstream(tmp_path_factory):
    out = tmp_path_factory.mktemp("downstream")
    return out, write_downstream(str(out), seed=3)


def test_parse_size():
    assert parse_size("123") == 123
    assert parse_size("200KB") == 200_000
    assert parse_size("50MB") == 50_000_000
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size(" 2 mb ") == 2_000_000
    assert parse_size("1MiB") == 1 << 20
    for bad in ("", "MB", "12 parsecs", "-5MB", "0"):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)


def test_same_seed_and_size_give_identical_bytes(corpus, tmp_path):
    out, counts = corpus
    again = write_corpus(str(tmp_path), SIZE, seed=3)
    assert again == counts
    assert _files(tmp_path) == _files(out)
    other = tmp_path / "other"
    write_corpus(str(other), SIZE, seed=4)
    assert _files(other) != _files(out)


def test_sizes_follow_the_request(corpus):
    out, counts = corpus
    assert abs(counts["bytes"] - SIZE) <= 0.1 * SIZE
    assert abs(counts["wiki_text_bytes"] - 0.75 * SIZE) <= 0.1 * 0.75 * SIZE
    assert abs(counts["book_bytes"] - 0.25 * SIZE) <= 0.1 * 0.25 * SIZE
    books = sorted((out / "books").glob("*.txt"))
    assert len(books) == counts["books"] >= 1
    assert sum(p.stat().st_size for p in books) == counts["book_bytes"]
    pages = _pages(out / "wiki" / "synthwiki-3-pages-articles.xml.bz2")
    assert len(pages) == counts["pages"]
    assert sum(len(p["text"].encode()) for p in pages) == counts["wiki_text_bytes"]


def test_tiny_request_still_writes_a_page_and_a_book(tmp_path):
    counts = write_corpus(str(tmp_path), 4000, seed=1)
    assert counts["pages"] >= 1 and counts["books"] == 1
    assert abs(counts["bytes"] - 4000) < 3000


def test_writes_to_any_fsspec_url(tmp_path):
    url = "memory://synth-test/out"
    assert write_corpus(url, 20_000, seed=5) == write_corpus(str(tmp_path), 20_000, seed=5)
    fs = fsspec.filesystem("memory")
    try:
        remote = {p.split("/out/", 1)[1]: fs.cat_file(p) for p in fs.find("/synth-test/out")}
        assert remote == _files(tmp_path)
    finally:
        fs.rm("/synth-test", recursive=True)


def test_dump_is_a_mediawiki_export_with_real_markup(corpus):
    out, counts = corpus
    dump = out / "wiki" / "synthwiki-3-pages-articles.xml.bz2"
    head = bz2.open(dump).read(2000).decode()
    assert 'xmlns="http://www.mediawiki.org/xml/export-0.10/"' in head and "<namespaces>" in head
    pages = _pages(dump)
    assert len({p["id"] for p in pages}) == len(pages)
    assert all(p["bytes"] == len(p["text"].encode()) for p in pages)
    redirects = [p for p in pages if p["redirect"]]
    articles = [p for p in pages if p["ns"] == 0 and not p["redirect"]]
    assert counts["redirects"] == len(redirects) and counts["articles"] == len(articles)
    assert len(redirects) * 20 >= len(articles)
    titles = {p["title"] for p in pages}
    assert all(p["text"].startswith(f"#REDIRECT [[{p['redirect']}]]") and p["redirect"] in titles for p in redirects)
    assert {1, 4, 10, 14} <= {p["ns"] for p in pages}
    assert all(p["title"].split(":")[0] in ("Talk", "Wikipedia", "Template", "Category") for p in pages if p["ns"] != 0)
    text = "\n".join(p["text"] for p in articles)
    for marker in (
        "{{Infobox settlement",
        "{{formatnum:",
        "{{convert|",
        '<ref name="r1">{{cite web |',
        '<ref name="r1" />',
        "{{reflist}}",
        '{| class="wikitable',
        "\n|}",
        "\n* [[",
        "\n# ",
        "\n== See also ==",
        "\n== References ==",
        "\n== External links ==",
        "\n=== ",
        "[[File:",
        "|thumb|",
        "[[Category:",
        "[http://example.org/",
        "'''",
        "''",
        "<!--",
        "&nbsp;",
        "{{Short description|",
    ):
        assert marker in text, marker
    assert re.search(r"\[\[[^\]|]+\|[^\]]+\]\]", text)  # [[Target|label]]
    assert re.search(r"\[\[File:[^\n]*\[\[[^\]]+\]\][^\n]*\]\]", text)  # a link inside a caption
    assert re.search(r"\{\{Infobox settlement\n(?:\|[^\n]*\n)*\| population_total = \{\{formatnum:\d+\}\}", text)


def test_books_have_a_title_chapters_and_wrapped_paragraphs(corpus):
    out, _ = corpus
    for path in sorted((out / "books").glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        assert lines[0] and not lines[0].startswith("Chapter") and lines[1] == ""
        chapters = [int(m) for m in re.findall(r"^Chapter (\d+)$", text, flags=re.M)]
        assert chapters == list(range(1, len(chapters) + 1)) and chapters
        assert max(len(line) for line in lines) <= 70
        assert "\n\n" in text and '"' in text  # paragraphs and dialogue


def test_facts_recur_in_varied_phrasings_across_documents(corpus):
    out, _ = corpus
    pages = [p["text"] for p in _pages(out / "wiki" / "synthwiki-3-pages-articles.xml.bz2")]
    books = [" ".join(p.read_text(encoding="utf-8").split()) for p in (out / "books").glob("*.txt")]
    templates, recurring = set(), 0
    for town in World(3).block(0).towns:
        docs = set()
        for template in PHRASES["town.river"]:  # with the wiki's links or the books' plain names
            pattern = (
                re.escape(template)
                .replace(re.escape("{s}"), r"(?:\[\[)?%s(?:\]\])?" % re.escape(town.name))
                .replace(re.escape("{o}"), r"(?:\[\[[^|\]]*\|)?%s(?:\]\])?" % re.escape(town["river"].name))
            )
            hits = {i for i, doc in enumerate(pages + books) if re.search(pattern, doc)}
            templates |= {template} if hits else set()
            docs |= hits
        recurring += len(docs) >= 2
    assert len(templates) >= 3, templates
    assert recurring >= 4


def test_downstream_formats(downstream):
    out, counts = downstream
    sst = out / "glue" / "SST-2"
    sentences = set()
    for name, n in (("train.tsv", 2000), ("dev.tsv", 400)):
        lines = (sst / name).read_text(encoding="utf-8").splitlines()
        assert lines[0] == "sentence\tlabel" and len(lines) == n + 1
        rows = [line.split("\t") for line in lines[1:]]
        assert all(len(r) == 2 and r[1] in ("0", "1") and r[0] == r[0].lower() for r in rows)
        assert sum(r[1] == "1" for r in rows) == n // 2
        sentences |= {r[0] for r in rows}
        assert any(" not " in r[0] or " never " in r[0] for r in rows if r[1] == "1")  # negation
    test = (sst / "test.tsv").read_text(encoding="utf-8").splitlines()
    assert test[0] == "index\tsentence" and len(test) == 401
    assert [line.split("\t")[0] for line in test[1:]] == [str(i) for i in range(400)]
    assert not sentences & {line.split("\t")[1] for line in test[1:]}
    assert len(sentences) == 2400  # no sentence in two splits

    ids = set()
    for name, lo, hi in (("train-v1.1.json", 900, 1000), ("dev-v1.1.json", 180, 200)):
        data = json.loads((out / "squad" / name).read_text(encoding="utf-8"))
        assert data["version"] == "1.1" and set(data) == {"version", "data"}
        n = 0
        for article in data["data"]:
            assert set(article) == {"title", "paragraphs"} and " " not in article["title"]
            for para in article["paragraphs"]:
                assert set(para) == {"context", "qas"}
                for qa in para["qas"]:
                    assert set(qa) == {"id", "question", "answers"} and qa["question"].endswith("?")
                    assert len(qa["answers"]) == (3 if name.startswith("dev") else 1)
                    for ans in qa["answers"]:
                        start = ans["answer_start"]
                        assert para["context"][start : start + len(ans["text"])] == ans["text"]
                    ids.add(qa["id"])
                    n += 1
        assert lo <= n <= hi
    assert len(ids) == counts["squad_train_questions"] + counts["squad_dev_questions"]


def test_committed_sample_is_reproducible(tmp_path):
    counts = write_sample(str(tmp_path))
    assert counts["sst2_train"] == 2000 and counts["squad_train_questions"] == 1000
    regenerated, committed = _files(tmp_path), _files(SAMPLE_DIR)
    assert sorted(regenerated) == sorted(committed), "run: python -m synth.corpus"
    for name in regenerated:
        assert regenerated[name] == committed[name], f"{name} differs; run: python -m synth.corpus"
    assert sum(len(b) for b in committed.values()) < 3_000_000


def test_downstream_entities_are_described_by_the_sample_corpus():
    pages = _pages(SAMPLE_DIR / "wiki" / "synthwiki-0-pages-articles.xml.bz2")
    titles = {p["title"] for p in pages if p["ns"] == 0}
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        data = json.loads((SAMPLE_DIR / "squad" / name).read_text(encoding="utf-8"))
        for article in data["data"]:
            assert article["title"].replace("_", " ") in titles


def test_every_downstream_sample_reads_in_its_official_format():
    from tasks.glue import read_split
    from tasks.ner import read_conll
    from tasks.registry import family_tasks
    from tasks.squad import read_squad
    from tasks.swag import read_swag

    glue = SAMPLE_DIR / "glue"
    for spec in (t.layout for t in family_tasks("glue").values()):
        folder = glue / spec.folder
        train = read_split(str(folder / "train.tsv"), spec, "train").examples
        devs = [read_split(str(folder / n), spec, "dev").examples for n in spec.dev_files]
        assert len(train) >= 200 and all(len(d) >= 50 for d in devs), spec.folder
        if not spec.is_regression:
            assert len({e.label for e in train}) == len(spec.labels), spec.folder  # every label occurs
        for name in spec.test_files:
            assert read_split(str(folder / name), spec, "test").examples, (spec.folder, name)
    # CoLA's train/dev have no header; MNLI has matched and mismatched dev sets
    assert (glue / "CoLA" / "train.tsv").read_text().split("\t")[0].startswith("syn")
    assert {p.name for p in (glue / "MNLI").iterdir()} >= {"dev_matched.tsv", "dev_mismatched.tsv"}
    v2 = read_squad(str(SAMPLE_DIR / "squad" / "dev-v2.0.json"), "2.0")
    assert 0.2 < sum(e.is_impossible for e in v2) / len(v2) < 0.6
    for e in v2:
        assert all(e.context[s : s + len(t)] == t for t, s in e.answers)
    sents = read_conll(str(SAMPLE_DIR / "conll2003" / "eng.train"))
    tags = {t for s in sents for t in s.tags}
    assert {"I-PER", "I-LOC", "I-ORG", "I-MISC", "B-LOC"} <= tags  # IOB1, B- between adjacent places
    assert (SAMPLE_DIR / "conll2003" / "eng.train").read_text().startswith("-DOCSTART- -X- -X- O\n\n")
    swag = read_swag(str(SAMPLE_DIR / "swag" / "train.csv"))
    assert len(swag) == 600 and {e.label for e in swag} == {0, 1, 2, 3}
    assert read_swag(str(SAMPLE_DIR / "swag" / "test.csv"), labelled=False)[0].label is None


def test_wnli_and_swag_dev_rows_are_told_only_by_what_the_corpus_teaches(corpus):
    """WNLI and SWAG rest on which words are food (and, for WNLI, cargo): no dev word appears
    in a train row, so fine-tuning alone cannot tell a dev row; the corpus uses every such word
    in its slot, and first names recur across people with one pronoun each."""
    from synth.glue_sets import SHIP_WANTS, diet_split, ship_wants, wnli_rows
    from synth.tagging import ENDINGS, swag_rows, word_split
    from synth.world import ANIMALS

    world = World(3)
    pronoun_of: dict[str, set[str]] = {}
    people_of: Counter = Counter()
    for b in range(60):
        for p in world.block(b).people:
            pronoun_of.setdefault(p.name.split(" ")[0], set()).add(p["pronoun"])
            people_of[p.name.split(" ")[0]] += 1
    assert all(len(v) == 1 for v in pronoun_of.values())
    assert people_of.most_common(1)[0][1] >= 5  # first names recur across people

    foods = set(ANIMALS.values())

    def wants(rows):  # the word "it" wants, and whether the hypothesis names the animal
        out = []
        for s1, s2, label in rows:
            x = s1.rstrip(".").rsplit(" for ", 1)[1] if " for " in s1 else s1.rstrip(".").rsplit(" wanted ", 1)[1]
            out.append((x, any(s2.split(" ")[2] == a or f" {a} " in s2 for a in ANIMALS), label))
        return out

    train, dev = wants(wnli_rows(world, "train", 400)), wants(wnli_rows(world, "dev", 100))
    assert not {x for x, _, _ in train} & {x for x, _, _ in dev}
    assert {x for x, _, _ in dev} <= foods | set(ship_wants(3, "dev")) and set(ship_wants(3, "dev")) < set(SHIP_WANTS)
    for x, names_animal, label in dev:  # entailed exactly when the food goes with the animal
        assert label == int(names_animal == (x in foods))
    assert 0.4 < sum(label for _, _, label in dev) / len(dev) < 0.6

    side = diet_split(3)
    train_diets = {ANIMALS[a] for a, s in side.items() if s == "train"}
    dev_diets = {ANIMALS[a] for a, s in side.items() if s == "dev"}
    assert len(dev_diets) >= 4 and not train_diets & dev_diets

    def words_in(rows):
        return {
            w
            for r in rows
            for e in r[7:11]
            for w in set(ANIMALS.values()) | set(word_split(3))
            if any(e == t.format(o=w) for t in ENDINGS)
        }

    train_words = words_in(swag_rows(world, "train", 300))
    dev_rows = swag_rows(world, "dev", 100)
    assert train_words and words_in(dev_rows) and not train_words & words_in(dev_rows)
    assert words_in(dev_rows) >= dev_diets
    for row in dev_rows:  # the right ending names what the context's animal eats, the others no food
        animal = next(a for a in ANIMALS if row[5].endswith(f" {a}"))
        assert row[7 + row[11]] in {t.format(o=ANIMALS[animal]) for t in ENDINGS}
        wrong = [e for k, e in enumerate(row[7:11]) if k != row[11]]
        assert not any(e.endswith(f" {d}.") for e in wrong for d in ANIMALS.values())

    out, _ = corpus  # the corpus puts the food and cargo words in their slots
    text = " ".join(p.read_text(encoding="utf-8") for p in (out / "books").glob("*.txt"))
    text = " ".join(text.split())
    assert (
        sum(
            text.count(f"{a} eats mostly {d}")
            + text.count(f"every {a} feeds on {d}")
            + text.count(f"a {a} hunting for {d}")
            for a, d in ANIMALS.items()
        )
        >= 3
    )
    assert sum(text.count(f"loaded with {c}") for c in ("timber", "wool", "glass")) >= 1


def test_cola_unacceptable_rows_are_no_phrasing_of_a_fact():
    """A corruption that happens to give a valid phrasing ("X died in 1827" from "X died in the
    year 1827") would be an acceptable sentence marked unacceptable: none is left."""
    import re

    from synth.glue_sets import cola_rows, fact_pool
    from synth.phrases import PHRASES
    from synth.world import Entity

    def rendered(template: str, subject: str, value) -> str:
        """The test's own rendering of a phrasing (not the generator's): the template filled in,
        numbers from 10,000 with thousands commas, "a" -> "an" before a vowel."""
        obj = (
            value.name
            if isinstance(value, Entity)
            else f"{value:,}"
            if isinstance(value, int) and value >= 10000
            else str(value)
        )
        return re.sub(r"\b([Aa]) (?=[aeiouAEIOU])", r"\1n ", template.replace("{s}", subject).replace("{o}", obj))

    world = World(3)
    good = {rendered(t, e.name, v) for e, rel, v in fact_pool(world) for t in PHRASES[rel]}
    for split in ("train", "dev"):
        rows = cola_rows(world, split, 400)
        bad = [r[3] for r in rows if r[1] == 0]
        assert len(bad) == 200 and not set(bad) & good
        assert all(r[3] in good for r in rows if r[1] == 1)


def test_sst2_dev_rows_turn_on_adjectives_no_train_row_has(downstream):
    from synth.tasks import dev_adjectives
    from synth.words import NEGATIVE, POSITIVE

    out, _ = downstream
    dev_words = dev_adjectives(3)
    assert len(dev_words & set(POSITIVE)) == len(dev_words & set(NEGATIVE)) == 4

    def rows(name):
        lines = (out / "glue" / "SST-2" / name).read_text(encoding="utf-8").splitlines()[1:]
        return [
            set(r.split("\t")[-2 if name != "test.tsv" else -1].split()) & (set(POSITIVE) | set(NEGATIVE))
            for r in lines
        ]

    train = set().union(*rows("train.tsv"))
    assert train and not train & dev_words
    for name in ("dev.tsv", "test.tsv"):  # a third of the rows turn on held-out words only
        held = [r <= dev_words for r in rows(name)]
        assert all(r <= dev_words or not r & dev_words for r in rows(name))
        assert 0.25 < sum(held) / len(held) < 0.42
