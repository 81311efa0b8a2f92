"""A dump's bz2 through indexed_bzip2's decoder: the same bytes as the stdlib's, and where the
data fails (a cut, a flipped bit, bytes after the last stream, not bz2 at all) the same output
before the fault and the same error, which the stdlib's decompressor decides."""

import bz2
import io
import random

import pytest

from pipeline.corpus import compressed
from pipeline.corpus.compressed import file_chunks, inflate, raw_chunks

pytest.importorskip("indexed_bzip2")


def _text(mb: float) -> bytes:
    rng = random.Random(7)
    words = [f"w{i}" for i in range(5000)]
    out, size = [], 0
    while size < mb * 1e6:
        line = " ".join(rng.choice(words) for _ in range(12)) + ".\n"
        out.append(line)
        size += len(line)
    return "".join(out).encode()


GOOD = bz2.compress(_text(2.5))  # 3 blocks of 900k


def _cases() -> dict[str, bytes]:
    rng = random.Random(1)
    cases = {
        "sound": GOOD,
        "two streams": GOOD + bz2.compress(b"second stream\n"),
        "empty": b"",
        "trailing garbage": GOOD + b"xyz",
        "zero padding": GOOD + b"\0" * 8,
        "header only": b"BZh9",
        "cut in the middle": GOOD[: len(GOOD) // 2],
        "cut before the end marker": GOOD[:-3],
        "second stream cut": GOOD + GOOD[:500],
        "not bz2": b"<mediawiki>" * 50,
    }
    for _ in range(4):
        flipped = bytearray(GOOD)
        pos = rng.randrange(100, len(flipped))
        flipped[pos] ^= 1 << rng.randrange(8)
        cases[f"bit flipped at {pos}"] = bytes(flipped)
    return cases


def _drain(chunks):
    out = []
    try:
        for chunk in chunks:
            out.append(chunk)
    except Exception as exc:
        return b"".join(out), (type(exc), str(exc))
    return b"".join(out), None


@pytest.mark.parametrize("name", list(_cases()))
def test_the_fast_decoder_gives_the_stdlib_s_bytes_and_errors(tmp_path, name):
    data = _cases()[name]
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(data)
    want = _drain(inflate(raw_chunks(io.BytesIO(data)), "bz2"))
    got = _drain(file_chunks(str(path), fast_bz2=True))
    assert got[1] == want[1]
    assert got[0] == want[0]
    if name in ("sound", "two streams"):
        assert got[1] is None and len(got[0]) > 2_000_000
    elif name != "empty":
        assert got[1] is not None  # every damaged file is said


def test_a_sound_file_is_decoded_once_by_the_fast_decoder(tmp_path, monkeypatch):
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(GOOD)
    made = []
    real = compressed._indexed_bzip2()

    class Counting:
        def IndexedBzip2File(self, *args, **kwargs):  # noqa: N802 (the library's name)
            made.append(1)
            return real.IndexedBzip2File(*args, **kwargs)

    monkeypatch.setattr(compressed, "_indexed_bzip2", lambda: Counting())
    monkeypatch.setattr(compressed, "inflate", lambda *a: pytest.fail("the stdlib path ran on a sound file"))
    assert b"".join(file_chunks(str(path), fast_bz2=True)) == bz2.decompress(GOOD)
    assert made == [1]


def test_without_the_fast_decoder_or_unasked_the_stdlib_reads(tmp_path, monkeypatch):
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(GOOD[:-3])
    monkeypatch.setattr(compressed, "_indexed_bzip2", lambda: None)
    for fast in (True, False):
        data, error = _drain(file_chunks(str(path), fast_bz2=fast))
        assert error[0] is compressed.TruncatedInput and len(data) > 2_000_000


@pytest.mark.parametrize("name", ["sound", "cut in the middle", "trailing garbage"])
def test_fast_bz2_on_gcs(gcs_bucket, name):  # a short name: the bucket is named after it
    """gcsfs's file object (seekable, read through Python) under the fast decoder, on the local
    GCS emulator: the same bytes and error as the stdlib's."""
    import fsspec

    data = _cases()[name]
    url = f"{gcs_bucket}/dump.xml.bz2"
    with fsspec.open(url, "wb") as f:
        f.write(data)
    want = _drain(inflate(raw_chunks(io.BytesIO(data)), "bz2"))
    assert _drain(file_chunks(url, fast_bz2=True)) == want
