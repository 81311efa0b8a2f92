"""The vocabulary trained on a sample of the corpus (``vocab.sample_sentences``) beside the one
trained on all of it: CPU, peak memory, the tokens they share, and how they tokenise held-out text.
With ``--max-words N``: the sample's vocabulary with at most N distinct words held
(``vocab.max_words``, the rarest dropped) beside the one with every word.

    python benchmarks/bench_vocab_sample.py --corpus ROOT/corpus --cap 4000000 [--preset base]
    python benchmarks/bench_vocab_sample.py --corpus ROOT/corpus --cap 4000000 --max-words 500000

Each training runs ``run_vocab`` in a fresh process and reports that process's own CPU-s (user +
sys, the trainer's threads included) and peak RSS (``ru_maxrss``). Held-out text: the sentences of
the documents whose doc_id digest, salted otherwise than the sample's, falls in the lowest 1%
(most of them are in the full run's training text, few in the sample's: the comparison leans
towards the full vocabulary). Printed: WordPiece tokens per word over it, and ``[UNK]`` per word.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRAIN = """
import dataclasses, json, resource, sys
from flows.presets import load_config
from pipeline.vocab.job import run_vocab
cfg = dataclasses.replace(
    load_config(sys.argv[1], []).vocab, sample_sentences=int(sys.argv[4]), max_words=int(sys.argv[5])
)
manifest = run_vocab(cfg, sys.argv[2], sys.argv[3])
me = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"counts": manifest.counts, "cpu_s": me.ru_utime + me.ru_stime, "rss_mib": me.ru_maxrss / 1024}))
"""


def train(preset: str, corpus: str, out: Path, cap: int, max_words: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", TRAIN, preset, corpus, str(out), str(cap), str(max_words)],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def held_out_text(corpus: str, share: float = 0.01) -> list[str]:
    import pyarrow.parquet as pq

    from pipeline.schema.manifest import read_manifest

    texts = []
    for url in read_manifest(corpus).file_urls(".parquet"):
        table = pq.read_table(url.removeprefix("file://"), columns=["doc_id", "sentences"])
        for doc_id, sentences in zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True):
            digest = hashlib.blake2b(b"held-out:" + doc_id.encode(), digest_size=8).digest()
            if int.from_bytes(digest, "big") < share * 2**64:
                texts.extend(sentences)
    return texts


def fertility(vocab_dir: Path, texts: list[str]) -> tuple[float, float]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(vocab_dir / "tokenizer.json"))
    unk = tok.token_to_id("[UNK]")
    pieces = words = unks = 0
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        pieces += len(enc.ids)
        words += len(set(enc.word_ids) - {None})
        unks += enc.ids.count(unk)
    return pieces / max(1, words), unks / max(1, words)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="a finished corpus stage's folder")
    parser.add_argument("--cap", type=int, default=4_000_000, help="vocab.sample_sentences of the sampled run")
    parser.add_argument(
        "--max-words",
        type=int,
        default=0,
        help="compare the sample's vocabulary with at most this many words held (vocab.max_words) to its uncapped one",
    )
    parser.add_argument("--preset", default="base", help="the vocab config otherwise (vocab_size ...)")
    parser.add_argument("--work", default=None, help="where the two vocabularies are written")
    args = parser.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-vocab-sample-"))
    rows = {}
    if args.max_words:
        sample = f"sample of {args.cap:,}"
        runs = ((f"{sample}, all words", "all", args.cap, 0),
                (f"{sample}, at most {args.max_words:,} words", "capped", args.cap, args.max_words))  # fmt: skip
    else:
        runs = (("all sentences", "all", 0, 0), (f"sample of {args.cap:,}", "sample", args.cap, 0))
    for name, folder, cap, max_words in runs:
        rows[name] = train(args.preset, args.corpus, work / folder, cap, max_words)
        rows[name]["dir"] = work / folder
    texts = held_out_text(args.corpus)
    vocabs = {n: (r["dir"] / "vocab.txt").read_text(encoding="utf-8").splitlines() for n, r in rows.items()}
    full, sampled = vocabs.values()
    shared = len(set(full) & set(sampled))

    print(f"corpus: {args.corpus}; held-out: {len(texts):,} sentences (1% of documents by another digest)")
    print(
        "| vocabulary | sentences read | trainer's words | dropped: seen at most | CPU s | peak RSS MiB "
        "| WordPiece tokens per word | [UNK] per word |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        per_word, unk = fertility(r["dir"], texts)
        c = r["counts"]
        words, floor = c.get("trainer_words", 0), c.get("words_dropped_at_most_seen", 0)
        print(
            f"| {name} | {c['sentences_used']:,} | {words:,} | {floor} "
            f"| {r['cpu_s']:.1f} | {r['rss_mib']:,.0f} | {per_word:.4f} | {unk:.5f} |"
        )
    print(f"\nentries in both: {shared:,} of {len(full):,} ({shared / len(full):.2%})")
    top = [t for t in full if not t.startswith("[")][:10_000]
    both = len(set(top) & set(sampled)) / len(top)
    print(f"of the full one's first 10,000 entries after the special ones: {both:.2%} in both")


if __name__ == "__main__":
    main()
