"""Filters with reasons: what the corpus job drops, why, and the rows that say so.

Design choices:
1. Every reason is a name in one of three tuples: :data:`RECORD_REJECTS` (a page or book read
   and not kept: these add up with the documents to the records read), :data:`FILE_EVENTS` (a
   fault of a file itself, no record) and :data:`PART_DROPS` (a sentence or paragraph dropped
   from a kept document). Each is a Beam counter in namespace "corpus" and a manifest count.
2. Rejected records and file faults are rows of :data:`REJECT_SCHEMA` (reason, detail, a text
   sample) written to ``rejects/`` beside the documents, so a rejected page can be looked at,
   not only counted. Dropped sentences are only counted (there are millions).
3. Content hashes are ``blake2b`` of case- and whitespace-normalised text: stable across
   processes and workers, unlike the builtin ``hash()``.
4. Near-duplicate detection (MinHash LSH, ``datasketch``) is optional and off by default: it
   needs the whole corpus's signatures in one place, which the exact dedup does not.
"""

from __future__ import annotations

import hashlib
import re

import pyarrow as pa

from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.sentences import squeezed

RECORD_REJECTS = (
    # read
    "unclosed_page",
    "truncated_page",
    "page_too_large",
    "malformed_xml",
    "malformed_page",
    "binary_file",
    "undecodable",
    "file_too_large",
    "unreadable_book",
    "unsupported_file",
    "line_too_long",  # a line (a document) or a JSONL record over corpus.max_line_bytes: skipped unread
    "record_too_large",  # a Parquet/Arrow text value over corpus.max_line_bytes
    "malformed_record",  # a JSONL line that is not a JSON object
    "missing_text",  # a text record without the text field (or null, or not a string)
    # kind of page
    "redirect",
    "non_article_namespace",
    "disambiguation",
    # content
    "empty_after_cleaning",
    "mostly_non_text",
    "too_few_sentences",
    "doc_too_short",
    "doc_too_long",
    # dedup
    "duplicate_document",
    "near_duplicate_document",
    "duplicate_doc_id",
    "all_paragraphs_duplicate",  # every paragraph kept by another document
)
FILE_EVENTS = ("unreadable_file", "truncated_file", "no_pages")
PART_DROPS = (
    "long_line",  # a line of a book over corpus.max_line_bytes: skipped unread, the rest kept
    "sentence_too_short",
    "sentence_too_long",
    "sentence_low_alpha",
    "duplicate_sentence",
    "duplicate_paragraph",
    "duplicate_paragraph_corpus",
)
WRITTEN_PART_DROPS = ("duplicate_paragraph_corpus", "long_line")
"""Part drops also written to ``rejects/`` (one row each, with the document id)."""
NOTES = ("invalid_utf8", "books_reencoded", "wiki_reencoded", "control_chars")
"""Repairs, the record kept: invalid UTF-8 replaced, a book or dump read in another encoding,
control characters (NUL, ...) replaced by spaces."""
REJECT_REASONS = RECORD_REJECTS + FILE_EVENTS + PART_DROPS

REJECT_SCHEMA = pa.schema(
    [
        pa.field("reject_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("record_id", pa.string()),  # doc_id when known ("wiki:12", "books:name")
        pa.field("title", pa.string()),
        pa.field("url", pa.string()),  # the input file
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string()),
        pa.field("sample", pa.string()),  # the first ~1,000 characters of the record
    ]
)
SAMPLE_CHARS = 1000


_CONTROL = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f]")
"""C0 and C1 control characters but the whitespace ones (tab, newlines, vertical tab, form feed)."""


_XML_CONTROL = re.compile("[\x7f-\x9f]")
"""The control characters XML 1.0 lets through (it refuses the C0 ones but tab and newlines)."""


def scrub_controls(text: str, xml: bool = False) -> tuple[str, int]:
    """``text`` with NUL and the other control characters replaced by spaces, and how many; a text
    without any is returned as it is (one C-speed scan). ``xml``: text an XML parser accepted,
    which holds no C0 control, so only DEL and C1 are looked for (an ASCII text: a memchr for DEL)."""
    if xml:
        if text.isascii() and "\x7f" not in text:  # isascii is O(1) on CPython's compact strings
            return text, 0
        pattern = _XML_CONTROL
    else:
        pattern = _CONTROL
    if pattern.search(text) is None:
        return text, 0
    return pattern.subn(" ", text)


def digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def normalise(text: str) -> str:
    """Case- and whitespace-insensitive form of a sentence or document, for exact dedup."""
    return squeezed(text.casefold())


def text_digest(sentences: list[str]) -> str:
    return digest("\n".join(normalise(s) for s in sentences))


def reject_row(
    source: str, reason: str, *, record_id: str = "", title: str = "", url: str = "", detail: str = "", sample: str = ""
) -> dict:
    """A REJECT_SCHEMA row; its id is a digest of what identifies it (stable across runs)."""
    rid = digest("\x1f".join((source, record_id, url, reason, detail)))
    return {
        "reject_id": rid,
        "source": source,
        "record_id": record_id,
        "title": title,
        "url": url,
        "reason": reason,
        "detail": detail,
        "sample": sample[:SAMPLE_CHARS],
    }


_ASCII_NON_LETTERS = bytes(b for b in range(128) if not chr(b).isalpha())
_ASCII_SPACES = bytes(b for b in range(128) if chr(b).isspace())
# Every byte but an ASCII letter: what a UTF-8 text keeps of its ASCII letters (a character
# outside ASCII is encoded in bytes >= 0x80 only).
_BYTES_NOT_ASCII_LETTERS = _ASCII_NON_LETTERS + bytes(range(128, 256))
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def letters_and_visible(text: str) -> tuple[int, int]:
    """(letters, non-space characters) of a text. The ASCII characters are counted by byte
    translation in C (of the text's UTF-8), the others one by one (text of Latin script: a few,
    found by one regex scan)."""
    if text.isascii():
        data = text.encode("ascii")
        return len(data.translate(None, _ASCII_NON_LETTERS)), len(data.translate(None, _ASCII_SPACES))
    data = text.encode("utf-8", "surrogatepass")  # a lone surrogate is neither letter nor space
    if len(data) > 2 * len(text):  # mostly outside ASCII (Chinese, Japanese): one pass
        return sum(map(str.isalpha, text)), len(text) - sum(map(str.isspace, text))
    others = "".join(_NON_ASCII.findall(text))
    letters = len(data.translate(None, _BYTES_NOT_ASCII_LETTERS)) + sum(map(str.isalpha, others))
    spaces = len(data) - len(data.translate(None, _ASCII_SPACES)) + sum(map(str.isspace, others))
    return letters, len(text) - spaces


def sentence_reject(sentence: str, config: CorpusConfig) -> str | None:
    """The reason a sentence fails the filters, or None when it passes."""
    n = len(sentence)
    if n < config.min_sentence_chars:
        return "sentence_too_short"
    if n > config.max_sentence_chars:
        return "sentence_too_long"
    letters, visible = letters_and_visible(sentence)
    if visible == 0 or letters / visible < config.min_alpha_ratio:
        return "sentence_low_alpha"
    return None


def text_share(paragraphs: list[str], limit: int = 20_000) -> float:
    """Share of letters among the non-space characters of a document's cleaned text (its first
    ``limit`` characters: a sample is enough to tell prose from a table of figures)."""
    visible = letters = 0
    for p in paragraphs:
        got_letters, got_visible = letters_and_visible(p[: limit - visible])
        letters += got_letters
        visible += got_visible
        if visible >= limit:
            break
    return letters / visible if visible else 0.0


def document_reject(paragraphs: list[str], config: CorpusConfig) -> str | None:
    """The reason a whole cleaned document is dropped before sentence splitting, or None."""
    if not paragraphs:
        return "empty_after_cleaning"
    chars = sum(len(p) for p in paragraphs)
    if chars > config.max_doc_chars:
        return "doc_too_long"
    if text_share(paragraphs) < config.min_doc_alpha_ratio:
        return "mostly_non_text"
    return None


def dedup_paragraphs(paragraphs: list[str]) -> tuple[list[str], int]:
    """Paragraphs with exact repeats (normalised) removed, first kept; and how many went."""
    seen: set[str] = set()
    kept = []
    for p in paragraphs:
        key = digest(normalise(p))
        if key not in seen:
            seen.add(key)
            kept.append(p)
    return kept, len(paragraphs) - len(kept)


NUM_PERM = 128


def minhash(sentences: list[str], num_perm: int = NUM_PERM, shingle: int = 5) -> list[int]:
    """MinHash signature of a document over word ``shingle``-grams (``datasketch``, seeded, so
    the same on every worker)."""
    from datasketch import MinHash

    words = normalise(" ".join(sentences)).split()
    mh = MinHash(num_perm=num_perm, seed=1)
    for i in range(max(1, len(words) - shingle + 1)):
        mh.update(" ".join(words[i : i + shingle]).encode("utf-8"))
    return [int(v) for v in mh.hashvalues]


def near_duplicates(signatures: list[tuple[str, list[int]]], threshold: float) -> dict[str, str]:
    """{doc_id: the kept doc_id it nearly duplicates} by MinHash LSH over (doc_id, signature)
    pairs. Documents are visited in doc_id order and the first of a cluster is kept, so the
    answer does not depend on input order."""
    import numpy as np
    from datasketch import LeanMinHash, MinHash, MinHashLSH

    scheme = MinHash(num_perm=NUM_PERM, seed=1).scheme  # the one minhash() used
    lsh = MinHashLSH(threshold=threshold, num_perm=NUM_PERM)
    dropped: dict[str, str] = {}
    for doc_id, values in sorted(signatures):
        mh = LeanMinHash(seed=1, hashvalues=np.array(values, dtype=np.uint64), scheme=scheme)
        similar = lsh.query(mh)
        if similar:
            dropped[doc_id] = min(similar)
        else:
            lsh.insert(doc_id, mh)
    return dropped
