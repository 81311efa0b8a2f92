"""Cleaning and sentence splitting of Japanese and Chinese wikitext and books: localized
namespaces, {{読み仮名}}, {{lang}}, {{仮リンク}}, {{le}}, ruby, -{...}- variants, full-width
punctuation, 「」 quotes across sentence ends; and the corpus stage's rejects on the samples."""

from pathlib import Path

import pytest

from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.sentences import book_paragraphs, split_sentences
from pipeline.corpus.wikitext import clean_wikitext, resolve_variants

DATA = Path(__file__).resolve().parents[2] / "data"


def test_japanese_templates_ruby_and_localized_namespaces():
    text = (
        "{{基礎情報 日本の市町村\n|名称 = 青川町\n}}\n"
        "'''{{読み仮名|青川町|あおかわちょう}}'''は、{{lang|en|Aokawa}}とも書かれる町。"
        "<ruby>青川<rp>（</rp><rt>あおかわ</rt><rp>）</rp></ruby>の名は{{仮リンク|青川神社|en|Aokawa Shrine}}に由来する"
        "{{要出典|date=2020年1月}}。[[ファイル:Aokawa.jpg|thumb|青川町の風景]][[画像:B.png|サムネイル]]"
        "[[カテゴリ:青葉県の市町村]][[Category:日本の町]]\n\n== 脚注 ==\n{{Reflist}}\n\n== 関連項目 ==\n* [[青葉県]]\n"
    )
    assert clean_wikitext(text) == ["青川町（あおかわちょう）は、Aokawaとも書かれる町。青川の名は青川神社に由来する。"]


def test_chinese_variants_aliases_and_templates():
    assert resolve_variants("当地的-{zh-hans:计算机;zh-hant:電腦;}-产业") == "当地的计算机产业"
    assert resolve_variants("-{zh-tw:電腦; zh-cn:计算机}-") == "计算机"
    assert resolve_variants("名为-{河金县}-，-{H|zh-hans:鼠标;zh-hant:滑鼠;}-") == "名为河金县，"
    assert resolve_variants("a -{{{1}}}- b {{{2}}}") == "a -{{{1}}}- b {{{2}}}"  # template parameters untouched
    text = (
        "{{NoteTA|G1=地名|1=zh-hans:河金县;zh-hant:河金縣;}}\n'''河金县'''（{{lang|en|Hejin Xian}}）是一个县"
        "{{来源请求|time=2020}}，与[[河龙市]]结为{{le|友好城市|Sister city}}。[[File:A.jpg|thumb|x]]"
        "[[文件:B.png|缩略图|全景]][[分类:东海省]][[分類:县]]\n\n== 参考文献 ==\n{{reflist}}\n"
    )
    assert clean_wikitext(text) == ["河金县（Hejin Xian）是一个县，与河龙市结为友好城市。"]


@pytest.mark.parametrize(
    "paragraph, sentences",
    [
        ("彼は「もう行く。今日は無理だ。」と言った。次の日は雨だった。",
         ["彼は「もう行く。今日は無理だ。」と言った。", "次の日は雨だった。"]),
        ("当地人称之为「茶叶之乡。金沙河之畔。」，由此得名。人口约五万！",
         ["当地人称之为「茶叶之乡。金沙河之畔。」，由此得名。", "人口约五万！"]),
        ("『雪の記憶。春の詩。』を発表した。", ["『雪の記憶。春の詩。』を発表した。"]),
        ("「閉じない引用。次の文。", ["「閉じない引用。", "次の文。"]),  # an unclosed quote blocks nothing
    ],
)  # fmt: skip
def test_quotes_across_sentence_ends_stay_in_their_sentence(paragraph, sentences):
    assert split_sentences(paragraph) == sentences


def test_japanese_and_chinese_books_join_wrapped_lines_without_spaces_and_drop_chapter_headings():
    text = (
        "青葉県紀行 第1巻\n\n　第1章　原宮村\n\n　原宮村を訪れたのは\n春だった。\n\n短い段落。"
        "\n\n第二章\n\n　　我来到了\n青河镇。"
    )
    assert book_paragraphs(text) == ["原宮村を訪れたのは春だった。", "短い段落。", "我来到了青河镇。"]


@pytest.mark.parametrize("lang", ["ja", "zh"])
def test_the_corpus_stage_counts_rejects_of_the_samples_as_for_english(tmp_path, lang):
    from pipeline.corpus.job import run_corpus
    from pipeline.schema.manifest import read_manifest

    root = DATA / f"sample-{lang}"
    config = CorpusConfig(num_shards=1, min_sentence_chars=6)
    manifest = run_corpus(config, {"wiki": str(root / "wiki"), "books": str(root / "books")}, str(tmp_path / "c"))
    counts = read_manifest(str(tmp_path / "c")).counts
    assert manifest is not None
    assert counts["read"] == counts["documents"] + counts["records_rejected"]
    assert counts["redirect"] >= 60 and counts["disambiguation"] == 3
    assert counts["non_article_namespace"] >= 3
    assert counts["sentences"] > 4000
