"""A dump read by a child process, a thread or inline: the same pages and events, in order."""

import dataclasses
import sys

import pytest

import pipeline.corpus.wiki_reader as dr
from pipeline.beam.config import BeamConfig
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.job import run_corpus
from pipeline.corpus.wiki_reader import read_wiki
from synth.dumps import FOOTER, HEADER, pages_xml, stream_ends, write_multistream


def faulty_dump(tmp_path):
    """A multistream dump with a malformed page and a cut in its last page stream."""
    pages = pages_xml(120)
    pages[10] = pages[10].replace("<ns>0</ns>", "<ns>0</nss>")
    path, _ = write_multistream(tmp_path / "w-multistream.xml.bz2", pages, per_stream=20)
    data = path.read_bytes()
    ends = stream_ends(path)
    path.write_bytes(data[: (ends[-3] + ends[-2]) // 2])
    return str(path), ends


def test_every_reader_yields_the_same_items(tmp_path):
    url, ends = faulty_dump(tmp_path)
    plain = tmp_path / "plain.xml"  # invalid UTF-8 and a <page> never closed
    pages = pages_xml(30)
    pages[12] = pages[12].replace("</page>", "")
    plain.write_bytes((HEADER + "".join(pages) + FOOTER).encode().replace(b"Thing 21</title>", b"Thing 21\xff</title>"))
    for source, args in [(url, ()), (url, (ends[1], ends[3])), (url, (None, None, 1 << 20, 1, 3)), (str(plain), ())]:
        items = {mode: list(read_wiki(source, *args, reader=mode)) for mode in ("thread", "inline", "process")}
        assert items["process"] == items["thread"] == items["inline"]
    everything = list(read_wiki(url, reader="process"))
    reasons = [i.reason for i in everything if not hasattr(i, "page_id")]
    assert reasons == ["malformed_xml", "truncated_file"]
    assert len([i for i in everything if hasattr(i, "page_id")]) == 99  # the last stream lost to the cut
    reasons = [i.reason for i in read_wiki(str(plain), reader="process") if not hasattr(i, "page_id")]
    assert reasons == ["unclosed_page", "invalid_utf8"]


def test_a_reader_process_that_dies_is_an_error_naming_the_file(tmp_path, monkeypatch):
    url, _ = faulty_dump(tmp_path)
    monkeypatch.setattr(sys, "executable", "/bin/false")  # exits 1 before writing anything
    with pytest.raises(RuntimeError, match="reader process of .*w-multistream.xml.bz2.*exit code 1"):
        list(read_wiki(url, reader="process"))


def test_reader_mode_follows_the_cores_per_worker(monkeypatch):
    for cores, runner, workers, mode in [
        (1, "FnApiRunner", 1, "inline"),
        (2, "FnApiRunner", 1, "process"),
        (2, "FnApiRunner", 2, "inline"),  # a core per worker: no core for a thread
        (3, "FnApiRunner", 2, "thread"),
        (8, "FnApiRunner", 4, "process"),
        (8, "FnApiRunner", 8, "inline"),
        (8, "DataflowRunner", 1, "thread"),
        (1, "DataflowRunner", 1, "inline"),
    ]:
        monkeypatch.setattr(dr, "available_cores", lambda cores=cores: cores)
        assert dr.wiki_reader_mode("auto", runner, workers) == mode
    assert dr.wiki_reader_mode("thread", "FnApiRunner", 1) == "thread"
    with pytest.raises(ValueError, match="corpus.wiki_reader"):
        CorpusConfig(wiki_reader="fork")


def test_the_corpus_is_the_same_whatever_the_reader(tmp_path):
    path = tmp_path / "raw" / "w.xml.bz2"
    path.parent.mkdir()
    import bz2

    pages = pages_xml(40)
    pages[5] = pages[5].replace("<ns>0</ns>", "<ns>0</nss>")
    path.write_bytes(bz2.compress((HEADER + "".join(pages) + pages[7] + FOOTER).encode()))
    outputs = []
    for mode in ("process", "inline"):
        cfg = CorpusConfig(sources=("wiki",), num_shards=2, wiki_reader=mode, beam=BeamConfig(num_workers=1))
        m = run_corpus(cfg, {"wiki": str(path)}, str(tmp_path / mode))
        outputs.append(({f.path: f.sha256 for f in m.files}, m.counts))
    assert outputs[0] == outputs[1]
    assert outputs[0][1]["malformed_xml"] == 1 and outputs[0][1]["read"] == 41
    assert dataclasses.replace(cfg, wiki_reader="auto").wiki_reader == "auto"


def test_a_reader_process_stopped_and_continued_loses_nothing(tmp_path, monkeypatch):
    """A writer stopped and continued mid-batch (SIGSTOP/SIGCONT; a profiler's ptrace stops do
    the same) made a buffered read return short: the frames slipped (UnicodeDecodeError, or the
    end taken for a dead reader). Every item still arrives, in order."""
    import os
    import signal
    import subprocess
    import threading
    import time

    path, _ = write_multistream(tmp_path / "big-multistream.xml.bz2", pages_xml(1500), per_stream=50)
    expected = list(read_wiki(str(path), reader="inline"))
    started, real_popen, done = [], subprocess.Popen, threading.Event()

    def popen(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        return proc

    def poke():
        while not done.is_set():
            for proc in started:
                try:
                    os.kill(proc.pid, signal.SIGSTOP)
                    os.kill(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            time.sleep(0.002)

    monkeypatch.setattr(dr.subprocess, "Popen", popen)
    poker = threading.Thread(target=poke, daemon=True)
    poker.start()
    try:
        for _ in range(3):
            assert list(read_wiki(str(path), reader="process")) == expected
    finally:
        done.set()
        poker.join()
    assert len(started) == 3 and sum(len(getattr(i, "text", "")) for i in expected) > 3 * dr.BATCH_BYTES
