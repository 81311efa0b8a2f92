"""The cleaning half of the corpus job: raw records to documents in fragment files, keys and rejects to runs."""

from __future__ import annotations

import logging

import apache_beam as beam

from pipeline.beam.dofns import RUNS, windowed
from pipeline.corpus import filters
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.decide import KEY_SCHEMA, PartitionedRuns, key_row
from pipeline.corpus.dedup import KEYS, FragmentWriter, doc_digest, norms_digest, norms_hash, paragraph_hash
from pipeline.corpus.documents import _build_paragraphs
from pipeline.corpus.filters import NOTES, RECORD_REJECTS
from pipeline.corpus.read import PROGRESS_EVERY
from pipeline.corpus.rejects import Rejecting
from pipeline.schema.storage import join_url

log = logging.getLogger("bertflow.corpus")


class _CleanToFragments(Rejecting):
    """Raw record -> its document written to a fragment and its key row (digest, doc_id, title,
    ref, paragraph hashes[, minhash]) to a key run; rejects written to runs; fragment ids
    (tagged "fragments"), key runs ("keys") and runs ("runs") at the end of each bundle."""

    def __init__(self, config: CorpusConfig, work_url: str, partitions: int = 1):
        super().__init__(work_url)
        self.config = config
        self.partitions = partitions

    def start_bundle(self):
        super().start_bundle()
        self._fragments = FragmentWriter(self.work_url)
        self._keys = PartitionedRuns(join_url(self.work_url, RUNS), KEYS, KEY_SCHEMA, self.partitions)
        self._processed = 0

    def process(self, record: dict):
        self._clean(record)

    def _clean(self, record: dict) -> None:
        paragraphs, norms, rejects = _build_paragraphs(record, self.config)
        for reason, n in rejects.items():
            if reason not in RECORD_REJECTS:
                self.count(reason, n)
                if reason not in NOTES:
                    self.count(f"{record['source']}.{reason}", n)
        self._processed += 1
        if self._processed % PROGRESS_EVERY == 0:
            log.info("corpus: %d documents processed by this worker (last %s)", self._processed, record["doc_id"])
        if paragraphs is None:
            reason = next(r for r in rejects if r in RECORD_REJECTS)
            self.reject(
                record["source"], reason, record_id=record["doc_id"], title=record["title"], sample=record["text"]
            )
            return
        # The digest and hashes normalise each sentence; the dedup above already did (the
        # same strings: normalise(" ".join(p)) == " ".join(map(normalise, p)), no kept
        # sentence normalising to "").
        digest = doc_digest(paragraphs) if norms is None else norms_digest(norms)
        ref = self._fragments.add(
            {
                "doc_id": record["doc_id"],
                "source": record["source"],
                "title": record["title"],
                "digest": digest,
                "paragraphs": paragraphs,
            }
        )
        if not self.config.dedup_paragraphs:
            hashes = []
        elif norms is None:
            hashes = [paragraph_hash(p) for p in paragraphs]
        else:
            hashes = [norms_hash(n) for n in norms]
        sig = filters.minhash([s for p in paragraphs for s in p]) if self.config.near_dup_threshold > 0 else None
        self._keys.add(key_row(bytes.fromhex(digest), record["doc_id"], record["title"], ref, hashes, sig))

    def finish_bundle(self):
        for fragment in self._fragments.close():
            yield beam.pvalue.TaggedOutput("fragments", windowed(fragment))
        for item in self._keys.close():
            yield beam.pvalue.TaggedOutput(KEYS, windowed(item))
        yield from super().finish_bundle()


class CleanToFragments(beam.PTransform):
    """Raw records -> key runs ``(partition, run)`` ("keys"), fragment ids ("fragments") and
    reject runs ("runs")."""

    def __init__(self, config: CorpusConfig, work_url: str, partitions: int = 1):
        super().__init__()
        self.config = config
        self.work_url = work_url
        self.partitions = partitions

    def expand(self, records):
        return records | "BuildDocument" >> beam.ParDo(
            _CleanToFragments(self.config, self.work_url, self.partitions)
        ).with_outputs("fragments", RUNS, KEYS, main="none")
