"""Slow tier (`pytest -m slow`): the data stages on a 5 MB synthetic corpus.

Checks what the tiny sample is too small to show: the stages hold up on a corpus ten times the
sample, and the Beam jobs stay byte-identical with one worker or two.
"""

import pytest

from flows.presets import load_config
from flows.runner import run_stage
from pipeline.schema.manifest import read_manifest
from synth.corpus import write_corpus

pytestmark = pytest.mark.slow


def _run_data_stages(root, data, workers):
    cfg = load_config(
        "tiny",
        {
            "data.wiki": str(data / "wiki"),
            "data.books": str(data / "books"),
            "corpus.beam.num_workers": workers,
            "examples.beam.num_workers": workers,
            "examples.dupe_factor": 2,
        },
    )
    return [run_stage(s, cfg, str(root)) for s in ("corpus", "vocab", "examples")]


def test_data_stages_on_5mb_are_identical_with_one_or_two_workers(tmp_path):
    data = tmp_path / "data"
    write_corpus(str(data), 5_000_000, seed=11)
    one = _run_data_stages(tmp_path / "one", data, 1)
    two = _run_data_stages(tmp_path / "two", data, 2)
    assert one[0].counts["documents"] > 1000
    assert one[1].counts["vocab_size"] == 4096
    for a, b in zip(one, two):
        fa = {f.path: f.sha256 for f in read_manifest(a.url).files}
        fb = {f.path: f.sha256 for f in read_manifest(b.url).files}
        assert fa == fb, a.stage
