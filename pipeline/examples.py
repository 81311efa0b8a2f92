"""Stage 3: the Beam job that turns documents into MLM + NSP pretraining examples (Parquet).

Documents -> tokenized sentences -> buckets -> ``create_instances_from_document`` for each
document x ``dupe_factor`` copy x sequence length -> deterministic shards per length.

The design choice is the **bucket**. NSP's "random next" needs *other* documents, and the
reference draws them from the whole corpus held in memory; a Beam worker sees only a bundle, in
an order the runner chooses. So each document goes to a bucket picked by a stable digest of its
``doc_id``; a bucket's documents are grouped, sorted by ``doc_id``, and random-next spans are drawn
from within the bucket. The output then depends only on the corpus and the config, never on the
worker count or the order of arrival. The cost: random-next spans come from the
~:data:`DOCS_PER_BUCKET` documents that share a bucket, not the whole corpus (still unrelated
documents: the bucket is a hash of the id), and a bucket's tokenized documents sit in one
worker's memory at once.
``num_buckets = ceil(num_documents / DOCS_PER_BUCKET)``, the document count read from the Parquet
footers, so it depends on the corpus alone.

Each example gets a unique stable key, ``<digest>|<doc_id>|<copy>|<index>``: it picks the shard
and the order inside the shard (the digest prefix scatters a document's examples, as the
reference shuffles its instances), and is dropped when the row is written.
"""

from __future__ import annotations

import hashlib
import math
import operator
import time
from typing import Any, Iterator

import apache_beam as beam
import fsspec
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics

from pipeline.beam_io import (
    WriteShards,
    counters,
    fill_empty_shards,
    parquet_rows,
    pipeline_options,
    stable_shard,
)
from pipeline.config import ExamplesConfig, to_dict
from pipeline.masking import VocabIds, create_instances_from_document, example_rng
from pipeline.schema import (
    Manifest,
    clear_stage,
    describe_file,
    example_schema,
    fingerprint_input,
    join_url,
    list_files,
    read_manifest,
    write_manifest,
)
from pipeline.wordpiece import VOCAB_FILE, build_text_tokenizer, read_vocab

NAMESPACE = "examples"
DOCS_PER_BUCKET = 256
"""Documents per random-next bucket, on average. A constant (not a config field) so that the
examples depend on the corpus alone; large enough that random-next spans come from many unrelated
documents, small enough that a bucket of long documents fits a worker's memory."""
COUNTERS = (
    "documents",
    "sentences",
    "sentences_empty_after_tokenizing",
    "docs_skipped_too_short",
    "docs_single_sentence",
    "duplicate_doc_ids_dropped",
    "unk_tokens",
)
KEY = "example_key"  # transient column: shard and in-shard order, dropped on write


def num_buckets_for(num_documents: int) -> int:
    return max(1, math.ceil(num_documents / DOCS_PER_BUCKET))


def example_key(doc_id: str, copy: int, index: int) -> str:
    """A unique, stable example key whose digest prefix spreads a document's examples."""
    ident = f"{doc_id}|{copy:04d}|{index:06d}"
    return hashlib.blake2b(ident.encode("utf-8"), digest_size=8).hexdigest() + "|" + ident


def seq_name(max_seq_length: int) -> str:
    return f"seq{max_seq_length}"


def read_documents(url: str) -> Iterator[tuple[str, list[str]]]:
    """(doc_id, sentences) of one document Parquet file."""
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as f:
        pf = pq.ParquetFile(f)
        for batch in pf.iter_batches(columns=["doc_id", "sentences"], batch_size=512):
            for doc_id, sentences in zip(
                batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True
            ):
                yield doc_id, sentences


class TokenizeDocument(beam.DoFn):
    """(doc_id, sentences) -> (doc_id, [ids per sentence]); empty sentences and documents dropped
    and counted."""

    def __init__(self, vocab: list[str], lowercase: bool):
        self.vocab = vocab
        self.lowercase = lowercase
        self.documents = Metrics.counter(NAMESPACE, "documents")
        self.sentences = Metrics.counter(NAMESPACE, "sentences")
        self.empty_sentences = Metrics.counter(NAMESPACE, "sentences_empty_after_tokenizing")
        self.skipped = Metrics.counter(NAMESPACE, "docs_skipped_too_short")
        self.single = Metrics.counter(NAMESPACE, "docs_single_sentence")
        self.unknown = Metrics.counter(NAMESPACE, "unk_tokens")

    def setup(self):
        # No truncation: truncate_seq_pair cuts examples, not sentences.
        self.tokenizer = build_text_tokenizer(self.vocab, self.lowercase)
        self.unk_id = self.tokenizer.token_to_id("[UNK]")

    def process(self, element):
        doc_id, sentences = element
        self.documents.inc()
        self.sentences.inc(len(sentences))
        encodings = self.tokenizer.encode_batch(sentences, add_special_tokens=False)
        ids = [e.ids for e in encodings if e.ids]
        if len(ids) < len(sentences):
            self.empty_sentences.inc(len(sentences) - len(ids))
        if not ids:
            self.skipped.inc()  # nothing to make an example from
            return
        if len(ids) == 1:
            self.single.inc()  # allowed: its examples are all random-next
        self.unknown.inc(sum(s.count(self.unk_id) for s in ids))
        yield doc_id, ids


class CreateExamples(beam.DoFn):
    """A bucket of documents -> examples, one tagged output per sequence length."""

    def __init__(self, config: ExamplesConfig, vocab: VocabIds):
        self.config = config
        self.vocab = vocab
        self.duplicates = Metrics.counter(NAMESPACE, "duplicate_doc_ids_dropped")
        self.stats = {
            (n, stat): Metrics.counter(NAMESPACE, f"{seq_name(n)}.{stat}")
            for n in config.max_seq_lengths
            for stat in ("examples", "tokens", "masked_tokens", "random_next")
        }

    def process(self, element):
        _, members = element
        docs: list[tuple[str, list[list[int]]]] = []
        for doc_id, ids in sorted(members):  # by doc_id (then content): arrival order ignored
            if docs and docs[-1][0] == doc_id:
                self.duplicates.inc()
                continue
            docs.append((doc_id, ids))
        token_docs = [ids for _, ids in docs]
        cfg = self.config
        for index, (doc_id, _) in enumerate(docs):
            for length, max_predictions in zip(
                cfg.max_seq_lengths, cfg.max_predictions_per_seq, strict=True
            ):
                tag = seq_name(length)
                for copy in range(cfg.dupe_factor):
                    rng = example_rng(cfg.seed, doc_id, copy, length)
                    instances = create_instances_from_document(
                        index,
                        token_docs,
                        max_seq_length=length,
                        short_seq_prob=cfg.short_seq_prob,
                        masked_lm_prob=cfg.masked_lm_prob,
                        max_predictions_per_seq=max_predictions,
                        random_next_prob=cfg.random_next_prob,
                        vocab=self.vocab,
                        rng=rng,
                        whole_word_mask=cfg.whole_word_mask,
                    )
                    for k, row in enumerate(instances):
                        self._count(length, row)
                        row[KEY] = example_key(doc_id, copy, k)
                        yield beam.pvalue.TaggedOutput(tag, row)

    def _count(self, length: int, row: dict[str, Any]) -> None:
        self.stats[length, "examples"].inc()
        self.stats[length, "tokens"].inc(len(row["input_ids"]))
        self.stats[length, "masked_tokens"].inc(len(row["masked_positions"]))
        if row["is_random_next"]:
            self.stats[length, "random_next"].inc()


class ExamplesFromDocuments(beam.PTransform):
    """(doc_id, sentences) -> {"seq<N>": examples}: tokenize, bucket, create."""

    def __init__(self, config: ExamplesConfig, vocab: list[str], lowercase: bool, num_buckets: int):
        super().__init__()
        self.config = config
        self.vocab = vocab
        self.lowercase = lowercase
        self.num_buckets = num_buckets

    def expand(self, docs):
        n = self.num_buckets
        tags = [seq_name(length) for length in self.config.max_seq_lengths]
        return (
            docs
            | "Tokenize" >> beam.ParDo(TokenizeDocument(self.vocab, self.lowercase))
            | "AssignBucket" >> beam.Map(lambda d: (stable_shard(d[0], n), d))
            | "GroupByBucket" >> beam.GroupByKey()
            | "CreateExamples"
            >> beam.ParDo(
                CreateExamples(self.config, VocabIds.from_vocab(self.vocab))
            ).with_outputs(*tags)
        )


def run_examples(
    config: ExamplesConfig, corpus_url: str, vocab_url: str, output_url: str
) -> Manifest:
    """Create the examples of a finished corpus stage with a finished vocab stage.

    Writes ``output_url/seq<N>/part-*.parquet`` (``config.num_shards`` each) and the manifest last.
    """
    start = time.time()
    corpus = read_manifest(corpus_url)
    vocab_manifest = read_manifest(vocab_url)
    inputs = {"corpus": fingerprint_input(corpus_url), "vocab": fingerprint_input(vocab_url)}
    vocab = read_vocab(join_url(vocab_url, VOCAB_FILE))
    lowercase = bool(vocab_manifest.config.get("lowercase", True))
    doc_urls = corpus.file_urls(".parquet")
    num_documents = sum(parquet_rows(u) for u in doc_urls)
    num_buckets = num_buckets_for(num_documents)
    clear_stage(output_url)

    schemas = {n: example_schema(len(vocab), n) for n in config.max_seq_lengths}
    pipeline = beam.Pipeline(options=pipeline_options(config.beam, job_name="bertflow-examples"))
    examples = (
        pipeline
        | "ListFiles" >> beam.Create(doc_urls)
        | "ReadDocuments" >> beam.FlatMap(read_documents)
        | "Examples" >> ExamplesFromDocuments(config, vocab, lowercase, num_buckets)
    )
    for n in config.max_seq_lengths:
        _ = examples[seq_name(n)] | f"Write{seq_name(n).capitalize()}" >> WriteShards(
            join_url(output_url, seq_name(n)),
            schemas[n],
            config.num_shards,
            operator.itemgetter(KEY),
        )
    result = pipeline.run()
    result.wait_until_finish()
    beam_counts = counters(result, NAMESPACE)

    files = []
    counts: dict[str, float] = {
        "documents_in_corpus": num_documents,
        "num_buckets": num_buckets,
        "vocab_size": len(vocab),
    }
    for n in config.max_seq_lengths:
        name = seq_name(n)
        fill_empty_shards(join_url(output_url, name), schemas[n], config.num_shards)
        rows = 0
        for rel in list_files(output_url):
            if rel.startswith(name + "/"):
                file_rows = parquet_rows(join_url(output_url, rel))
                files.append(describe_file(output_url, rel, rows=file_rows))
                rows += file_rows
        counts[f"{name}.examples"] = rows
        for stat in ("tokens", "masked_tokens", "random_next"):
            counts[f"{name}.{stat}"] = beam_counts.get(f"{name}.{stat}", 0)
        counts[f"{name}.random_next_share"] = counts[f"{name}.random_next"] / rows if rows else 0.0
        counts[f"{name}.masked_share"] = (
            counts[f"{name}.masked_tokens"] / counts[f"{name}.tokens"] if rows else 0.0
        )
    for key in COUNTERS:
        counts.setdefault(key, beam_counts.get(key, 0))  # a counter never incremented is absent
    return write_manifest(
        stage="examples",
        stage_url=output_url,
        config=to_dict(config),
        inputs=inputs,
        counts=counts,
        files=files,
        seconds=time.time() - start,
    )
