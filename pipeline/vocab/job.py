"""Stage 2, the vocab job: the corpus's sentences (sampled by doc_id) to ``vocab.txt`` and ``tokenizer.json``."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator

import fsspec
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.beam.config import to_dict
from pipeline.schema.manifest import Manifest, clear_stage, fingerprint_input, read_manifest, write_manifest
from pipeline.schema.outputs import VocabOutput, vocab_record
from pipeline.schema.parquet import READ_OPTIONS
from pipeline.schema.storage import join_url, write_atomically
from pipeline.schema.tokenization import WordTokenizer, hf_tokenizer_config, segmented_text
from pipeline.vocab.config import VocabConfig
from pipeline.vocab.tokenizer import (
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    VOCAB_FILE,
    build_tokenizer,
    tokenizer_config,
    write_vocab,
)
from pipeline.vocab.wordpiece import train_char_vocab, train_vocab_with_stats


def in_sample(doc_id: str, fraction: float) -> bool:
    """Whether a document is in a ``fraction`` sample, from a stable digest of its id."""
    if fraction >= 1.0:
        return True
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


class ParquetSentences:
    """The sentences of document Parquet files, re-iterable (each ``iter`` reads them afresh).

    Streams: a batch of documents at a time, column chunks read through a small buffer, so
    memory does not grow with the corpus. ``sample_fraction`` keeps a stable sample of the
    documents (:func:`in_sample`); ``max_sentences`` stops after that many."""

    def __init__(self, urls: list[str], max_sentences: int = 0, sample_fraction: float = 1.0):
        self.urls = list(urls)
        self.max_sentences = max_sentences
        self.sample_fraction = sample_fraction

    def __iter__(self) -> Iterator[str]:
        n = 0
        for url in self.urls:
            fs, path = fsspec.core.url_to_fs(url)
            with fs.open(path, "rb") as f:
                pf = pq.ParquetFile(f, pre_buffer=False, buffer_size=1 << 20, **READ_OPTIONS)
                for batch in pf.iter_batches(columns=["doc_id", "sentences"], batch_size=256):
                    for doc_id, doc in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
                        if not in_sample(doc_id, self.sample_fraction):
                            continue
                        for sentence in doc:
                            if self.max_sentences and n >= self.max_sentences:
                                return
                            n += 1
                            yield sentence


def corpus_sentences(urls: list[str]) -> int:
    """Sentences in document Parquet files, from their ``num_sentences`` column alone."""
    total = 0
    for url in urls:
        fs, path = fsspec.core.url_to_fs(url)
        with fs.open(path, "rb") as f:
            column = pq.ParquetFile(f, **READ_OPTIONS).read(columns=["num_sentences"]).column(0)
            total += pc.sum(column).as_py() or 0
    return total


def sampling_rate(config: VocabConfig, corpus: Manifest) -> tuple[float, int]:
    """The share of documents the trainer reads, and the corpus's sentences (0 when not counted).

    ``sample_fraction`` as set; with ``sample_sentences`` below what that share holds, the
    smaller rate that keeps about ``sample_sentences``. The corpus's sentences are its manifest's
    count; a manifest without one has them summed from the files."""
    if not config.sample_sentences:
        return config.sample_fraction, 0
    total = int(corpus.counts.get("sentences") or corpus_sentences(corpus.file_urls(".parquet")))
    if total * config.sample_fraction <= config.sample_sentences:
        return config.sample_fraction, total
    return config.sample_sentences / total, total


class SegmentedSentences:
    """Sentences as the segmenter's words, space-joined (re-iterable, like its source)."""

    def __init__(self, sentences, word_tokenizer: str, lowercase: bool):
        self.sentences = sentences
        self.word_tokenizer = word_tokenizer
        self.lowercase = lowercase

    def __iter__(self) -> Iterator[str]:
        segment = segmented_text(self.word_tokenizer, self.lowercase)
        for sentence in self.sentences:
            yield segment(sentence)


def write_segmented_tokenizer(vocab: list[str], config: VocabConfig, output_url: str) -> None:
    """tokenizer_config.json of a MeCab or jieba vocabulary (what AutoTokenizer builds from),
    and for jieba the tokenizer.json BertTokenizerFast reads (jieba-segmented text in)."""
    if config.word_tokenizer == "jieba":
        tok = WordTokenizer(vocab, "jieba", lowercase=config.lowercase).rust
        tok.enable_truncation(512)
        write_atomically(join_url(output_url, TOKENIZER_FILE), tok.to_str(pretty=True))
    hf = hf_tokenizer_config(config.word_tokenizer, config.subword, config.lowercase)
    write_atomically(join_url(output_url, TOKENIZER_CONFIG_FILE), json.dumps(hf, indent=2, sort_keys=True) + "\n")


def run_vocab(config: VocabConfig, corpus_url: str, output_url: str) -> Manifest:
    """Train the vocabulary on a finished corpus stage: vocab.txt, tokenizer.json, manifest."""
    start = time.time()
    corpus = read_manifest(corpus_url)
    inputs = {"corpus": fingerprint_input(corpus_url)}
    fraction, total = sampling_rate(config, corpus)
    sentences = ParquetSentences(corpus.file_urls(".parquet"), config.max_sentences, fraction)
    clear_stage(output_url)

    segmented = config.word_tokenizer != "none"
    if segmented:  # trained on MeCab's or jieba's words (tokenization.py)
        words = SegmentedSentences(sentences, config.word_tokenizer, config.lowercase)
        train = train_char_vocab if config.subword == "character" else train_vocab_with_stats
        vocab, counts = train(words, config)
    else:
        vocab, counts = train_vocab_with_stats(sentences, config)
    if total:
        counts["corpus_sentences"] = total
    if counts["learned_tokens"] <= 0:  # only [PAD], [unused*], [UNK], [CLS], [SEP], [MASK]: never "done"
        raise ValueError(
            f"vocab: no piece learnt beyond the {len(vocab)} special entries from {counts.get('sentences_used', 0)} "
            f"sentences of {corpus_url} (vocab.sample_fraction={config.sample_fraction}, "
            f"vocab.sample_sentences={config.sample_sentences}, vocab.max_sentences={config.max_sentences}): "
            "the corpus stage's output has no text to learn from"
        )
    write_vocab(vocab, join_url(output_url, VOCAB_FILE))
    if segmented:
        write_segmented_tokenizer(vocab, config, output_url)
    else:
        tok = build_tokenizer(vocab, config.lowercase)
        write_atomically(join_url(output_url, TOKENIZER_FILE), tok.to_str(pretty=True))
        write_atomically(
            join_url(output_url, TOKENIZER_CONFIG_FILE),
            json.dumps(tokenizer_config(config.lowercase), indent=2, sort_keys=True) + "\n",
        )

    return write_manifest(
        stage="vocab",
        stage_url=output_url,
        config=to_dict(config),
        inputs=inputs,
        counts=counts,
        seconds=time.time() - start,
        outputs=vocab_record(VocabOutput.of(vocab, config.lowercase, config.word_tokenizer, config.subword)),
    )
