"""The visible text of the inline templates whose value a reader sees in running prose.

A dump does not carry template definitions, so the cleaner cannot expand templates in general;
most (citations, infoboxes, navboxes, maintenance tags) are not prose anyway and become a space.
A small, fixed set shows words that the sentence needs: ``{{convert|52419|sqmi|km2}}`` reads
"52,419 square miles", ``{{lang|fr|mot}}`` reads "mot", ``{{nihongo|Tokyo|東京}}`` reads
"Tokyo (東京)". Dropping those leaves "At, Alabama ..." or a sentence that starts in lower case.

Design choices:
1. A table from template name to a small renderer of its arguments; anything not in the table
   becomes a space. The renderers reproduce the primary reading (the converted-to unit in
   parentheses, language labels, audio links are left out), never template syntax.
2. Arguments are split at top-level pipes only (pipes inside ``[[..]]`` and nested ``{{..}}`` stay
   in their argument), in one linear scan. Nested templates inside a kept argument are cleaned by
   the caller's :func:`pipeline.corpus.wikitext.strip_braces`, recursively to a bounded depth
   (:data:`MAX_DEPTH`), so the work stays linear in the page for any nesting.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["render_template", "split_args", "MAX_DEPTH"]

MAX_DEPTH = 4  # nested kept templates deeper than this become a space

# Argument-less templates that stand for a character.
INLINE_CHARS = {
    "ndash": "–",
    "mdash": "—",
    "snd": " – ",
    "spnd": " – ",
    "spaced ndash": " – ",
    "spaced en dash": " – ",
    "sndash": " – ",
    "nbsp": " ",
    "sp": " ",
    "-": "-",
    "née": "née",
    "nee": "née",
    "!": "|",
    "=": "=",
    "'": "'",
    "apos": "'",
    "·": " · ",
    "dot": " · ",
    "en dash": "–",
    "em dash": "—",
    "thinsp": " ",
    "zwsp": "",
    "shy": "",
    "sic": "[sic]",
    "'s": "'s",
    "year": "",
    "currentyear": "",
}

# Unit codes of {{convert}}: (singular, plural). Unknown codes are shown as written.
_UNITS = {
    "km": ("kilometre", "kilometres"),
    "m": ("metre", "metres"),
    "cm": ("centimetre", "centimetres"),
    "mm": ("millimetre", "millimetres"),
    "mi": ("mile", "miles"),
    "ft": ("foot", "feet"),
    "in": ("inch", "inches"),
    "yd": ("yard", "yards"),
    "nmi": ("nautical mile", "nautical miles"),
    "sqmi": ("square mile", "square miles"),
    "km2": ("square kilometre", "square kilometres"),
    "m2": ("square metre", "square metres"),
    "sqft": ("square foot", "square feet"),
    "ha": ("hectare", "hectares"),
    "acre": ("acre", "acres"),
    "kg": ("kilogram", "kilograms"),
    "g": ("gram", "grams"),
    "lb": ("pound", "pounds"),
    "t": ("tonne", "tonnes"),
    "ST": ("short ton", "short tons"),
    "LT": ("long ton", "long tons"),
    "oz": ("ounce", "ounces"),
    "C": ("°C", "°C"),
    "F": ("°F", "°F"),
    "K": ("kelvin", "kelvins"),
    "mph": ("mile per hour", "miles per hour"),
    "km/h": ("kilometre per hour", "kilometres per hour"),
    "kn": ("knot", "knots"),
    "L": ("litre", "litres"),
    "l": ("litre", "litres"),
    "USgal": ("US gallon", "US gallons"),
    "impgal": ("imperial gallon", "imperial gallons"),
    "hp": ("horsepower", "horsepower"),
    "kW": ("kilowatt", "kilowatts"),
    "MW": ("megawatt", "megawatts"),
    "m3": ("cubic metre", "cubic metres"),
    "cuft": ("cubic foot", "cubic feet"),
    "mi2": ("square mile", "square miles"),
    "sqkm": ("square kilometre", "square kilometres"),
}
_RANGE_WORDS = {"-", "–", "to", "and", "or", "x", "by", "+/-", "±", "and(-)", "to(-)"}
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_NUMBER = re.compile(r"^[+-]?\d+(?:\.\d+)?(?:e-?\d+)?$")
_LANG_CODE = re.compile(r"^[a-z]{2,3}(?:-[a-z0-9]{2,8})*$", re.I)
_IPAC_LABELS = {"lang", "pron", "local", "us", "uk", "audio", "ipa", "ukalso", "usalso", "also"}


def split_args(inner: str) -> list[str]:
    """A template's inner text split at top-level pipes: [name, arg1, arg2, ...]."""
    parts: list[str] = []
    depth_brace = depth_link = 0
    start = 0
    i, n = 0, len(inner)
    while i < n:
        two = inner[i : i + 2]
        if two == "{{":
            depth_brace += 1
            i += 2
        elif two == "}}" and depth_brace:
            depth_brace -= 1
            i += 2
        elif two == "[[":
            depth_link += 1
            i += 2
        elif two == "]]" and depth_link:
            depth_link -= 1
            i += 2
        else:
            if inner[i] == "|" and not depth_brace and not depth_link:
                parts.append(inner[start:i])
                start = i + 1
            i += 1
    parts.append(inner[start:])
    return parts


def _positional_and_named(args: list[str]) -> tuple[list[str], dict[str, str]]:
    positional, named = [], {}
    for arg in args:
        key, eq, value = arg.partition("=")
        if eq and "{{" not in key and "[[" not in key and key.strip():
            named[key.strip().lower()] = value.strip()
        else:
            positional.append(arg.strip())
    return positional, named


def _fmt_number(value: str) -> str:
    """ "52419" -> "52,419" (as MediaWiki displays a number); other forms as written."""
    if not _NUMBER.match(value) or "e" in value.lower():
        return value
    sign = value[0] if value[0] in "+-" else ""
    whole, dot, frac = value[len(sign) :].partition(".")
    return f"{sign}{int(whole):,}{dot}{frac}"


def _convert(pos: list[str], named: dict[str, str]) -> str:
    """{{convert|52419|sqmi|km2}} -> "52,419 square miles"; ranges {{convert|5|to|10|km}}."""
    if not pos or not pos[0]:
        return " "
    numbers = [pos[0].replace(",", "")]
    parts = [_fmt_number(numbers[0])]
    i = 1
    while i + 1 < len(pos) and pos[i].lower() in _RANGE_WORDS:
        sep = pos[i]
        parts.append("–" if sep in ("-", "–") else f" {sep} ")
        numbers.append(pos[i + 1].replace(",", ""))
        parts.append(_fmt_number(numbers[-1]))
        i += 2
    text = "".join(parts)
    unit = pos[i] if i < len(pos) else ""
    if unit:
        names = _UNITS.get(unit)
        if names is None or named.get("abbr", "") in ("on", "values", "in"):
            text += f" {unit}"
        else:
            text += " " + (names[0] if numbers[-1].lstrip("+-") in ("1", "1.0") else names[1])
    return text


def _date(pos: list[str], _named) -> str:
    nums = [p for p in pos if p.strip().isdigit()][:3]
    if len(nums) == 3 and 1 <= int(nums[1]) <= 12:
        return f"{int(nums[2])} {_MONTHS[int(nums[1]) - 1]} {nums[0]}"
    if len(nums) == 2 and 1 <= int(nums[1]) <= 12:
        return f"{_MONTHS[int(nums[1]) - 1]} {nums[0]}"
    return nums[0] if nums else " "


def _nth(k: int) -> Callable:
    return lambda pos, named: pos[k] if len(pos) > k else " "


def _lang(pos, named) -> str:  # {{lang|fr|mot}}, {{langx|fr|mot}}
    return pos[1] if len(pos) > 1 else " "


def _ipa(pos, named) -> str:  # {{IPA|/x/}} or {{IPA|de|x}}
    if len(pos) > 1 and _LANG_CODE.match(pos[0]):
        return pos[1]
    return pos[0] if pos else " "


def _ipac(pos, named) -> str:  # {{IPAc-en|ˈ|æ|l|ə}} -> /ˈælə/
    pieces = [p for p in pos if p.lower() not in _IPAC_LABELS]
    return "/" + "".join(pieces) + "/" if pieces else " "


def _nihongo(pos, named) -> str:  # {{nihongo|English|漢字|rōmaji}}
    english = pos[0] if pos else ""
    native = pos[1] if len(pos) > 1 else ""
    if english and native:
        return f"{english} ({native})"
    return english or native or " "


def _yomigana(pos, named) -> str:  # {{読み仮名|東京都|とうきょうと}} -> 東京都（とうきょうと）
    base = pos[0] if pos else ""
    reading = pos[1] if len(pos) > 1 else ""
    if base and reading:
        return f"{base}（{reading}）"
    return base or " "


def _frac(pos, named) -> str:
    if len(pos) == 3:
        return f"{pos[0]} {pos[1]}/{pos[2]}"
    if len(pos) == 2:
        return f"{pos[0]}/{pos[1]}"
    return f"1/{pos[0]}" if pos else " "


def _prefixed(prefix: str) -> Callable:
    return lambda pos, named: f"{prefix}{pos[0]}" if pos and pos[0] else prefix.strip()


def _as_of(pos, named) -> str:
    return "As of " + " ".join(p for p in pos if p) if pos else " "


def _val(pos, named) -> str:
    value = _fmt_number(pos[0].replace(",", "")) if pos else ""
    unit = named.get("u") or named.get("ul") or ""
    return f"{value} {unit}".strip() or " "


_RENDERERS: dict[str, Callable] = {
    **{
        name: _nth(0)
        for name in (
            "nowrap",
            "nobr",
            "small",
            "smaller",
            "big",
            "larger",
            "sic",
            "not a typo",
            "proper name",
            "visible anchor",
            "vanchor",
            "mvar",
            "math",
            "var",
            "em",
            "strong",
            "text",
            "abbr",
            "ill",
            "interlanguage link",
            "flag",
            "flagcountry",
            "flagu",
            "gloss",
            "sup",
            "sub",
            "keypress",
            "wikt-lang",
            "linktext",
            "lang-en",
            "nihongo2",
            "coord missing",
            "lit",
            "literally",
            "script",
            "oldstyledate",
            "no wrap",
            "nowrap begin",
            "bold",
            "italic",
            "ublist",
        )
    },
    # Japanese and Chinese Wikipedia: readings, ruby, links to articles in other languages
    "読み仮名": _yomigana,
    "読み仮名 ruby不使用": _yomigana,
    "読み仮名 ruby使用": _yomigana,
    "ruby": _nth(0),
    "仮リンク": _nth(0),
    "le": _nth(0),
    "link-en": _nth(0),
    "link-ja": _nth(0),
    "illm": _nth(0),
    "script": _nth(1),
    "transl": lambda p, n: p[-1] if p else " ",
    "transliteration": lambda p, n: p[-1] if p else " ",
    "lang": _lang,
    "langx": _lang,
    "ipa": _ipa,
    "nihongo": _nihongo,
    "nihongo3": _nth(2),
    "convert": _convert,
    "cvt": lambda p, n: _convert(p, {**n, "abbr": n.get("abbr", "on")}),
    "frac": _frac,
    "fraction": _frac,
    "sfrac": _frac,
    "circa": _prefixed("c. "),
    "c.": _prefixed("c. "),
    "floruit": _prefixed("fl. "),
    "fl.": _prefixed("fl. "),
    "as of": _as_of,
    "val": _val,
    "us$": _prefixed("US$"),
    "usd": _prefixed("US$"),
    "start date": _date,
    "birth date": _date,
    "death date": _date,
    "birth date and age": _date,
    "death date and age": _date,
    "start date and age": _date,
    "end date": _date,
    "dts": _date,
}


def template_name(raw: str) -> str:
    """Normalised template name: lower case, underscores as spaces, no "Template:" prefix."""
    name = " ".join(raw.replace("_", " ").split()).lower()
    if name.startswith("template:"):
        name = name[9:].strip()
    return name


def render_template(inner: str, clean_arg: Callable[[str], str], depth: int) -> str:
    """The visible text of ``{{inner}}`` (a space for every template not in the table).

    ``clean_arg`` strips markup nested inside a kept argument (nested templates); it is only
    called while ``depth < MAX_DEPTH``.
    """
    head = inner[:200]  # a name is short: never scan a huge template to find it
    cut = len(head)
    for stop in ("|", "{", "}", "\n"):
        k = head.find(stop)
        if 0 <= k < cut:
            cut = k
    if cut == len(head) and len(inner) > len(head):
        return " "
    name = template_name(head[:cut])
    if "|" not in inner:
        char = INLINE_CHARS.get(name)
        if char is not None:
            return char
    if name.startswith("formatnum:"):
        return _fmt_number(inner.partition(":")[2].strip().replace(",", ""))
    renderer = _RENDERERS.get(name)
    if renderer is None and name.startswith("lang-"):
        renderer = _nth(0)
    elif renderer is None and name.startswith("ipac-"):
        renderer = _ipac
    elif renderer is None and name.startswith("ipa-"):
        renderer = _nth(0)
    if renderer is None or depth >= MAX_DEPTH:
        return " "
    args = split_args(inner)[1:]
    args = [clean_arg(a) if "{" in a else a for a in args]
    pos, named = _positional_and_named(args)
    out = renderer(pos, named)
    return out if out.strip() else " "
