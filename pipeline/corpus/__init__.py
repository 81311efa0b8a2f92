"""Stage 1, the corpus: raw Wikipedia dumps and books to cleaned, deduplicated documents.

``job.run_corpus`` is the stage; ``inputs`` (what a source names), ``wiki``/``wiki_reader``
(dumps page by page), ``books`` (text files), ``wikitext``/``templates`` (markup to prose),
``sentences``, ``filters`` and ``documents`` (a record to a document), ``read``/``clean``
(the Beam job's halves), ``dedup``/``decide`` (corpus-wide dedup), ``preview``, ``fetch``.
This file imports nothing.
"""
