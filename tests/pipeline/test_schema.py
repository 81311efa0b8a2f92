import json
import os

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

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "data", "sample")


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


def _swap_same_length_words(text: str, count: int) -> str:
    """``count`` words replaced by other words of the same length (the file keeps its size)."""
    import re

    words = re.findall(r"\b[a-z]{5}\b", text)
    assert len(words) >= 2
    out, done = text, 0
    for word in dict.fromkeys(words):
        other = next(w for w in words if w != word)
        out, n = re.subn(rf"\b{word}\b", other, out, count=count - done)
        done += n
        if done >= count:
            break
    assert done >= count and len(out) == len(text) and out != text
    return out


def test_a_same_size_edit_of_a_raw_input_changes_its_fingerprint(tmp_path):
    """Issue 19 point 10: 40 same-length word swaps in one book of the bundled sample (written by
    synth/) left the fingerprint (names and sizes) unchanged, so `status` said the corpus was done."""
    import shutil

    books = tmp_path / "books"
    shutil.copytree(os.path.join(SAMPLE, "books"), books)
    fp = fingerprint_input(str(books))
    book = sorted(books.iterdir())[0]
    size = book.stat().st_size
    book.write_text(_swap_same_length_words(book.read_text(), 40))
    assert book.stat().st_size == size
    assert fingerprint_input(str(books)) != fp
    # the same for a single file and for a glob
    dump = tmp_path / "dump.xml"
    dump.write_bytes(b"<page>" + b"x" * 5000 + b"</page>")
    one, glob = fingerprint_input(str(dump)), fingerprint_input(str(tmp_path / "*.xml"))
    dump.write_bytes(b"<page>" + b"y" * 5000 + b"</page>")
    assert fingerprint_input(str(dump)) != one and fingerprint_input(str(tmp_path / "*.xml")) != glob


def test_a_large_input_is_sampled_and_a_store_checksum_is_used_unread(tmp_path):
    """Past FULL_HASH_BYTES a file is fingerprinted by its size and sampled blocks (its first and
    last bytes among them), never read whole; on an object store its own checksum is used."""
    import fsspec

    from pipeline.schema import manifest as m

    big = tmp_path / "big.bin"
    size = m.FULL_HASH_BYTES + (3 << 20)
    with open(big, "wb") as f:
        f.truncate(size)
    fs = fsspec.filesystem("file")
    reads: list[int] = []
    real_open = fs.open

    def counting_open(path, mode="rb", **kw):
        f = real_open(path, mode, **kw)
        real_read = f.read
        f.read = lambda n=-1: (data := real_read(n), reads.append(len(data)))[0]
        return f

    fs.open = counting_open
    before = m.content_digest(fs, str(big))
    assert sum(reads) == m.SAMPLE_BLOCKS * m.SAMPLE_BYTES  # 4 MiB of an 11 MiB file
    for offset in (0, size - 1):  # an edit of a sampled block: the first or the last byte
        with open(big, "r+b") as f:
            f.seek(offset)
            f.write(b"\x01")
        assert m.content_digest(fs, str(big)) != before
        with open(big, "r+b") as f:
            f.seek(offset)
            f.write(b"\x00")
    assert m.content_digest(fs, str(big)) == before
    # gs:// (gcsfs) reports crc32c and md5Hash: the fingerprint comes from info(), nothing is read
    info = {"size": 10, "crc32c": "yZRlqg==", "md5Hash": "XrY7u+Ae7tCTyyK7j1rNww=="}
    assert m.content_digest(fs, str(tmp_path / "not-there"), info) == "crc32c:yZRlqg=="
