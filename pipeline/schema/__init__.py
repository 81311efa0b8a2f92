"""The data contract between stages, defined once and imported by its writers and its readers.

- :mod:`pipeline.schema.parquet`: the Parquet schemas of documents and pretraining examples;
- :mod:`pipeline.schema.manifest`: the stage manifest (``_manifest.json``: config, input
  fingerprints, counts, every output file with its checksum) and input fingerprints;
- :mod:`pipeline.schema.storage`: URLs and the one commit rule for whole files (atomic writes);
- :mod:`pipeline.schema.config`: the one configuration error, ``check()``, and what a recorded
  config is made of (flattened, digested, secrets redacted).

It imports only the standard library, pyarrow and fsspec, so reading it never pulls in Beam or
torch. ``model/`` reads it through ``model/contract.py`` (its one door to ``pipeline/``), and
``tasks/`` through ``model/``. This file imports nothing: import the part you need.
"""
