"""Benchmark: the data stages (corpus, vocab, examples) on a synthetic corpus of a given size.

Prints wall time and MB/s of raw text per stage, next to the reference figure this machine
class was measured at for a plain Beam job (ECOSYSTEM notes: a 79 MB read/split/count/write
job took 25 s in one process, 15 s with 2 workers, i.e. ~3.2 / ~5.3 MB/s).

    python benchmarks/bench_data_stages.py --size 20MB --workers 1
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from flows.presets import load_config
from flows.runner import run_stage
from synth.corpus import parse_size, write_corpus

REFERENCE_MB_S = {1: 79 / 25, 2: 79 / 15}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="20MB")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--dupe-factor", type=int, default=5)
    parser.add_argument("--keep", default=None, help="work folder to keep (default: a temp folder)")
    args = parser.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="bertflow-bench-")
    data = os.path.join(work, "data")
    t = time.time()
    counts = write_corpus(data, parse_size(args.size), seed=1)
    mb = counts["bytes"] / 1e6
    print(
        f"synthetic corpus: {mb:.1f} MB of text ({counts['articles']} articles, {counts['books']} books) "
        f"written in {time.time() - t:.1f} s"
    )
    cfg = load_config(
        "tiny",
        {
            "data.wiki": os.path.join(data, "wiki"),
            "data.books": os.path.join(data, "books"),
            "corpus.beam.num_workers": args.workers,
            "examples.beam.num_workers": args.workers,
            "examples.dupe_factor": args.dupe_factor,
        },
    )
    root = os.path.join(work, "run")
    ref = REFERENCE_MB_S.get(args.workers)
    print(f"\n{'stage':<10} {'seconds':>8} {'MB/s':>7} {'reference MB/s':>15}  key figures")
    for stage in ("corpus", "vocab", "examples"):
        r = run_stage(stage, cfg, root, force=True)
        figs = {k: v for k, v in r.counts.items() if k in ("documents", "vocab_size") or k.endswith(".examples")}
        ref_text = f"{ref:15.1f}" if ref and stage == "corpus" else f"{'-':>15}"
        print(f"{stage:<10} {r.seconds:8.1f} {mb / r.seconds:7.2f} {ref_text}  {figs}")
    print(f"\nwork folder: {work}")


if __name__ == "__main__":
    main()
