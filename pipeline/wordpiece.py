"""Stage 2: a WordPiece vocabulary in Google's ``vocab.txt`` layout, and the tokenizer built on it.

The tokenizers ``WordPieceTrainer`` does the training (Rust, ~3 MB/s). Two things are ours:

1. **Determinism.** The trainer gives each continuation piece ``##c`` an id in the order it meets
   words in a hash map that is seeded afresh for every map, and breaks ties between equally
   frequent merges by those ids, so both the order *and* (at the cut-off) the set of learned
   tokens change run to run. We count the alphabet ourselves first (a cheap pass of the
   normalizer and pre-tokenizer) and hand the trainer every ``##c`` it would create as a
   "special token", in sorted order: then every id, every tie-break and so every merge is fixed.
   The cost is one extra pass over the sentences (~0.4 s/MB; the Parquet input is read twice).
   Should the trainer still add a ``##c`` we did not foresee (Python's and Rust's Unicode tables
   disagreeing on a character), we retrain once with it pre-assigned as well.
2. **Layout.** Google's released vocabularies put ``[PAD]`` at 0, ``[unused0..N-1]`` after it,
   then ``[UNK] [CLS] [SEP] [MASK]`` (100..103 with 99 unused slots), then the learned tokens.
   We write the learned tokens as: single characters (code point order), their ``##``
   continuations (code point order), then merged pieces in the order the trainer learned them
   (most frequent first).

The alphabet is capped (:data:`MAX_ALPHABET`, the cap Hugging Face's BERT trainer uses, and at
most a quarter of the budget): the most frequent characters are kept, ties broken by code point.
Words with a dropped character tokenize to ``[UNK]``.
"""

from __future__ import annotations

import collections
import hashlib
import json
import re
import time
import unicodedata
from collections.abc import Iterable, Iterator

import fsspec
import pyarrow.parquet as pq
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from pipeline.config import VocabConfig, to_dict
from pipeline.schema.manifest import Manifest, clear_stage, fingerprint_input, read_manifest, write_manifest
from pipeline.schema.storage import join_url, write_atomically

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
PREFIX = "##"
MAX_ALPHABET = 1000
"""Most single characters kept in the vocabulary (Hugging Face's BertWordPieceTokenizer default)."""
VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
"""What ``transformers.BertTokenizerFast.from_pretrained(vocab_dir)`` reads besides the two above."""


def special_tokens(num_unused: int) -> list[str]:
    """Google's leading entries: [PAD], [unused0..num_unused-1], [UNK], [CLS], [SEP], [MASK]."""
    return [PAD] + [f"[unused{i}]" for i in range(num_unused)] + [UNK, CLS, SEP, MASK]


def _normalizer(lowercase: bool) -> normalizers.Normalizer:
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )


def _is_punctuation(c: str) -> bool:
    """BERT's punctuation (what BertPreTokenizer splits off): ASCII symbols and Unicode P*."""
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


_FIRST_OF_WORD = re.compile(r"(?<!\S)\S")


def count_alphabet(
    sentences: Iterable[str], lowercase: bool, batch_size: int = 2048
) -> tuple[collections.Counter, set[str], int]:
    """Character counts over pre-tokenized words, the characters seen inside a word, #sentences.

    These are the characters the trainer puts into its alphabet, and the ones for which it
    creates a ``##`` continuation piece. Works on batches of normalized text with C-speed string
    operations (the normalizer acts per character, so a joined batch normalizes as its parts).
    """
    norm = _normalizer(lowercase)
    chars: collections.Counter = collections.Counter()
    inner: set[str] = set()
    to_space: dict[int, str] = {}  # punctuation -> space, grown as new characters appear
    n = 0

    def add(batch: list[str]) -> None:
        text = norm.normalize_str("\n".join(batch))
        counts = collections.Counter(text)
        for c in counts:
            if c.isspace():
                continue
            chars[c] += counts[c]
            if ord(c) not in to_space and _is_punctuation(c):
                to_space[ord(c)] = " "
        # Drop each word's first character; whatever non-space is left sat inside a word.
        inner.update(_FIRST_OF_WORD.sub("", text.translate(to_space)))

    batch: list[str] = []
    for sentence in sentences:
        n += 1
        batch.append(sentence)
        if len(batch) >= batch_size:
            add(batch)
            batch = []
    if batch:
        add(batch)
    return chars, {c for c in inner if not c.isspace()}, n


def _choose_alphabet(chars: collections.Counter, budget: int) -> list[str]:
    limit = max(1, min(MAX_ALPHABET, budget // 4))
    ranked = sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))
    return sorted(c for c, _ in ranked[:limit])


def train_vocab(sentences: Iterable[str], config: VocabConfig) -> list[str]:
    """Train WordPiece on ``sentences``; the vocabulary in Google's vocab.txt order (index = id).

    The same sentences and config always give the same list. A one-shot iterator is read into
    memory (two passes are needed); pass a re-iterable (a list, or an object whose ``__iter__``
    starts afresh) to stream.
    """
    return train_vocab_with_stats(sentences, config)[0]


def _train_pieces(
    sentences: Iterable[str],
    config: VocabConfig,
    budget: int,
    alphabet: list[str],
    continuations: list[str],
) -> list[str]:
    """The trainer's tokens by id: continuations, alphabet, then merges in the order learned."""
    tok = Tokenizer(models.WordPiece(unk_token=UNK))
    tok.normalizer = _normalizer(config.lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=budget,
        min_frequency=config.min_frequency,
        show_progress=False,
        # Pre-assigned, sorted ids for every ## piece: this is what makes training deterministic.
        special_tokens=continuations,
        # The trainer keeps initial_alphabet (counted as infinitely frequent) and drops the rest.
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        continuing_subword_prefix=PREFIX,
    )
    tok.train_from_iterator(iter(sentences), trainer)
    by_id = sorted(tok.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1])
    return [t for t, _ in by_id]


def train_vocab_with_stats(sentences: Iterable[str], config: VocabConfig) -> tuple[list[str], dict[str, int]]:
    """:func:`train_vocab`, plus counts for the manifest (sentences, characters seen, ...)."""
    if iter(sentences) is sentences:  # a generator: keep it for the second pass
        sentences = list(sentences)
    specials = special_tokens(config.num_unused)
    budget = config.vocab_size - len(specials)

    chars, inner, num_sentences = count_alphabet(sentences, config.lowercase)
    if num_sentences == 0:
        raise ValueError("train_vocab: no sentences to train on (is the corpus empty?)")
    alphabet = _choose_alphabet(chars, budget)
    continuations = [PREFIX + c for c in alphabet if c in inner]
    learned = _train_pieces(sentences, config, budget, alphabet, continuations)
    # Guard: a ## piece we did not foresee (a Unicode table differing between Python and Rust)
    # got a run-dependent id. Retrain with it pre-assigned too; that run is deterministic.
    unforeseen = sorted(
        t for t in learned if t.startswith(PREFIX) and len(t) == len(PREFIX) + 1 and t not in continuations
    )
    if unforeseen:
        continuations = sorted(continuations + unforeseen)
        learned = _train_pieces(sentences, config, budget, alphabet, continuations)

    head = set(alphabet) | set(continuations)
    merged = [t for t in learned if t not in head]  # trainer order: merge order
    taken = set(specials)
    ordered = [t for t in alphabet + continuations + merged if t not in taken]
    vocab = (specials + ordered)[: config.vocab_size]
    stats = {
        "vocab_size": len(vocab),
        "learned_tokens": len(vocab) - len(specials),
        "alphabet_size": len(alphabet),
        "continuation_chars": len(continuations),
        "merged_tokens": len(vocab) - len(specials) - len(alphabet) - len(continuations),
        "characters_seen": len(chars),
        "characters_dropped": len(chars) - len(alphabet),
        "sentences_used": num_sentences,
    }
    return vocab, stats


def build_text_tokenizer(vocab: list[str], lowercase: bool) -> Tokenizer:
    """The bare WordPiece tokenizer for corpus text: no template, no truncation, and literal
    "[SEP]"/"[MASK]" in the text split like any other text (as the reference's FullTokenizer
    does), so a corpus cannot smuggle special ids into an example's segments."""
    ids = {t: i for i, t in enumerate(vocab)}
    missing = [t for t in (PAD, UNK, CLS, SEP, MASK) if t not in ids]
    if missing:
        raise ValueError(f"vocabulary lacks the special tokens {missing}")
    tok = Tokenizer(models.WordPiece(vocab=ids, unk_token=UNK, continuing_subword_prefix=PREFIX))
    tok.normalizer = _normalizer(lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix=PREFIX)
    return tok


def build_tokenizer(vocab: list[str], lowercase: bool, max_length: int = 512) -> Tokenizer:
    """A BERT tokenizer on ``vocab``: what BertTokenizerFast loads from ``tokenizer.json``.

    Encodes a pair as ``[CLS] A [SEP] B [SEP]`` with type ids 0/1, recognises the special
    tokens in text, and truncates to ``max_length``.
    """
    tok = build_text_tokenizer(vocab, lowercase)
    cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )
    tok.add_special_tokens([PAD, UNK, CLS, SEP, MASK])  # already in vocab: ids unchanged
    tok.enable_truncation(max_length)
    return tok


def tokenizer_config(lowercase: bool, max_length: int = 512) -> dict:
    """The Hugging Face tokenizer_config.json of a vocabulary: BERT's class and options."""
    return {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase,
        "tokenize_chinese_chars": True,
        "strip_accents": None,
        "model_max_length": max_length,
        "unk_token": UNK,
        "sep_token": SEP,
        "pad_token": PAD,
        "cls_token": CLS,
        "mask_token": MASK,
    }


def write_vocab(vocab: list[str], url: str) -> None:
    write_atomically(url, "".join(t + "\n" for t in vocab))


def read_vocab(url: str) -> list[str]:
    """A vocab.txt as a list (line number = id). Split on \\n only: tokens may hold U+2028 etc."""
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "r", encoding="utf-8", newline="") as f:
        text = f.read()
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")


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
                pf = pq.ParquetFile(f, pre_buffer=False, buffer_size=1 << 20)
                for batch in pf.iter_batches(columns=["doc_id", "sentences"], batch_size=256):
                    for doc_id, doc in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
                        if not in_sample(doc_id, self.sample_fraction):
                            continue
                        for sentence in doc:
                            if self.max_sentences and n >= self.max_sentences:
                                return
                            n += 1
                            yield sentence


def run_vocab(config: VocabConfig, corpus_url: str, output_url: str) -> Manifest:
    """Train the vocabulary on a finished corpus stage: vocab.txt, tokenizer.json, manifest."""
    start = time.time()
    corpus = read_manifest(corpus_url)
    inputs = {"corpus": fingerprint_input(corpus_url)}
    sentences = ParquetSentences(corpus.file_urls(".parquet"), config.max_sentences, config.sample_fraction)
    clear_stage(output_url)

    vocab, counts = train_vocab_with_stats(sentences, config)
    write_vocab(vocab, join_url(output_url, VOCAB_FILE))
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
    )
