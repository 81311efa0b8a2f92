"""The first half of the examples job: documents tokenized into per-bucket token files."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics

from pipeline.beam.io import stable_shard
from pipeline.beam.shards import use_lean_memory_pool
from pipeline.examples.buckets import documents_array
from pipeline.examples.masking import VocabIds
from pipeline.examples.segment import Segmenter, continuation_flags, has_cjk
from pipeline.schema.parquet import READ_OPTIONS, WRITE_OPTIONS
from pipeline.schema.storage import join_url
from pipeline.schema.tokenization import WordTokenizer
from pipeline.vocab.tokenizer import build_text_tokenizer, plain_ascii, plain_pre_tokenizer

NAMESPACE = "examples"
"""The Beam counters' namespace of the examples job."""

READ_DOCS = 16
"""Documents read per batch (a book is thousands of sentences)."""
ENCODE_SENTENCES = 2048
"""Sentences per ``encode_batch`` call: its Encodings cost ~100 bytes a token, so bounded."""
FLUSH_TOKENS = 500_000
"""Tokens a TokenizeToBuckets worker buffers (over all buckets) before writing them out."""
SENTENCE_MARK = "\ue000"
"""A private-use character between the sentences of one encoded text (see :func:`encode_joined`)."""
JOIN_SENTENCES = 64
"""Sentences per encoded text in :func:`encode_joined`."""


def id_space(vocab_size: int, segmenter: str, marked: bool | None = None) -> int:
    """Ids in token files: the vocabulary, twice over when a segmenter marks continuations."""
    marked = segmenter != "none" if marked is None else marked
    return vocab_size * (2 if marked else 1)


def marks_words(segmenter: str, word_tokenizer: str = "none", subword: str = "wordpiece", whole_word_mask: bool = True):
    """Whether token files carry word marks (``id + vocab_size``): with an examples segmenter
    (CJK ideographs of BERT's tokenizer), or a MeCab character vocabulary under whole-word
    masking (its tokens are characters; MeCab's words are the units). A MeCab or jieba WordPiece
    vocabulary needs none: its ``##`` pieces already continue the segmenter's words."""
    if word_tokenizer != "none":
        return subword == "character" and whole_word_mask
    return segmenter != "none"


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


def joined_tokenizer(vocab: list[str], lowercase: bool):
    """:func:`build_text_tokenizer` that also knows :data:`SENTENCE_MARK`, as a token of its own
    (matched in the raw text before normalization, its id after the vocabulary's); ``None`` when
    that id is also a vocabulary entry's (a vocabulary whose lines repeat an entry has fewer ids
    than lines, and the next free id is then some line's own)."""
    from tokenizers import AddedToken

    tok = build_text_tokenizer(vocab, lowercase)
    tok.add_special_tokens([AddedToken(SENTENCE_MARK, normalized=False, special=True)])
    mark = tok.token_to_id(SENTENCE_MARK)
    if mark < len(vocab) and vocab[mark] != SENTENCE_MARK:
        return None
    return tok


def plain_tokenizer(vocab: list[str], lowercase: bool):
    """:func:`joined_tokenizer` for the sentences of ``pipeline.vocab.tokenizer.plain_ascii``
    (printable ASCII): ``Lowercase`` (nothing, cased) and ``plain_pre_tokenizer`` instead of
    BERT's normalizer and pre-tokenizer, the same ids at ~55% of the tokenizing time; ``None``
    where :func:`joined_tokenizer` is."""
    from tokenizers import normalizers

    tok = joined_tokenizer(vocab, lowercase)
    if tok is None:
        return None
    tok.normalizer = normalizers.Lowercase() if lowercase else None
    tok.pre_tokenizer = plain_pre_tokenizer()
    return tok


def encode_joined(
    tokenizer, sentences: list[str], per_text: int = JOIN_SENTENCES, plain=None
) -> tuple[np.ndarray, np.ndarray] | None:
    """(every sentence's ids one after the other, each sentence's number of ids), as
    ``encode_batch_fast`` of the sentences one by one gives them, from texts of ``per_text``
    sentences joined by :data:`SENTENCE_MARK` (``tokenizer`` from :func:`joined_tokenizer`);
    ``None`` when a sentence holds the mark (the caller encodes them one by one). With ``plain``
    (from :func:`plain_tokenizer`), the sentences of printable ASCII are encoded by it, apart,
    and the two parts' ids put back in the sentences' order.

    Why: an Encoding per sentence (its tokens, masks, the Python object and its ``ids`` list),
    then a list per sentence to write, cost about a tenth of the tokenizing time of 30-token
    sentences (measured: 2.6 against 2.9 CPU-s over 136,623 sentences, the same ids). The same
    ids, because everything the text tokenizer does is per character or per whitespace-split
    word: the mark, an added token, is cut out of the raw text first, and a private-use character
    has no case, accent, or composition with its neighbours, so each sentence between two marks is
    normalized, pre-tokenized and split into pieces as it is alone.
    """
    if plain is None:
        return _encode_texts(tokenizer, sentences, per_text)
    ascii_at, other_at = plain_ascii(sentences)
    if not other_at:
        return _encode_texts(plain, sentences, per_text)
    if not ascii_at:
        return _encode_texts(tokenizer, sentences, per_text)
    rest = _encode_texts(tokenizer, [sentences[i] for i in other_at], per_text)
    if rest is None:
        return None
    head = _encode_texts(plain, [sentences[i] for i in ascii_at], per_text)  # ASCII never holds the mark
    return _interleave(len(sentences), [(ascii_at, *head), (other_at, *rest)])


def _encode_texts(tokenizer, sentences: list[str], per_text: int) -> tuple[np.ndarray, np.ndarray] | None:
    mark_id = tokenizer.token_to_id(SENTENCE_MARK)
    texts = [SENTENCE_MARK.join(sentences[i : i + per_text]) for i in range(0, len(sentences), per_text)]
    if sum(t.count(SENTENCE_MARK) for t in texts) != len(sentences) - len(texts):
        return None
    ids: list[int] = []
    for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False):
        ids += encoding.ids
        ids.append(mark_id)  # after a text's last sentence too: one mark ends each sentence
    values = np.array(ids, dtype=np.uint32)
    at_mark = values == mark_id
    ends = np.flatnonzero(at_mark)
    return values[~at_mark], np.diff(ends, prepend=-1) - 1


def _interleave(count: int, parts: list[tuple[list[int], np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(values, lengths) of ``count`` sentences from parts ``(their places, values, lengths)``."""
    lengths = np.zeros(count, dtype=np.int64)
    for at, _, part_lengths in parts:
        lengths[at] = part_lengths
    starts = np.cumsum(lengths) - lengths
    values = np.empty(int(lengths.sum()), dtype=np.uint32)
    for at, part_values, part_lengths in parts:
        part_starts = np.cumsum(part_lengths) - part_lengths
        values[np.repeat(starts[at] - part_starts, part_lengths) + np.arange(len(part_values))] = part_values
    return values, lengths


def flat_ids(id_lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(the lists' ids one after the other, each list's length): :func:`encode_joined`'s form."""
    lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    values = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.uint32, count=int(lengths.sum()))
    return values, lengths


def read_documents(
    url: str, batch_docs: int = READ_DOCS, row_groups: tuple[int, int] | None = None
) -> Iterator[tuple[list, list]]:
    """(doc_ids, sentences) batches of one document Parquet file (row groups [first, end) only
    when ``row_groups`` is given)."""
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as f:
        # Buffered column reads: a corpus file may be one row group of hundreds of MB.
        pf = pq.ParquetFile(f, pre_buffer=False, buffer_size=1 << 20, **READ_OPTIONS)
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

    def __init__(
        self,
        vocab: list[str],
        lowercase: bool,
        num_buckets: int,
        work_url: str,
        segmenter: str = "none",
        word_tokenizer: str = "none",
        subword: str = "wordpiece",
        marked: bool | None = None,
    ):
        self.vocab = vocab
        self.segmenter = segmenter
        self.word_tokenizer = word_tokenizer
        self.subword = subword
        self.marked = marks_words(segmenter, word_tokenizer, subword) if marked is None else marked
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
        self.schema = token_schema(id_space(len(self.vocab), self.segmenter, self.marked))
        if self.word_tokenizer != "none":  # MeCab or jieba words before the subword step
            self.tokenizer = WordTokenizer(
                self.vocab, self.word_tokenizer, self.subword, self.lowercase, specials=False
            )
            self.unk_id = self.tokenizer.token_to_id("[UNK]")
            self.words = self.joined = self.plain = None
            self.encode = lambda texts, **kw: self.tokenizer.encode_batch(texts, offsets=False, **kw)
            return
        # No truncation: truncate_seq_pair cuts examples, not sentences.
        self.tokenizer = build_text_tokenizer(self.vocab, self.lowercase)
        self.unk_id = self.tokenizer.token_to_id("[UNK]")
        self.words = Segmenter(self.segmenter) if self.segmenter != "none" else None
        self.joined = joined_tokenizer(self.vocab, self.lowercase) if self.words is None else None
        self.plain = plain_tokenizer(self.vocab, self.lowercase) if self.joined is not None else None
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
            values, lengths = self._encode(flat)
            ends = np.cumsum(lengths)
            sentence = token = 0
            for doc_id, sentences in zip(doc_ids, docs, strict=True):
                n = len(sentences)
                lens = lengths[sentence : sentence + n]
                end = int(ends[sentence + n - 1]) if n else token
                doc_values = values[token:end]
                sentence, token = sentence + n, end
                kept = lens[lens > 0]  # empty sentences dropped (counted)
                self._count(n, len(kept), doc_values)
                if not len(kept):
                    continue
                ids_buf, values_buf, lengths_buf = buffers.setdefault(
                    stable_shard(doc_id, self.num_buckets), ([], [], [])
                )
                ids_buf.append(doc_id)
                values_buf.append(doc_values)
                lengths_buf.append(kept)
                held += len(doc_values)
            if held >= FLUSH_TOKENS:
                self._flush(buffers, writers, part)
                held = 0
        self._flush(buffers, writers, part)
        for bucket, (file, writer, out_url) in sorted(writers.items()):
            writer.close()
            file.close()
            yield bucket, out_url

    def _encode(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(the sentences' ids one after the other, each sentence's number of ids).

        ``ENCODE_SENTENCES`` at a time: through :func:`encode_joined` when the job has its joined
        tokenizer (no segmenter, no word tokenizer, no repeated vocabulary line) and no sentence of
        the chunk holds the mark; else one Encoding per sentence (the segmenter reads its offsets,
        the word tokenizer its word starts)."""
        parts = []
        step = ENCODE_SENTENCES
        for i in range(0, len(sentences), step):
            chunk = sentences[i : i + step]
            flat = None if self.joined is None else encode_joined(self.joined, chunk, plain=self.plain)
            if flat is None:
                encodings = self.encode(chunk, add_special_tokens=False)
                flat = flat_ids([self._ids(text, e) for text, e in zip(chunk, encodings, strict=True)])
            parts.append(flat)
        if not parts:
            return np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=np.int64)
        return np.concatenate([v for v, _ in parts]), np.concatenate([n for _, n in parts])

    def _ids(self, text: str, encoding) -> list[int]:
        """The token ids; with a segmenter, an ideograph continuing a word gets + vocab size."""
        ids = encoding.ids
        if self.word_tokenizer != "none":
            if not self.marked:
                return ids
            v = len(self.vocab)
            return [t if start else t + v for t, start in zip(ids, encoding.word_starts, strict=True)]
        if self.words is None or not has_cjk(text):
            return ids
        flags = continuation_flags(text, encoding.offsets, self.words.word_spans(text))
        v = len(self.vocab)
        return [t + v if cont else t for t, cont in zip(ids, flags, strict=True)]

    def _count(self, num_sentences: int, num_kept: int, values: np.ndarray) -> None:
        """One document's figures: its sentences, those that kept ids, and its ids."""
        self.documents.inc()
        self.sentences.inc(num_sentences)
        if num_kept < num_sentences:
            self.empty_sentences.inc(num_sentences - num_kept)
        if not num_kept:
            self.skipped.inc()  # nothing to make an example from
        elif num_kept == 1:
            self.single.inc()  # allowed: its examples are all random-next
        self.unknown.inc(int(np.count_nonzero(values == self.unk_id)))  # marked ids are ideographs
        self.tokens.inc(len(values))

    def _flush(self, buffers, writers, part: int) -> None:
        for bucket, (doc_ids, values, lengths) in sorted(buffers.items()):
            if bucket not in writers:
                out_url = join_url(self.work_url, "tokens", f"b{bucket:05d}", f"f{part:05d}.parquet")
                fs, path = fsspec.core.url_to_fs(out_url)
                fs.makedirs(fs._parent(path), exist_ok=True)
                file = fs.open(path, "wb")
                writers[bucket] = (file, pq.ParquetWriter(file, self.schema, **WRITE_OPTIONS), out_url)
            documents = documents_array(
                np.concatenate(values),
                np.concatenate(lengths),
                [len(n) for n in lengths],
                self.schema.field(1).type.value_type.value_type,
            )
            table = pa.Table.from_arrays([pa.array(doc_ids, pa.string()), documents], schema=self.schema)
            writers[bucket][1].write_table(table)
        buffers.clear()
