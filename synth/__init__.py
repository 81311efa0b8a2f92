"""Synthetic data in the real formats (MediaWiki XML, books, GLUE/SQuAD files): the bundled sample and test corpora.

Not a stage: no stage imports it. ``bertflow synth-corpus`` and the tests do.
"""
