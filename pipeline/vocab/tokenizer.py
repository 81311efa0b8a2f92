"""The BERT tokenizer of a vocabulary: Google's special tokens, normaliser, ``vocab.txt`` and ``tokenizer.json``.

Built from the vocab stage's ``vocab.txt`` alone, so the examples stage, the export and the
fine-tuning tokenise exactly as the vocabulary was trained."""

from __future__ import annotations

import re

import fsspec
from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from pipeline.schema.storage import write_atomically

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
PREFIX = "##"
VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
"""What ``transformers.BertTokenizerFast.from_pretrained(vocab_dir)`` reads besides the two above."""


def special_tokens(num_unused: int) -> list[str]:
    """Google's leading entries: [PAD], [unused0..num_unused-1], [UNK], [CLS], [SEP], [MASK]."""
    return [PAD] + [f"[unused{i}]" for i in range(num_unused)] + [UNK, CLS, SEP, MASK]


def bert_normalizer(lowercase: bool) -> normalizers.Normalizer:
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )


def build_text_tokenizer(vocab: list[str], lowercase: bool) -> Tokenizer:
    """The bare WordPiece tokenizer for corpus text: no template, no truncation, and literal
    "[SEP]"/"[MASK]" in the text split like any other text (as the reference's FullTokenizer
    does), so a corpus cannot smuggle special ids into an example's segments."""
    ids = {t: i for i, t in enumerate(vocab)}
    missing = [t for t in (PAD, UNK, CLS, SEP, MASK) if t not in ids]
    if missing:
        raise ValueError(f"vocabulary lacks the special tokens {missing}")
    tok = Tokenizer(models.WordPiece(vocab=ids, unk_token=UNK, continuing_subword_prefix=PREFIX))
    tok.normalizer = bert_normalizer(lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix=PREFIX)
    return tok


ASCII_PUNCTUATION = r"[!-/:-@\[-`{-~]"
"""Rust's ``char::is_ascii_punctuation``: U+0021-002F, U+003A-0040, U+005B-0060, U+007B-007E."""
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""ASCII characters that BERT's normalizer drops (controls but tab, newline, return)."""


def plain_ascii(sentences: list[str]) -> tuple[list[int], list[int]]:
    """The places in ``sentences`` of those of printable ASCII (and tab, newline, return), and of
    the others.

    On them BERT's normalizer only lowercases: it drops no control character (there is none),
    maps tab/newline/return to spaces (they split words either way), pads no ideograph and strips
    no accent (NFD of ASCII is ASCII, none is a combining mark). And BERT's pre-tokenizer, which
    splits at whitespace and isolates each character that is ASCII punctuation or of a Unicode
    punctuation category, isolates exactly ASCII punctuation there: :func:`plain_pre_tokenizer`
    and a lowercase give the same words without three Unicode table searches a character
    (control, non-spacing mark, punctuation: a fifth of the tokenizer's time, docs/speed-data.md
    section 8). ``str.isascii`` is a flag in CPython; one regex search over the ASCII sentences
    joined, one per sentence only when it finds a control."""
    at = [i for i, s in enumerate(sentences) if s.isascii()]
    if _CONTROL.search("\n".join(sentences[i] for i in at)):
        at = [i for i in at if not _CONTROL.search(sentences[i])]
    if len(at) == len(sentences):
        return at, []
    taken = set(at)
    return at, [i for i in range(len(sentences)) if i not in taken]


def plain_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """BERT's pre-tokenizer for the text of :func:`plain_ascii`: whitespace split, then each ASCII
    punctuation character isolated (one regex, no Unicode table)."""
    return pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(ASCII_PUNCTUATION), "isolated")]
    )


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
