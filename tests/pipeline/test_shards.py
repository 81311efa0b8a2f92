"""Sorted runs and their streaming merge: global key order, balanced shards, same bytes
whatever the runs' split."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.beam import shards
from pipeline.beam.io import shard_name
from pipeline.beam.shards import KEY, RunWriter, merge_runs

SCHEMA = pa.schema([pa.field("k", pa.uint64()), pa.field("ids", pa.list_(pa.uint16()))])


def make_rows(n: int, seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        key = rng.getrandbits(64)
        rows.append({"k": key, "ids": [rng.randrange(1000) for _ in range(rng.randint(1, 9))], KEY: key})
    return rows


def write_runs(tmp_path, rows, parts: int, budget: int) -> list[tuple[str, int]]:
    runs = []
    for p in range(parts):
        w = RunWriter(SCHEMA, lambda r, p=p: str(tmp_path / f"p{p}-r{r:03d}.parquet"), budget_bytes=budget)
        for row in rows[p::parts]:
            w.add(dict(row))
        runs += w.close()
    return sorted(runs)


def read_shards(folder, k):
    return [pq.read_table(folder / shard_name(j, k)) for j in range(k)]


def test_runs_are_sorted_and_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "CONVERT_ROWS", 100)
    rows = make_rows(5000)
    runs = write_runs(tmp_path, rows, parts=1, budget=20_000)
    assert len(runs) > 3 and sum(n for _, n in runs) == 5000
    for url, n in runs:
        keys = pq.read_table(url).column(KEY).to_pylist()
        assert keys == sorted(keys) and len(keys) == n


def test_merge_gives_the_global_order_in_balanced_shards(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "CONVERT_ROWS", 128)
    monkeypatch.setattr(shards, "SHARD_ROW_GROUP", 300)
    monkeypatch.setattr(shards, "MERGE_BUDGET_BYTES", 40_000)  # small read batches: many rounds
    rows = make_rows(7003)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = write_runs(tmp_path / "a", rows, parts=1, budget=1 << 30)
    many = write_runs(tmp_path / "b", rows, parts=5, budget=30_000)
    assert len(one) == 1 and len(many) > 5
    for runs, out in ((one, tmp_path / "one"), (many, tmp_path / "many")):
        counts = merge_runs(runs, str(out), SCHEMA, 4, shard_name, row_bytes=64)
        assert counts == [1750, 1751, 1751, 1751]
        tables = read_shards(out, 4)
        assert [t.num_rows for t in tables] == counts
        assert all(t.schema.equals(SCHEMA) for t in tables)  # the key column is dropped
        got = [r for t in tables for r in t.to_pylist()]
        assert got == sorted(({"k": r["k"], "ids": r["ids"]} for r in rows), key=lambda r: r["k"])
    for j in range(4):  # the split into runs leaves no trace in the bytes
        name = shard_name(j, 4)
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "many" / name).read_bytes()


def test_fewer_rows_than_shards_leaves_empty_shards(tmp_path):
    rows = make_rows(2)
    runs = write_runs(tmp_path, rows, parts=1, budget=1 << 20)
    counts = merge_runs(runs, str(tmp_path / "out"), SCHEMA, 5, shard_name)
    assert sorted(counts) == [0, 0, 0, 1, 1]
    assert [t.num_rows for t in read_shards(tmp_path / "out", 5)] == counts
    assert merge_runs([], str(tmp_path / "none"), SCHEMA, 2, shard_name) == [0, 0]


def test_merging_in_levels_gives_the_same_bytes_and_reads_few_runs_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "CONVERT_ROWS", 64)
    rows = make_rows(4001)
    # equal keys in different runs: the tie-break by run order must survive the grouping
    for i in range(0, 200, 2):
        rows[i + 1][KEY] = rows[i][KEY]
    (tmp_path / "runs").mkdir()
    runs = write_runs(tmp_path / "runs", rows, parts=7, budget=2_000)
    assert len(runs) > 20
    calls = []
    real_merge = shards.merge_runs

    def recording_merge(group, *args, **kwargs):
        calls.append(len([r for r in group if r[1]]))
        return real_merge(group, *args, **kwargs)

    flat = merge_runs(runs, str(tmp_path / "flat"), SCHEMA, 3, shard_name)
    monkeypatch.setattr(shards, "merge_runs", recording_merge)
    work = tmp_path / "work"
    levels = shards.merge_runs_in_levels(runs, str(work), str(tmp_path / "levels"), SCHEMA, 3, shard_name, max_fan_in=4)
    assert levels == flat
    for j in range(3):
        assert (tmp_path / "levels" / shard_name(j, 3)).read_bytes() == (
            tmp_path / "flat" / shard_name(j, 3)
        ).read_bytes()
    assert max(calls) <= 4 and len(calls) > len(runs) // 4  # several levels, never more than 4 runs at once
    # the producers' runs are their owner's to remove; intermediate runs of all but the last level are gone
    assert all((tmp_path / "runs" / url.rsplit("/", 1)[1]).exists() for url, _ in runs)
    left = {p.name.split("-")[0] for p in work.iterdir()}
    assert len(left) == 1 and len(list(work.iterdir())) <= 4


def test_transient_files_round_trip_uncompressed_locally_and_zstd_on_other_stores(tmp_path):
    """A job's work files (a handing-off reader's record batches): every row back as written
    (nulls, any script, empty text); no compression on a local disk, zstd elsewhere (fsspec's
    memory store stands for an object store); a cut file is an error, never fewer rows."""
    import fsspec
    import pyarrow.lib

    schema = pa.schema([("doc_id", pa.string(), False), ("title", pa.string()), ("text", pa.string(), False)])
    rows = [{"doc_id": f"wiki:{i}", "title": None if i % 3 else f"T{i}", "text": "Zürich 東京 . " * 2000}
            for i in range(20)] + [{"doc_id": "wiki:empty", "title": "", "text": ""}]  # fmt: skip
    raw = sum(len(r["text"].encode()) for r in rows)
    local = str(tmp_path / "work" / "batches" / "a.arrows")  # parent folders made as needed
    shards.write_transient(local, pa.Table.from_pylist(rows, schema=schema))
    assert shards.read_transient(local) == rows
    assert (tmp_path / "work" / "batches" / "a.arrows").stat().st_size > raw  # not compressed

    remote = "memory://bucket/work/batches/b.arrows"
    shards.write_transient(remote, pa.Table.from_pylist(rows, schema=schema))
    assert shards.read_transient(remote) == rows
    assert fsspec.filesystem("memory").size("/bucket/work/batches/b.arrows") < raw / 20  # zstd

    data = (tmp_path / "work" / "batches" / "a.arrows").read_bytes()
    cut = tmp_path / "cut.arrows"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises((pyarrow.lib.ArrowInvalid, OSError)):
        shards.read_transient(str(cut))


BIG = pa.schema([pa.field("k", pa.uint64()), pa.field("text", pa.string())])


def _merge_peak(tmp_path, runs: int) -> tuple[int, list[int]]:
    """Peak Arrow bytes of merging ``runs`` runs of 100 KB rows (whole books), and the most rows
    in a row group of any run file read or written."""
    rng = random.Random(runs)
    folder = tmp_path / f"runs{runs}"
    folder.mkdir()
    urls = []
    for p in range(runs):
        w = RunWriter(BIG, lambda r, p=p: str(folder / f"p{p}-r{r:03d}.parquet"), budget_bytes=1 << 30)
        for _ in range(60):
            key = rng.getrandbits(64)
            w.add({"k": key, "text": rng.randbytes(50_000).hex(), KEY: key})
        urls += w.close()
    pool, default = pa.proxy_memory_pool(pa.system_memory_pool()), pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        shards.merge_runs_in_levels(
            sorted(urls), str(tmp_path / f"work{runs}"), str(tmp_path / f"out{runs}"), BIG, 2, shard_name,
            row_bytes=100_000, max_fan_in=8, budget_bytes=4 << 20, level_row_group_rows=128, row_group_rows=8,
        )  # fmt: skip
    finally:
        pa.set_memory_pool(default)
    files = [*folder.iterdir(), *((tmp_path / f"work{runs}").glob("*.parquet"))]
    metas = [pq.ParquetFile(f).metadata for f in files]
    groups = [m.row_group(i).num_rows for m in metas for i in range(m.num_row_groups)]
    return pool.max_memory(), groups


def test_a_merge_of_large_rows_holds_about_the_same_whatever_its_number_of_runs(tmp_path):
    """A merge holds one row group of each run it reads (decompressed whole): run files'
    row groups are bounded in bytes (RUN_ROW_GROUP_BYTES), not only in rows, so merging 8 runs
    of 100 KB rows holds about what merging 2 does (16.1 and 17.2 MB; with 1,024-row groups and
    at least 16 rows a round, 81.0 and 27.2 MB)."""
    small, small_groups = _merge_peak(tmp_path, 2)
    large, large_groups = _merge_peak(tmp_path, 8)
    assert max(small_groups + large_groups) <= shards.RUN_ROW_GROUP_BYTES // 100_000
    assert large < 1.6 * small, (small, large)


def test_transient_files_are_read_a_few_rows_at_a_time(tmp_path):
    """A corpus fragment (1,000 documents, paragraphs as lists of sentences) is written in record
    batches of TRANSIENT_ROWS rows and read back a batch at a time: the same rows as a whole read,
    and never the file's bytes (a Python file hands a batch over as one bytes object) nor all its
    rows at once (measured: 0.47 MB against 2.7 MB of file, 4.6 MB for a whole read)."""
    from tests.pipeline.test_dumps import peak_bytes

    schema = pa.schema([("doc_id", pa.string()), ("paragraphs", pa.list_(pa.list_(pa.string())))])
    rng = random.Random(5)
    rows = [
        {"doc_id": f"wiki:{i}", "paragraphs": [[f"Sentence {rng.random()} of {i}." * 3] * 6] * 4} for i in range(1000)
    ]
    url = str(tmp_path / "fragment.arrows")
    shards.write_transient(url, pa.Table.from_pylist(rows, schema=schema))
    assert list(shards.iter_transient(url)) == rows == shards.read_transient(url)

    count = sum(1 for _ in shards.iter_transient(url))  # lazy imports made before the counts
    whole = peak_bytes(lambda: shards.read_transient(url))
    streamed = peak_bytes(lambda: sum(1 for _ in shards.iter_transient(url)))
    size = (tmp_path / "fragment.arrows").stat().st_size
    assert count == len(rows)
    assert whole > size * 1.5  # the file's bytes, then every row as Python objects
    assert streamed * 4 < size, (streamed, whole, size)


def test_a_run_writer_holds_about_a_megabyte_of_python_rows_whatever_their_size(tmp_path):
    """Rows wait as Python objects until they are converted to Arrow: at most CONVERT_ROWS of
    small rows, and about CONVERT_BYTES of large ones (whole books: 100 KB each; 512 of them were
    held at once before), measured on the rows converted so far; the runs hold every row in key
    order either way."""
    rng = random.Random(11)

    def most_held(text_bytes: int, n: int) -> int:
        w = RunWriter(BIG, lambda r: str(tmp_path / f"{text_bytes}-{r:03d}.parquet"), budget_bytes=1 << 30)
        most, rows = 0, []
        for _ in range(n):
            key = rng.getrandbits(64)
            rows.append({"k": key, "text": rng.randbytes(text_bytes // 2).hex(), KEY: key})
            w.add(dict(rows[-1]))
            most = max(most, len(w.rows))
        [(url, count)] = w.close()
        assert count == n and pq.read_table(url).column("k").to_pylist() == sorted(r["k"] for r in rows)
        return most

    assert most_held(100_000, 200) <= shards.FIRST_CONVERT_ROWS
    assert most_held(100, 2000) == shards.CONVERT_ROWS - 1  # converted as the 512th arrives
