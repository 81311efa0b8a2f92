"""Stage 1, the corpus job: raw Wikipedia dumps, books and text records to cleaned, deduplicated documents.

    check_corpus_inputs -> plan_units (files, multistream ranges) -> spread_units -> Create
    -> Reshuffle -> ReadUnits (pages / books / lines; rejects to runs; a handing-off reader's
    records to batch files, dealt to every worker) -> CleanToFragments
    (clean markup, split sentences, filter; documents to fragment files, their keys and the
    rejects to runs; run URLs out) -> DedupAndWrite (pipeline.corpus.dedup; the decisions in
    pipeline.corpus.decide: exact documents, [near], one per doc_id, paragraphs across the
    corpus; drops applied per fragment, runs merged into shards)
    -> fill_empty_shards -> _manifest.json (last)

Design choices:
1. A unit of read work is a file, or a byte range of whole bz2 streams of a multistream dump
   (:func:`pipeline.corpus.wiki.plan_reads`, planned before the pipeline), so one big dump is read by
   many workers; a file that cannot be split is read once and its records handed to every
   worker through batch files (:func:`spread_units`). Page text never crosses a shuffle (only
   batch file URLs do).
2. The per-record work is pure functions (:func:`page_record`, :func:`build_paragraphs`) that
   return their rejects as a Counter; the DoFns turn those into Beam counters and reject rows.
3. Nothing is lost silently: every record read is either a document or a reject with a reason
   (``{source}_read == documents + sum of RECORD_REJECTS``, checked by a test), every reject row
   goes to ``rejects/`` with a sample, and a fault in a file costs only what is unreadable
   (:mod:`pipeline.corpus.wiki` resynchronises at the next page). A source whose files give 0
   documents fails the stage before its manifest (:func:`check_sources_not_empty`), naming the
   files and the top reject reasons; ``corpus.allow_empty_sources`` lets it be empty.
4. Output is byte-identical whatever the parallelism: every dedup decision sorts by stable
   keys, and the shards are a merge of key-sorted runs (:mod:`pipeline.corpus.dedup`).
5. ``rejects/`` is written beside the source folders but left out of the manifest's ``files``:
   downstream stages read every ``.parquet`` the manifest lists as documents. Its row count is
   the manifest count ``rejects_written``.
"""

from __future__ import annotations

import logging
import time

import apache_beam as beam
import fsspec

from pipeline.beam.config import BeamConfig, output_config
from pipeline.beam.dofns import RUNS
from pipeline.beam.io import check_runner_urls, counters, fill_empty_shards, make_pipeline, parquet_rows, run_job
from pipeline.corpus.clean import CleanToFragments
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.dedup import DedupAndWrite
from pipeline.corpus.filters import (
    FILE_EVENTS,
    NOTES,
    PART_DROPS,
    RECORD_REJECTS,
    REJECT_REASONS,
    REJECT_SCHEMA,
)
from pipeline.corpus.inputs import check_corpus_inputs
from pipeline.corpus.read import ReadUnits, plan_units, spread_units
from pipeline.corpus.rejects import NAMESPACE, REJECTS_FOLDER
from pipeline.schema.manifest import Manifest, clear_stage, describe_file, fingerprint_input, list_files, write_manifest
from pipeline.schema.parquet import DOCUMENT_SCHEMA
from pipeline.schema.storage import join_url

log = logging.getLogger("bertflow.corpus")

WORK_DIR = "_work"


PARTITION_BYTES = 256 << 20
"""Input (as given: a compressed dump counts compressed) one dedup partition is sized for."""


def job_workers(beam_config: BeamConfig) -> int:
    """The workers a corpus job plans for: the local runner's processes; elsewhere the most
    workers the job may get (``max_num_workers`` when set, else ``num_workers``)."""
    return max(1, beam_config.num_workers, beam_config.max_num_workers)


def dedup_partitions(config: CorpusConfig, workers: int, input_bytes: int | None) -> int:
    """Key ranges each dedup pass is split into: one per worker, but no more than one per
    :data:`PARTITION_BYTES` of input (near-duplicate detection needs every signature in one
    place: one). Every producer of a pass writes a run file per partition it has rows for, so
    the pass writes up to producers x partitions objects: 64 partitions for the 400-document
    sample made thousands of small objects on gs://; sized from the input, the sample has one.
    ``input_bytes`` None (not known): one per worker. The output does not depend on it (design
    choice 4)."""
    if config.near_dup_threshold > 0:
        return 1
    if input_bytes is None:
        return max(1, workers)
    return max(1, min(workers, -(-input_bytes // PARTITION_BYTES)))


def input_bytes(files: dict[str, list[str]]) -> int:
    """Total size of the input files (one listing call per source on object stores)."""
    total = 0
    for urls in files.values():
        fs, _ = fsspec.core.url_to_fs(urls[0])
        total += sum(fs.sizes([fsspec.core.url_to_fs(u)[1] for u in urls]))
    return total


def build_corpus_pipeline(
    config: CorpusConfig, files: dict[str, list[str]], output_url: str, size: int | None = None
) -> beam.Pipeline:
    """The corpus job over ``files`` (source -> input file URLs, ``size`` bytes in all when
    known), built, not run, with the options of ``config.beam`` (any runner: a test validates
    it for Dataflow without submitting)."""
    check_runner_urls(config.beam, {**files, "output": [output_url]})
    # Page text never crosses a shuffle: each worker cleans what it reads.
    workers = job_workers(config.beam)
    units = spread_units([u for name, urls in files.items() for u in plan_units(name, urls, config)], workers)
    partitions = dedup_partitions(config, workers, size)
    log.info("corpus: %d read units for %d workers, %d dedup partitions", len(units), workers, partitions)

    work = join_url(output_url, WORK_DIR)
    p = make_pipeline(config.beam, job_name="bertflow-corpus")
    read = p | "Units" >> beam.Create(units) | "SpreadUnits" >> beam.Reshuffle() | "Read" >> ReadUnits(config, work)
    cleaned = read["records"] | "Clean" >> CleanToFragments(config, work, partitions)
    handed = read["handed"] | "CleanHanded" >> CleanToFragments(config, work, partitions)
    keys = (cleaned.keys, handed.keys) | "AllKeys" >> beam.Flatten()
    fragments = (cleaned.fragments, handed.fragments) | "AllFragments" >> beam.Flatten()
    runs = (read[RUNS], cleaned[RUNS], handed[RUNS]) | "ReadRuns" >> beam.Flatten()
    _ = (keys, fragments, runs) | "Dedup" >> DedupAndWrite(config, work, output_url, partitions)
    return p


# -- the stage entry point -----------------------------------------------------------------------
def run_corpus(config: CorpusConfig, inputs: dict[str, str], output_url: str) -> Manifest:
    """Run the corpus job on ``inputs`` ({"wiki": url, "books": url}, each a file, folder or
    glob) and write ``output_url/<source>/part-*.parquet``, ``output_url/rejects/`` and
    ``_manifest.json`` last. Raises CorpusInputError before any work when an input the config
    needs is missing or empty."""
    started = time.monotonic()
    files = check_corpus_inputs(config, inputs)
    fingerprints = {name: fingerprint_input(inputs[name]) for name in files}
    clear_stage(output_url)
    log.info("corpus: %s -> %s", {n: len(f) for n, f in files.items()}, output_url)

    p = build_corpus_pipeline(config, files, output_url, input_bytes(files))
    work = join_url(output_url, WORK_DIR)
    result = run_job(p, config.beam, "the corpus job")

    fs, work_path = fsspec.core.url_to_fs(work)
    if fs.exists(work_path):
        fs.rm(work_path, recursive=True)
    for name in list(files) + [REJECTS_FOLDER]:
        schema = REJECT_SCHEMA if name == REJECTS_FOLDER else DOCUMENT_SCHEMA
        fill_empty_shards(join_url(output_url, name), schema, config.num_shards)
    counts = _counts(counters(result, NAMESPACE), files)
    out_files, rejects_written = [], 0
    for rel in list_files(output_url):
        n = parquet_rows(join_url(output_url, rel))
        if rel.startswith(REJECTS_FOLDER + "/"):
            rejects_written += n
        else:
            out_files.append(describe_file(output_url, rel, rows=n))
    counts["rejects_written"] = rejects_written
    check_sources_not_empty(config, files, counts, join_url(output_url, REJECTS_FOLDER))
    seconds = time.monotonic() - started
    manifest = write_manifest(
        stage="corpus",
        stage_url=output_url,
        config=output_config(config),
        inputs=fingerprints,
        counts=counts,
        files=out_files,
        seconds=seconds,
    )
    log.info(
        "corpus: %d documents, %d sentences in %.1f s; rejects %s (rows in %s)",
        counts["documents"],
        counts["sentences"],
        seconds,
        {r: counts[r] for r in REJECT_REASONS if counts[r]},
        join_url(output_url, REJECTS_FOLDER),
    )
    return manifest


class EmptySourceError(RuntimeError):
    """A source of the run yielded no document; the message names it, its files and why."""


def check_sources_not_empty(
    config: CorpusConfig, files: dict[str, list[str]], counts: dict[str, float], rejects_url: str
) -> None:
    """Raise :class:`EmptySourceError` for the first source with 0 documents (unless
    ``corpus.allow_empty_sources``): its files, what was read and the top reject reasons, so a
    run on inputs that all fail never ends "done"."""
    if config.allow_empty_sources:
        return
    for name, urls in files.items():
        if counts.get(f"{name}_documents", 0) > 0:
            continue
        reasons = sorted(
            ((k.split(".", 1)[1], int(v)) for k, v in counts.items() if k.startswith(f"{name}.") and v),
            key=lambda kv: (-kv[1], kv[0]),
        )
        why = ", ".join(f"{reason} {n}" for reason, n in reasons[:5]) or "no reject either"
        shown = ", ".join(urls[:3]) + (f" and {len(urls) - 3} more" if len(urls) > 3 else "")
        raise EmptySourceError(
            f"corpus: the {name} source gave 0 documents: {int(counts.get(f'{name}_read', 0))} records read "
            f"from {len(urls)} file(s) ({shown}); top reject reasons: {why} (rows with samples under "
            f"{rejects_url}); fix the input, or set corpus.allow_empty_sources=true to let it be empty"
        )


def _counts(found: dict[str, int], files: dict[str, list[str]]) -> dict[str, float]:
    counts: dict[str, float] = {reason: 0 for reason in REJECT_REASONS + NOTES}
    for name in files:
        for what in ("read", "documents", "sentences", "chars"):
            counts[f"{name}_{what}"] = 0
    counts.update(found)
    for what in ("read", "documents", "sentences", "chars"):
        counts[what] = sum(counts[f"{name}_{what}"] for name in files)
    counts["records_rejected"] = sum(counts[r] for r in RECORD_REJECTS)
    counts["file_faults"] = sum(counts[r] for r in FILE_EVENTS)
    counts["parts_dropped"] = sum(counts[r] for r in PART_DROPS)
    return counts
