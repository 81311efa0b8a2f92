"""Benchmark: what MeCab costs the examples stage on a Japanese corpus.

Writes ``--copies`` Japanese samples (synth.ja's world under seeds 0..N-1) as one corpus, runs the
corpus stage and two vocab stages on it (tiny-ja's MeCab + WordPiece, and BERT's basic tokenizer
as a reference), then times the examples stage with each (one worker, tiny-ja's settings) and,
on the same sentences, the parts of the MeCab path alone: NFKC + MeCab (the segmenter), and the
whole segmenting tokenizer (segmenter + WordPiece). Prints the segmenter's share of the
examples stage's time side by side with the basic tokenizer's run.

    python benchmarks/bench_segmenter.py --copies 8 --work /tmp/bench-seg
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
import unicodedata

import pyarrow.parquet as pq

from flows.presets import load_config
from pipeline.corpus.job import run_corpus
from pipeline.examples.job import run_examples
from pipeline.schema.manifest import has_manifest, read_manifest
from pipeline.schema.storage import join_url
from pipeline.schema.tokenization import Segmenter, WordTokenizer
from pipeline.vocab.job import run_vocab
from pipeline.vocab.tokenizer import build_text_tokenizer, read_vocab
from synth.cjk import write_language_sample
from synth.ja import LANG, downstream


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=8, help="Japanese samples (seeds) in the corpus")
    parser.add_argument("--work", required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    cfg = load_config("tiny-ja")
    data = join_url(args.work, "data")
    for seed in range(args.copies):
        folder = join_url(data, f"s{seed}")
        if not has_manifest(folder) and not __import__("os").path.exists(f"{folder}/books"):
            write_language_sample(LANG, downstream, folder, seed=seed, towns=200, people=160, books=6)
    corpus = join_url(args.work, "corpus")
    if not has_manifest(corpus):
        run_corpus(cfg.corpus, {"wiki": f"{data}/s*/wiki/*.xml.bz2", "books": f"{data}/s*/books/*.txt"}, corpus)
    counts = read_manifest(corpus).counts
    urls = read_manifest(corpus).file_urls(".parquet")
    sentences = [
        s for u in urls for d in pq.ParquetFile(u).read(columns=["sentences"]).column(0).to_pylist() for s in d
    ]
    chars = sum(map(len, sentences))
    print(f"corpus: {counts['documents']} documents, {len(sentences)} sentences, {chars / 1e6:.2f} M characters")

    beam = dataclasses.replace(cfg.examples.beam, num_workers=args.workers)
    examples_cfg = dataclasses.replace(cfg.examples, beam=beam)
    rows = []
    for name, vocab_cfg, ex_cfg in (
        ("mecab", cfg.vocab, examples_cfg),
        ("basic (none)", dataclasses.replace(cfg.vocab, word_tokenizer="none"), dataclasses.replace(examples_cfg)),
    ):
        vocab = join_url(args.work, f"vocab-{name.split()[0]}")
        run_vocab(vocab_cfg, corpus, vocab)
        out = join_url(args.work, f"examples-{name.split()[0]}")
        start = time.perf_counter()
        run_examples(ex_cfg, corpus, vocab, out)
        seconds = time.perf_counter() - start
        rows.append((name, seconds, read_manifest(out).counts["seq64.examples"], vocab))

    mecab_vocab = read_vocab(join_url(rows[0][3], "vocab.txt"))
    seg = Segmenter("mecab")
    seg.words("準備")  # load the dictionary outside the timing
    _, t_seg = timed(lambda: [seg.words(unicodedata.normalize("NFKC", s)) for s in sentences])
    tok = WordTokenizer(mecab_vocab, "mecab", specials=False)
    tok.encode_batch(sentences[:10], offsets=False)
    _, t_tok = timed(
        lambda: [tok.encode_batch(sentences[i : i + 2048], False, False) for i in range(0, len(sentences), 2048)]
    )
    basic = build_text_tokenizer(read_vocab(join_url(rows[1][3], "vocab.txt")), cfg.vocab.lowercase)
    _, t_basic = timed(
        lambda: [basic.encode_batch_fast(sentences[i : i + 2048], add_special_tokens=False)
                 for i in range(0, len(sentences), 2048)]
    )  # fmt: skip

    print(f"\n{'examples stage':<22} {'seconds':>8} {'examples (seq64)':>17}")
    for name, seconds, n, _ in rows:
        print(f"{name:<22} {seconds:8.1f} {n:17.0f}")
    ex_mecab = rows[0][1]
    print(f"\n{'part, on the same sentences':<40} {'seconds':>8} {'M chars/s':>10} {'share of examples (mecab)':>26}")
    for name, t in (
        ("NFKC + MeCab (the segmenter)", t_seg),
        ("segmenting tokenizer (MeCab + WordPiece)", t_tok),
        ("BERT basic tokenizer (Rust, reference)", t_basic),
    ):
        print(f"{name:<40} {t:8.2f} {chars / t / 1e6:10.2f} {100 * t / ex_mecab:25.1f}%")


if __name__ == "__main__":
    main()
