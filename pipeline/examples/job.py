"""Stage 3: the Beam job that turns documents into pretraining examples (Parquet), of the
objective ``examples.objective`` names (its builder: ``pipeline.examples.objectives``).

    Create(corpus files) -> TokenizeToBuckets (one token file per corpus file x bucket)
    -> GroupByKey(bucket: file URLs only) -> CreateBucketExamples (sorted runs per length)
    -> GroupByKey(length: run URLs only) -> MergeShards (balanced shards, at most 16 runs read
    at once: longer runs first when there are more) -> _manifest.json

Design choices:

1. **Buckets for random-next.** NSP's "random next" needs *other* documents; the reference
   draws them from the whole corpus held in memory. Each document goes to a bucket picked by a
   stable digest of its ``doc_id``; a bucket's documents are sorted by ``doc_id`` and random-next
   spans are drawn among them (``docs_per_bucket``, 4096 by default; fewer when documents are
   long, see ``bucket_chars``). The output depends on the corpus and the config only, never on
   the worker count or the order of arrival. The cost: random-next comes from a bucket, not the
   whole corpus, and a bucket's tokens (uint16/uint32 arrays, not Python lists) sit in one
   worker's memory at once.
2. **No data through the shuffle.** Beam's ``GroupByKey`` only ever carries file URLs: the
   tokenized documents reach their bucket through files, and the examples reach their shard
   through key-sorted runs and a streaming merge (:mod:`pipeline.beam.shards`). Grouping the data
   itself made the local runner (and each Dataflow worker) hold the whole output: ~4.5 KiB per
   example. Memory is now bounded by a bucket and a few buffers, whatever the corpus size; the
   cost is one extra write and read of the tokens and of the examples.
3. **Stable order.** Each example has a uint64 key, a digest of ``doc_id|copy|index``: it fixes
   the global order (the digest scatters a document's examples, as the reference shuffles its
   instances), and the shards are consecutive ranges of that order, row counts within one.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

import apache_beam as beam
import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics

from pipeline.beam.config import output_config
from pipeline.beam.io import (
    check_runner_urls,
    counters,
    fill_empty_shards,
    make_pipeline,
    parquet_rows,
    run_job,
    shard_name,
)
from pipeline.beam.shards import KEY, RunWriter, merge_runs_in_levels, use_lean_memory_pool
from pipeline.examples.buckets import bucket_documents
from pipeline.examples.config import ExamplesConfig
from pipeline.examples.masking import VocabIds
from pipeline.examples.objectives import builder_of
from pipeline.examples.tokens import (
    NAMESPACE,
    TokenizeToBuckets,
    marks_words,
    token_work,
    unmark,
    word_marked_vocab,
)
from pipeline.examples.view import histogram_bins, histogram_width
from pipeline.schema.manifest import (
    Manifest,
    clear_stage,
    describe_file,
    fingerprint_input,
    list_files,
    read_manifest,
    write_manifest,
)
from pipeline.schema.objectives import get_objective
from pipeline.schema.outputs import ExampleLength, lengths_record, parse_seq_folder, seq_folder, vocab_output
from pipeline.schema.parquet import READ_OPTIONS, example_schema
from pipeline.schema.storage import join_url
from pipeline.vocab.tokenizer import VOCAB_FILE, read_vocab, write_vocab

WORK_DIR = "_work"
"""Intermediate files (token files, sorted runs) under the stage folder; removed at the end."""
COUNTERS = (
    "documents",
    "sentences",
    "sentences_empty_after_tokenizing",
    "docs_skipped_too_short",
    "docs_single_sentence",
    "duplicate_doc_ids_dropped",
    "unk_tokens",
    "document_tokens",
)
BASE_STATS = ("examples", "tokens", "masked_tokens", "eligible_tokens")


def stats_of(objective: str) -> tuple[str, ...]:
    """The per-length counters of an objective's examples (those of its sentence label too)."""
    label = get_objective(objective).label_stat
    return (*BASE_STATS, label, "multi_sentence_chunk", f"{label}_multi") if label else BASE_STATS


def num_buckets_for(num_documents: int, num_chars: int = 0, config: ExamplesConfig | None = None) -> int:
    """Buckets for a corpus: ~``docs_per_bucket`` documents and at most ~``bucket_chars`` each."""
    config = config or ExamplesConfig()
    by_docs = math.ceil(num_documents / config.docs_per_bucket)
    by_chars = math.ceil(num_chars / config.bucket_chars)
    return max(1, by_docs, by_chars)


def example_key(doc_id: str, copy: int, index: int) -> int:
    """A stable uint64 key, digest of ``doc_id|copy|index``: the example's place in the order."""
    ident = f"{doc_id}|{copy:04d}|{index:06d}"
    return int.from_bytes(hashlib.blake2b(ident.encode("utf-8"), digest_size=8).digest(), "big")


seq_name = seq_folder


class CreateBucketExamples(beam.DoFn):
    """(bucket, token file URLs) -> (seq name, (run URL, rows)) for each sorted run written."""

    def __init__(self, config: ExamplesConfig, vocab: VocabIds, vocab_size: int, work_url: str, marked=None):
        self.config = config
        self.marked = config.segmenter != "none" if marked is None else marked
        self.vocab = vocab
        self.vocab_size = vocab_size
        self.work_url = work_url
        self.duplicates = Metrics.counter(NAMESPACE, "duplicate_doc_ids_dropped")
        self.stats = {
            (n, stat): Metrics.counter(NAMESPACE, f"{seq_name(n)}.{stat}")
            for n in config.max_seq_lengths
            for stat in stats_of(config.objective)
        }
        objective = get_objective(config.objective)
        self.label, self.label_stat = objective.sentence_label, objective.label_stat
        self.build = builder_of(config.objective)
        self.hist = {
            n: [Metrics.counter(NAMESPACE, f"{seq_name(n)}.length_hist.{lo:04d}") for lo in histogram_bins(n)]
            for n in config.max_seq_lengths
        }

    def setup(self):
        use_lean_memory_pool()

    def process(self, element):
        bucket, urls = element
        doc_ids, docs, duplicates = bucket_documents(list(urls))
        self.duplicates.inc(duplicates)
        cfg = self.config
        marked = self.marked
        vocab = word_marked_vocab(self.vocab, self.vocab_size) if marked else self.vocab
        for length in cfg.max_seq_lengths:
            name = seq_name(length)
            writer = RunWriter(
                example_schema(self.vocab_size, length, cfg.objective),
                lambda r, name=name: join_url(self.work_url, name, f"b{bucket:05d}-r{r:04d}.parquet"),
            )
            tally = _Tally(length, self.label, self.label_stat)
            for doc_id, copy, k, row in self.build(doc_ids, docs, length, cfg.max_predictions(length), cfg, vocab):
                if marked:
                    unmark(row, self.vocab_size)
                tally.add(row)
                row[KEY] = example_key(doc_id, copy, k)
                writer.add(row)
            self._count(length, tally)
            for run in writer.close():
                yield name, run

    def _count(self, length: int, tally: _Tally) -> None:
        """A bucket's figures of one length into the Beam counters, once per bucket: a counter's
        ``inc`` per example cost more than the tally (profile in docs/speed-data.md)."""
        for stat, value in tally.stats.items():
            if value:
                self.stats[length, stat].inc(value)
        for counter, value in zip(self.hist[length], tally.hist, strict=True):
            if value:
                counter.inc(value)


class _Tally:
    """The figures of the examples of one length, counted in plain ints (see :func:`stats_of`)."""

    def __init__(self, length: int, label: str | None, label_stat: str | None):
        self.width = histogram_width(length)
        self.last_bin = len(histogram_bins(length)) - 1
        self.hist = [0] * (self.last_bin + 1)
        self.label, self.label_stat = label, label_stat
        self.examples = self.tokens = self.eligible = self.masked = self.labelled = self.multi = 0
        self.labelled_multi = 0

    def add(self, row: dict[str, Any]) -> None:
        n = len(row["input_ids"])
        self.examples += 1
        self.tokens += n
        self.eligible += n - row["special_tokens"]  # all but [CLS] and the [SEP]s
        self.masked += len(row["masked_positions"])
        self.hist[min(n // self.width, self.last_bin)] += 1  # view.histogram_bin, its sizes kept
        if not self.label:
            return
        if row[self.label]:
            self.labelled += 1
        if row["multi_sentence_chunk"]:
            self.multi += 1
            if row[self.label]:
                self.labelled_multi += 1

    @property
    def stats(self) -> dict[str, int]:
        stats = {"examples": self.examples, "tokens": self.tokens, "masked_tokens": self.masked,
                 "eligible_tokens": self.eligible}  # fmt: skip
        if self.label:
            stats[self.label_stat] = self.labelled
            stats["multi_sentence_chunk"] = self.multi
            stats[f"{self.label_stat}_multi"] = self.labelled_multi
        return stats


class MergeShards(beam.DoFn):
    """(seq name, run URLs) -> (seq name, rows per shard): the balanced, key-ordered shards."""

    def __init__(self, output_url: str, schemas: dict[str, pa.Schema], num_shards: int, work_url: str):
        self.output_url = output_url
        self.schemas = schemas
        self.num_shards = num_shards
        self.work_url = work_url

    def setup(self):
        use_lean_memory_pool()

    def process(self, element):
        name, runs = element
        length = parse_seq_folder(name)
        rows = merge_runs_in_levels(
            sorted(runs),
            join_url(self.work_url, "merge", name),
            join_url(self.output_url, name),
            self.schemas[name],
            self.num_shards,
            shard_name,
            row_bytes=4 * length + 64,
        )
        yield name, rows


class ExamplesFromDocuments(beam.PTransform):
    """Tokenizing work (see :func:`token_work`) -> (seq name, rows per shard): the whole job."""

    def __init__(
        self,
        config: ExamplesConfig,
        vocab: list[str],
        lowercase: bool,
        num_buckets: int,
        output_url: str,
        word_tokenizer: str = "none",
        subword: str = "wordpiece",
    ):
        super().__init__()
        self.config = config
        self.vocab = vocab
        self.lowercase = lowercase
        self.num_buckets = num_buckets
        self.output_url = output_url
        self.word_tokenizer = word_tokenizer
        self.subword = subword

    def expand(self, parts):
        cfg = self.config
        work = join_url(self.output_url, WORK_DIR)
        schemas = {seq_name(n): example_schema(len(self.vocab), n, cfg.objective) for n in cfg.max_seq_lengths}
        marked = marks_words(cfg.segmenter, self.word_tokenizer, self.subword, cfg.whole_word_mask)
        tokenize = TokenizeToBuckets(
            self.vocab, self.lowercase, self.num_buckets, work, cfg.segmenter, self.word_tokenizer, self.subword, marked
        )
        return (
            parts
            | "SpreadFiles" >> beam.Reshuffle()
            | "TokenizeToBuckets" >> beam.ParDo(tokenize)
            | "GroupByBucket" >> beam.GroupByKey()
            | "CreateExamples"
            >> beam.ParDo(CreateBucketExamples(cfg, VocabIds.from_vocab(self.vocab), len(self.vocab), work, marked))
            | "GroupByLength" >> beam.GroupByKey()
            | "MergeShards" >> beam.ParDo(MergeShards(self.output_url, schemas, cfg.num_shards, work))
        )


def corpus_size(doc_urls: list[str]) -> tuple[int, int]:
    """(documents, characters) of document Parquet files, from footers and one int column."""
    docs = chars = 0
    for url in doc_urls:
        fs, path = fsspec.core.url_to_fs(url)
        with fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f, **READ_OPTIONS)
            docs += pf.metadata.num_rows
            for batch in pf.iter_batches(columns=["num_chars"], batch_size=65536):
                chars += int(pc.sum(batch.column(0)).as_py() or 0)
    return docs, chars


def build_examples_pipeline(
    config: ExamplesConfig,
    doc_urls: list[str],
    vocab: list[str],
    lowercase: bool,
    num_buckets: int,
    output_url: str,
    word_tokenizer: str = "none",
    subword: str = "wordpiece",
) -> beam.Pipeline:
    """The examples job over the corpus files ``doc_urls``, built, not run, with the options of
    ``config.beam`` (any runner: a test validates it for Dataflow without submitting)."""
    check_runner_urls(config.beam, {"corpus": doc_urls, "output": [output_url]})
    pipeline = make_pipeline(config.beam, job_name="bertflow-examples")
    _ = (
        pipeline
        | "ListFiles" >> beam.Create(token_work(doc_urls, config.beam))
        | "Examples"
        >> ExamplesFromDocuments(config, vocab, lowercase, num_buckets, output_url, word_tokenizer, subword)
    )
    return pipeline


def run_examples(config: ExamplesConfig, corpus_url: str, vocab_url: str, output_url: str) -> Manifest:
    """Create the examples of a finished corpus stage with a finished vocab stage.

    Writes ``output_url/seq<N>/part-*.parquet`` (``config.num_shards`` each), a copy of the
    ``vocab.txt`` the ids refer to, and the manifest last.
    """
    start = time.time()
    corpus = read_manifest(corpus_url)
    vocab_manifest = read_manifest(vocab_url)
    inputs = {"corpus": fingerprint_input(corpus_url), "vocab": fingerprint_input(vocab_url)}
    vocab = read_vocab(join_url(vocab_url, VOCAB_FILE))
    produced = vocab_output(vocab_manifest, vocab)
    lowercase, word_tokenizer, subword = produced.lowercase, produced.word_tokenizer, produced.subword
    if word_tokenizer != "none" and config.segmenter != "none":
        raise ValueError(
            f"examples.segmenter={config.segmenter!r} with a vocabulary segmented by {word_tokenizer!r}: its words"
            " already give whole-word masking its units; set examples.segmenter=none"
        )
    ids = VocabIds.from_vocab(vocab)
    doc_urls = corpus.file_urls(".parquet")
    num_documents, num_chars = corpus_size(doc_urls)
    num_buckets = num_buckets_for(num_documents, num_chars, config)
    clear_stage(output_url)

    pipeline = build_examples_pipeline(
        config, doc_urls, vocab, lowercase, num_buckets, output_url, word_tokenizer, subword
    )
    result = run_job(pipeline, config.beam, "the examples job")
    beam_counts = counters(result, NAMESPACE)
    fs, work_path = fsspec.core.url_to_fs(join_url(output_url, WORK_DIR))
    if fs.exists(work_path):
        fs.rm(work_path, recursive=True)
    write_vocab(vocab, join_url(output_url, VOCAB_FILE))

    counts: dict[str, Any] = {
        "documents_in_corpus": num_documents,
        "chars_in_corpus": num_chars,
        "num_buckets": num_buckets,
        "vocab_size": len(vocab),
        "vocab_fingerprint": inputs["vocab"],
        "pad_id": vocab.index("[PAD]"),
        "cls_id": ids.cls_id,
        "sep_id": ids.sep_id,
        "mask_id": ids.mask_id,
        "unk_id": vocab.index("[UNK]"),
    }
    files = [describe_file(output_url, VOCAB_FILE)]
    for n in config.max_seq_lengths:
        name = seq_name(n)
        schema = example_schema(len(vocab), n, config.objective)
        fill_empty_shards(join_url(output_url, name), schema, config.num_shards)
        rows = 0
        for rel in list_files(output_url):
            if rel.startswith(name + "/"):
                file_rows = parquet_rows(join_url(output_url, rel))
                files.append(describe_file(output_url, rel, rows=file_rows))
                rows += file_rows
        counts.update(shard_counts(name, n, rows, beam_counts, config.objective))
        if rows == 0:  # a phase at this length would have no data: never "done"
            raise ValueError(
                f"examples: 0 examples of length {n} from the {num_documents} documents of {corpus_url} "
                "(a document needs at least one sentence of tokens; see the corpus stage's counts)"
            )
    for key in COUNTERS:
        counts.setdefault(key, beam_counts.get(key, 0))  # a counter never incremented is absent
    return write_manifest(
        stage="examples",
        stage_url=output_url,
        config=output_config(config),
        inputs=inputs,
        counts=counts,
        files=files,
        seconds=time.time() - start,
        outputs=lengths_record(example_lengths_of(config)),
    )


def example_lengths_of(config: ExamplesConfig) -> list[ExampleLength]:
    """What each length of ``config``'s examples is, as the manifest records it."""
    return [
        ExampleLength(
            max_seq_length=n,
            max_predictions=config.max_predictions(n),
            masking=config.masking,
            masked_lm_prob=config.masked_lm_prob,
            whole_word_mask=config.whole_word_mask,
            objective=config.objective,
        )
        for n in config.max_seq_lengths
    ]


def shard_counts(name: str, length: int, rows: int, beam_counts: dict[str, int], objective: str) -> dict[str, float]:
    """The manifest figures of one sequence length, from the Beam counters."""
    out: dict[str, float] = {f"{name}.examples": rows}
    for stat in stats_of(objective)[1:]:
        out[f"{name}.{stat}"] = beam_counts.get(f"{name}.{stat}", 0)
    for lo in histogram_bins(length):
        key = f"{name}.length_hist.{lo:04d}"
        out[key] = beam_counts.get(key, 0)
    if label := get_objective(objective).label_stat:
        out[f"{name}.{label}_share"] = out[f"{name}.{label}"] / rows if rows else 0.0
        multi = out[f"{name}.multi_sentence_chunk"]
        out[f"{name}.{label}_share_multi_sentence"] = out[f"{name}.{label}_multi"] / multi if multi else 0.0
    tokens, eligible = out[f"{name}.tokens"], out[f"{name}.eligible_tokens"]
    out[f"{name}.masked_share"] = out[f"{name}.masked_tokens"] / tokens if tokens else 0.0
    out[f"{name}.masked_share_of_eligible"] = out[f"{name}.masked_tokens"] / eligible if eligible else 0.0
    out[f"{name}.tokens_per_example"] = tokens / rows if rows else 0.0
    return out
