"""One raw record (a page, a book, a line) to a document: clean, split, filter, dedup within it.

Pure functions that return their rejects as a Counter; the corpus job's DoFns turn those into
Beam counters and reject rows."""

from __future__ import annotations

import collections
import re

from pipeline.corpus import filters
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.filters import scrub_controls, sentence_reject
from pipeline.corpus.records import Page
from pipeline.corpus.sentences import split_sentences
from pipeline.corpus.sources import SOURCES, resolve

ARTICLE_NAMESPACE = 0
_DISAMBIGUATION = re.compile(
    r"\{\{\s*(?:disambiguation|disambig|dab|hndis|geodis|numberdis|letter-numbercombdisambig"
    r"|aimai|曖昧さ回避|消歧义|消歧義)"
    r"\s*(?:\||\}\})",
    re.I,
)


# -- pure per-record functions ------------------------------------------------------------------
def page_record(page: Page) -> tuple[dict | None, str | None]:
    """(raw record, None) for an article page, (None, reject reason) otherwise."""
    if page.redirect is not None:
        return None, "redirect"
    if page.ns != ARTICLE_NAMESPACE:
        return None, "non_article_namespace"
    if _DISAMBIGUATION.search(page.text):
        return None, "disambiguation"
    return {"doc_id": f"wiki:{page.page_id}", "source": "wiki", "title": page.title, "text": page.text}, None


def paragraphs_of(record: dict, config: CorpusConfig, text: str | None = None) -> list[str]:
    """The cleaned paragraphs of a record (of ``text`` when given: the record's, repaired)."""
    text = record["text"] if text is None else text
    if record.get("layout") == "line":
        return [" ".join(text.split())]
    return resolve(SOURCES[record["source"]].paragraphs)(text, config)


def build_paragraphs(record: dict, config: CorpusConfig) -> tuple[list[list[str]] | None, collections.Counter]:
    """Clean, split and filter one raw record into its paragraphs' kept sentences (or None).

    The Counter holds every sentence/paragraph dropped by reason and, when the record is
    dropped, exactly one reason of :data:`pipeline.corpus.filters.RECORD_REJECTS`. Paragraphs left
    with no sentence are left out.
    """
    kept, _, rejects = _build_paragraphs(record, config)
    return kept, rejects


def _build_paragraphs(record: dict, config: CorpusConfig):
    """:func:`build_paragraphs`, with the normalised form (:func:`pipeline.corpus.filters.normalise`)
    of every kept sentence when ``config.dedup_sentences`` (computed for the sentence dedup
    anyway; the document digest and paragraph hashes are made from it), else None."""
    rejects: collections.Counter = collections.Counter()
    # NUL & co anywhere in any source: spaces (a dump's page went through the XML parser)
    text, controls = scrub_controls(record["text"], xml=SOURCES[record["source"]].xml)
    if controls:
        rejects["control_chars"] += 1
    paragraphs = paragraphs_of(record, config, text)
    reason = filters.document_reject(paragraphs, config)
    if reason:
        rejects[reason] += 1
        return None, None, rejects
    dedup = config.dedup_sentences
    if dedup:
        paragraphs, dropped = filters.dedup_paragraphs(paragraphs)
        if dropped:
            rejects["duplicate_paragraph"] += dropped
    kept: list[list[str]] = []
    norms: list[list[str]] = []
    seen: set[str] = set()
    split_any = False
    num_sentences = num_chars = 0
    for paragraph in paragraphs:
        sentences = []
        keys = []
        for sentence in split_sentences(paragraph):
            split_any = True
            reason = sentence_reject(sentence, config)
            if reason is None and dedup:
                # normalise(sentence), without its split and join: split_sentences's sentences
                # hold single spaces only, and casefold maps no character to or from a space
                # (checked over every code point in tests/pipeline/test_corpus_dedup.py).
                key = sentence.casefold()
                if key in seen:
                    reason = "duplicate_sentence"
                seen.add(key)
            if reason:
                rejects[reason] += 1
            else:
                sentences.append(sentence)
                num_chars += len(sentence)
                if dedup:
                    keys.append(key)
        if sentences:
            kept.append(sentences)
            norms.append(keys)
            num_sentences += len(sentences)
    if not split_any:
        rejects["empty_after_cleaning"] += 1
        return None, None, rejects
    if num_sentences < config.min_doc_sentences:
        rejects["too_few_sentences"] += 1
        return None, None, rejects
    if num_chars < config.min_doc_chars:
        rejects["doc_too_short"] += 1
        return None, None, rejects
    return kept, norms if dedup else None, rejects


def build_document(record: dict, config: CorpusConfig) -> tuple[dict | None, collections.Counter]:
    """Clean, split and filter one raw record into a DOCUMENT_SCHEMA row (or None), with rejects
    (see :func:`build_paragraphs`); corpus-wide dedup comes later."""
    paragraphs, rejects = build_paragraphs(record, config)
    if paragraphs is None:
        return None, rejects
    sentences = [s for p in paragraphs for s in p]
    row = {
        "doc_id": record["doc_id"],
        "source": record["source"],
        "title": record["title"],
        "sentences": sentences,
        "num_sentences": len(sentences),
        "num_chars": sum(len(s) for s in sentences),
    }
    return row, rejects
