"""Typed configuration of the vocab stage."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.schema.config import LIMITS, check, check_at_most
from pipeline.schema.tokenization import SUBWORDS, WORD_TOKENIZERS


@dataclass(frozen=True)
class VocabConfig:
    """WordPiece vocabulary in Google's vocab.txt layout."""

    vocab_size: int = 30522
    """Total entries including [PAD], [unused*], [UNK], [CLS], [SEP], [MASK]."""
    min_frequency: int = 2
    """A merge (a WordPiece candidate) must occur at least this many times in the training
    sentences to enter the vocabulary."""
    lowercase: bool = True
    """Lower-case and strip accents before splitting (an "uncased" vocabulary, as Google's
    uncased models); false keeps case (a "cased" one)."""
    num_unused: int = 99
    """[unused0..N-1] slots after [PAD], as in Google's released vocabularies."""
    max_sentences: int = 0
    """Train on at most this many sentences (0: all)."""
    sample_fraction: float = 1.0
    """Train on this share of the documents, picked by a stable digest of doc_id (the same
    documents on every run, spread over the whole corpus rather than its first files)."""
    sample_sentences: int = 0
    """Train on a stable sample of about this many sentences (0: no cap). When the corpus (after
    sample_fraction) holds more, documents are kept by the same digest of doc_id at the rate
    sample_sentences / its sentences, spread over the whole corpus. The trainer holds every
    distinct word it reads, so its memory grows with the corpus; this bounds it whatever the
    corpus's size (SentencePiece's input_sentence_size plays the same part). The base and large
    presets set 4,000,000 (docs/scale.md)."""
    max_words: int = 0
    """Most distinct words held while the sentences' words are counted for the trainer (0: no
    cap; word_tokenizer=none). Past it, the rarest are dropped: those seen at most N times so
    far, N as low as leaves three quarters of the cap (word2vec's ReduceVocab and gensim's
    max_vocab_size do the same with N raised at every pruning); a dropped word seen again counts
    afresh. The trainer holds ~1.1 KB of memory a distinct word, so this bounds it whatever the
    sample meets. The base and large presets set 200,000 (docs/scale.md: at 1 GB, 281,320 words
    -> 163,266, RSS 446 -> 350 MiB, WordPiece tokens per held-out word 1.0836 -> 1.0838)."""
    word_tokenizer: str = "none"
    """What splits text into words before the subword step, here and in every later
    tokenisation: "none" (BERT's basic tokenizer: whitespace, punctuation, one token per CJK
    ideograph), "mecab" (Japanese: fugashi + unidic-lite, as transformers' BertJapaneseTokenizer),
    "jieba" (Chinese words; the export then expects jieba-segmented text). mecab and jieba need
    the 'cjk' extra. Default "none"."""
    subword: str = "wordpiece"
    """"wordpiece" (## continuations) or "character" (one token per character of a MeCab word,
    as the cl-tohoku char models; word_tokenizer=mecab only). Default "wordpiece"."""
    max_alphabet: int = 1000
    """Most single characters kept (at most a quarter of vocab_size); words with a rarer one
    tokenise to [UNK]. Default 1000 characters (Hugging Face's BERT trainer default); base-ja and
    base-zh keep 8000 (kanji, hanzi)."""

    def __post_init__(self):
        check(
            0.0 < self.sample_fraction <= 1.0,
            "vocab.sample_fraction",
            f"must lie in (0, 1], got {self.sample_fraction}",
        )
        check(self.max_sentences >= 0, "vocab.max_sentences", "must be >= 0 (0: all)")
        check(self.sample_sentences >= 0, "vocab.sample_sentences", "must be >= 0 (0: no cap)")
        check(self.max_words >= 0, "vocab.max_words", "must be >= 0 (0: no cap)")
        check(
            self.max_words == 0 or self.word_tokenizer == "none",
            "vocab.max_words",
            f"needs vocab.word_tokenizer=none (the trainer counts {self.word_tokenizer}'s words itself)",
        )
        check(self.num_unused >= 0, "vocab.num_unused", "must be >= 0")
        check(
            self.vocab_size > self.num_unused + 5 + 100,
            "vocab.vocab_size",
            f"must exceed the {self.num_unused + 5} special entries by at least 100",
        )
        check(self.min_frequency >= 1, "vocab.min_frequency", "must be >= 1")
        check_at_most(self.vocab_size, LIMITS.vocab_size, "vocab.vocab_size", "embedding rows")
        check(
            self.word_tokenizer in WORD_TOKENIZERS,
            "vocab.word_tokenizer",
            f"must be one of {WORD_TOKENIZERS}, got {self.word_tokenizer!r}",
        )
        check(self.subword in SUBWORDS, "vocab.subword", f"must be one of {SUBWORDS}, got {self.subword!r}")
        check(
            self.subword == "wordpiece" or self.word_tokenizer == "mecab",
            "vocab.subword",
            "'character' needs vocab.word_tokenizer=mecab (its words give whole-word masking its units)",
        )
        check(self.max_alphabet >= 1, "vocab.max_alphabet", "must be >= 1")
