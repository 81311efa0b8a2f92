"""Stage 3: the Beam job that turns documents into MLM + NSP pretraining examples (Parquet).

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
   through key-sorted runs and a streaming merge (:mod:`pipeline.shards`). Grouping the data
   itself made the local runner (and each Dataflow worker) hold the whole output: ~4.5 KiB per
   example. Memory is now bounded by a bucket and a few buffers, whatever the corpus size; the
   cost is one extra write and read of the tokens and of the examples.
3. **Stable order.** Each example has a uint64 key, a digest of ``doc_id|copy|index``: it fixes
   the global order (the digest scatters a document's examples, as the reference shuffles its
   instances), and the shards are consecutive ranges of that order, row counts within one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics

from pipeline.beam_io import (
    check_runner_urls,
    counters,
    fill_empty_shards,
    make_pipeline,
    parquet_rows,
    shard_name,
    stable_shard,
)
from pipeline.bucket_docs import bucket_documents
from pipeline.config import ExamplesConfig, output_config
from pipeline.example_view import decode_examples, histogram_bin, histogram_bins  # noqa: F401
from pipeline.masking import VocabIds, create_instances_from_document, example_rng
from pipeline.schema.manifest import (
    Manifest,
    clear_stage,
    describe_file,
    fingerprint_input,
    list_files,
    read_manifest,
    write_manifest,
)
from pipeline.schema.parquet import example_schema
from pipeline.schema.storage import join_url
from pipeline.segment import Segmenter, continuation_flags, has_cjk
from pipeline.shards import KEY, RunWriter, merge_runs_in_levels, use_lean_memory_pool
from pipeline.wordpiece import VOCAB_FILE, build_text_tokenizer, read_vocab, write_vocab

NAMESPACE = "examples"
WORK_DIR = "_work"
"""Intermediate files (token files, sorted runs) under the stage folder; removed at the end."""
READ_DOCS = 16
"""Documents read per batch (a book is thousands of sentences)."""
ENCODE_SENTENCES = 2048
"""Sentences per ``encode_batch`` call: its Encodings cost ~100 bytes a token, so bounded."""
FLUSH_TOKENS = 500_000
"""Tokens a TokenizeToBuckets worker buffers (over all buckets) before writing them out."""
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
STATS = (
    "examples",
    "tokens",
    "masked_tokens",
    "random_next",
    "multi_sentence_chunk",
    "random_next_multi",
    "eligible_tokens",
)


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


def seq_name(max_seq_length: int) -> str:
    return f"seq{max_seq_length}"


def id_space(vocab_size: int, segmenter: str) -> int:
    """Ids in token files: the vocabulary, twice over when a segmenter marks continuations."""
    return vocab_size * (2 if segmenter != "none" else 1)


def word_marked_vocab(ids: VocabIds, vocab_size: int) -> VocabIds:
    """VocabIds for marked ids (``id + vocab_size``): every marked id continues a word."""
    marked = frozenset(range(vocab_size, 2 * vocab_size))
    return dataclasses.replace(ids, continuation=ids.continuation | marked)


def unmark(row: dict[str, Any], vocab_size: int) -> None:
    """Remove the word marks from an example's ids, in place."""
    for column in ("input_ids", "masked_ids"):
        row[column] = [t - vocab_size if t >= vocab_size else t for t in row[column]]


def token_schema(vocab_size: int) -> pa.Schema:
    id_type = pa.uint16() if vocab_size <= 1 << 16 else pa.uint32()
    return pa.schema([pa.field("doc_id", pa.string()), pa.field("sentences", pa.list_(pa.list_(id_type)))])


def read_documents(
    url: str, batch_docs: int = READ_DOCS, row_groups: tuple[int, int] | None = None
) -> Iterator[tuple[list, list]]:
    """(doc_ids, sentences) batches of one document Parquet file (row groups [first, end) only
    when ``row_groups`` is given)."""
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as f:
        # Buffered column reads: a corpus file may be one row group of hundreds of MB.
        pf = pq.ParquetFile(f, pre_buffer=False, buffer_size=1 << 20)
        groups = None if row_groups is None else list(range(*row_groups))
        for batch in pf.iter_batches(columns=["doc_id", "sentences"], batch_size=batch_docs, row_groups=groups):
            yield batch.column(0).to_pylist(), batch.column(1).to_pylist()


UNITS_PER_WORKER = 4
"""Tokenizing units planned per local worker: enough to balance the workers' shares."""


def plan_token_work(doc_urls: list[str], workers: int) -> list[tuple[int, list[tuple[str, int, int]]]]:
    """The tokenizing work of the local runner's ``workers``: ``[(part, [(url, first row group,
    end row group), ...]), ...]``, one part per worker, of about equal text.

    Beam's local runner deals a stage's elements out to its workers once, round robin, with no
    rebalancing: whole corpus files (books files hold fewer, longer documents than wiki files)
    left one worker with up to twice the other's share. Here row groups are gathered into
    ``UNITS_PER_WORKER`` units of text per worker, dealt largest first to the least loaded
    part; one part per worker. The output does not depend on this plan (a bucket's documents
    are sorted by doc_id whatever file they come from: tested across worker counts)."""
    sizes = []  # (bytes, url, first, end)
    for url in doc_urls:
        fs, path = fsspec.core.url_to_fs(url)
        with fs.open(path, "rb") as f:
            meta = pq.ParquetFile(f).metadata
        sizes += [(meta.row_group(g).total_byte_size, url, g, g + 1) for g in range(meta.num_row_groups)]
    target = sum(s[0] for s in sizes) / max(1, workers * UNITS_PER_WORKER)
    units: list[list] = []
    for size, url, first, end in sizes:  # consecutive row groups of a file, up to the target
        if units and units[-1][1] == url and units[-1][3] == first and units[-1][0] + size <= target:
            units[-1][0] += size
            units[-1][3] = end
        else:
            units.append([size, url, first, end])
    loads = [0] * workers
    parts: list[list[int]] = [[] for _ in range(workers)]
    for i in sorted(range(len(units)), key=lambda i: (-units[i][0], i)):
        j = min(range(workers), key=lambda j: (loads[j], j))
        loads[j] += units[i][0]
        parts[j].append(i)
    return [(j, [tuple(units[i][1:]) for i in sorted(part)]) for j, part in enumerate(parts) if part]


def token_work(doc_urls: list[str], beam_config) -> list[tuple[int, list[tuple[str, int, int]]]]:
    """Elements of TokenizeToBuckets: balanced parts on the local runner at 2+ workers, else one
    element per corpus file (a runner that rebalances work, e.g. Dataflow, splits files itself)."""
    if beam_config.runner in ("FnApiRunner", "DirectRunner") and beam_config.num_workers > 1:
        return plan_token_work(doc_urls, beam_config.num_workers)
    return [(i, [(url, 0, -1)]) for i, url in enumerate(doc_urls)]


class TokenizeToBuckets(beam.DoFn):
    """(part, [(corpus file URL, first row group, end row group or -1 for all), ...]) ->
    (bucket, token file URL) for each bucket it wrote (one token file per part and bucket).

    Documents are tokenized (empty sentences and documents dropped and counted) and appended to
    one token file per bucket, flushed as row groups so the worker holds a bounded buffer."""

    def __init__(self, vocab: list[str], lowercase: bool, num_buckets: int, work_url: str, segmenter: str = "none"):
        self.vocab = vocab
        self.segmenter = segmenter
        self.lowercase = lowercase
        self.num_buckets = num_buckets
        self.work_url = work_url
        self.documents = Metrics.counter(NAMESPACE, "documents")
        self.sentences = Metrics.counter(NAMESPACE, "sentences")
        self.empty_sentences = Metrics.counter(NAMESPACE, "sentences_empty_after_tokenizing")
        self.skipped = Metrics.counter(NAMESPACE, "docs_skipped_too_short")
        self.single = Metrics.counter(NAMESPACE, "docs_single_sentence")
        self.unknown = Metrics.counter(NAMESPACE, "unk_tokens")
        self.tokens = Metrics.counter(NAMESPACE, "document_tokens")

    def setup(self):
        use_lean_memory_pool()
        # No truncation: truncate_seq_pair cuts examples, not sentences.
        self.tokenizer = build_text_tokenizer(self.vocab, self.lowercase)
        self.unk_id = self.tokenizer.token_to_id("[UNK]")
        self.schema = token_schema(id_space(len(self.vocab), self.segmenter))
        self.words = Segmenter(self.segmenter) if self.segmenter != "none" else None
        # Without a segmenter no character offsets are needed: encode_batch_fast gives the same
        # ids without computing them (~15% less tokenizing time, measured).
        self.encode = self.tokenizer.encode_batch if self.words else self.tokenizer.encode_batch_fast

    def process(self, element):
        part, units = element
        buffers: dict[int, tuple[list, list]] = {}
        writers: dict[int, Any] = {}
        held = 0
        batches = (
            batch
            for url, first, end in units
            for batch in read_documents(url, row_groups=None if end < 0 else (first, end))
        )
        for doc_ids, docs in batches:
            flat = [s for doc in docs for s in doc]
            encoded = [
                self._ids(text, e)
                for i in range(0, len(flat), ENCODE_SENTENCES)
                for text, e in zip(
                    flat[i : i + ENCODE_SENTENCES],
                    self.encode(flat[i : i + ENCODE_SENTENCES], add_special_tokens=False),
                    strict=True,
                )
            ]
            at = 0
            for doc_id, sentences in zip(doc_ids, docs, strict=True):
                ids = [e for e in encoded[at : at + len(sentences)] if e]
                at += len(sentences)
                self._count(sentences, ids)
                if not ids:
                    continue
                ids_buf, docs_buf = buffers.setdefault(stable_shard(doc_id, self.num_buckets), ([], []))
                ids_buf.append(doc_id)
                docs_buf.append(ids)
                held += sum(map(len, ids))
            if held >= FLUSH_TOKENS:
                self._flush(buffers, writers, part)
                held = 0
        self._flush(buffers, writers, part)
        for bucket, (file, writer, out_url) in sorted(writers.items()):
            writer.close()
            file.close()
            yield bucket, out_url

    def _ids(self, text: str, encoding) -> list[int]:
        """The token ids; with a segmenter, an ideograph continuing a word gets + vocab size."""
        ids = encoding.ids
        if self.words is None or not has_cjk(text):
            return ids
        flags = continuation_flags(text, encoding.offsets, self.words.word_spans(text))
        v = len(self.vocab)
        return [t + v if cont else t for t, cont in zip(ids, flags, strict=True)]

    def _count(self, sentences: list[str], ids: list[list[int]]) -> None:
        self.documents.inc()
        self.sentences.inc(len(sentences))
        if len(ids) < len(sentences):
            self.empty_sentences.inc(len(sentences) - len(ids))
        if not ids:
            self.skipped.inc()  # nothing to make an example from
        elif len(ids) == 1:
            self.single.inc()  # allowed: its examples are all random-next
        self.unknown.inc(sum(s.count(self.unk_id) for s in ids))  # marked ids are ideographs
        self.tokens.inc(sum(map(len, ids)))

    def _flush(self, buffers, writers, part: int) -> None:
        for bucket, (doc_ids, docs) in sorted(buffers.items()):
            if bucket not in writers:
                out_url = join_url(self.work_url, "tokens", f"b{bucket:05d}", f"f{part:05d}.parquet")
                fs, path = fsspec.core.url_to_fs(out_url)
                fs.makedirs(fs._parent(path), exist_ok=True)
                file = fs.open(path, "wb")
                writers[bucket] = (file, pq.ParquetWriter(file, self.schema), out_url)
            table = pa.Table.from_arrays(
                [pa.array(doc_ids, pa.string()), pa.array(docs, self.schema.field(1).type)],
                schema=self.schema,
            )
            writers[bucket][1].write_table(table)
        buffers.clear()


class CreateBucketExamples(beam.DoFn):
    """(bucket, token file URLs) -> (seq name, (run URL, rows)) for each sorted run written."""

    def __init__(self, config: ExamplesConfig, vocab: VocabIds, vocab_size: int, work_url: str):
        self.config = config
        self.vocab = vocab
        self.vocab_size = vocab_size
        self.work_url = work_url
        self.duplicates = Metrics.counter(NAMESPACE, "duplicate_doc_ids_dropped")
        self.stats = {
            (n, stat): Metrics.counter(NAMESPACE, f"{seq_name(n)}.{stat}")
            for n in config.max_seq_lengths
            for stat in STATS
        }
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
        special = (self.vocab.cls_id, self.vocab.sep_id)
        marked = cfg.segmenter != "none"
        vocab = word_marked_vocab(self.vocab, self.vocab_size) if marked else self.vocab
        for length, max_predictions in zip(cfg.max_seq_lengths, cfg.max_predictions_per_seq, strict=True):
            name = seq_name(length)
            writer = RunWriter(
                example_schema(self.vocab_size, length),
                lambda r, name=name: join_url(self.work_url, name, f"b{bucket:05d}-r{r:04d}.parquet"),
            )
            for index, doc_id in enumerate(doc_ids):
                for copy in range(cfg.dupe_factor):
                    rng = example_rng(cfg.seed, doc_id, copy, length)
                    instances = create_instances_from_document(
                        index,
                        docs,
                        max_seq_length=length,
                        short_seq_prob=cfg.short_seq_prob,
                        masked_lm_prob=cfg.masked_lm_prob,
                        max_predictions_per_seq=max_predictions,
                        random_next_prob=cfg.random_next_prob,
                        vocab=vocab,
                        rng=rng,
                        whole_word_mask=cfg.whole_word_mask,
                        mask=cfg.masking == "static",
                    )
                    for k, row in enumerate(instances):
                        if marked:
                            unmark(row, self.vocab_size)
                        self._count(length, row, special)
                        row[KEY] = example_key(doc_id, copy, k)
                        writer.add(row)
            for run in writer.close():
                yield name, run

    def _count(self, length: int, row: dict[str, Any], special: tuple[int, int]) -> None:
        stats = self.stats
        n = len(row["input_ids"])
        stats[length, "examples"].inc()
        stats[length, "tokens"].inc(n)
        stats[length, "eligible_tokens"].inc(n - 3)  # all but [CLS] and the two [SEP]
        stats[length, "masked_tokens"].inc(len(row["masked_positions"]))
        self.hist[length][histogram_bin(n, length)].inc()
        if row["is_random_next"]:
            stats[length, "random_next"].inc()
        if row["multi_sentence_chunk"]:
            stats[length, "multi_sentence_chunk"].inc()
            if row["is_random_next"]:
                stats[length, "random_next_multi"].inc()


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
        length = int(name[3:])
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
    ):
        super().__init__()
        self.config = config
        self.vocab = vocab
        self.lowercase = lowercase
        self.num_buckets = num_buckets
        self.output_url = output_url

    def expand(self, parts):
        cfg = self.config
        work = join_url(self.output_url, WORK_DIR)
        schemas = {seq_name(n): example_schema(len(self.vocab), n) for n in cfg.max_seq_lengths}
        return (
            parts
            | "SpreadFiles" >> beam.Reshuffle()
            | "TokenizeToBuckets"
            >> beam.ParDo(TokenizeToBuckets(self.vocab, self.lowercase, self.num_buckets, work, cfg.segmenter))
            | "GroupByBucket" >> beam.GroupByKey()
            | "CreateExamples"
            >> beam.ParDo(CreateBucketExamples(cfg, VocabIds.from_vocab(self.vocab), len(self.vocab), work))
            | "GroupByLength" >> beam.GroupByKey()
            | "MergeShards" >> beam.ParDo(MergeShards(self.output_url, schemas, cfg.num_shards, work))
        )


def corpus_size(doc_urls: list[str]) -> tuple[int, int]:
    """(documents, characters) of document Parquet files, from footers and one int column."""
    docs = chars = 0
    for url in doc_urls:
        fs, path = fsspec.core.url_to_fs(url)
        with fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
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
) -> beam.Pipeline:
    """The examples job over the corpus files ``doc_urls``, built, not run, with the options of
    ``config.beam`` (any runner: a test validates it for Dataflow without submitting)."""
    check_runner_urls(config.beam, {"corpus": doc_urls, "output": [output_url]})
    pipeline = make_pipeline(config.beam, job_name="bertflow-examples")
    _ = (
        pipeline
        | "ListFiles" >> beam.Create(token_work(doc_urls, config.beam))
        | "Examples" >> ExamplesFromDocuments(config, vocab, lowercase, num_buckets, output_url)
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
    lowercase = bool(vocab_manifest.config.get("lowercase", True))
    ids = VocabIds.from_vocab(vocab)
    doc_urls = corpus.file_urls(".parquet")
    num_documents, num_chars = corpus_size(doc_urls)
    num_buckets = num_buckets_for(num_documents, num_chars, config)
    clear_stage(output_url)

    pipeline = build_examples_pipeline(config, doc_urls, vocab, lowercase, num_buckets, output_url)
    result = pipeline.run()
    result.wait_until_finish()
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
        fill_empty_shards(join_url(output_url, name), example_schema(len(vocab), n), config.num_shards)
        rows = 0
        for rel in list_files(output_url):
            if rel.startswith(name + "/"):
                file_rows = parquet_rows(join_url(output_url, rel))
                files.append(describe_file(output_url, rel, rows=file_rows))
                rows += file_rows
        counts.update(shard_counts(name, n, rows, beam_counts))
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
    )


def shard_counts(name: str, length: int, rows: int, beam_counts: dict[str, int]) -> dict[str, float]:
    """The manifest figures of one sequence length, from the Beam counters."""
    out: dict[str, float] = {f"{name}.examples": rows}
    for stat in STATS[1:]:
        out[f"{name}.{stat}"] = beam_counts.get(f"{name}.{stat}", 0)
    for lo in histogram_bins(length):
        key = f"{name}.length_hist.{lo:04d}"
        out[key] = beam_counts.get(key, 0)
    out[f"{name}.random_next_share"] = out[f"{name}.random_next"] / rows if rows else 0.0
    multi = out[f"{name}.multi_sentence_chunk"]
    out[f"{name}.random_next_share_multi_sentence"] = out[f"{name}.random_next_multi"] / multi if multi else 0.0
    tokens, eligible = out[f"{name}.tokens"], out[f"{name}.eligible_tokens"]
    out[f"{name}.masked_share"] = out[f"{name}.masked_tokens"] / tokens if tokens else 0.0
    out[f"{name}.masked_share_of_eligible"] = out[f"{name}.masked_tokens"] / eligible if eligible else 0.0
    out[f"{name}.tokens_per_example"] = tokens / rows if rows else 0.0
    return out
