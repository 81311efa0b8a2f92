"""The local runner's forked workers (pipeline.beam.local_workers): same results as Beam's own
workers, really forked, runs back to back in one process, errors surfaced, nothing left behind."""

import os
import sys

import apache_beam as beam
import pytest
from apache_beam.internal.cloudpickle import cloudpickle
from apache_beam.metrics import Metrics

from pipeline.beam.config import BeamConfig
from pipeline.beam.io import counters, local_runner, make_pipeline
from pipeline.beam.local_workers import ForkingFnApiRunner, can_fork

pytestmark = pytest.mark.skipif(not can_fork(), reason="forked workers need Linux")

# Beam's own workers are fresh interpreters that cannot import this test module: send its code.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _forked() -> bool:
    """Whether this process carries the driver's modules: pytest is never imported by a fresh
    Beam worker."""
    return "_pytest" in sys.modules


class _Tag(beam.DoFn):
    def __init__(self):
        self.seen = Metrics.counter("t", "seen")

    def process(self, x):
        self.seen.inc()
        yield x % 7, (x * x, _forked(), os.getpid())


def _collect(cfg: BeamConfig, tmp_path, n: int = 400):
    """Results written by the workers to files (a forked worker's list is not the driver's)."""
    folder = tmp_path / f"out-{os.urandom(4).hex()}"
    folder.mkdir()

    def write(kv):
        key, values = kv
        (folder / f"{key}.txt").write_text(
            repr((sorted(v[0] for v in values), sorted({v[1] for v in values}), len({v[2] for v in values})))
        )

    p = make_pipeline(cfg)
    _ = p | beam.Create(list(range(n))) | beam.Reshuffle() | beam.ParDo(_Tag()) | beam.GroupByKey() | beam.Map(write)
    result = p.run()
    result.wait_until_finish()
    rows = {f.name: eval(f.read_text()) for f in sorted(folder.iterdir())}  # our own repr
    return rows, counters(result, "t")


def _children() -> set[int]:
    me = str(os.getpid())
    kids = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                kids.add(int(pid))
    return kids


def test_local_runner_choice():
    assert isinstance(local_runner(BeamConfig(num_workers=2)), ForkingFnApiRunner)
    assert local_runner(BeamConfig(num_workers=1)) is None  # in-process, no workers to start
    assert local_runner(BeamConfig(num_workers=2, fork_workers=False)) is None  # Beam's own
    # DirectRunner is run as Beam's local FnApiRunner (never Prism's download): the same forked workers
    assert isinstance(local_runner(BeamConfig(runner="DirectRunner", num_workers=2)), ForkingFnApiRunner)


def test_forked_workers_match_and_are_forked(tmp_path):
    before = _children()
    forked, forked_counts = _collect(BeamConfig(num_workers=2), tmp_path)
    again, _ = _collect(BeamConfig(num_workers=2), tmp_path)  # back to back in one process
    fresh, fresh_counts = _collect(BeamConfig(num_workers=2, fork_workers=False), tmp_path)
    single, _ = _collect(BeamConfig(num_workers=1), tmp_path)  # in process
    assert len(forked) == 7
    assert sorted(sq for squares, _, _ in forked.values() for sq in squares) == [x * x for x in range(400)]
    assert forked_counts == fresh_counts == {"seen": 400}
    for name in forked:
        squares, marks, _pids = forked[name]
        assert squares == fresh[name][0] == again[name][0] == single[name][0]
        assert marks == [True]  # a forked worker carries the driver's modules
        assert fresh[name][1] == [False]  # Beam's worker is a fresh interpreter
    assert _children() == before  # every forked process reaped


class _Boom(beam.DoFn):
    def process(self, x):
        if x == 13:
            raise ValueError("bad record 13")
        yield x


def test_worker_error_reaches_the_driver():
    before = _children()
    p = make_pipeline(BeamConfig(num_workers=2))
    _ = p | beam.Create(list(range(40))) | beam.Reshuffle() | beam.ParDo(_Boom())
    with pytest.raises(Exception, match="bad record 13"):
        p.run().wait_until_finish()
    assert _children() == before
