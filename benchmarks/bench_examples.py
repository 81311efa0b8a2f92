"""Benchmark: the examples job next to the bare ``tokenizers`` rate, with the process tree's peak RSS.

For each generated corpus size: the synthetic corpus, the corpus and vocab stages (not timed
here), then, side by side,
- ``encode_batch`` of ``tokenizers`` over the same sentences with the same vocabulary (the bare
  tokenising rate: what any example job must at least do), one process on one core, rayon held
  to one thread (``RAYON_NUM_THREADS=1``); then ``encode_batch_fast`` (same ids, no offsets: what
  the job calls without a segmenter), for reference;
- our examples job at 1 worker (pinned to one core, as the bare rate) and at 2 workers (two
  cores), at each ``dupe_factor``;
each in its own process, its peak RSS summed over the whole process tree (the job forks its
workers), sampled every 50 ms from /proc. ``input tok/s`` is the corpus's tokens over the job's
wall time, comparable with the bare rate (``vs bare``); ``instances/s`` and ``example tok/s``
count what the job writes. ``CPU s`` is the CPU time of the job's call (driver and workers; the
bare rates: their encode loop), so a loaded machine can be read per CPU-second (``vs bare,
CPU``); ``load`` is the 1-minute load average when the row started.

With ``--original DIR`` (a checkout of google-research/bert) and ``--original-python PY`` (a
Python with TensorFlow 2: the script runs under ``tensorflow.compat.v1``, unmodified), the
original ``create_pretraining_data.py`` runs on the same sentences (written one per line, a blank
line between documents, as it reads them), vocabulary, length, masking and dupe factor, on one
core, and each of our rows at that dupe factor says how many times the original's input tokens
per CPU-second it makes (``vs original, CPU``; the original's TensorFlow import not counted, as
our job's imports are not).

    python benchmarks/bench_examples.py --sizes 20MB,100MB --dupe-factors 1,5 --workers 1,2
    python benchmarks/bench_examples.py --sizes 20MB --dupe-factors 1,5 --workers 1 \
        --original ~/src/bert --original-python ~/venvs/tf/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

JOB = """
import json, resource, sys, time
from pipeline.beam.config import BeamConfig
from pipeline.examples.config import ExamplesConfig
from pipeline.examples.job import run_examples
a = json.loads(sys.argv[1])
cfg = ExamplesConfig(max_seq_lengths=(a["seq"],), max_predictions_per_seq=(a["pred"],),
                     dupe_factor=a["dupe"], num_shards=4, masking=a["masking"],
                     beam=BeamConfig(num_workers=a["workers"], fork_workers=a["fork"]))
def cpu():
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
t, c = time.time(), cpu()
m = run_examples(cfg, a["corpus"], a["vocab"], a["out"])
print(json.dumps({"seconds": time.time() - t, "cpu": cpu() - c, "counts": m.counts}))
"""

BARE = """
import json, sys, time
import pyarrow.parquet as pq
from pipeline.schema.manifest import read_manifest
from pipeline.schema.storage import join_url
from pipeline.vocab.tokenizer import build_text_tokenizer, read_vocab
a = json.loads(sys.argv[1])
sentences = [s for u in read_manifest(a["corpus"]).file_urls(".parquet")
             for doc in pq.read_table(u, columns=["sentences"]).column(0).to_pylist() for s in doc]
tok = build_text_tokenizer(read_vocab(join_url(a["vocab"], "vocab.txt")), True)
encode = getattr(tok, a.get("method", "encode_batch"))
t, c = time.time(), time.process_time(); tokens = 0
for i in range(0, len(sentences), 4096):
    tokens += sum(len(e.ids) for e in encode(sentences[i:i + 4096], add_special_tokens=False))
print(json.dumps({"seconds": time.time() - t, "cpu": time.process_time() - c, "tokens": tokens,
                  "sentences": len(sentences)}))
"""

ORIGINAL = """
import json, os, runpy, sys, time
a = json.loads(sys.argv[1])
import tensorflow.compat.v1 as tf
sys.modules["tensorflow"] = tf  # the script and its tokenization.py were written for TensorFlow 1
sys.path.insert(0, a["dir"])
script = os.path.join(a["dir"], "create_pretraining_data.py")
sys.argv = [script, "--input_file=" + a["text"], "--output_file=" + a["out"], "--vocab_file=" + a["vocab"],
            "--do_lower_case=True", "--max_seq_length=%d" % a["seq"], "--max_predictions_per_seq=%d" % a["pred"],
            "--masked_lm_prob=0.15", "--random_seed=12345", "--dupe_factor=%d" % a["dupe"]]
t, c = time.time(), time.process_time()
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as e:
    if e.code:
        raise
print(json.dumps({"seconds": time.time() - t, "cpu": time.process_time() - c}))
"""


def original_text(corpus: str, path: str) -> str:
    """The corpus's documents as the original script reads them: one sentence per line, a blank
    line between documents (written once, reused)."""
    if not os.path.exists(path):
        import pyarrow.parquet as pq

        from pipeline.schema.manifest import read_manifest

        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for url in read_manifest(corpus).file_urls(".parquet"):
                for doc in pq.read_table(url, columns=["sentences"]).column(0).to_pylist():
                    f.write("\n".join(doc) + "\n\n")
        os.replace(path + ".tmp", path)
    return path


def tree_rss_bytes(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(name))
            rss[int(name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def run_measured(
    code: str, args: dict, cores: str, env: dict | None = None, python: str = sys.executable
) -> tuple[dict, int, float]:
    """Run ``code`` in a child pinned to ``cores``; its JSON result, the tree's peak RSS and the
    CPU seconds (user + system) of the whole tree (workers are reaped by the job, the job here)."""
    cmd = ["taskset", "-c", cores, python, "-c", code, json.dumps(args)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, **(env or {})}
    )
    peak = [0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss_bytes(proc.pid))
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, _ = proc.communicate()
    t.join()
    if proc.returncode:
        raise RuntimeError(f"{cmd[:4]} failed with {proc.returncode}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(out.strip().splitlines()[-1]), peak[0], cpu


def prepare(work: str, size: str) -> tuple[str, str, float]:
    """The corpus and vocab stages of a synthetic corpus of ``size`` (reused when present)."""
    from pipeline.corpus.config import CorpusConfig
    from pipeline.corpus.job import run_corpus
    from pipeline.schema.manifest import has_manifest
    from pipeline.vocab.config import VocabConfig
    from pipeline.vocab.job import run_vocab
    from synth.corpus import parse_size, write_corpus

    root = os.path.join(work, size)
    raw, corpus, vocab = (os.path.join(root, d) for d in ("raw", "corpus", "vocab"))
    meta = os.path.join(root, "size.json")
    if not os.path.exists(meta):
        counts = write_corpus(raw, parse_size(size), seed=1)
        with open(meta, "w") as f:
            json.dump(counts, f)
    with open(meta) as f:
        mb = json.load(f)["bytes"] / 1e6
    if not has_manifest(corpus):
        run_corpus(
            CorpusConfig(num_shards=4), {"wiki": os.path.join(raw, "wiki"), "books": os.path.join(raw, "books")}, corpus
        )
    if not has_manifest(vocab):
        run_vocab(VocabConfig(vocab_size=30522), corpus, vocab)
    return corpus, vocab, mb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20MB,100MB")
    parser.add_argument("--dupe-factors", default="1,5")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--masking", default="static")
    parser.add_argument(
        "--no-fork", action="store_true", help="Beam's own subprocess workers (BeamConfig.fork_workers=False)"
    )
    parser.add_argument("--work", default=None, help="folder for corpora (kept, reused); default: a temp folder")
    parser.add_argument("--original", default="", help="a google-research/bert checkout: its script beside ours")
    parser.add_argument("--original-python", default="", help="a Python with TensorFlow 2, for --original")
    args = parser.parse_args()
    if bool(args.original) != bool(args.original_python):
        parser.error("--original and --original-python go together")
    work = args.work or tempfile.mkdtemp(prefix="bertflow-bench-examples-")
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env_path) if p)
    header = (
        f"| {'corpus':>7} | {'job':<22} | {'seconds':>7} | {'CPU s':>6} | {'instances/s':>11} | {'example tok/s':>13} "
        f"| {'input tok/s':>11} | {'vs bare':>7} | {'vs bare, CPU':>12} | {'peak RSS MiB':>12} | {'load':>4} |"
        + (f" {'vs original, CPU':>16} |" if args.original else "")
    )
    blank = f" {'-':>16} |" if args.original else ""
    pred = max(1, round(args.seq * 0.15625))  # 20 at 128, as the presets
    original_dir, original_python = (
        os.path.abspath(os.path.expanduser(p)) for p in (args.original, args.original_python)
    )
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for size in args.sizes.split(","):
        corpus, vocab, mb = prepare(work, size)
        load = os.getloadavg()[0]
        # Single-threaded by construction: one core, and tokenizers' rayon pool held to one thread.
        bare, bare_rss, _ = run_measured(BARE, {"corpus": corpus, "vocab": vocab}, "0", {"RAYON_NUM_THREADS": "1"})
        bare_rate = bare["tokens"] / bare["seconds"]
        bare_cpu_rate = bare["tokens"] / bare["cpu"]
        print(
            f"| {mb:5.0f}MB | {'bare encode_batch':<22} | {bare['seconds']:7.1f} | {bare['cpu']:6.1f} "
            f"| {'-':>11} | {'-':>13} "
            f"| {bare_rate:11,.0f} | {1:7.2f} | {1:12.2f} | {bare_rss / 2**20:12,.0f} | {load:4.1f} |{blank}",
            flush=True,
        )
        # What the job calls (no offsets needed without a segmenter): same ids, less work. Shown
        # for reference; "vs bare" stays relative to encode_batch, as issue 7 defines it.
        fast, _, _ = run_measured(
            BARE, {"corpus": corpus, "vocab": vocab, "method": "encode_batch_fast"}, "0", {"RAYON_NUM_THREADS": "1"}
        )
        fast_rate = fast["tokens"] / fast["seconds"]
        print(
            f"| {mb:5.0f}MB | {'bare encode_batch_fast':<22} | {fast['seconds']:7.1f} | {fast['cpu']:6.1f} | {'-':>11} "
            f"| {'-':>13} | {fast_rate:11,.0f} | {fast_rate / bare_rate:7.2f} | {bare['cpu'] / fast['cpu']:12.2f} "
            f"| {'-':>12} | {load:4.1f} |{blank}",
            flush=True,
        )
        text = original_text(corpus, os.path.join(work, size, "original-input.txt")) if args.original else ""
        for dupe in (int(d) for d in args.dupe_factors.split(",")):
            original_cpu = None
            if args.original:
                load = os.getloadavg()[0]
                orig_args = {
                    "dir": original_dir,
                    "text": text,
                    "out": os.path.join(work, size, f"original-dupe{dupe}.tfrecord"),
                    "vocab": os.path.join(vocab, "vocab.txt"),
                    "seq": args.seq,
                    "pred": pred,
                    "dupe": dupe,
                }
                no_gpu = {"CUDA_VISIBLE_DEVICES": ""}
                orig, orig_rss, _ = run_measured(ORIGINAL, orig_args, "0", no_gpu, original_python)
                original_cpu = orig["cpu"]
                print(
                    f"| {mb:5.0f}MB | {f'original dupe={dupe}':<22} | {orig['seconds']:7.1f} | {orig['cpu']:6.1f} "
                    f"| {'-':>11} | {'-':>13} | {'-':>11} | {'-':>7} | {bare['cpu'] / orig['cpu']:12.2f} "
                    f"| {orig_rss / 2**20:12,.0f} | {load:4.1f} | {1:16.2f} |",
                    flush=True,
                )
            for workers in (int(w) for w in args.workers.split(",")):
                job = {
                    "corpus": corpus,
                    "vocab": vocab,
                    "out": os.path.join(work, size, "examples"),
                    "seq": args.seq,
                    "pred": pred,
                    "dupe": dupe,
                    "workers": workers,
                    "masking": args.masking,
                    "fork": not args.no_fork,
                }
                load = os.getloadavg()[0]
                res, rss, _ = run_measured(JOB, job, ",".join(str(c) for c in range(workers)))
                c, s, cpu = res["counts"], res["seconds"], res["cpu"]
                name = f"seq{args.seq}"
                rate = c["document_tokens"] / s
                # CPU view (a loaded machine stretches the wall time, not the work): the job's
                # input tokens per CPU-second (driver and workers, from the call to its return)
                # over the bare encode_batch's tokens per CPU-second.
                cpu_rate = c["document_tokens"] / cpu
                print(
                    f"| {mb:5.0f}MB | {f'ours dupe={dupe} workers={workers}':<22} | {s:7.1f} | {cpu:6.1f} "
                    f"| {c[name + '.examples'] / s:11,.0f} | {c[name + '.tokens'] / s:13,.0f} "
                    f"| {rate:11,.0f} | {rate / bare_rate / workers:7.2f} | {cpu_rate / bare_cpu_rate:12.2f} "
                    f"| {rss / 2**20:12,.0f} | {load:4.1f} |"
                    + (f" {original_cpu / cpu:16.2f} |" if original_cpu else blank),
                    flush=True,
                )
    print(
        "\n'vs bare' is per worker (input tok/s / workers / bare rate); 'vs bare, CPU' is the input "
        "tokens per CPU-second of the job (driver and workers, the call of run_examples) over the "
        "bare tokens per CPU-second; 'CPU s' is those CPU-seconds (bare: of the encode loop); 'load' "
        "is the 1-minute load average when the row started (a figure taken at load > 1 "
        f"shares the cores with other work); 'vs original, CPU' is the original script's CPU-seconds "
        f"over ours on the same input (its input tokens are ours). Work folder: {work}"
    )


if __name__ == "__main__":
    main()
