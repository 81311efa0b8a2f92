"""Rule-based sentence splitting and book paragraphs."""

import pytest
from fuzz_texts import random_texts

from pipeline.corpus.sentences import book_paragraphs, split_sentences


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The cat sat. The dog ran.", ["The cat sat.", "The dog ran."]),
        ("Is it? Yes! It is.", ["Is it?", "Yes!", "It is."]),
        (
            "Mr. Smith met Dr. Jones at St. Paul's. They spoke.",
            ["Mr. Smith met Dr. Jones at St. Paul's.", "They spoke."],
        ),
        (
            "Fruits, e.g. Apples, and i.e. Pears are sold. Done here.",
            ["Fruits, e.g. Apples, and i.e. Pears are sold.", "Done here."],
        ),
        ("J. R. R. Tolkien wrote it. He was English.", ["J. R. R. Tolkien wrote it.", "He was English."]),
        ("Pi is 3.14 or so. The U.S. Army came.", ["Pi is 3.14 or so.", "The U.S. Army came."]),
        ("Wait... What happened? Nothing… Really.", ["Wait...", "What happened?", "Nothing…", "Really."]),
        ("He paused... and went on.", ["He paused... and went on."]),
        ('"Go home." She left.', ['"Go home."', "She left."]),
        ("She left (it was late.) Then she slept.", ["She left (it was late.)", "Then she slept."]),
        ("“Run!” he said. “Now?” (Yes.) [Done.] Ok.", ["“Run!” he said.", "“Now?”", "(Yes.)", "[Done.]", "Ok."]),
        ("It sold No. 5 and fig. 3 well. Next one.", ["It sold No. 5 and fig. 3 well.", "Next one."]),
        ("Apples, pears etc. The end.", ["Apples, pears etc.", "The end."]),
        ("Apples, pears etc. and more.", ["Apples, pears etc. and more."]),
        ("Born c. 1900 in Rome. Died 1990.", ["Born c. 1900 in Rome.", "Died 1990."]),
        ("ends with lowercase. next starts lower.", ["ends with lowercase. next starts lower."]),
        ("In 1990. 1991 was better.", ["In 1990.", "1991 was better."]),
        ("  Spaces   inside\n and newlines.  ", ["Spaces inside and newlines."]),
        ("No terminal punctuation", ["No terminal punctuation"]),
        ("", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "Кирил създава азбуката, чието име носи и днес. Той поправя превода.",
            ["Кирил създава азбуката, чието име носи и днес.", "Той поправя превода."],
        ),
        ("А. С. Пушкин родился в Москве. Он писал стихи.", ["А. С. Пушкин родился в Москве.", "Он писал стихи."]),
        ("Это было, т.е. давно. Потом всё прошло.", ["Это было, т.е. давно.", "Потом всё прошло."]),
        ("Он родился в 1799 г. В Москве жил долго.", ["Он родился в 1799 г.", "В Москве жил долго."]),
        ("Ο Σωκράτης ήταν φιλόσοφος. Έζησε στην Αθήνα.", ["Ο Σωκράτης ήταν φιλόσοφος.", "Έζησε στην Αθήνα."]),
        ("Er kam z.B. Montag. Dann ging er.", ["Er kam z.B. Montag.", "Dann ging er."]),
        (
            "東京は日本の首都です。人口は多い！本当？はい。",
            ["東京は日本の首都です。", "人口は多い！", "本当？", "はい。"],
        ),
        ("他说：“我来了。”然后走了。", ["他说：“我来了。”", "然后走了。"]),
        ("「行こう。」と彼は言った。次へ。", ["「行こう。」と彼は言った。", "次へ。"]),
        ("यह एक वाक्य है। यह दूसरा है।", ["यह एक वाक्य है।", "यह दूसरा है।"]),
        ("هل أنت هنا؟ نعم.", ["هل أنت هنا؟", "نعم."]),
        (
            "Il pesait 3,5 kg. Le prix était 2.50 euros. Fin.",
            ["Il pesait 3,5 kg.", "Le prix était 2.50 euros.", "Fin."],
        ),
    ],
)
def test_split_sentences_any_script(text, expected):
    assert split_sentences(text) == expected


def test_split_sentences_keeps_every_character():
    text = 'Dr. A. Smith (b. 1950) said: "Yes." Then e.g. this! And 2.5 km... Fine?'
    assert " ".join(split_sentences(text)) == text


BOOK = """THE RED HOUSE

by A. Writer

Chapter 1

It was a dark and
stormy night. The wind was wild-
ly blowing through the trees.

"Who is there?" she asked,
stepping forward.

* * *

CHAPTER II. THE STORM
The storm broke at dawn.

IV

The End
"""


def test_book_paragraphs_join_wrapped_lines_and_drop_headings():
    assert book_paragraphs(BOOK) == [
        "It was a dark and stormy night. The wind was wildly blowing through the trees.",
        '"Who is there?" she asked, stepping forward.',
        "The storm broke at dawn.",
    ]


def test_book_paragraphs_windows_newlines_and_empty():
    assert book_paragraphs("One line,\r\nnext line.\r\n\r\nTwo.\r\n") == ["One line, next line.", "Two."]
    assert book_paragraphs("") == []
    assert book_paragraphs("\n\n  \n") == []


def test_candidates_found_from_their_first_character_are_the_regex_matches():

    from pipeline.corpus.sentences import _CANDIDATE, _candidates

    pieces = [
        ".",
        "..",
        "...",
        "…",
        "?",
        "!",
        "?!",
        "。",
        "！",
        "」",
        "”",
        ")",
        " ",
        "  ",
        "A",
        "a",
        "3",
        "।",
        "Б",
        "と",
    ]
    for text in random_texts(pieces, 3000, 25, seed=5):
        assert [(m.span(), m.groups()) for m in _candidates(text)] == [
            (m.span(), m.groups()) for m in _CANDIDATE.finditer(text)
        ], text


def test_squeezed_is_split_and_join():
    """squeezed returns a text as it is when it holds only single spaces between words (checked
    with isprintable, which is False for every whitespace character but " "): the same as
    " ".join(text.split()) next to every code point, and on random spacing."""

    from pipeline.corpus.sentences import squeezed

    for c in range(0x110000):
        for text in ("a" + chr(c) + "b", chr(c), "a " + chr(c)):
            assert squeezed(text) == " ".join(text.split()), hex(c)
    pieces = [" ", "  ", "\t", "\n", "\u00a0", "\u2028", "\x1f", "\u200b", "a", "bc", "."]
    for text in random_texts(pieces, 5000, 12, seed=4):
        assert squeezed(text) == " ".join(text.split()), repr(text)
