import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.beam.io import WriteShards, fill_empty_shards, parquet_rows, shard_name, stable_shard

SCHEMA = pa.schema([("id", pa.string()), ("value", pa.int64())])


def _write(out, rows, num_shards, extra=()):
    opts = PipelineOptions(["--runner=FnApiRunner", *extra])
    with beam.Pipeline(options=opts) as p:
        _ = p | beam.Create(rows) | WriteShards(str(out), SCHEMA, num_shards, key_fn=lambda r: r["id"])
    return fill_empty_shards(str(out), SCHEMA, num_shards)


def test_shards_are_deterministic_and_complete(tmp_path):
    rows = [{"id": f"doc-{i}", "value": i} for i in range(200)]
    a = _write(tmp_path / "a", rows, 4)
    b = _write(tmp_path / "b", list(reversed(rows)), 4)
    assert [u.rsplit("/", 1)[1] for u in a] == [shard_name(i, 4) for i in range(4)]
    for ua, ub in zip(a, b):
        assert open(ua, "rb").read() == open(ub, "rb").read()  # input order does not matter
    assert sum(parquet_rows(u) for u in a) == 200
    for i, u in enumerate(a):
        ids = pq.read_table(u).column("id").to_pylist()
        assert ids == sorted(ids)
        assert all(stable_shard(x, 4) == i for x in ids)


def test_empty_shards_are_filled(tmp_path):
    urls = _write(tmp_path / "c", [{"id": "only", "value": 1}], 3)
    assert sorted(parquet_rows(u) for u in urls) == [0, 0, 1]
