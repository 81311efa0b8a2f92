"""Deterministic synthetic data: a wiki dump, books and downstream sets about one invented world.

Entry points (the ``bertflow synth-corpus`` command calls the first two):
- :func:`write_corpus` writes ``wiki/synthwiki-<seed>-pages-articles.xml.bz2`` (a MediaWiki
  export) and ``books/<slug>.txt`` (one book a file): about 75% / 25% of ``size_bytes``, both
  measured as uncompressed UTF-8 text (the wiki on the wikitext of its pages, markup included,
  XML wrapping not; the XML stream is about 1.4x that).
- :func:`write_downstream` writes the downstream sets in their official formats: the nine GLUE
  tasks, SQuAD v1.1 and v2.0, CoNLL-2003 and SWAG.
- :func:`write_sample` writes the bundled sample under ``data/sample/``.

The world (:mod:`synth.world`) is prefix-stable, so every corpus size of a seed and its
downstream sets speak of the same entities. Same seed and size give byte-identical files: every
generator is seeded from a stable digest, files are written in a fixed order, bz2 at a fixed
level. The design choice: generation is a single sequential pass in one process (no Beam), which
is simple and fast enough (tens of MB a minute, see the report in the tests) at the cost of not
scaling to a full-size Wikipedia; for that, run several seeds into separate folders.

``out_dir`` is an fsspec URL (a local folder or ``gs://...``).
"""

from __future__ import annotations

import bz2
import json
import os
import re
from pathlib import Path

import fsspec

from synth.books import book_for
from synth.glue_sets import glue_files
from synth.mediawiki import XML_FOOTER, page_xml, xml_header
from synth.tagging import conll_text, ner_sentences, swag_csv, swag_rows
from synth.tasks import squad_sets, squad_v2_sets, sst2_rows
from synth.wiki import block_pages
from synth.world import World, derive_rng

WIKI_SHARE = 0.75
SAMPLE_SIZE = 1_200_000
SAMPLE_DIR = Path(__file__).resolve().parent.parent / "data" / "sample"
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
}


def parse_size(text: str) -> int:
    """Bytes from "123", "200KB", "50MB", "1.5GB" (decimal units; KiB/MiB/GiB binary)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"size: cannot read {text!r}; use e.g. 123, 200KB, 50MB or 1.5GB")
    value = round(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise ValueError(f"size: {text!r} must be more than 0 bytes")
    return value


def _clear(fs: fsspec.AbstractFileSystem, pattern: str) -> None:
    """Remove files this module wrote before, so a smaller rerun leaves no stale parts."""
    for old in sorted(fs.glob(pattern)):
        fs.rm(old)


def _write_wiki(world: World, fs: fsspec.AbstractFileSystem, path: str, budget: int) -> dict:
    """Pages block by block until their wikitext is as close to ``budget`` bytes as a page allows."""
    header, footer = xml_header(world.seed).encode(), XML_FOOTER.encode()
    size, xml_size = 0, len(header) + len(footer)
    counts = {"pages": 0, "articles": 0, "redirects": 0, "other_namespace_pages": 0, "blocks": 0}
    with fs.open(path, "wb") as raw, bz2.open(raw, "wb", compresslevel=9) as out:
        out.write(header)
        block, done, batch = 0, False, []
        while not done:
            counts["blocks"] = block + 1
            for title, ns, text in block_pages(world, world.block(block)):
                page_id = counts["pages"] + 10
                n = len(text.encode())
                # take the page if that lands nearer the budget than stopping here
                if counts["pages"] and size + n - budget > budget - size:
                    done = True
                    break
                data = page_xml(title, ns, page_id, text, derive_rng(world.seed, "rev", page_id)).encode()
                batch.append(data)
                size += n
                xml_size += len(data)
                counts["pages"] += 1
                if ns != 0:
                    counts["other_namespace_pages"] += 1
                elif text.startswith("#REDIRECT"):
                    counts["redirects"] += 1
                else:
                    counts["articles"] += 1
            out.write(b"".join(batch))
            batch = []
            block += 1
        out.write(footer)
    counts["wiki_text_bytes"], counts["wiki_xml_bytes"] = size, xml_size
    counts["wiki_bz2_bytes"] = fs.size(path)
    return counts


def write_corpus(out_dir: str, size_bytes: int, seed: int) -> dict:
    """Write the wiki dump and the books under ``out_dir``; return counts and byte sizes.

    Same ``seed`` and ``size_bytes``: byte-identical files. Earlier synthetic dumps and books
    in ``out_dir/wiki`` and ``out_dir/books`` are removed first.
    """
    if size_bytes <= 0:
        raise ValueError(f"size_bytes: must be more than 0, got {size_bytes}")
    fs, root = fsspec.core.url_to_fs(out_dir)
    wiki_dir, books_dir = f"{root.rstrip('/')}/wiki", f"{root.rstrip('/')}/books"
    fs.makedirs(wiki_dir, exist_ok=True)
    fs.makedirs(books_dir, exist_ok=True)
    _clear(fs, f"{wiki_dir}/synthwiki-*-pages-articles.xml.bz2")
    _clear(fs, f"{books_dir}/*.txt")

    world = World(seed)
    wiki_budget = round(size_bytes * WIKI_SHARE)
    counts = _write_wiki(world, fs, f"{wiki_dir}/synthwiki-{seed}-pages-articles.xml.bz2", wiki_budget)

    book_budget, book_bytes, index = size_bytes - wiki_budget, 0, 0
    while book_bytes < book_budget:
        book = book_for(world, index, counts["blocks"])
        target = min(book.rng.randrange(25_000, 75_000), book_budget - book_bytes)
        data = book.write(target).encode("utf-8")
        fs.pipe_file(f"{books_dir}/{book.slug}.txt", data)
        book_bytes += len(data)
        index += 1
    counts.update(
        books=index,
        book_bytes=book_bytes,
        bytes=counts["wiki_text_bytes"] + book_bytes,
        seed=seed,
        size_bytes=size_bytes,
    )
    return counts


def _write_tsv(fs: fsspec.AbstractFileSystem, path: str, header: str, rows: list[tuple]) -> None:
    lines = [header] + ["\t".join(str(x) for x in row) for row in rows]
    fs.pipe_file(path, ("\n".join(lines) + "\n").encode("utf-8"))


def write_downstream(out_dir: str, seed: int) -> dict:
    """Write every downstream set in its official layout; return counts.

    ``glue/<Task>/`` for the nine GLUE tasks (SST-2 as before; CoLA's train/dev headerless,
    MNLI's matched and mismatched dev and test files), ``squad/{train,dev}-v{1.1,2.0}.json``,
    ``conll2003/eng.{train,testa,testb}`` and ``swag/{train,val,test}.csv``.
    """
    world = World(seed)
    fs, root = fsspec.core.url_to_fs(out_dir)
    root = root.rstrip("/")
    sst_dir, squad_dir = f"{root}/glue/SST-2", f"{root}/squad"
    fs.makedirs(sst_dir, exist_ok=True)
    fs.makedirs(squad_dir, exist_ok=True)

    rng, seen = derive_rng(seed, "sst2"), set()
    train, dev, test = (
        sst2_rows(world, n, rng, seen, split) for n, split in ((2000, "train"), (400, "dev"), (400, "test"))
    )
    _write_tsv(fs, f"{sst_dir}/train.tsv", "sentence\tlabel", train)
    _write_tsv(fs, f"{sst_dir}/dev.tsv", "sentence\tlabel", dev)
    _write_tsv(fs, f"{sst_dir}/test.tsv", "index\tsentence", [(i, s) for i, (s, _) in enumerate(test)])
    counts = {"sst2_train": len(train), "sst2_dev": len(dev), "sst2_test": len(test)}

    for folder, files in glue_files(world).items():
        fs.makedirs(f"{root}/glue/{folder}", exist_ok=True)
        for name, (header, rows) in files.items():
            lines = ([header] if header else []) + ["\t".join(str(x) for x in row) for row in rows]
            fs.pipe_file(f"{root}/glue/{folder}/{name}", ("\n".join(lines) + "\n").encode("utf-8"))
            counts[f"{folder.lower().replace('-', '')}_{name.rsplit('.', 1)[0]}"] = len(rows)

    def questions(d: dict) -> int:
        return sum(len(p["qas"]) for a in d["data"] for p in a["paragraphs"])

    squad_train, squad_dev = squad_sets(world, 1000, 200)
    v2_train, v2_dev = squad_v2_sets(world, 1200, 150)
    for name, data in (
        ("train-v1.1.json", squad_train),
        ("dev-v1.1.json", squad_dev),
        ("train-v2.0.json", v2_train),
        ("dev-v2.0.json", v2_dev),
    ):
        fs.pipe_file(f"{squad_dir}/{name}", (json.dumps(data, ensure_ascii=False) + "\n").encode("utf-8"))
    counts.update(
        squad_train_questions=questions(squad_train),
        squad_dev_questions=questions(squad_dev),
        squad2_train_questions=questions(v2_train),
        squad2_dev_questions=questions(v2_dev),
        squad2_dev_unanswerable=sum(
            q["is_impossible"] for a in v2_dev["data"] for p in a["paragraphs"] for q in p["qas"]
        ),
    )

    fs.makedirs(f"{root}/conll2003", exist_ok=True)
    for name, split, n in (("eng.train", "train", 600), ("eng.testa", "dev", 150), ("eng.testb", "test", 150)):
        fs.pipe_file(f"{root}/conll2003/{name}", conll_text(ner_sentences(world, split, n)).encode("utf-8"))
        counts[f"conll2003_{split}_sentences"] = n

    fs.makedirs(f"{root}/swag", exist_ok=True)
    for name, split, n in (("train.csv", "train", 600), ("val.csv", "dev", 150), ("test.csv", "test", 100)):
        labelled = split != "test"
        text = swag_csv(swag_rows(world, split, n, labelled), labelled)
        fs.pipe_file(f"{root}/swag/{name}", text.encode("utf-8"))
        counts[f"swag_{split}"] = n
    return counts


def write_sample(out_dir: str) -> dict:
    """The bundled sample: a ~1.2 MB corpus and the downstream sets, seed 0."""
    counts = write_corpus(out_dir, SAMPLE_SIZE, seed=0)
    counts.update(write_downstream(out_dir, seed=0))
    return counts


if __name__ == "__main__":  # regenerate the committed sample: python -m synth.corpus
    print(json.dumps(write_sample(os.fspath(SAMPLE_DIR)), indent=2))
