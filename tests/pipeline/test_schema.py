import json

import pyarrow as pa
import pytest

from pipeline.schema.manifest import (
    ManifestError,
    clear_stage,
    fingerprint_input,
    has_manifest,
    read_manifest,
    write_manifest,
)
from pipeline.schema.parquet import example_schema


def test_manifest_round_trip_and_fingerprint(tmp_path):
    stage = tmp_path / "vocab"
    stage.mkdir()
    (stage / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (stage / "sub").mkdir()
    (stage / "sub" / "x.bin").write_bytes(b"abc")
    m = write_manifest("vocab", str(stage), {"size": 2, "lens": (64, 128)}, {"corpus": "f00"}, {"vocab_size": 2})
    assert [f.path for f in m.files] == ["sub/x.bin", "vocab.txt"]
    assert m.files[0].size == 3
    again = read_manifest(str(stage))
    assert again.fingerprint == m.fingerprint
    assert again.matches({"size": 2, "lens": [64, 128]}, {"corpus": "f00"})
    assert not again.matches({"size": 3, "lens": [64, 128]}, {"corpus": "f00"})
    assert not again.matches({"size": 2, "lens": [64, 128]}, {"corpus": "changed"})
    assert json.loads((stage / "_manifest.json").read_text())["fingerprint"] == m.fingerprint
    # a changed output file changes the fingerprint that downstream stages record
    (stage / "vocab.txt").write_text("[PAD]\n[UNK]\nx\n")
    m2 = write_manifest("vocab", str(stage), {"size": 2, "lens": (64, 128)}, {"corpus": "f00"}, {})
    assert m2.fingerprint != m.fingerprint
    assert fingerprint_input(str(stage)) == m2.fingerprint


def test_unfinished_folder_is_refused(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "part-0.parquet").write_bytes(b"half")
    assert not has_manifest(str(tmp_path / "corpus"))
    with pytest.raises(ManifestError, match="did not finish"):
        read_manifest(str(tmp_path / "corpus"))
    (tmp_path / "corpus" / "_manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not a valid manifest"):
        read_manifest(str(tmp_path / "corpus"))
    clear_stage(str(tmp_path / "corpus"))
    assert not (tmp_path / "corpus").exists()


def test_raw_input_fingerprint_follows_files(tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").write_text("one")
    fp = fingerprint_input(str(books))
    assert fingerprint_input(str(books)) == fp
    (books / "b.txt").write_text("two")
    assert fingerprint_input(str(books)) != fp
    with pytest.raises(FileNotFoundError):
        fingerprint_input(str(tmp_path / "missing"))


def test_example_schema_uses_narrow_types():
    assert example_schema(30522, 512).field("input_ids").type == pa.list_(pa.uint16())
    assert example_schema(70000, 512).field("input_ids").type == pa.list_(pa.uint32())
    assert example_schema(30522, 512).field("len_a").type == pa.uint16()
