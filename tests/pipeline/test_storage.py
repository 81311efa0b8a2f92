"""The commit rule of ``pipeline.schema.storage.write_atomically``: a rename on local folders, one object
write (never a rename) on object stores, checked on memory:// and on the GCS emulator."""

import logging
import os

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from pipeline.schema import storage
from pipeline.schema.manifest import read_manifest, write_manifest
from pipeline.schema.storage import write_atomically


def test_local_write_replaces_the_whole_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "deep" / "er" / "config.json"
    write_atomically(str(target), '{"a": 1}\n')
    assert target.read_text() == '{"a": 1}\n'
    write_atomically(str(target), b"\x00binary")
    assert target.read_bytes() == b"\x00binary"
    assert os.listdir(target.parent) == ["config.json"]


def test_local_write_that_fails_keeps_the_old_file_and_cleans_up(tmp_path, monkeypatch):
    target = tmp_path / "_manifest.json"
    target.write_text("old, complete")

    def refuse(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(storage.os, "replace", refuse)
    with pytest.raises(OSError, match="disk gone"):
        write_atomically(str(target), "new")
    assert target.read_text() == "old, complete"
    assert os.listdir(tmp_path) == ["_manifest.json"]  # the temporary file is gone too


def test_object_stores_get_one_write_and_no_rename(monkeypatch):
    def no_rename(self, *args, **kwargs):
        raise AssertionError("an object store must not be committed by a rename")

    for name in ("mv", "_mv", "rename", "copy", "cp_file"):
        monkeypatch.setattr(MemoryFileSystem, name, no_rename, raising=False)
    url = "memory://commit-test/stage"
    write_manifest("vocab", url, {"size": 2}, {}, {"vocab_size": 2}, files=[])
    write_atomically(url + "/vocab.txt", "[PAD]\n")
    fs, path = fsspec.core.url_to_fs(url)
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.find(path)) == ["_manifest.json", "vocab.txt"]
    assert read_manifest(url).counts == {"vocab_size": 2}
    fs.rm(path, recursive=True)


def test_manifests_on_gcs_are_one_quiet_upload(gcs_bucket, monkeypatch, caplog):
    """Against the emulator (no moveTo API): a rename would log gcsfs's 501 traceback and take
    30-40 s; the commit is a single upload, read back whole, with nothing logged by gcsfs."""
    import gcsfs

    def no_rename(self, *args, **kwargs):
        raise AssertionError("manifests on gs:// must not be renamed into place")

    for name in ("mv", "_mv", "_mv_file", "_cp_file", "copy"):
        monkeypatch.setattr(gcsfs.GCSFileSystem, name, no_rename, raising=False)
    caplog.set_level(logging.DEBUG, logger="gcsfs")
    stage = f"{gcs_bucket}/run/vocab"
    write_atomically(f"{stage}/vocab.txt", "[PAD]\n[UNK]\n")
    first = write_manifest("vocab", stage, {"size": 2}, {"corpus": "f00"}, {"vocab_size": 2})
    second = write_manifest("vocab", stage, {"size": 3}, {"corpus": "f00"}, {"vocab_size": 3})  # overwrite
    assert first.files == second.files and [f.path for f in first.files] == ["vocab.txt"]
    again = read_manifest(stage)
    assert again.config == {"size": 3} and again.fingerprint == second.fingerprint
    fs, path = fsspec.core.url_to_fs(stage)
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.find(path)) == ["_manifest.json", "vocab.txt"]
    assert not [r for r in caplog.records if r.name.startswith("gcsfs") and r.levelno >= logging.WARNING]
