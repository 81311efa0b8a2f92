"""Stage 2: a WordPiece vocabulary in Google's ``vocab.txt`` layout, and the tokenizer built on it.

The tokenizers ``WordPieceTrainer`` does the training (Rust). Three things are ours:

1. **Determinism.** The trainer gives each continuation piece ``##c`` an id in the order it meets
   words in a hash map that is seeded afresh for every map, and breaks ties between equally
   frequent merges by those ids, so both the order *and* (at the cut-off) the set of learned
   tokens change run to run. We count the alphabet ourselves first (a cheap pass of the
   normalizer and pre-tokenizer) and hand the trainer every ``##c`` it would create as a
   "special token", in sorted order: then every id, every tie-break and so every merge is fixed.
   The cost is one extra pass over the sentences (~0.4 s/MB; the Parquet input is read twice).
   Should the trainer still add a ``##c`` we did not foresee (Python's and Rust's Unicode tables
   disagreeing on a character), we retrain once with it pre-assigned as well.
2. **BERT's words at a third of the cost.** The trainer and the alphabet count read BERT's
   normalizer and pre-tokenizer's words, but most sentences (printable ASCII) reach them
   lowercased by Python and split by whitespace and one ASCII-punctuation regex, without BERT's
   three Unicode table searches a character (:class:`_PlainText`): the same vocabulary, 112 ->
   41 CPU-s on a 0.5 GB corpus's 4M-sentence sample (docs/speed-data.md section 9).
3. **Layout.** Google's released vocabularies put ``[PAD]`` at 0, ``[unused0..N-1]`` after it,
   then ``[UNK] [CLS] [SEP] [MASK]`` (100..103 with 99 unused slots), then the learned tokens.
   We write the learned tokens as: single characters (code point order), their ``##``
   continuations (code point order), then merged pieces in the order the trainer learned them
   (most frequent first).

The alphabet is capped (``vocab.max_alphabet``, by default :data:`MAX_ALPHABET`, the cap Hugging
Face's BERT trainer uses, and at most a quarter of the budget): the most frequent characters are
kept, ties broken by code point. Words with a dropped character tokenize to ``[UNK]``.

With ``vocab.word_tokenizer`` set (MeCab, jieba: :mod:`pipeline.schema.tokenization`) the trainer
reads the segmenter's words, space-joined, through the same normaliser and pre-tokenizer the
later stages use; with ``vocab.subword=character`` there is no training, the vocabulary is the
most frequent characters (:func:`train_char_vocab`).
"""

from __future__ import annotations

import collections
import re
import unicodedata
from collections.abc import Iterable

from tokenizers import (
    Tokenizer,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

from pipeline.schema.tokenization import text_normalizer, text_pre_tokenizer
from pipeline.vocab.config import VocabConfig
from pipeline.vocab.tokenizer import (
    PREFIX,
    UNK,
    bert_normalizer,
    plain_ascii,
    plain_pre_tokenizer,
    special_tokens,
)

MAX_ALPHABET = 1000
"""Most single characters kept in the vocabulary (Hugging Face's BertWordPieceTokenizer default)."""
FEED_SENTENCES = 256
"""Sentences per text handed to the trainer, which buffers 256 texts (measured: 2048 a text held
~35 MB more at the 4M-sentence sample, for 1-2 CPU-s more of 43)."""


def _is_punctuation(c: str) -> bool:
    """BERT's punctuation (what BertPreTokenizer splits off): ASCII symbols and Unicode P*."""
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


_FIRST_OF_WORD = re.compile(r"(?<!\S)\S")


def _text_steps(config: VocabConfig):
    """(normaliser or None, pre-tokenizer, whether punctuation splits words) of the vocabulary's
    text: BERT's for word_tokenizer=none, else the segmented kinds' (MeCab: whitespace only)."""
    if config.word_tokenizer == "none":
        return bert_normalizer(config.lowercase), pre_tokenizers.BertPreTokenizer(), True
    return (
        text_normalizer(config.word_tokenizer, config.lowercase),
        text_pre_tokenizer(config.word_tokenizer),
        config.word_tokenizer == "jieba",
    )


def count_alphabet(
    sentences: Iterable[str],
    lowercase: bool,
    batch_size: int = 2048,
    normalizer: normalizers.Normalizer | None | str = "bert",
    split_punctuation: bool = True,
) -> tuple[collections.Counter, set[str], int]:
    """Character counts over pre-tokenized words, the characters seen inside a word, #sentences.

    These are the characters the trainer puts into its alphabet, and the ones for which it
    creates a ``##`` continuation piece. Works on batches of normalized text with C-speed string
    operations (the normalizer acts per character, so a joined batch normalizes as its parts).
    """
    plain = _PlainText(lowercase) if normalizer == "bert" else None
    norm = None if plain is not None else normalizer
    chars: collections.Counter = collections.Counter()
    inner: set[str] = set()
    to_space: dict[int, str] = {}  # punctuation -> space, grown as new characters appear
    n = 0

    def add(batch: list[str]) -> None:
        if plain is not None:  # BERT's normalizer: the same characters, in another order
            text = plain.normalized(batch)
        else:
            text = "\n".join(batch)
            text = norm.normalize_str(text) if norm is not None else text
        counts = collections.Counter(text)
        for c in counts:
            if c.isspace():
                continue
            chars[c] += counts[c]
            if split_punctuation and ord(c) not in to_space and _is_punctuation(c):
                to_space[ord(c)] = " "
        # Drop each word's first character; whatever non-space is left sat inside a word.
        inner.update(_FIRST_OF_WORD.sub("", text.translate(to_space)))

    for batch in _batches(sentences, batch_size):
        n += len(batch)
        add(batch)
    return chars, {c for c in inner if not c.isspace()}, n


class _PlainText:
    """BERT's normalizer and pre-tokenizer, their work done mostly without them.

    The sentences of :func:`~pipeline.vocab.tokenizer.plain_ascii` (printable ASCII, ~90% of
    English text) are lowercased by Python (``str.lower`` of ASCII is ASCII's); the others go
    through BERT's normalizer. :meth:`words` also puts spaces around each character of the
    normalized text that BERT's pre-tokenizer isolates and
    :func:`~pipeline.vocab.tokenizer.plain_pre_tokenizer` does not (punctuation outside ASCII, as
    Rust's tables say: each new character is asked of BERT's pre-tokenizer once), so that a
    trainer with no normalizer and the plain pre-tokenizer reads BERT's words. The trainer counts
    words: their grouping into texts and their order do not matter."""

    def __init__(self, lowercase: bool):
        self.lowercase = lowercase
        self.normalizer = bert_normalizer(lowercase)
        self.bert_pre = pre_tokenizers.BertPreTokenizer()
        self.seen: set[str] = set()
        self.spaced: dict[int, str] = {}  # a character BERT isolates -> itself between spaces

    def normalized(self, batch: list[str], spaced: bool = False) -> str:
        """The sentences as BERT's normalizer gives them, in another order (newline-joined)."""
        at, other_at = plain_ascii(batch)
        plain = "\n".join(batch[i] for i in at)
        if self.lowercase:
            plain = plain.lower()
        if not other_at:
            return plain
        other = self.normalizer.normalize_str("\n".join(batch[i] for i in other_at))
        if spaced:
            for c in set(other) - self.seen:
                self.seen.add(c)
                if not c.isascii() and len(self.bert_pre.pre_tokenize_str(f"a{c}a")) == 3:
                    self.spaced[ord(c)] = f" {c} "
            other = other.translate(self.spaced)
        return f"{plain}\n{other}"

    def words(self, batch: list[str]) -> str:
        """Text whose whitespace-split, ASCII-punctuation-isolated pieces are BERT's words."""
        return self.normalized(batch, spaced=True)


def _batches(sentences: Iterable[str], size: int):
    batch: list[str] = []
    for sentence in sentences:
        batch.append(sentence)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _choose_alphabet(chars: collections.Counter, budget: int, max_alphabet: int = MAX_ALPHABET) -> list[str]:
    limit = max(1, min(max_alphabet, budget // 4))
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
    if config.word_tokenizer == "none":  # BERT's words, from text that splits without Unicode tables
        plain = _PlainText(config.lowercase)
        tok.pre_tokenizer = plain_pre_tokenizer()
        texts = (plain.words(batch) for batch in _batches(sentences, FEED_SENTENCES))
    else:
        normalizer, pre_tokenizer, _ = _text_steps(config)
        if normalizer is not None:
            tok.normalizer = normalizer
        tok.pre_tokenizer = pre_tokenizer
        texts = iter(sentences)
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
    tok.train_from_iterator(texts, trainer)
    by_id = sorted(tok.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1])
    return [t for t, _ in by_id]


def train_vocab_with_stats(sentences: Iterable[str], config: VocabConfig) -> tuple[list[str], dict[str, int]]:
    """:func:`train_vocab`, plus counts for the manifest (sentences, characters seen, ...)."""
    if iter(sentences) is sentences:  # a generator: keep it for the second pass
        sentences = list(sentences)
    specials = special_tokens(config.num_unused)
    budget = config.vocab_size - len(specials)

    normalizer, _, split_punctuation = _text_steps(config)
    chars, inner, num_sentences = count_alphabet(
        sentences,
        config.lowercase,
        normalizer="bert" if config.word_tokenizer == "none" else normalizer,
        split_punctuation=split_punctuation,
    )
    if num_sentences == 0:
        raise ValueError("train_vocab: no sentences to train on (is the corpus empty?)")
    alphabet = _choose_alphabet(chars, budget, config.max_alphabet)
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


def train_char_vocab(sentences: Iterable[str], config: VocabConfig) -> tuple[list[str], dict[str, int]]:
    """A character vocabulary (``vocab.subword=character``): the special entries, then the
    characters seen at least ``min_frequency`` times, the most frequent first up to the budget
    (ties by code point), written in code point order. ``sentences``: space-joined words."""
    specials = special_tokens(config.num_unused)
    budget = config.vocab_size - len(specials)
    chars: collections.Counter = collections.Counter()
    n = 0
    for sentence in sentences:
        n += 1
        chars.update(sentence)
    if n == 0:
        raise ValueError("train_vocab: no sentences to train on (is the corpus empty?)")
    ranked = sorted(((c, k) for c, k in chars.items() if not c.isspace()), key=lambda ck: (-ck[1], ck[0]))
    taken = set(specials)
    kept = sorted([c for c, k in ranked if k >= config.min_frequency and c not in taken][:budget])
    vocab = specials + kept
    seen = sum(1 for c in chars if not c.isspace())
    stats = {
        "vocab_size": len(vocab),
        "learned_tokens": len(kept),
        "alphabet_size": len(kept),
        "continuation_chars": 0,
        "merged_tokens": 0,
        "characters_seen": seen,
        "characters_dropped": seen - len(kept),
        "sentences_used": n,
    }
    return vocab, stats
