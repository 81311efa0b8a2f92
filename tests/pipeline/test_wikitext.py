"""Wikitext cleaning: each construct on tricky hand-written markup, and linear time."""

import re

import pytest
from fuzz_texts import random_texts

from pipeline.corpus.wikitext import clean_wikitext, strip_braces


def clean(text: str) -> str:
    return "\n".join(clean_wikitext(text))


def braces(text: str) -> str:
    """strip_braces with whitespace collapsed (a template leaves a space behind)."""
    return re.sub(" +", " ", strip_braces(text))


def test_nested_templates_and_parameters():
    assert braces("a {{b|{{c|{{d}}}}}} e") == "a e"
    assert braces("x {{{1|{{y}}}}} z") == "x z"
    assert braces("x {{t|a{b}c}} z") == "x z"  # single braces inside do not count
    assert braces("{{t\n|a = 1\n|}}\nProse.") == " \nProse."  # "|}}" is no table close
    assert clean("Before {{cite|a={{nowrap|b}}|c=d}} after.") == "Before after."


def test_templates_leave_a_space_or_their_character():
    assert clean("Born 1815{{snd}}1852, a{{nbsp}}poet{{efn|x}}.") == "Born 1815 – 1852, a poet."
    assert clean("({{née}} Byron; 1815{{ndash}}1852)") == "(née Byron; 1815–1852)"


def test_infobox_multiline():
    text = "{{Infobox person\n| name = {{nowrap|Ada {{small|L}}}}\n| born = 1815\n}}\n'''Ada''' was a mathematician."
    assert clean_wikitext(text) == ["Ada was a mathematician."]


def test_tables_nested_and_inside_templates():
    text = (
        "Intro text here.\n"
        '{| class="wikitable"\n|-\n! Head\n|-\n| cell {{flag|X}}\n|-\n|\n'
        "{|\n| inner || table\n|}\n|}\n"
        "Outro text here.\n"
        "{{quote|\n{|\n| quoted table\n|}\n}}\n"
        ":{| indented\n| cell\n|}\n"
        "Last line."
    )
    assert clean_wikitext(text) == ["Intro text here.", "Outro text here.", "Last line."]


def test_unclosed_template_is_literal_and_unclosed_table_runs_to_end():
    assert braces("a {{ b {{c}} d") == "a b d"
    assert clean("Prose stays.\n{|\n| cell\nmore") == "Prose stays."


def test_refs_comments_and_drop_tags():
    text = (
        'Cats purr.<ref name="a">{{cite web|url=http://x|title=T}}</ref> Dogs bark.<ref name=b/>'
        '<ref group="n">Note with [[link]].</ref> Cows moo<!-- hidden\n== Fake ==\n --> loudly. '
        "Area is <math>\\pi r^2</math> units.<gallery>\nA.jpg|cap\n</gallery> End.\n"
        "<timeline>\nImageSize = width:100\n</timeline>"
    )
    assert clean(text) == "Cats purr. Dogs bark. Cows moo loudly. Area is units. End."


def test_keep_tags_keep_their_text():
    text = "She is <b>bold</b>, <span style='x'>styled</span> and H<sub>2</sub>O.<br/>Next <small>bit</small>."
    assert clean(text) == "She is bold, styled and H2O. Next bit."
    assert clean("if a<b and c>d then") == "if a<b and c>d then"  # not a tag


def test_headings_lists_and_magic_words():
    text = (
        "__TOC__\nLead paragraph.\n"
        "== History ==\nHistory prose.\n"
        "* list item\n# numbered\n: indented\n; term\n"
        "----\n=== Sub ===\nSub prose.\n__NOEDITSECTION__"
    )
    assert clean_wikitext(text) == ["Lead paragraph.", "History prose.", "Sub prose."]


def test_non_prose_sections_dropped_until_next_heading_of_same_level():
    text = (
        "Body.\n== Notes ==\nA note.\n=== Sub-note ===\nMore.\n"
        "== Legacy ==\nLegacy prose.\n"
        "=== Further reading ===\nA book.\n=== Influence ===\nInfluence prose.\n"
        "== See also ==\n* [[X]]\n== References ==\n{{reflist}}\n"
        "== External links ==\n* [http://x.org Site]\n== Bibliography ==\nSmith, J. (1990).\n"
    )
    assert clean_wikitext(text) == ["Body.", "Legacy prose.", "Influence prose."]


def test_links_labels_files_categories_interlanguage():
    text = (
        "A [[United States|American]] [[writer]]s of [[Paris (France)|]] and [[#History|history]].\n"
        "[[File:Ada.jpg|thumb|upright|Ada at the [[Royal Society|society]] in [[1840]]]]\n"
        "Text [[Image:X.png|left|A [[b|c]] d]] continues [[wikt:cat|cat]] and [[:Category:Y|Ys]].\n"
        "[[Category:Writers|Lovelace]]\n[[de:Ada Lovelace]]\n[[zh-min-nan:Ada]]"
    )
    assert clean_wikitext(text) == [
        "A American writers of Paris and history.",
        "Text continues cat and Ys.",
    ]


def test_external_links_and_bare_urls():
    text = "See [https://example.org the site] and [http://x.org] or https://bare.example.com/p?q=1 now."
    assert clean(text) == "See the site and or now."


def test_entities_quotes_and_spacing():
    text = "'''Bold''' and ''italic'' and '''''both'''''&nbsp;here: R&amp;D, 5&nbsp;km, &lt;tag&gt;, caf&eacute;."
    assert clean(text) == "Bold and italic and both here: R&D, 5 km, <tag>, café."
    # an escaped ref written as text is shown as text, never stripped as markup
    assert clean("Use &lt;ref&gt; for notes.") == "Use <ref> for notes."


def test_template_leftovers_do_not_leave_empty_parens():
    text = "'''Ada''' ({{efn|x}}; born {{birth date|1815|12|10}}) was a writer {{citation needed}}."
    assert clean(text) == "Ada (born 10 December 1815) was a writer."
    assert clean("'''Ada''' ({{sfn|P|1982}}{{IPAc-en|lang|ˈ|eɪ|d|ə}}) wrote.") == "Ada (/ˈeɪdə/) wrote."
    assert clean("'''Ada''' ({{efn|a}}; {{cite|b}}) wrote.") == "Ada wrote."


def test_paragraphs_join_wrapped_lines():
    assert clean_wikitext("One line\ncontinues here.\n\nSecond paragraph.") == [
        "One line continues here.",
        "Second paragraph.",
    ]


def test_empty_and_redirect_like_text():
    assert clean_wikitext("") == []
    assert clean_wikitext("{{Infobox only}}\n[[Category:X]]") == []


@pytest.mark.parametrize(
    "text",
    [
        "{{" * 20000 + "x",  # unclosed openers
        "[[" * 20000 + "x",
        "<ref>" * 20000,
        "{|\n" * 5000,
        "''" * 50000,
    ],
)
def test_adversarial_input_leaves_no_markup(text):
    """Pathological nesting and unclosed openers: no error, no markup left (their speed is
    measured by benchmarks/bench_wikitext.py)."""
    paragraphs = clean_wikitext(text)
    assert all(isinstance(p, str) for p in paragraphs)
    assert not any(m in p for p in paragraphs for m in ("{{", "}}", "[[", "]]", "<ref", "{|", "''"))


def test_a_page_repeated_cleans_to_its_paragraphs_repeated():
    """Cleaning is local: N copies of a page give N copies of its paragraphs (the linear time
    this allows is measured by benchmarks/bench_wikitext.py)."""
    page = (
        "{{Infobox x|a={{b|c}}}}\n'''Word''' is a [[thing|things]] in [[Place]].<ref>{{cite|x}}</ref> "
        "More prose &amp; text here.\n\n{|\n| a || b\n|}\n== Section ==\nSome more prose.\n\n"
    )
    one = clean_wikitext(page)
    assert one == ["Word is a things in Place. More prose & text here.", "Some more prose."]
    assert clean_wikitext(page * 200) == one * 200


# -- residue found on real pages (issue 6) --------------------------------------------------------
LENGTH_CHANGING = ["İ", "ß", "ﬁ", "ŉ", "ΐ", "ǰ"]  # lower() or upper() of each is 2+ characters


@pytest.mark.parametrize("char", LENGTH_CHANGING)
def test_case_mapping_never_shifts_cut_offsets(char):
    page = (
        '@stanbul and @zmir are cities.<ref>{{cite|x}}</ref> He said it was "clearly".<ref>x</ref>\n'
        "=== Death ===\nOn 17 April he died.{{Sfnp|Pais|1982|p=3}}<REF name=a>y</REF> "
        "It passed to the next.{{rp|158}} <Math>\\pi</MATH> @@ <Source lang=c>int @;</SOURCE> end.\n"
        "[[File:@.jpg|thumb|@ caption]] {{lang|tr|@zmir}} is @@ [[Category:@]]"
    )
    plain = clean_wikitext(page.replace("@", "Q"))
    assert clean_wikitext(page.replace("@", char)) == [p.replace("Q", char) for p in plain]
    joined = " ".join(plain)
    for residue in ("===", "rp|", "Sfnp", "158", "thumb", "{{", "}}", "<", ">", "Death"):
        assert residue not in joined


def test_inline_templates_keep_their_visible_value():
    assert clean("At {{convert|52419|sqmi|km2}}, Alabama is large.") == ("At 52,419 square miles, Alabama is large.")
    assert clean("It runs {{convert|5|to|10|km|abbr=on}} and {{cvt|1|mi}} then {{convert|1|ft}}.") == (
        "It runs 5 to 10 km and 1 mi then 1 foot."
    )
    assert clean("{{lang|de|Albert}} was born in {{lang-de|Ulm}}.") == "Albert was born in Ulm."
    assert clean("{{nihongo|Tokyo|東京|Tōkyō}} is big.") == "Tokyo (東京) is big."
    assert clean("{{math|''x'' + 1}} is odd; {{mvar|y}} is {{frac|1|2}}.") == "x + 1 is odd; y is 1/2."
    assert clean("Let <math>x</math> be {{nowrap|{{lang|fr|très}} grand}}.") == "Let x be très grand."
    assert clean("{{circa|1900}} and {{as of|2020}}, {{formatnum:1234567}}.") == ("c. 1900 and As of 2020, 1,234,567.")


def test_tags_with_valueless_attributes_and_charts():
    text = (
        "Code <source lang=python inline>x = {1}</source> here and <syntaxhighlight lang=c line>"
        "int x;</syntaxhighlight> done.\n"
        "{{chart top|Family}}\n{{chart|border=0|AAA | | BBB |AAA=[[Foo]]|BBB=Bar}}\n"
        "{{chart| |!| }}\n{{chart bottom}}\nProse here."
    )
    assert clean_wikitext(text) == ["Code here and done.", "Prose here."]


def test_unicode_nfc_and_control_characters():
    assert clean("Cafe\u0301 soft\u00adhyphen zero\u200bwidth bell\x07 end.") == ("Café softhyphen zerowidth bell end.")


def test_unclosed_and_nested_braces_are_linear():
    """Operations, not seconds: the scanner's search count grows linearly with the openers."""
    import pipeline.corpus.wikitext as wt

    calls = []
    real = wt._token_finder

    def counting_finder(text):
        next_token = real(text)

        def counting(pos):
            calls.append(pos)
            return next_token(pos)

        return counting

    wt._token_finder = counting_finder
    try:
        for k in (2500, 10000):
            calls.clear()
            assert strip_braces("{{a " * k + "x").split() == ["a"] * k + ["x"]
            unclosed = len(calls)
            calls.clear()
            strip_braces("{{lang|x|" * k + "y" + "}}" * k)
            assert k <= unclosed <= 2 * k + 2 and len(calls) <= 4 * (2 * k + 2)
    finally:
        wt._token_finder = real


def test_sentence_introducing_a_dropped_list_goes_with_it():
    text = "Rivers flow here. The main rivers are:\n* A\n* B\nAfter the list.\n\nOnly:\n# x\nNot a list intro: fine."
    assert clean_wikitext(text) == ["Rivers flow here.", "After the list.", "Not a list intro: fine."]


def test_token_search_from_braces_and_line_starts_is_the_regex_search():
    """The token finder tries only braces and table line starts; it must find what the regex
    search finds from every position (random markup: braces, tables, colons, spaces, newlines)."""

    from pipeline.corpus.wikitext import _BRACE_TOKEN, _token_finder

    pieces = ["{", "}", "{{", "}}}", "{|", "|}", "|", ":", " ", "\t", "\n", "a", "b c", "\n:{|", "\n |}", "\r", "|}}"]
    for text in random_texts(pieces, 400, 30, seed=3):
        next_token = _token_finder(text)
        for pos in range(len(text) + 1):
            want, got = _BRACE_TOKEN.search(text, pos), next_token(pos)
            assert (want and (want.span(), want.groups())) == (got and (got.span(), got.groups())), (text, pos)


def test_bare_urls_found_from_their_scheme_are_the_pattern_s():
    """_drop_bare_urls finds URLs without _BARE_URL's leading \\b and checks the boundary itself;
    on random text (schemes in any case, U+017F that re.I folds to "s", word characters before a
    scheme, URLs inside URLs) it must give what the pattern's own sub gives."""

    from pipeline.corpus.wikitext import _BARE_URL, _drop_bare_urls

    pieces = [
        "http://",
        "HTTPS://",
        "Ftp://",
        "httpſ://",
        "x",
        "_",
        "é",
        "9",
        " ",
        "\n",
        "a.b/c",
        "|",
        "{",
        "<",
        "]",
        "http",
        "://",
        "ftp",
        "s://",
        "(",
        "https://e.org/?u=http://f",
    ]
    for text in random_texts(pieces, 5000, 25, seed=5):
        assert _drop_bare_urls(text) == _BARE_URL.sub("", text), text
    assert _drop_bare_urls("see http://a.org/x and xhttp://b.org, (ftp://c)") == "see  and xhttp://b.org, ("


def test_tidy_is_the_whitespace_regexes_it_replaced():
    """_tidy drops spaces around brackets and marks with " +" patterns and collapses at the end
    only when a deletion left two spaces: the same text as with the \\s+ patterns and a final
    split/join (random paragraphs of every kind of space, brackets, marks, leftovers, CJK)."""
    import html
    import unicodedata

    from pipeline.corpus import wikitext as w

    def tidy_before(paragraph):
        text = html.unescape(paragraph) if "&" in paragraph else paragraph
        text = w._INVISIBLE.sub("", text)
        text = unicodedata.normalize("NFC", text)
        text = " ".join(text.split())
        text = w._LEFTOVER.sub("", text)
        text = w._EMPTY_PARENS.sub("", w._PAREN_LEAD.sub("(", text))
        text = re.sub(r"([(\[])\s+", r"\1", text)
        text = re.sub(r"\s+([,.;:!?)\]])", r"\1", text)
        text = w._SPACE_BETWEEN_WIDE.sub("", text)
        return " ".join(text.split())

    pieces = [
        " ",
        "  ",
        "\t",
        "\n",
        "\u00a0",
        "\u3000",
        "\x1f",
        "\u200b",
        "a",
        "word",
        "(",
        ")",
        "[",
        "]",
        ",",
        ".",
        ";",
        "!",
        "[[",
        "]]",
        "{{",
        "}}",
        "( , )",
        "&amp;",
        "&nbsp;",
        "漢",
        "字",
        "e\u0301",
        w._PARA_SEP,
    ]
    for text in random_texts(pieces, 5000, 30, seed=11):
        assert w._tidy(text) == tidy_before(text), text
