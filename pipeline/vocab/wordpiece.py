"""Stage 2: a WordPiece vocabulary in Google's ``vocab.txt`` layout, and the tokenizer built on it.

The tokenizers ``WordPieceTrainer`` does the training (Rust). Three things are ours:

1. **Determinism.** The trainer gives each continuation piece ``##c`` an id in the order it meets
   words in a hash map that is seeded afresh for every map, and breaks ties between equally
   frequent merges by those ids, so both the order *and* (at the cut-off) the set of learned
   tokens change run to run. We count the alphabet ourselves first (a cheap pass of the
   normalizer and pre-tokenizer) and hand the trainer every ``##c`` it would create as a
   "special token", in sorted order: then every id, every tie-break and so every merge is fixed.
   BERT's words are counted in that same pass (:func:`count_words`) and the trainer reads the
   counts, not the text again (the Parquet input is read once; ``vocab.max_words`` bounds the
   words held, the rarest dropped past it); the ``##c`` it can make are then known exactly.
   MeCab's and jieba's words are read by the trainer from the text, a second pass; should it
   add a ``##c`` we did not foresee there (Python's and Rust's Unicode tables disagreeing on a
   character), we retrain once with it pre-assigned as well.
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
import dataclasses
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
    ASCII_PUNCTUATION,
    PREFIX,
    UNK,
    bert_normalizer,
    plain_ascii,
    special_tokens,
)

MAX_ALPHABET = 1000
"""Most single characters kept in the vocabulary (Hugging Face's BertWordPieceTokenizer default)."""


def _is_punctuation(c: str) -> bool:
    """BERT's punctuation (what BertPreTokenizer splits off): ASCII symbols and Unicode P*."""
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


_FIRST_OF_WORD = re.compile(r"(?<!\S)\S")
_ISOLATE_ASCII = {cp: f" {chr(cp)} " for cp in range(0x21, 0x7F) if re.fullmatch(ASCII_PUNCTUATION, chr(cp))}
"""What :func:`~pipeline.vocab.tokenizer.plain_pre_tokenizer`'s second step does: each ASCII
punctuation character a word of its own."""
FEED_CHARS = 1 << 15
"""Characters per text handed to the trainer from word counts (it buffers 256 texts: ~8 MB)."""


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


class _Alphabet:
    """Character counts over pre-tokenized words, and the characters seen inside a word (after
    its first): the trainer's alphabet and the characters it makes a ``##`` piece of. Counts
    batches of normalized text with C-speed string operations (the normalizer acts per
    character, so a joined batch normalizes as its parts)."""

    def __init__(self, split_punctuation: bool = True):
        self.split_punctuation = split_punctuation
        self.chars: collections.Counter = collections.Counter()
        self.inner: set[str] = set()
        self.to_space: dict[int, str] = {}  # punctuation -> space, grown as new characters appear

    def add(self, text: str) -> None:
        counts = collections.Counter(text)
        for c in counts:
            if c.isspace():
                continue
            self.chars[c] += counts[c]
            if self.split_punctuation and ord(c) not in self.to_space and _is_punctuation(c):
                self.to_space[ord(c)] = " "
        # Drop each word's first character; whatever non-space is left sat inside a word.
        self.inner.update(_FIRST_OF_WORD.sub("", text.translate(self.to_space)))

    def inner_chars(self) -> set[str]:
        return {c for c in self.inner if not c.isspace()}


def count_alphabet(
    sentences: Iterable[str],
    lowercase: bool,
    batch_size: int = 2048,
    normalizer: normalizers.Normalizer | None | str = "bert",
    split_punctuation: bool = True,
) -> tuple[collections.Counter, set[str], int]:
    """Character counts over pre-tokenized words, the characters seen inside a word, #sentences
    (:class:`_Alphabet` over BERT's normalizer, ``normalizer`` or none)."""
    plain = _PlainText(lowercase) if normalizer == "bert" else None
    norm = None if plain is not None else normalizer
    alphabet = _Alphabet(split_punctuation)
    n = 0
    for batch in _batches(sentences, batch_size):
        n += len(batch)
        if plain is not None:  # BERT's normalizer: the same characters, in another order
            alphabet.add(plain.normalized(batch))
        else:
            text = "\n".join(batch)
            alphabet.add(norm.normalize_str(text) if norm is not None else text)
    return alphabet.chars, alphabet.inner_chars(), n


@dataclasses.dataclass
class WordCounts:
    """What one pass over BERT's words of the sentences gives the trainer."""

    chars: collections.Counter
    """Every character's count (all words, dropped ones too): count_alphabet's."""
    inner: set[str]
    """Characters seen inside a word (all words, dropped ones too): count_alphabet's, and
    those inside BERT's words where Python's and Rust's punctuation tables disagree."""
    sentences: int
    words: collections.Counter
    """BERT's words and their counts: all of them, or with ``max_words`` those left."""
    floor: int = 0
    """0: no word dropped; else the highest bar of a pruning (words then seen at most this often
    were dropped)."""
    prunes: int = 0


def count_words(sentences: Iterable[str], lowercase: bool, max_words: int = 0, batch_size: int = 2048) -> WordCounts:
    """BERT's words of ``sentences`` (its normalizer and pre-tokenizer's, :class:`_PlainText`)
    counted in one pass, and the characters :func:`count_alphabet` counts, from the words.

    With ``max_words``, whenever more distinct words than that are held after a batch, the
    rarest are dropped: those seen at most ``bar`` times so far, the least ``bar`` that leaves
    three quarters of ``max_words`` (word2vec's ``ReduceVocab`` and gensim's ``max_vocab_size``
    drop those seen once, then twice, ..., the bar raised at every pruning; here it is as low as
    the cap allows each time). What is held stays under ``max_words`` plus one batch's new
    words, whatever the text; a dropped word seen again counts afresh, so a kept word's count
    is at most its true one, and exact when it was never dropped. Without a cap, exact."""
    plain = _PlainText(lowercase)
    other_text = _Alphabet()  # the inner characters of the text outside plain ASCII, as count_alphabet's
    words: collections.Counter = collections.Counter()
    chars: collections.Counter = collections.Counter()
    inner: set[str] = set()
    floor = prunes = n = 0
    for batch in _batches(sentences, batch_size):
        n += len(batch)
        text, other = plain.parts(batch)
        if other:
            other_text.add(other)
            text = f"{text}\n{plain.space(other)}"
        words.update(text.translate(_ISOLATE_ASCII).split())
        if max_words and len(words) > max_words:
            bar = _bar(words, max_words * 3 // 4)
            _characters({w: k for w, k in words.items() if k <= bar}, chars, inner)
            words = collections.Counter({w: k for w, k in words.items() if k > bar})
            floor, prunes = max(floor, bar), prunes + 1
    _characters(words, chars, inner)
    # On plain ASCII, Python's punctuation and Rust's agree: its words' inner characters are
    # count_alphabet's. Elsewhere the tables may not: both sets are kept (the ## pieces the text
    # path pre-assigns, and those the trainer makes of the words it reads).
    return WordCounts(chars, inner | other_text.inner_chars(), n, words, floor, prunes)


def _characters(words: dict[str, int], chars: collections.Counter, inner: set[str]) -> None:
    """Add the characters of counted words (every non-space character of their text: the split
    only removed whitespace) to ``chars``, and those after a word's first to ``inner``."""
    by_count: dict[int, list[str]] = collections.defaultdict(list)
    for word, count in words.items():
        by_count[count].append(word)
    for count, group in by_count.items():
        for c, k in collections.Counter("".join(group)).items():
            chars[c] += k * count
    inner.update("".join(w[1:] for w in words))


def _bar(words: collections.Counter, keep: int) -> int:
    """The least count ``bar`` such that at most ``keep`` words are seen more than ``bar`` times."""
    left = len(words)
    for count, number in sorted(collections.Counter(words.values()).items()):
        left -= number
        if left <= keep:
            return count
    return max(words.values())


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
        plain, other = self.parts(batch)
        if not other:
            return plain
        return f"{plain}\n{self.space(other) if spaced else other}"

    def parts(self, batch: list[str]) -> tuple[str, str]:
        """(the plain sentences lowercased, the others through BERT's normalizer), each
        newline-joined; the second is empty when all are plain."""
        at, other_at = plain_ascii(batch)
        plain = "\n".join(batch[i] for i in at)
        if self.lowercase:
            plain = plain.lower()
        if not other_at:
            return plain, ""
        return plain, self.normalizer.normalize_str("\n".join(batch[i] for i in other_at))

    def space(self, other: str) -> str:
        """Normalized text with each character BERT's pre-tokenizer isolates and the plain one
        does not between spaces."""
        for c in set(other) - self.seen:
            self.seen.add(c)
            if not c.isascii() and len(self.bert_pre.pre_tokenize_str(f"a{c}a")) == 3:
                self.spaced[ord(c)] = f" {c} "
        return other.translate(self.spaced)

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


def _trainer(config: VocabConfig, budget: int, alphabet: list[str], continuations: list[str]):
    return trainers.WordPieceTrainer(
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


def _pieces(tok: Tokenizer) -> list[str]:
    return [t for t, _ in sorted(tok.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1])]


def _train_pieces(
    sentences: Iterable[str],
    config: VocabConfig,
    budget: int,
    alphabet: list[str],
    continuations: list[str],
) -> list[str]:
    """The trainer's tokens by id (continuations, alphabet, then merges in the order learned),
    the trainer reading the sentences' text through the vocabulary's normalizer and
    pre-tokenizer (:func:`_text_steps`; BERT's words go through :func:`_learn_from_words`)."""
    tok = Tokenizer(models.WordPiece(unk_token=UNK))
    normalizer, pre_tokenizer, _ = _text_steps(config)
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.train_from_iterator(iter(sentences), _trainer(config, budget, alphabet, continuations))
    return _pieces(tok)


def _train_pieces_from_words(
    words: collections.Counter,
    config: VocabConfig,
    budget: int,
    alphabet: list[str],
    continuations: list[str],
) -> list[str]:
    """:func:`_train_pieces` on counted words: the trainer reads each word as often as counted
    (it counts words; their order and grouping into texts do not matter). Empties ``words`` as
    it goes, so the counts and the trainer's copy of them are not both held whole."""
    tok = Tokenizer(models.WordPiece(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(_repeated(words), _trainer(config, budget, alphabet, continuations))
    return _pieces(tok)


def _repeated(words: collections.Counter):
    """Texts of about FEED_CHARS characters in which each word appears as often as counted."""
    parts: list[str] = []
    size = 0
    while words:
        word, count = words.popitem()
        unit = word + " "
        per_text = max(1, FEED_CHARS // len(unit))
        while count:
            k = min(count, per_text)
            parts.append(unit * k)
            size += k * len(unit)
            count -= k
            if size >= FEED_CHARS:
                yield "".join(parts)
                parts, size = [], 0
    if parts:
        yield "".join(parts)


def train_vocab_with_stats(sentences: Iterable[str], config: VocabConfig) -> tuple[list[str], dict[str, int]]:
    """:func:`train_vocab`, plus counts for the manifest (sentences, characters seen, ...).

    BERT's words (``word_tokenizer=none``) are counted in one pass over the sentences
    (:func:`count_words`, ``vocab.max_words`` bounding what is held) and the trainer reads the
    counts; MeCab's and jieba's words are read by the trainer from the text, a second pass."""
    specials = special_tokens(config.num_unused)
    budget = config.vocab_size - len(specials)
    if config.word_tokenizer == "none":
        alphabet, continuations, learned, counts = _learn_from_words(sentences, config, budget)
    else:
        alphabet, continuations, learned, counts = _learn_from_text(sentences, config, budget)
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
        "characters_dropped": counts["characters_seen"] - len(alphabet),
        **counts,
    }
    return vocab, stats


def _learn_from_words(sentences: Iterable[str], config: VocabConfig, budget: int):
    """(alphabet, continuations, the trainer's tokens by id, counts) from BERT's words counted."""
    counted = count_words(sentences, config.lowercase, config.max_words)
    if counted.sentences == 0:
        raise ValueError("train_vocab: no sentences to train on (is the corpus empty?)")
    alphabet = _choose_alphabet(counted.chars, budget, config.max_alphabet)
    # Every ## piece the trainer can make (each alphabet character inside a word it reads) and
    # those _learn_from_text pre-assigns: both paths give the same list.
    continuations = [PREFIX + c for c in alphabet if c in counted.inner]
    counts = {
        "sentences_used": counted.sentences,
        "characters_seen": len(counted.chars),
        "trainer_words": len(counted.words),
        "words_dropped_at_most_seen": counted.floor,
    }
    learned = _train_pieces_from_words(counted.words, config, budget, alphabet, continuations)
    unforeseen = _unforeseen(learned, continuations)
    if unforeseen:  # cannot happen: the trainer read exactly the words whose characters were listed
        raise RuntimeError(f"train_vocab: the trainer made ## pieces not listed beforehand: {unforeseen[:10]}")
    return alphabet, continuations, learned, counts


def _learn_from_text(sentences: Iterable[str], config: VocabConfig, budget: int):
    """(alphabet, continuations, the trainer's tokens by id, counts), the trainer reading text."""
    if iter(sentences) is sentences:  # a generator: keep it for the second pass
        sentences = list(sentences)
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
    unforeseen = _unforeseen(learned, continuations)
    if unforeseen:
        continuations = sorted(continuations + unforeseen)
        learned = _train_pieces(sentences, config, budget, alphabet, continuations)
    return alphabet, continuations, learned, {"sentences_used": num_sentences, "characters_seen": len(chars)}


def _unforeseen(learned: list[str], continuations: list[str]) -> list[str]:
    listed = set(continuations)
    return sorted(t for t in learned if t.startswith(PREFIX) and len(t) == len(PREFIX) + 1 and t not in listed)


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
