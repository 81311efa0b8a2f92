"""The corpus and examples stages as functions under cProfile: the top lines by own time.

    python benchmarks/profile_data_stages.py --data DIR [--work WD] [--top 25] [--stages corpus,examples]

``DIR`` is a synthetic corpus (``bertflow synth-corpus --out DIR --size 20MB``): its ``wiki``
and ``books`` folders are the corpus stage's inputs. One worker, the wiki reader inline (so every
page's work runs in the profiled thread), the default corpus config with 4 shards; the vocab
stage (30,522 entries, not profiled) then the examples stage (seq 128, dupe 1, the defaults
otherwise; ``RAYON_NUM_THREADS=1`` unless set: the tokenizer on one thread, as the bare rate of
benchmarks/bench_examples.py). The profiler's clock is the process's CPU time. Prints, per
stage, the CPU-seconds of the call and the ``--top`` functions by their own time (``tottime``),
then by cumulative time, in the form docs/speed-data.md quotes.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def profiled(label: str, fn, top: int, out_dir: str):
    # CPU time, not wall time: the machine is shared, and a wall-clock profile charges a function
    # for the time it waited for a core.
    prof = cProfile.Profile(time.process_time)
    cpu = time.process_time()
    prof.enable()
    result = fn()
    prof.disable()
    cpu = time.process_time() - cpu
    prof.dump_stats(os.path.join(out_dir, f"{label}.prof"))
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(top)
        lines = buf.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
        print(f"\n## {label}: {cpu:.2f} CPU-s in the process (profiled), top {top} by {key}\n")
        print("\n".join(lines[start : start + top + 1]))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a synth-corpus folder (wiki/, books/)")
    parser.add_argument("--work", default=None, help="output folder (default: a temp folder)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--stages", default="corpus,examples")
    parser.add_argument("--dupe", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", "1")

    from pipeline.beam.config import BeamConfig
    from pipeline.corpus.config import CorpusConfig
    from pipeline.corpus.job import run_corpus
    from pipeline.examples.config import ExamplesConfig
    from pipeline.examples.job import run_examples
    from pipeline.schema.manifest import has_manifest
    from pipeline.vocab.config import VocabConfig
    from pipeline.vocab.job import run_vocab

    work = args.work or tempfile.mkdtemp(prefix="bertflow-profile-")
    corpus, vocab, examples = (os.path.join(work, d) for d in ("corpus", "vocab", "examples"))
    stages = args.stages.split(",")
    inputs = {"wiki": os.path.join(args.data, "wiki"), "books": os.path.join(args.data, "books")}
    corpus_cfg = CorpusConfig(num_shards=4, wiki_reader="inline", beam=BeamConfig(num_workers=1))
    if "corpus" in stages:
        profiled("corpus", lambda: run_corpus(corpus_cfg, inputs, corpus), args.top, work)
    elif not has_manifest(corpus):
        run_corpus(corpus_cfg, inputs, corpus)
    if not has_manifest(vocab):
        run_vocab(VocabConfig(vocab_size=30522), corpus, vocab)
    if "examples" in stages:
        cfg = ExamplesConfig(max_seq_lengths=(128,), max_predictions_per_seq=(20,), dupe_factor=args.dupe, num_shards=4)
        profiled("examples", lambda: run_examples(cfg, corpus, vocab, examples), args.top, work)
    print(f"\nwork folder: {work}")


if __name__ == "__main__":
    main()
