"""Word segmentation before WordPiece: the tokenizer of a Japanese (MeCab) or jieba vocabulary.

A vocabulary folder says how its ids were made (``tokenizer_config.json``); this module is the
one implementation of the segmented kinds, shared by every stage that turns text into ids: the
vocab stage trains on its words, the examples stage writes their ids, fine-tuning and the MLflow
model encode with it (``tasks/`` reaches it through ``model/contract.py``). It belongs to the
data contract because the ids in the shards mean what this code makes of the text.

The kinds (``word_tokenizer`` x ``subword``):

- ``mecab`` + ``wordpiece`` / ``character``: what ``transformers.BertJapaneseTokenizer`` does with
  ``word_tokenizer_type="mecab"``, ``mecab_kwargs={"mecab_dic": "unidic_lite"}`` (the cl-tohoku
  v2/v3 models): NFKC over the text, MeCab (``fugashi`` with the ``unidic-lite`` dictionary, the
  same options string transformers builds), each surface lower-cased if asked, then greedy
  longest-match WordPiece per surface (``##`` continuations, a word over 100 characters is
  ``[UNK]``) or one token per character. Special tokens in the text are split off first, as
  transformers' ``tokenize`` does, when ``specials`` is on (fine-tuning); the examples stage
  leaves them off, so a corpus cannot smuggle ``[SEP]`` into a segment.
- ``jieba`` + ``wordpiece``: jieba's words (dictionary only, ``HMM=False``: deterministic) joined by
  spaces, then BERT's tokenizer without the one-ideograph split. The export's ``tokenizer.json``
  is that second half, so ``BertTokenizerFast`` tokenises jieba-segmented text identically.

The design choice: segmentation runs in Python, and its words reach the Rust tokenizer as one
space-joined string (``WhitespaceSplit`` pre-tokenizer), so the WordPiece, the truncation and
the ``[CLS] A [SEP] B [SEP]`` template are ``tokenizers``' own, and offsets are mapped back to
the original text through the NFKC alignment and the inserted spaces. The cost: one Python call
to MeCab per text (~3 M characters/s here) and, when offsets are asked for, one alignment pass.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

WORD_TOKENIZERS = ("none", "mecab", "jieba")
"""What splits text into words before the subword step: BERT's basic tokenizer, MeCab, jieba."""
SUBWORDS = ("wordpiece", "character")
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_INPUT_CHARS_PER_WORD = 100
"""Longer words are one [UNK] (transformers' WordpieceTokenizer and tokenizers' WordPiece)."""
MECAB_DIC = "unidic_lite"
CONFIG_KEY = "bertflow_word_tokenizer"
"""The tokenizer_config.json key that names a jieba vocabulary (transformers has no jieba kind)."""

_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")


# -- the segmenters ----------------------------------------------------------------------------
def mecab_tagger(wakati: bool = True):
    """fugashi's MeCab with unidic-lite, with the options transformers' MecabTokenizer passes."""
    try:
        import fugashi
        import unidic_lite
    except ImportError as exc:  # optional extra
        raise ImportError(f"word_tokenizer 'mecab' needs the 'cjk' extra: pip install 'bertflow[cjk]' ({exc})") from exc
    dic = unidic_lite.DICDIR
    option = f'-d "{dic}" -r "{os.path.join(dic, "mecabrc")}" '
    return fugashi.GenericTagger(option + ("-Owakati" if wakati else ""))


def jieba_tokenizer():
    try:
        import jieba
    except ImportError as exc:
        raise ImportError(f"word_tokenizer 'jieba' needs the 'cjk' extra: pip install 'bertflow[cjk]' ({exc})") from exc
    jieba.setLogLevel(60)
    tok = jieba.Tokenizer()
    tok.initialize()
    return tok


class Segmenter:
    """Words of a text (MeCab surfaces of its NFKC form, or jieba's words); loaded on first use."""

    def __init__(self, kind: str):
        if kind not in WORD_TOKENIZERS[1:]:
            raise ValueError(f"word_tokenizer: {kind!r} is not one of {WORD_TOKENIZERS[1:]}")
        self.kind = kind
        self._impl = None

    def __getstate__(self) -> dict:
        # MeCab's tagger cannot be pickled (MLflow pickles the model object, Beam its DoFns):
        # travel without it and load it again on first use
        return {"kind": self.kind, "_impl": None}

    def words(self, text: str) -> list[str]:
        """Surfaces in order. MeCab: of ``text`` as given (normalise first); jieba: they
        concatenate back to ``text``."""
        if self._impl is None:
            self._impl = mecab_tagger() if self.kind == "mecab" else jieba_tokenizer()
        if self.kind == "mecab":
            return self._impl.parse(text).split()
        return [w for w, _, _ in self._impl.tokenize(text, HMM=False)]


def nfkc_aligned(text: str) -> tuple[str, list[tuple[int, int]]]:
    """NFKC of ``text`` and, per normalised character, the span of original characters it came
    from. Normalised cluster by cluster (a starter and its combining marks: か + U+3099 is one
    cluster, が); where that differs from normalising the whole (rare: conjoining jamo), the
    whole is used and spans are spread proportionally."""
    whole = unicodedata.normalize("NFKC", text)
    if whole == text:
        return text, [(i, i + 1) for i in range(len(text))]
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(text) + 1):
        if i == len(text) or not unicodedata.combining(text[i]):
            piece = unicodedata.normalize("NFKC", text[start:i])
            out.append(piece)
            spans.extend([(start, i)] * len(piece))
            start = i
    if "".join(out) == whole:
        return whole, spans
    n, m = max(1, len(whole)), len(text)
    return whole, [(k * m // n, max(k * m // n + 1, (k + 1) * m // n)) for k in range(len(whole))]


# -- the tokenizer -----------------------------------------------------------------------------
@dataclass
class Encoded:
    """One encoded text or pair: what ``tokenizers.Encoding`` offers that the stages use."""

    ids: list[int]
    type_ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    """Character spans in the original text of their sequence ((0, 0) for special tokens)."""
    sequence_ids: list[int | None]
    word_starts: list[bool]
    """True where a token begins a segmenter word (special tokens: True)."""

    @property
    def attention_mask(self) -> list[int]:
        return [1] * len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class _Prepared:
    joined: str  # the words, space-joined: what the Rust tokenizer reads
    unit_word: list[int]  # per whitespace unit of ``joined``: its word's index
    char_word: list[int] | None  # with spans: per character of ``joined``, its word (-1: a separator)
    char_span: list[tuple[int, int]] | None  # with spans: per character, its span in the original text


class WordTokenizer:
    """A vocabulary's segmenting tokenizer, with the calls of ``tokenizers.Tokenizer`` the stages
    make: ``encode``/``encode_batch`` (texts or (a, b) pairs), ``enable_truncation``,
    ``no_truncation``, ``no_padding``, ``token_to_id``, ``id_to_token``, ``get_vocab_size``."""

    def __init__(
        self,
        vocab: Sequence[str],
        word_tokenizer: str,
        subword: str = "wordpiece",
        lowercase: bool = False,
        specials: bool = True,
    ):
        if word_tokenizer not in WORD_TOKENIZERS[1:]:
            raise ValueError(f"word_tokenizer: {word_tokenizer!r} is not one of {WORD_TOKENIZERS[1:]}")
        if subword not in SUBWORDS:
            raise ValueError(f"subword: {subword!r} is not one of {SUBWORDS}")
        if word_tokenizer == "jieba" and subword != "wordpiece":
            raise ValueError("subword 'character' goes with word_tokenizer 'mecab' (jieba: wordpiece)")
        ids = {t: i for i, t in enumerate(vocab)}
        missing = [t for t in SPECIAL_TOKENS if t not in ids]
        if missing:
            raise ValueError(f"vocabulary lacks the special tokens {missing}")
        self.kind, self.subword, self.lowercase, self.specials = word_tokenizer, subword, lowercase, specials
        self.segmenter = Segmenter(word_tokenizer)
        self.rust = Tokenizer(
            models.WordPiece(vocab=ids, unk_token="[UNK]", max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)
        )
        normalizer = text_normalizer(word_tokenizer, lowercase)
        if normalizer is not None:
            self.rust.normalizer = normalizer
        self.rust.pre_tokenizer = text_pre_tokenizer(word_tokenizer)
        self.rust.decoder = decoders.WordPiece(prefix="##")
        cls_id, sep_id = ids["[CLS]"], ids["[SEP]"]
        self.rust.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
        )
        if specials:
            self.rust.add_special_tokens(list(SPECIAL_TOKENS))  # in the vocabulary: ids unchanged

    # -- the calls of tokenizers.Tokenizer ---------------------------------------------------
    def enable_truncation(self, max_length: int, **kwargs) -> None:
        self.rust.enable_truncation(max_length, **kwargs)

    def no_truncation(self) -> None:
        self.rust.no_truncation()

    def no_padding(self) -> None:
        self.rust.no_padding()

    def token_to_id(self, token: str) -> int | None:
        return self.rust.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self.rust.id_to_token(i)

    def get_vocab_size(self) -> int:
        return self.rust.get_vocab_size()

    def get_vocab(self) -> dict[str, int]:
        return self.rust.get_vocab()

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.rust.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def encode(self, text, pair: str | None = None, add_special_tokens: bool = True) -> Encoded:
        item = text if pair is None else (text, pair)
        return self.encode_batch([item], add_special_tokens=add_special_tokens)[0]

    def encode_batch(self, inputs: Sequence, add_special_tokens: bool = True, offsets: bool = True) -> list[Encoded]:
        """Encodings of texts or (a, b) pairs; ``offsets=False`` skips the alignment (ids and
        word starts only, as the examples stage needs)."""
        pairs = [isinstance(x, (tuple, list)) for x in inputs]
        prepared = [[self.prepare(t, offsets) for t in (x if p else (x,))] for x, p in zip(inputs, pairs)]
        rust_in = [tuple(p.joined for p in ps) if pair else ps[0].joined for ps, pair in zip(prepared, pairs)]
        encodings = self.rust.encode_batch(rust_in, add_special_tokens=add_special_tokens)
        return [self._encoded(e, ps) for e, ps in zip(encodings, prepared)]

    # -- segmentation ------------------------------------------------------------------------
    def words(self, text: str) -> list[str]:
        """The words the subword step sees (special tokens kept whole when ``specials``)."""
        return [w for w, _ in self._words(text, spans=False)]

    def prepare(self, text: str, spans: bool = True) -> _Prepared:
        units: list[str] = []
        unit_word: list[int] = []
        unit_spans: list[list[tuple[int, int]]] = []
        for k, (word, word_spans) in enumerate(self._words(text, spans)):
            if self.subword == "character" and word not in SPECIAL_TOKENS:
                keep = [i for i, c in enumerate(word) if not c.isspace()]  # one unit a character
                units.extend(word[i] for i in keep)
                unit_word.extend([k] * len(keep))
                if spans:
                    unit_spans.extend(word_spans[i : i + 1] for i in keep)
            else:
                units.append(word)
                unit_word.append(k)
                if spans:
                    unit_spans.append(word_spans)
        if not spans:
            return _Prepared(" ".join(units), unit_word, None, None)
        char_word: list[int] = []
        char_span: list[tuple[int, int]] = []
        for i, (unit, span) in enumerate(zip(units, unit_spans)):
            if i:
                char_word.append(-1)
                char_span.append((0, 0))
            char_word.extend([unit_word[i]] * len(unit))
            char_span.extend(span)
        return _Prepared(" ".join(units), unit_word, char_word, char_span)

    def _words(self, text: str, spans: bool):
        """(word, per-character original spans or None) in order. Whitespace inside a word is
        dropped (transformers' WordpieceTokenizer splits on it; MeCab gives none)."""
        chunks = _SPECIAL_SPLIT.split(text) if self.specials else [text]
        at = 0
        for chunk in chunks:
            base = at
            at += len(chunk)
            if not chunk:
                continue
            if self.specials and chunk in SPECIAL_TOKENS:
                yield chunk, ([(base + i, base + i + 1) for i in range(len(chunk))] if spans else None)
                continue
            if self.kind == "jieba":
                pos = base
                for word in self.segmenter.words(chunk):
                    start, pos = pos, pos + len(word)
                    for m in re.finditer(r"\S+", word):
                        s0 = start + m.start()
                        yield m.group(0), ([(s0 + i, s0 + i + 1) for i in range(len(m.group(0)))] if spans else None)
                continue
            if not spans:  # the examples stage: the words alone
                words = self.segmenter.words(unicodedata.normalize("NFKC", chunk))
                for word in words:
                    word = word.lower() if self.lowercase else word
                    if any(c.isspace() for c in word):
                        word = "".join(word.split())
                    if word:
                        yield word, None
                continue
            norm, origin = nfkc_aligned(chunk)
            pos = 0
            for word in self.segmenter.words(norm):
                found = norm.find(word, pos)
                found = pos if found < 0 else found  # MeCab surfaces are always found
                pos = found + len(word)
                if self.lowercase:
                    word = word.lower()
                src = [(base + a, base + b) for a, b in origin[found:pos]]
                if len(word) != len(src):  # lower-casing changed the length ("İ"): spread the word's span
                    first, last = (src[0][0], src[-1][1]) if src else (base, base)
                    src = [(first, last)] * len(word)
                keep = [i for i, c in enumerate(word) if not c.isspace()]
                if len(keep) != len(word):
                    word, src = "".join(word[i] for i in keep), [src[i] for i in keep]
                if word:
                    yield word, src

    def _encoded(self, enc, prepared: list[_Prepared]) -> Encoded:
        """Offsets through the character maps; word starts from them, or without spans (the
        examples stage: no special tokens in the text, so MeCab's whitespace units are the
        pre-tokenizer's words) from ``word_ids``, or from ``##`` for WordPiece."""
        offsets, starts = [], []
        prev = None
        by_unit = self.kind == "mecab" and self.subword == "character"
        tokens, word_ids = enc.tokens, enc.word_ids
        if not by_unit and all(p.char_word is None for p in prepared):  # WordPiece, no offsets
            starts = [seq is None or not t.startswith("##") for seq, t in zip(enc.sequence_ids, tokens)]
            n = len(tokens)
            return Encoded(
                list(enc.ids), list(enc.type_ids), list(tokens), [(0, 0)] * n, list(enc.sequence_ids), starts
            )
        for k, (seq, (s, e)) in enumerate(zip(enc.sequence_ids, enc.offsets)):
            if seq is None or e <= s:  # [CLS], [SEP] of the template
                offsets.append((0, 0))
                starts.append(True)
                prev = None
                continue
            p = prepared[seq]
            if p.char_word is not None:
                word = (seq, p.char_word[s])
                offsets.append((p.char_span[s][0], p.char_span[e - 1][1]))
            else:
                offsets.append((0, 0))
                word = (
                    (seq, p.unit_word[word_ids[k]]) if by_unit else (seq, k if not tokens[k].startswith("##") else -1)
                )
            if word[1] == -1:  # a ## piece: continues the word before it
                starts.append(False)
                continue
            starts.append(word != prev)
            prev = word
        return Encoded(list(enc.ids), list(enc.type_ids), list(tokens), offsets, list(enc.sequence_ids), starts)


def text_normalizer(word_tokenizer: str, lowercase: bool):
    """The Rust normaliser after segmentation: none for MeCab (NFKC ran before MeCab and
    lower-casing after it, in Python, as transformers does), BERT's cleaning without the
    ideograph split for jieba."""
    if word_tokenizer == "jieba":
        return normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=False, strip_accents=None, lowercase=lowercase
        )
    return None


def text_pre_tokenizer(word_tokenizer: str):
    """Whitespace between MeCab's words; BERT's whitespace and punctuation split for jieba."""
    return pre_tokenizers.BertPreTokenizer() if word_tokenizer == "jieba" else pre_tokenizers.WhitespaceSplit()


def segmented_text(word_tokenizer: str, lowercase: bool = False):
    """A function text -> the space-joined words the vocabulary is trained on (no specials)."""
    seg = Segmenter(word_tokenizer)
    if word_tokenizer == "jieba":
        return lambda text: " ".join(seg.words(text))
    if lowercase:
        return lambda text: " ".join(w.lower() for w in seg.words(unicodedata.normalize("NFKC", text)))
    return lambda text: " ".join(seg.words(unicodedata.normalize("NFKC", text)))


def hf_tokenizer_config(word_tokenizer: str, subword: str, lowercase: bool, max_length: int = 512) -> dict:
    """The ``tokenizer_config.json`` of a vocabulary: what ``AutoTokenizer`` builds from it."""
    common = {
        "model_max_length": max_length,
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
        "do_lower_case": lowercase,
    }
    if word_tokenizer == "mecab":
        return {
            **common,
            "tokenizer_class": "BertJapaneseTokenizer",
            "word_tokenizer_type": "mecab",
            "subword_tokenizer_type": subword,
            "mecab_kwargs": {"mecab_dic": MECAB_DIC},
        }
    config = {**common, "tokenizer_class": "BertTokenizer", "tokenize_chinese_chars": word_tokenizer != "jieba"}
    config["strip_accents"] = None
    if word_tokenizer == "jieba":
        config[CONFIG_KEY] = "jieba"
    return config


def word_tokenizer_of(config: dict) -> tuple[str, str, bool] | None:
    """(word_tokenizer, subword, lowercase) of a ``tokenizer_config.json`` that needs this module
    (MeCab or jieba), else None (BERT's own tokenizer: ``tokenizer.json``)."""
    lowercase = bool(config.get("do_lower_case", False))
    if config.get("word_tokenizer_type") == "mecab" or config.get("tokenizer_class") == "BertJapaneseTokenizer":
        if config.get("word_tokenizer_type", "basic") != "mecab":
            raise ValueError(f"word_tokenizer_type {config.get('word_tokenizer_type')!r}: only 'mecab' is supported")
        dic = (config.get("mecab_kwargs") or {}).get("mecab_dic", MECAB_DIC)
        if dic != MECAB_DIC:
            raise ValueError(f"mecab_kwargs.mecab_dic {dic!r}: only {MECAB_DIC!r} is supported here")
        return "mecab", config.get("subword_tokenizer_type", "wordpiece"), lowercase
    if config.get(CONFIG_KEY) == "jieba":
        return "jieba", "wordpiece", lowercase
    return None
