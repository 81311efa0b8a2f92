"""Whole-word masking for Chinese and Japanese: segmenter words are masked together."""

from __future__ import annotations

import random

import pytest

from pipeline.examples.config import ExamplesConfig
from pipeline.examples.masking import VocabIds, create_masked_lm_predictions
from pipeline.examples.segment import Segmenter, continuation_flags, has_cjk
from pipeline.examples.tokens import TokenizeToBuckets, unmark, word_marked_vocab
from pipeline.schema.config import ConfigError
from pipeline.vocab.tokenizer import special_tokens


def test_continuation_flags_follow_the_word_spans():
    text = "北京大学 in 上海"
    offsets = [(0, 1), (1, 2), (2, 3), (3, 4), (5, 7), (8, 9), (9, 10)]
    spans = [(0, 2), (2, 4), (5, 7), (8, 10)]  # 北京 | 大学 | in | 上海
    assert continuation_flags(text, offsets, spans) == [False, True, False, True, False, False, True]
    # A non-ideograph inside a word is left to the ## rule; no spans, no continuations.
    assert continuation_flags("ab", [(0, 1), (1, 2)], [(0, 2)]) == [False, False]
    assert continuation_flags(text, offsets, []) == [False] * 7
    assert has_cjk("x北") and not has_cjk("abc ümlaut")


def test_config_needs_whole_word_mask_and_a_known_segmenter():
    with pytest.raises(ConfigError, match="examples.segmenter"):
        ExamplesConfig(segmenter="jieba")
    with pytest.raises(ConfigError, match="examples.segmenter"):
        ExamplesConfig(segmenter="mecab", whole_word_mask=True)
    assert ExamplesConfig(segmenter="jieba", whole_word_mask=True).segmenter == "jieba"


CHINESE = "我们在北京大学学习自然语言处理和机器翻译，研究生命科学。"
JAPANESE = "東京大学で自然言語処理を勉強しています。"


def tokenizer_for(text: str, kind: str) -> tuple[TokenizeToBuckets, list[str]]:
    pieces = sorted({c for c in text if not c.isspace()} | {"##" + c for c in text})
    vocab = special_tokens(99) + pieces
    dofn = TokenizeToBuckets(vocab, True, 1, "/nonexistent", kind)
    dofn.setup()
    return dofn, vocab


@pytest.mark.parametrize(("kind", "text", "module"), [("jieba", CHINESE, "jieba"), ("fugashi", JAPANESE, "fugashi")])
def test_segmenter_words_are_masked_together(kind, text, module):
    pytest.importorskip(module)
    dofn, vocab = tokenizer_for(text, kind)
    encoding = dofn.tokenizer.encode(text, add_special_tokens=False)
    marked = dofn._ids(text, encoding)
    v = len(vocab)
    assert [t - v if t >= v else t for t in marked] == encoding.ids  # marks only, same tokens
    spans = Segmenter(kind).word_spans(text)
    multi = [(s, e) for s, e in spans if e - s > 1 and has_cjk(text[s:e])]
    assert multi  # the sentences hold multi-character words (北京大学, 自然言語, ...)
    # Token index groups of each multi-character word.
    words = [[i for i, (a, _) in enumerate(encoding.offsets) if s <= a < e] for s, e in multi]
    ids = VocabIds.from_vocab(vocab)
    wm = word_marked_vocab(ids, v)
    rng = random.Random(0)
    whole = 0
    for _ in range(300):
        tokens = [ids.cls_id, *marked, ids.sep_id, *marked, ids.sep_id]
        out, positions, labels = create_masked_lm_predictions(tokens, 0.3, 20, wm, rng, True)
        row = {"input_ids": out, "masked_ids": labels}
        unmark(row, v)
        assert max(row["input_ids"]) < v and max(row["masked_ids"]) < v
        chosen = set(positions)
        for shift in (1, len(marked) + 2):  # the word in segment A, then in segment B
            for word in words:
                covered = [i + shift in chosen for i in word]
                assert all(covered) or not any(covered)
                whole += all(covered)
    assert whole > 50
