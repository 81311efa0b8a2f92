"""Word boundaries for whole-word masking of Chinese and Japanese text.

BERT's tokenizer puts every CJK ideograph in a token of its own (``handle_chinese_chars``), so
the ``##`` rule of whole-word masking sees one-character words: 北京大学 would be masked one
character at a time. A word segmenter gives the real words: ``jieba`` for Chinese, ``fugashi``
(MeCab with the ``unidic-lite`` dictionary) for Japanese; both ship their dictionaries, so they
run offline. They are an optional extra (``pip install bertflow[cjk]``), imported only when asked.

The design choice: a segmenter does not change the tokens, it marks which ideograph tokens
*continue* the word before them (:func:`continuation_flags`); the examples job carries the mark
in the token id itself (``id + vocab_size``) through example creation, so the one masking rule
(``pipeline.examples.masking``, which groups a word with its continuations) is reused unchanged, and the
mark is removed before anything is written. The cost: the shards keep no word boundaries, so the
loader's dynamic masking groups ``##`` pieces only.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

SEGMENTERS = ("none", "jieba", "fugashi")

_CJK = re.compile(
    "[\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f"
    "\U0002b740-\U0002b81f\U0002b820-\U0002ceaf\uf900-\ufaff\U0002f800-\U0002fa1f]"
)
"""The ideograph ranges of BERT's ``_is_chinese_char`` (the ones split one per token)."""


def has_cjk(text: str) -> bool:
    return _CJK.search(text) is not None


class Segmenter:
    """Word spans of a sentence, from ``jieba`` or ``fugashi``; loaded on first use."""

    def __init__(self, kind: str):
        if kind not in SEGMENTERS or kind == "none":
            raise ValueError(f"segmenter: {kind!r} is not one of {SEGMENTERS[1:]}")
        self.kind = kind
        self._impl = None

    def _load(self):
        try:
            if self.kind == "jieba":
                import jieba  # optional extra

                jieba.setLogLevel(60)
                tok = jieba.Tokenizer()
                tok.initialize()
                return tok
            import fugashi  # optional extra

            return fugashi.Tagger()
        except ImportError as exc:
            raise ImportError(
                f"segmenter {self.kind!r} needs the 'cjk' extra: pip install 'bertflow[cjk]' ({exc})"
            ) from exc

    def word_spans(self, text: str) -> list[tuple[int, int]]:
        """(start, end) character spans of the words of ``text``, in order."""
        if self._impl is None:
            self._impl = self._load()
        if self.kind == "jieba":
            return [(start, end) for _, start, end in self._impl.tokenize(text, HMM=False)]
        spans, pos = [], 0
        for word in self._impl(text):
            surface = word.surface
            at = text.find(surface, pos)
            if not surface or at < 0:
                continue  # a normalised form not found verbatim: no boundary from it
            spans.append((at, at + len(surface)))
            pos = at + len(surface)
        return spans


def continuation_flags(text: str, offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """For each token (its character ``offsets`` in ``text``): True when it is an ideograph that
    continues the segmenter word of the token before it."""
    starts = [s for s, _ in spans]
    word_of = []
    for start, _ in offsets:
        k = bisect.bisect_right(starts, start) - 1
        word_of.append(k if k >= 0 and start < spans[k][1] else -1)
    flags = [False] * len(offsets)
    for i in range(1, len(offsets)):
        start, end = offsets[i]
        if word_of[i] >= 0 and word_of[i] == word_of[i - 1] and end - start == 1 and has_cjk(text[start:end]):
            flags[i] = True
    return flags
