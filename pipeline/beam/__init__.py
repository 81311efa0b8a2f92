"""Beam plumbing the data stages share: how a job runs (``config``, ``io``), forked local workers,
and balanced key-ordered Parquet shards built in bounded memory (``shards``). This file imports
nothing.
"""
