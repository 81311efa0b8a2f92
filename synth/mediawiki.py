"""The MediaWiki export format the synthetic dump is written in: the XML header with its
namespaces, a page with its revision, contributor and sha1, the footer."""

from __future__ import annotations

import hashlib
import random
from xml.sax.saxutils import escape, quoteattr

XMLNS = "http://www.mediawiki.org/xml/export-0.10/"
NAMESPACES = (
    (-2, "Media"),
    (-1, "Special"),
    (0, ""),
    (1, "Talk"),
    (2, "User"),
    (3, "User talk"),
    (4, "Wikipedia"),
    (5, "Wikipedia talk"),
    (6, "File"),
    (7, "File talk"),
    (10, "Template"),
    (11, "Template talk"),
    (14, "Category"),
    (15, "Category talk"),
)
EDITORS = (
    "Harrowgate",
    "Quillon",
    "Mossbank",
    "Tarnwise",
    "Elderfen",
    "Orrin.k",
    "Vellum42",
    "Saltmarsh",
    "Ketterly",
    "Brightwater",
)


# -- the export XML ------------------------------------------------------------------------------
def _sha1_base36(text: str) -> str:
    n = int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest(), "big")
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while n:
        n, r = divmod(n, 36)
        out = digits[r] + out
    return out.rjust(31, "0")


def xml_header(seed: int) -> str:
    ns = "\n".join(
        f'      <namespace key="{k}" case="first-letter">{v}</namespace>'
        if v
        else f'      <namespace key="{k}" case="first-letter" />'
        for k, v in NAMESPACES
    )
    return (
        f'<mediawiki xmlns="{XMLNS}" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        f'xsi:schemaLocation="{XMLNS} http://www.mediawiki.org/xml/export-0.10.xsd" '
        'version="0.10" xml:lang="en">\n  <siteinfo>\n    <sitename>SynthWiki</sitename>\n'
        f"    <dbname>synthwiki{seed}</dbname>\n    <base>http://synthwiki.example.org/wiki/Main_Page</base>\n"
        "    <generator>MediaWiki 1.35.0-synth</generator>\n    <case>first-letter</case>\n"
        f"    <namespaces>\n{ns}\n    </namespaces>\n  </siteinfo>\n"
    )


XML_FOOTER = "</mediawiki>\n"
_QUOT = {'"': "&quot;"}  # dumps escape quotes in text too


def page_xml(title: str, ns: int, page_id: int, text: str, rng: random.Random) -> str:
    """One <page> element, its text escaped as a dump escapes it."""
    redirect = ""
    if text.startswith("#REDIRECT [["):
        redirect = f"    <redirect title={quoteattr(text[12 : text.index(']]')])} />\n"
    user = rng.choice(EDITORS)
    stamp = "%d-%02d-%02dT%02d:%02d:%02dZ" % (
        rng.randrange(2015, 2021),
        rng.randrange(1, 13),
        rng.randrange(1, 29),
        rng.randrange(24),
        rng.randrange(60),
        rng.randrange(60),
    )
    rev = 900000 + page_id * 13 + rng.randrange(13)
    return (
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{page_id}</id>\n"
        f"{redirect}    <revision>\n      <id>{rev}</id>\n      <parentid>{rev - 1 - rng.randrange(500)}</parentid>\n"
        f"      <timestamp>{stamp}</timestamp>\n      <contributor>\n        <username>{user}</username>\n"
        f"        <id>{1000 + EDITORS.index(user)}</id>\n      </contributor>\n"
        f"      <comment>{rng.choice(('copyedit', 'add source', 'expand', '/* History */ fix'))}</comment>\n"
        "      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
        f'      <text bytes="{len(text.encode())}" xml:space="preserve">{escape(text, _QUOT)}</text>\n'
        f"      <sha1>{_sha1_base36(text)}</sha1>\n    </revision>\n  </page>\n"
    )
