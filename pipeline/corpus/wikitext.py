"""Wikitext to paragraphs of running prose: a pure, linear-time cleaner for MediaWiki markup.

``clean_wikitext(text)`` keeps what a reader sees as article prose and drops everything else.

Design choices:
1. Nested constructs (templates ``{{..{{..}}..}}``, parameters ``{{{1}}}``, tables ``{| .. |}``)
   are removed by one scanner that jumps between brace/table tokens found by a regex and keeps a
   stack, so the cost is linear in the text. No backtracking regex ever spans nested markup.
2. Links are resolved innermost first, a bounded number of passes (a ``[[File:..]]`` caption
   holding ``[[links]]`` needs two), each pass one linear ``re.sub``.
3. Every template becomes a space except the inline ones whose value the sentence needs
   (``{{convert}}``, ``{{lang}}``, ``{{IPA}}``, ``{{nihongo}}``, dates, ``{{nbsp}}`` ...): those
   are rendered by :mod:`pipeline.corpus.templates`. Expanding templates in general needs their
   definitions, which a dump does not carry in the page.
4. Order matters and is fixed: comments, then tags whose content is dropped (refs, math,
   gallery ...), then braces, then line structure (headings, non-prose sections, lists), then
   links and inline markup, and HTML entities last, so that ``&lt;ref&gt;`` written as text in
   an article is never mistaken for markup.
5. Markup is searched and cut in the same string, never in a case-mapped copy: ``"İ".lower()``
   is two characters, so offsets found in ``text.lower()`` cut ``text`` in the wrong place.
   Case-insensitive matching uses ``re.IGNORECASE`` on the text itself; case mapping, NFC and
   other length-changing maps are applied only to keys (section names, tag names) or to the
   finished paragraph.
6. ``mwparserfromhell`` was measured as the alternative (docs/corpus.md): it builds a node
   tree per page and was several times slower for the same or more residue, so this scanner stays.
"""

from __future__ import annotations

import bisect
import html
import re
import unicodedata

from pipeline.corpus.templates import render_template

__all__ = ["clean_wikitext", "strip_braces", "NON_PROSE_SECTIONS"]

# Sections that are lists of sources or links, not prose (compared lowercased).
NON_PROSE_SECTIONS = frozenset(
    {
        "references",
        "see also",
        "external links",
        "further reading",
        "notes",
        "bibliography",
        "footnotes",
        "sources",
        "citations",
        "works cited",
        "notes and references",
        "references and notes",
        "external sources",
        "general references",
        "explanatory notes",
        # Japanese and Chinese Wikipedia
        "脚注",
        "注釈",
        "出典",
        "参考文献",
        "参考資料",
        "関連項目",
        "外部リンク",
        "参考资料",
        "參考資料",
        "參考文獻",
        "参见",
        "參見",
        "外部链接",
        "外部連結",
        "注释",
        "註釋",
        "腳註",
        "相关条目",
        "相關條目",
        "延伸阅读",
        "延伸閱讀",
    }
)

# Tags dropped together with their content (not prose, or not rendered as text).
_DROP_TAGS = (
    "ref",
    "references",
    "math",
    "chem",
    "ce",
    "gallery",
    "timeline",
    "imagemap",
    "graph",
    "mapframe",
    "maplink",
    "score",
    "hiero",
    "syntaxhighlight",
    "source",
    "pre",
    "code",
    "templatedata",
    "templatestyles",
    "includeonly",
    "inputbox",
    "categorytree",
    "charinsert",
    "poem",
    "table",
    "style",
    "script",
    "rt",  # ruby readings: the base text is what the sentence reads (漢字, not 漢字（かんじ）)
    "rp",
)
# Tags removed but whose inner text is kept.
_KEEP_TAGS = (
    "b",
    "i",
    "u",
    "s",
    "em",
    "strong",
    "small",
    "big",
    "sub",
    "sup",
    "span",
    "font",
    "center",
    "del",
    "ins",
    "strike",
    "abbr",
    "cite",
    "tt",
    "var",
    "kbd",
    "q",
    "dfn",
    "mark",
    "bdi",
    "bdo",
    "blockquote",
    "p",
    "div",
    "nowiki",
    "noinclude",
    "onlyinclude",
    "section",
    "ruby",
    "rb",
    "wbr",
    "br",
    "hr",
    "samp",
    "time",
    "data",
    "caption",
    "li",
    "ul",
    "ol",
    "dl",
    "dd",
    "dt",
)

_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
_DROP_NAMES = sorted({t.split()[0] for t in _DROP_TAGS}, key=len, reverse=True)
# An opening drop-tag, self-closing or not. [^<>]* cannot backtrack across tags.
# Attributes must have values (name="v", name='v', name=v), so "a<b and c>d" is no tag.
_ATTRS = r"""(?:\s+[\w:-]+\s*=\s*(?:"[^"<>]*"|'[^'<>]*'|[^\s<>"'/]+))*\s*"""
# Drop-tags also take valueless attributes (<syntaxhighlight lang=py inline>): their names are
# specific enough that "a<ref and b>" in prose is not a risk worth losing a code block to.
_LOOSE_ATTRS = r"""(?:\s+[\w:-]+(?:\s*=\s*(?:"[^"<>]*"|'[^'<>]*'|[^\s<>"'/]+))?)*\s*"""
_DROP_OPEN = re.compile(r"<(" + "|".join(_DROP_NAMES) + r")\b" + _LOOSE_ATTRS + r"(/?)>", re.I)
_DROP_CLOSE = {name: re.compile(r"</" + name + r"\s*>", re.I) for name in _DROP_NAMES}
# <math>x</math> and <chem>H2O</chem> are kept when short and plain (a variable, a formula
# without TeX commands): dropping them leaves "is a variable" with no subject.
_PLAIN_MATH = re.compile(r"^[\w\s=+\-*/().,^'′]{1,40}$")
_KEEP_TAG = re.compile(
    r"</?(?:" + "|".join(sorted(_KEEP_TAGS, key=len, reverse=True)) + r")\b" + _ATTRS + r"/?>",
    re.I,
)
_STRAY_CLOSE = re.compile(r"</(?:" + "|".join(_DROP_NAMES) + r")\s*>", re.I)

# Brace/table tokens: runs of 2+ braces, or a table opening/closing at the start of a line.
_BRACE_TOKEN = re.compile(r"(\{\{+)|(\}\}+)|^[ \t:]*(\{\||\|\})", re.M)
# A token starts at a brace or at a line start. re has no fast skip for _BRACE_TOKEN (one
# alternative starts with ^), so its search tries every character. Found instead: the braces, and
# once per text the line starts that hold a table's "{|" or "|}" (after spaces and colons).
_BRACE = re.compile(r"[{}]")
_TABLE_LINE = re.compile(r"\n[ \t:]*(?:\{\||\|\})")  # its start + 1: a line start _BRACE_TOKEN matches at
_TABLE_FIRST_LINE = re.compile(r"[ \t:]*(?:\{\||\|\})")


def _token_finder(text: str):
    """``pos -> _BRACE_TOKEN.search(text, pos)``, trying only braces and the line starts where
    the table alternative matches (found by one C scan for a newline): ~2x faster than trying
    every brace and every line start, ~4x than the search itself."""
    tables = [m.start() + 1 for m in _TABLE_LINE.finditer(text)]
    if _TABLE_FIRST_LINE.match(text):
        tables.insert(0, 0)
    brace, match, n = _BRACE.search, _BRACE_TOKEN.match, len(text)

    def next_token(pos: int) -> re.Match | None:
        k = bisect.bisect_left(tables, pos)
        table = tables[k] if k < len(tables) else n + 1
        while True:
            found = brace(text, pos)
            at = found.start() if found is not None else n + 1
            if table <= at:
                return match(text, table) if table <= n else None
            m = match(text, at)
            if m:
                return m
            pos = at + 1

    return next_token


_HEADING = re.compile(r"^(={1,6})\s*(.*?)\s*\1\s*$")
_INTERNAL_LINK = re.compile(r"\[\[([^\[\]]*(?:\[(?!\[)[^\[\]]*|\](?!\])[^\[\]]*)*)\]\]")
_EXTERNAL_LINK = re.compile(r"\[(?:https?://|ftp://|//|mailto:)[^\s\]]*(?:[ \t]+([^\]\n]*))?\]", re.I)
_BARE_URL = re.compile(r"\b(?:https?|ftp)://[^\s<>\[\]{}|]+", re.I)
# _BARE_URL without its \b, case folded by hand (re.I lets "s" match U+017F, kept here), and \w
# to check the boundary before each URL it finds.
_BARE_URL_CANDIDATE = re.compile(r"(?:[hH][tT][tT][pP][sS\u017f]?|[fF][tT][pP])://[^\s<>\[\]{}|]+")
_WORD = re.compile(r"\w")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_QUOTES = re.compile(r"''+")  # 2 or more: "'{2,}" has no literal prefix for re to search by (4x slower)
_LANG_CODE = re.compile(r"^[a-z]{2,3}(?:-[a-z]{2,8})*$|^simple$")
_DROP_NAMESPACES = frozenset(
    {"file", "image", "media", "category"}
    # their Japanese and Chinese names and aliases ([[ファイル:..]], [[文件:..]], [[分类:..]] ...)
    | {
        "ファイル",
        "画像",
        "メディア",
        "カテゴリ",
        "文件",
        "檔案",
        "档案",
        "图像",
        "圖像",
        "媒体",
        "媒體",
        "分类",
        "分類",
    }
)
_EMPTY_PARENS = re.compile(r"\(\s*(?:[,;:]\s*)*\)")
_PAREN_LEAD = re.compile(r"\(\s*[,;:]\s*")
_WS = re.compile(r"\s+")
# Japanese and Chinese: a space between two wide characters (CJK, kana, full-width punctuation)
# is left by removed markup ({{要出典}}, a ref), never written: "呼ばれていた 。" -> "呼ばれていた。"
_WIDE_CHARS = "\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
_SPACE_BETWEEN_WIDE = re.compile(f"(?<=[{_WIDE_CHARS}]) +(?=[{_WIDE_CHARS}])")
_HAS_WIDE = re.compile(f"[{_WIDE_CHARS}]")
_LEFTOVER = re.compile(r"\[\[|\]\]|\{\{|\}\}")


# -- 1. comments and tags ----------------------------------------------------------------------
def _drop_tags(text: str) -> str:
    """Remove drop-tags with their content; linear (one search for each tag's closing).

    Closings are searched in ``text`` itself with a case-insensitive pattern, never in
    ``text.lower()``, whose offsets differ after characters such as "İ".
    """
    out: list[str] = []
    pos = 0
    no_close_after: dict[str, int] = {}  # tag -> position after which no closing tag exists
    while True:
        m = _DROP_OPEN.search(text, pos)
        if not m:
            break
        out.append(text[pos : m.start()])
        name = m.group(1).lower()
        if m.group(2):  # <ref name="x" />
            pos = m.end()
            continue
        close = None
        if m.end() < no_close_after.get(name, len(text) + 1):
            close = _DROP_CLOSE[name].search(text, m.end())
            if close is None:
                no_close_after[name] = m.end()
        if close is None:  # unclosed: drop only the opening tag, as MediaWiki shows the rest
            pos = m.end()
            continue
        if name in ("math", "chem", "ce"):
            inner = text[m.end() : close.start()]
            if _PLAIN_MATH.match(inner):
                out.append(inner)
        pos = close.end()
    out.append(text[pos:])
    return _STRAY_CLOSE.sub("", "".join(out))


# -- 2. templates and tables -------------------------------------------------------------------
def strip_braces(text: str, _depth: int = 0) -> str:
    """Remove templates, template parameters and tables, however nested, in linear time.

    One scan pushes every opening brace run and table start on a stack; a closing run pops
    (``{{{`` opens 3, ``}}}}`` closes up to 4), so parameters and templates nest freely. ``{|`` and
    ``|}`` count only at a line start, and ``|}`` closes a table only when a table is the innermost
    open construct (``|}}`` ending a template stays braces); a ``}}`` closes an unclosed table
    inside its template. Openers never closed are literal text (their braces are dropped, what
    they enclose is kept: matched constructs inside it are still removed), as MediaWiki does; an
    unclosed table runs to the end of the page. Each outermost template is replaced by its
    visible text (:func:`pipeline.corpus.templates.render_template`, mostly a space).
    """
    n = len(text)
    next_token = _token_finder(text)
    stack: list[list] = []  # ["B", braces still open, start, braces opened] or ["T", 0, start, 0]
    spans: list[tuple[int, int, int]] = []  # (start, end, kind): 2 template, 3+ param, 0 table/literal
    pos = 0
    open_b = 0  # "B" entries on the stack
    while pos < n:
        m = next_token(pos)
        if m is None:
            break
        opening, closing, table = m.group(1), m.group(2), m.group(3)
        if opening:
            stack.append(["B", len(opening), m.start(), len(opening)])
            open_b += 1
            pos = m.end()
        elif closing:
            left = len(closing)
            at = m.start()
            while left >= 2 and stack:
                if stack[-1][0] == "T":
                    if open_b:
                        stack.pop()  # a table left open inside a template ends with it
                        continue
                    break
                entry = stack[-1]
                used = min(left, entry[1])
                entry[1] -= used
                left -= used
                at += used
                if entry[1] <= 1:  # closed; a single brace left over is a literal "{"
                    stack.pop()
                    open_b -= 1
                    start = entry[2] + entry[1]
                    spans.append((start, at, entry[3] - entry[1]))
            pos = m.end() if left else at
            if left and at < m.end():
                spans.append((at, m.end(), 0))  # stray closing braces
        elif table == "{|":
            stack.append(["T", 0, m.start(3), 0])
            pos = m.end()
        else:  # "|}"
            if stack and stack[-1][0] == "T":
                entry = stack.pop()
                spans.append((entry[2], m.end(), 0))
                pos = m.end()
            else:
                pos = m.start(3) + 1  # rescan from the brace: "|}}" may close a template
    for kind, open_left, start, _opened in stack:  # bottom up: never closed
        if kind == "T":
            spans.append((start, n, 0))
            break
        spans.append((start, start + open_left, 0))
    if not spans:
        return text
    spans.sort(key=lambda s: (s[0], -s[1]))
    out: list[str] = []
    cur = 0
    for start, end, kind in spans:
        if start < cur:
            continue  # inside an outer construct already removed
        out.append(text[cur:start])
        if kind == 2:
            out.append(render_template(text[start + 2 : end - 2], lambda arg: strip_braces(arg, _depth + 1), _depth))
        elif kind >= 3:
            out.append(" ")
        cur = end
    out.append(text[cur:])
    return "".join(out)


# -- 2b. Chinese variant markup ----------------------------------------------------------------
# -{...}- of zhwiki: plain text shown as written, or rules "zh-hans:计算机;zh-hant:電腦;" of which
# one variant is shown (simplified first), "-{H|..}-" / "-{T|..}-" rules that show nothing.
_VARIANT = re.compile(r"-\{(?!\{)([^{}]*)\}-")
_VARIANT_RULE = re.compile(r"(zh(?:-[a-z]{2,4})?)\s*:([^;]*)(?:;|$)")
_VARIANT_ORDER = ("zh-hans", "zh-cn", "zh", "zh-sg", "zh-my", "zh-hant", "zh-tw", "zh-hk", "zh-mo")


def _variant_text(m: re.Match) -> str:
    inner = m.group(1)
    flag, bar, rest = inner.partition("|")
    if bar and len(flag.strip()) <= 3 and re.fullmatch(r"[A-Za-z;\s]+", flag.strip() or "x"):
        if any(f in flag for f in "HT-"):
            return ""
        inner = rest
    rules = dict((code, text.strip()) for code, text in _VARIANT_RULE.findall(inner))
    if not rules or not re.match(r"\s*zh(?:-[a-z]{2,4})?\s*:", inner):
        return inner
    for code in _VARIANT_ORDER:
        if code in rules:
            return rules[code]
    return next(iter(rules.values()))


def resolve_variants(text: str) -> str:
    """Chinese variant markup ``-{...}-`` replaced by the text a simplified-Chinese reader sees."""
    return _VARIANT.sub(_variant_text, text) if "-{" in text else text


# -- 3. links ----------------------------------------------------------------------------------
def _link_text(m: re.Match) -> str:
    inner = m.group(1)
    target, pipe, label = inner.partition("|")
    target = target.strip()
    bare = target.lstrip(":")
    prefix, colon, _ = bare.partition(":")
    prefix = prefix.strip().lower()
    if colon and not target.startswith(":"):
        if prefix in _DROP_NAMESPACES:
            return ""
        if not pipe and _LANG_CODE.match(prefix):  # interlanguage link [[de:Foo]]
            return ""
    if pipe:
        label = label.strip()
        if label:
            return label
        # pipe trick: [[Foo (bar)|]] shows "Foo", [[Help:Foo|]] shows "Foo"
        shown = bare.split(":", 1)[-1] if colon else bare
        return re.sub(r"\s*\([^()]*\)\s*$", "", shown)
    return bare


def _resolve_links(text: str) -> str:
    for _ in range(6 if "[[" in text else 0):  # nesting depth; captions rarely nest more than twice
        new = _INTERNAL_LINK.sub(_link_text, text)
        if new == text:
            break
        text = new
        if "[[" not in text:
            break  # nothing left to match: spare the pass that would find nothing
    if "//" not in text and "mailto:" not in text:
        return text  # no URL: skip both scans
    text = _EXTERNAL_LINK.sub(lambda m: m.group(1) or "", text)
    return _drop_bare_urls(text) if "://" in text else text


def _drop_bare_urls(text: str) -> str:
    """``_BARE_URL.sub("", text)``, found ~8x faster: the same pattern without its leading
    ``\b`` starts with a character class, which re scans for in C; when every URL it finds has
    the boundary (no word character before it) the two patterns find the same URLs, left to
    right, and the text is cut here; otherwise (``xhttp://...``) the pattern itself decides."""
    spans = [m.span() for m in _BARE_URL_CANDIDATE.finditer(text)]
    if not spans:
        return text
    if any(start and _WORD.match(text, start - 1) for start, _ in spans):
        return _BARE_URL.sub("", text)
    out, last = [], 0
    for start, end in spans:
        out.append(text[last:start])
        last = end
    out.append(text[last:])
    return "".join(out)


# -- 4. lines: headings, sections, lists -------------------------------------------------------
def _prose_lines(text: str) -> list[str | None]:
    """Lines of prose; None marks a paragraph break (blank line, heading, list, dropped block)."""
    lines: list[str | None] = []
    skip_level = 0  # > 0 while inside a non-prose section of that heading level
    for raw in text.split("\n"):
        line = raw.strip()
        heading = _HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            title = _WS.sub(" ", _QUOTES.sub("", heading.group(2))).strip().lower()
            if skip_level and level > skip_level:
                continue
            skip_level = level if title in NON_PROSE_SECTIONS else 0
            lines.append(None)
            continue
        if skip_level:
            continue
        if not line or line[0] in "*#:;|!" or line.startswith("----"):
            if line and line[0] in "*#;" and lines and lines[-1] and lines[-1].endswith(":"):
                lines[-1] = _drop_list_intro(lines[-1])  # "Towns on the river include:"
            lines.append(None)
            continue
        lines.append(line)
    return lines


_LAST_BOUNDARY = re.compile(r".*[.!?…。！？][\"'”’»)\]]*\s")


def _drop_list_intro(line: str) -> str | None:
    """A line without its last sentence, the one that introduced a list now dropped."""
    m = _LAST_BOUNDARY.match(line)
    return m.group(0).rstrip() if m else None


# -- 5. inline cleanup -------------------------------------------------------------------------
# Control and invisible format characters dropped from prose (ZWJ/ZWNJ stay: Persian, Indic).
_INVISIBLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u200b\u2060\ufeff\ufffd\ufffe]")


_PARA_SEP = "\ue000"
# Spaces after an opening bracket, before a closing one or a mark, dropped in _tidy, where " " is
# the only whitespace left: a pattern that starts with a literal is searched for in C (~30% less
# than with \s+).
_SPACES_AFTER_OPEN = re.compile(r"([(\[]) +")
_SPACES_BEFORE_PUNCT = re.compile(r" +([,.;:!?)\]])")


def _tidy(paragraph: str) -> str:
    text = html.unescape(paragraph) if "&" in paragraph else paragraph
    text = _INVISIBLE.sub("", text)
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    # Every whitespace run to one space (also &nbsp;, U+00A0, and other Unicode spaces: str.split
    # and re's \s agree on every code point); a join is ~3x faster than _WS.sub here, and the
    # ends it drops are dropped by the final strip anyway (the subs below only delete). From here
    # on the only whitespace is " ": nothing below inserts any.
    text = " ".join(text.split())
    if "[[" in text or "]]" in text or "{{" in text or "}}" in text:
        text = _LEFTOVER.sub("", text)
    if "(" in text:
        text = _PAREN_LEAD.sub("(", text)
        text = _EMPTY_PARENS.sub("", text)
    text = _SPACES_AFTER_OPEN.sub(r"\1", text)
    text = _SPACES_BEFORE_PUNCT.sub(r"\1", text)
    if _HAS_WIDE.search(text):
        text = _SPACE_BETWEEN_WIDE.sub("", text)
    # The deletions above can leave a double space or one at an end, nothing else to collapse.
    return " ".join(text.split()) if "  " in text else text.strip(" ")


def clean_wikitext(text: str) -> list[str]:
    """Paragraphs of running prose from one page's wikitext, in page order.

    Drops templates, infoboxes, tables, references, comments, non-text tags with their content,
    headings, lists, files, categories, interlanguage links, magic words, bold/italic quotes and
    the sections References, See also, External links, Further reading, Notes, Bibliography
    (and similar); keeps link labels and the text of harmless tags; unescapes HTML entities.
    """
    if not text:
        return []
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "<!--" in text:
        text = _COMMENT.sub("", text)
    text = _drop_tags(text)
    text = resolve_variants(text)
    text = strip_braces(text)
    text = _resolve_links(text)  # before line splitting: [[File:..]] captions may span lines
    if "<" in text:
        text = _KEEP_TAG.sub(lambda m: " " if m.group(0)[1:3].lower() in ("br", "hr") else "", text)
    if "__" in text:
        text = _MAGIC_WORD.sub("", text)
    if "''" in text:
        text = _QUOTES.sub("", text)

    raw: list[str] = []
    current: list[str] = []
    for line in _prose_lines(text) + [None]:
        if line is None:
            if current:
                raw.append(" ".join(current))
                current = []
        else:
            current.append(line)
    if not raw:
        return []
    # One pass of the inline cleanup over all paragraphs (a private-use separator, which no
    # pattern treats as space or punctuation), not one per paragraph: a page has dozens.
    tidied = _tidy(_PARA_SEP.join(p.replace(_PARA_SEP, " ") for p in raw))
    return [p.strip() for p in tidied.split(_PARA_SEP) if p.strip()]
