"""The corpus stage against wikiextractor on the same generated dump, figures side by side.

    python benchmarks/bench_corpus.py --mb 20 --wikiextractor /tmp/wxvenv/bin/python
    python benchmarks/bench_corpus.py --mb 500 --workers 1 --no-pure --workdir /tmp/b  # memory
    python benchmarks/bench_corpus.py --mb 50 --workers 1 --wiki-reader process  # force a reader mode
    python benchmarks/bench_corpus.py --dump enwiki-...-pages-articles1.xml.bz2 --copies 10  # a real dump x10
    python benchmarks/bench_corpus.py --parsers      # cleaner vs mwparserfromhell, in-process
    python benchmarks/bench_corpus.py --sentences    # splitter vs pysbd and blingfire

The dump is the synthetic sample wiki (``synth``) repeated, with fresh page ids, to ``--mb``
MB of XML, written as ``.xml.bz2`` like a real dump; or, with ``--dump``, the pages of a real
dump repeated ``--copies`` times (our stage drops the repeats as duplicates after cleaning them;
wikiextractor writes every copy). Each tool runs in its own process at 1 and
2 workers; peak memory is the largest resident set of the process tree, sampled from /proc;
CPU seconds are those of the whole process tree (wikiextractor runs a reader process beside
its ``--processes`` workers, so "1 worker" uses more than one core), the fair figure on a
shared machine.
Residue is the share of output documents that still hold each markup trace. wikiextractor is
not a dependency: install it in its own venv (``python -m venv /tmp/wxvenv &&
/tmp/wxvenv/bin/pip install wikiextractor``) and give its interpreter.
"""

from __future__ import annotations

import argparse
import bz2
import glob
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESIDUE = ("{{", "}}", "[[", "|", "==", "<ref", "&amp;")
# A heading left as a line: at most 4 words of letters, spaces and light punctuation, with no
# end or a bare period (wikiextractor writes "Early life."); a real 4-word sentence ("He died
# young.") also counts, for both tools alike.
_HEADINGISH = re.compile(r"^[\w][\w ,'()-]{0,40}\.?$")


# -- input ---------------------------------------------------------------------------------------
def make_dump(path: Path, mb: float, source: str | None = None, copies: int = 0) -> tuple[int, int]:
    """The pages of ``source`` (a ``.xml.bz2`` dump; default: the sample wiki) repeated to ``mb``
    MB of XML, or ``copies`` times when given, each copy with fresh page ids; (pages, bytes of XML)."""
    sample = source or sorted(glob.glob(str(ROOT / "data/sample/wiki/*.xml.bz2")))[0]
    xml = bz2.decompress(Path(sample).read_bytes()).decode()
    head, _, rest = xml.partition("<page>")
    pages = ["<page>" + p for p in rest.split("<page>")]
    pages[-1] = pages[-1].replace("</mediawiki>", "")
    target = int(mb * 1e6) if not copies else None
    out, size, n, copy = [head], len(head), 0, 0
    while (size < target) if target is not None else (copy < copies):
        for p in pages:
            pid = int(re.search(r"<id>(\d+)</id>", p).group(1))
            page = re.sub(r"<id>\d+</id>", f"<id>{pid + copy * 10_000_000}</id>", p, count=1)
            out.append(page)
            size += len(page.encode())
            n += 1
            if target is not None and size >= target:
                break
        copy += 1
    out.append("</mediawiki>\n")
    data = "".join(out).encode()
    path.write_bytes(bz2.compress(data, 9))
    return n, len(data)


# -- measuring a process tree ----------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.split("/")[2]))
    return out


def _rss(pid: int) -> int:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_measured(cmd: list[str], env=None) -> tuple[float, int, int, float]:
    """(wall seconds, peak RSS of the largest process, peak RSS summed over the tree, CPU
    seconds of the whole tree: user + system of every process reaped under it)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_one = peak_sum = 0
    while proc.poll() is None:
        tree, todo = [], [proc.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo += _children(pid)
        sizes = [_rss(p) for p in tree]
        peak_one, peak_sum = max(peak_one, max(sizes)), max(peak_sum, sum(sizes))
        time.sleep(0.2)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{cmd[:3]} failed: {proc.stderr.read().decode()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, peak_one, peak_sum, cpu


# -- residue ---------------------------------------------------------------------------------------
def residue(docs: list[list[str]]) -> dict[str, float]:
    """Share of documents (each a list of lines/sentences) holding each markup trace."""
    n = max(1, len(docs))
    shares = {k: sum(any(k in line for line in d) for d in docs) / n for k in RESIDUE}
    shares["line *#"] = sum(any(line.lstrip().startswith(("*", "#")) for line in d) for d in docs) / n
    shares["heading-only"] = (
        sum(any(_HEADINGISH.match(line.strip()) and len(line.split()) <= 4 for line in d) for d in docs) / n
    )
    return shares


def our_docs(out: Path) -> list[list[str]]:
    import pyarrow.parquet as pq

    return [r["sentences"] for r in pq.read_table(str(out / "wiki")).to_pylist()]


def wx_docs(out: Path) -> list[list[str]]:
    docs = []
    for f in sorted(glob.glob(str(out / "*" / "wiki_*"))):
        for block in re.findall(r"<doc [^>]*>\n(.*?)</doc>", open(f, encoding="utf-8").read(), re.S):
            lines = [line for line in block.split("\n")[1:] if line.strip()]  # line 1 is the title
            if lines:
                docs.append(lines)
    return docs


# -- the comparison --------------------------------------------------------------------------------
OURS = """
import logging, sys
from pipeline.runtime import economical_gc
economical_gc()  # as in bertflow's own processes (the stage runs in the command's worker)
from pipeline.beam.config import BeamConfig
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.job import run_corpus
cfg = CorpusConfig(sources=("wiki",), num_shards=2, wiki_reader=sys.argv[5],
                   beam=BeamConfig(num_workers=int(sys.argv[3]), fork_workers=sys.argv[4] == "fork"))
run_corpus(cfg, {"wiki": sys.argv[1]}, sys.argv[2])
"""


PURE = """
import sys
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.documents import build_paragraphs, page_record
from pipeline.corpus.wiki import iter_wiki
cfg = CorpusConfig()
for item in iter_wiki(sys.argv[1]):
    if hasattr(item, "page_id"):
        record, _ = page_record(item)
        if record:
            build_paragraphs(record, cfg)
"""


def compare(args) -> None:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_corpus_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.dump:
        dump = work / f"bench-{Path(args.dump).name.split('.')[0]}-x{args.copies}-pages-articles.xml.bz2"
    else:
        dump = work / f"bench-{args.mb:g}MB-pages-articles.xml.bz2"
    sidecar = dump.with_name(dump.name + ".json")
    if dump.exists() and sidecar.exists():  # the same generated dump, kept from an earlier run
        pages, nbytes = json.loads(sidecar.read_text())
    else:
        pages, nbytes = make_dump(dump, args.mb, args.dump, args.copies if args.dump else 0)  # --mb: no copies
        sidecar.write_text(json.dumps([pages, nbytes]))
    mb = nbytes / 1e6
    print(f"dump: {pages} pages, {mb:.1f} MB of XML ({dump.stat().st_size / 1e6:.1f} MB bz2)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    rows, docs = [], {}

    def measure(name, workers, cmd, env=None):
        load = os.getloadavg()[0]
        wall, one, tree, cpu = run_measured(cmd, env)
        rows.append((name, workers, wall, one, tree, load, cpu))

    if not args.no_pure:
        measure("bertflow read+clean+split, no Beam", 1, [sys.executable, "-c", PURE, str(dump)], env)
    for workers in args.workers:
        out = work / f"ours{workers}"
        measure(
            "bertflow corpus"
            + (", Beam's subprocess workers" if args.no_fork and workers > 1 else "")
            + (f", wiki_reader={args.wiki_reader}" if args.wiki_reader != "auto" else ""),
            workers,
            [
                sys.executable,
                "-c",
                OURS,
                str(dump),
                str(out),
                str(workers),
                "no-fork" if args.no_fork else "fork",
                args.wiki_reader,
            ],
            env,
        )
        docs["bertflow corpus"] = our_docs(out)
        if args.wikiextractor:
            out = work / f"wx{workers}"
            measure(
                "wikiextractor",
                workers,
                [
                    args.wikiextractor,
                    "-m",
                    "wikiextractor.WikiExtractor",
                    str(dump),
                    "-o",
                    str(out),
                    "--processes",
                    str(workers),
                    "-q",
                ],
            )
            docs["wikiextractor"] = wx_docs(out)
    print(
        "\n| tool | workers | MB/s of XML | pages/s | MB of XML per CPU-second | peak RSS, largest process (MiB) "
        "| peak RSS, all processes (MiB) | load avg (1 min) at start |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, w, wall, one, tree, load, cpu in rows:
        print(
            f"| {name} | {w} | {mb / wall:.2f} | {pages / wall:.0f} | {mb / cpu:.2f} | {one / 2**20:.0f} "
            f"| {tree / 2**20:.0f} | {load:.1f} |"
        )
    names = list(docs)
    print("\n| share of documents with | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    shares = {n: residue(d) for n, d in docs.items()}
    for key in shares[names[0]]:
        print(f"| `{key}` | " + " | ".join(f"{shares[n][key]:.3f}" for n in names) + " |")
    print("| documents | " + " | ".join(str(len(docs[n])) for n in names) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"pages": pages, "mb": mb, "rows": rows, "residue": shares}))


def parsers(args) -> None:
    """clean_wikitext vs mwparserfromhell's strip_code on the sample pages, one process."""
    import mwparserfromhell as mw

    from pipeline.corpus.wiki import iter_pages
    from pipeline.corpus.wikitext import clean_wikitext

    sample = sorted(glob.glob(str(ROOT / "data/sample/wiki/*.xml.bz2")))[0]
    texts = [p.text for p in iter_pages(sample) if p.ns == 0 and p.redirect is None]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    t0 = time.perf_counter()
    ours = ["\n".join(clean_wikitext(t)) for t in texts]
    t1 = time.perf_counter()
    theirs = [mw.parse(t).strip_code(normalize=True, collapse=True) for t in texts]
    t2 = time.perf_counter()
    print(f"{len(texts)} pages, {mb:.2f} MB wikitext")
    print("| cleaner | MB/s | " + " | ".join(f"`{k}`" for k in RESIDUE + ("thumb",)) + " |")
    print("|---|---|" + "---|" * (len(RESIDUE) + 1))
    for name, out, dt in (("clean_wikitext", ours, t1 - t0), ("mwparserfromhell strip_code", theirs, t2 - t1)):
        shares = [sum(k in d for d in out) / len(out) for k in RESIDUE + ("thumb",)]
        print(f"| {name} | {mb / dt:.2f} | " + " | ".join(f"{s:.3f}" for s in shares) + " |")
    for k in (2500, 10000):
        text = "{{a " * k + "x"
        t0 = time.perf_counter()
        clean_wikitext(text)
        t1 = time.perf_counter()
        mw.parse(text).strip_code()
        t2 = time.perf_counter()
        print(f"{k} unclosed '{{{{': clean_wikitext {t1 - t0:.3f} s, mwparserfromhell {t2 - t1:.3f} s")


SENTENCE_CASES = [
    ("The cat sat. The dog ran.", ["The cat sat.", "The dog ran."]),
    ("Mr. Smith met Dr. Jones at St. Paul's. They spoke.", ["Mr. Smith met Dr. Jones at St. Paul's.", "They spoke."]),
    ("J. R. R. Tolkien wrote it. He was English.", ["J. R. R. Tolkien wrote it.", "He was English."]),
    ("Pi is 3.14 or so. The U.S. Army came.", ["Pi is 3.14 or so.", "The U.S. Army came."]),
    ('"Go home." She left.', ['"Go home."', "She left."]),
    ("It sold No. 5 and fig. 3 well. Next one.", ["It sold No. 5 and fig. 3 well.", "Next one."]),
    ("Born c. 1900 in Rome. Died 1990.", ["Born c. 1900 in Rome.", "Died 1990."]),
    (
        "Кирил създава азбуката, чието име носи и днес. Той поправя превода.",
        ["Кирил създава азбуката, чието име носи и днес.", "Той поправя превода."],
    ),
    ("А. С. Пушкин родился в Москве. Он писал стихи.", ["А. С. Пушкин родился в Москве.", "Он писал стихи."]),
    ("Ο Σωκράτης ήταν φιλόσοφος. Έζησε στην Αθήνα.", ["Ο Σωκράτης ήταν φιλόσοφος.", "Έζησε στην Αθήνα."]),
    ("東京は日本の首都です。人口は多い！本当？はい。", ["東京は日本の首都です。", "人口は多い！", "本当？", "はい。"]),
    ("他说：“我来了。”然后走了。", ["他说：“我来了。”", "然后走了。"]),
    ("Er kam z.B. Montag. Dann ging er.", ["Er kam z.B. Montag.", "Dann ging er."]),
    ("Il pesait 3,5 kg. Le prix était 2.50 euros. Fin.", ["Il pesait 3,5 kg.", "Le prix était 2.50 euros.", "Fin."]),
]


def sentences(args) -> None:
    """Our splitter vs pysbd and blingfire: cases right (written with the splitter, so biased
    towards it; the failures of the others are printed) and MB/s on English prose."""
    import blingfire
    import pysbd

    from pipeline.corpus.sentences import split_sentences

    seg = pysbd.Segmenter(language="en", clean=False)
    tools = {
        "bertflow split_sentences": split_sentences,
        "pysbd 0.3.4 (en)": lambda t: [s.strip() for s in seg.segment(t) if s.strip()],
        "blingfire 0.1.8": lambda t: [s for s in blingfire.text_to_sentences(t).split("\n") if s],
    }
    text = [" ".join(c[0] for c in SENTENCE_CASES[:7])] * 2000
    mb = sum(len(t.encode()) for t in text) / 1e6
    print("| splitter | cases right | MB/s |\n|---|---|---|")
    for name, fn in tools.items():
        ok = sum(fn(t) == exp for t, exp in SENTENCE_CASES)
        t0 = time.perf_counter()
        for t in text:
            fn(t)
        print(f"| {name} | {ok}/{len(SENTENCE_CASES)} | {mb / (time.perf_counter() - t0):.2f} |")
        for t, exp in SENTENCE_CASES:
            if fn(t) != exp:
                print(f"|   wrong: {fn(t)} | | |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=20, help="MB of XML in the generated dump")
    ap.add_argument("--dump", help="a real .xml.bz2 dump whose pages are repeated instead of the sample wiki's")
    ap.add_argument("--copies", type=int, default=1, help="with --dump: how many times its pages are repeated")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--wikiextractor", help="python of a venv with wikiextractor installed")
    ap.add_argument("--workdir", help="where the dump and outputs go (default: a temp folder)")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--no-pure", action="store_true", help="skip the no-Beam read+clean run")
    ap.add_argument(
        "--no-fork",
        action="store_true",
        help="Beam's own subprocess workers at 2+ workers (BeamConfig.fork_workers=False), for comparison",
    )
    ap.add_argument(
        "--wiki-reader",
        default="auto",
        choices=("auto", "process", "thread", "inline"),
        help="corpus.wiki_reader of our runs (auto: a reader process where a worker has a core to spare)",
    )
    ap.add_argument("--parsers", action="store_true", help="clean_wikitext vs mwparserfromhell")
    ap.add_argument("--sentences", action="store_true", help="split_sentences vs pysbd, blingfire")
    args = ap.parse_args()
    if args.parsers:
        parsers(args)
    elif args.sentences:
        sentences(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
