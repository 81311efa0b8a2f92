"""The streaming loader: contract of a batch, disjoint parts, seeded order, exact resume,
the same global batch for any number of processes and workers, dynamic masking, bounded memory."""

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from pretrain_shards import CLS, MASK, SEP, MaskRule, V, write_example_stage

from model.data import apply_dynamic_masking, padded_length, shard_urls
from model.stream import LoaderSpec, PartStream, StreamingLoader, plan_units, split_units
from pipeline.schema.manifest import read_manifest


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    # 3 shards of 80 rows in row groups of 16: 15 units
    return write_example_stage(tmp_path_factory.mktemp("examples"), n=240, shards=3, row_group_size=16)


def urls(examples, T=16):
    return tuple(shard_urls(read_manifest(examples), T))


def spec(examples, **kw):
    base = dict(urls=urls(examples), batch_size=8, max_seq_length=16, seed=1, key="p", buffer_size=40, vocab_size=V)
    return LoaderSpec(**{**base, **kw})


def rows_by_key(examples):
    out = {}
    for s, url in enumerate(urls(examples)):
        for r, row in enumerate(pq.read_table(url).to_pylist()):
            out[(s, r)] = row
    return out


def test_batches_follow_the_contract(examples):
    loader = StreamingLoader(spec(examples, batch_size=7, num_parts=1))
    rows = rows_by_key(examples)
    for _ in range(3):
        b = next(loader)
        keys = [tuple(k) for k in loader.last_keys.tolist()]
        longest = max(len(rows[k]["input_ids"]) for k in keys)
        T = b["input_ids"].shape[1]
        assert T == padded_length(longest, 16) and T % 8 == 0 and T >= longest
        assert all(b[k].shape == (7, T) for k in ("input_ids", "token_type_ids", "attention_mask", "labels"))
        assert all(t.dtype == torch.long for t in b.values())
        for i, k in enumerate(keys):
            row = rows[k]
            n, la = len(row["input_ids"]), row["len_a"]
            assert b["input_ids"][i, :n].tolist() == row["input_ids"] and torch.all(b["input_ids"][i, n:] == 0)
            assert b["attention_mask"][i].tolist() == [1] * n + [0] * (T - n)
            assert b["token_type_ids"][i].tolist() == [0] * la + [1] * (n - la) + [0] * (T - n)
            expected = torch.full((T,), -100)
            expected[row["masked_positions"]] = torch.tensor(row["masked_ids"])
            assert torch.equal(b["labels"][i], expected)
            assert b["next_sentence_label"][i].item() == int(row["is_random_next"])


def test_padded_length():
    assert [padded_length(n, 128) for n in (1, 8, 9, 127, 128)] == [8, 8, 16, 128, 128]
    assert padded_length(20, 30) == 24 and padded_length(29, 30) == 30  # capped at the phase's length
    assert padded_length(40, 128, buckets=(32, 64, 128)) == 64
    with pytest.raises(ValueError, match="longer than every bucket"):
        padded_length(130, 128, buckets=(64, 128))


def test_parts_are_disjoint_and_cover_every_example(examples):
    units = plan_units(list(urls(examples)), 1)
    assert len(units) == 15 and sum(u.rows for u in units) == 240
    for n in (1, 2, 4, 7, 20):  # 20 > 15 row groups: units are split into row ranges
        parts = split_units(plan_units(list(urls(examples)), n), n)
        seen = []
        for p, part in enumerate(parts):
            stream = PartStream(list(urls(examples)), part, p, 1, "p", 30, 16, V)
            data, epochs = stream.examples(0, stream.epoch_rows)
            assert set(epochs.tolist()) == {0}
            seen += [tuple(k) for k in data.keys.tolist()]
        assert sorted(seen) == sorted(rows_by_key(examples)), n  # no overlap, no gap


def test_order_is_seeded_and_resume_continues_exactly(examples):
    a = StreamingLoader(spec(examples, num_parts=2))
    seq = [next(a)["input_ids"] for _ in range(70)]  # past two epochs (240 / 8 = 30 batches each)
    b = StreamingLoader(spec(examples, num_parts=2))
    assert all(torch.equal(x, next(b)["input_ids"]) for x in seq[:5])
    c = StreamingLoader(spec(examples, num_parts=2))
    c.set_position(61)
    assert torch.equal(next(c)["input_ids"], seq[61])
    assert c.position == 62
    other = StreamingLoader(spec(examples, num_parts=2, seed=2))
    assert not torch.equal(next(other)["input_ids"], seq[0])
    # a new epoch visits the same examples in another order
    keys = lambda loader, n: [tuple(k) for _ in range(n) for k in (next(loader), loader.last_keys)[1].tolist()]
    d = StreamingLoader(spec(examples, num_parts=1))
    e0, e1 = keys(d, 30), keys(d, 30)
    assert sorted(e0) == sorted(e1) == sorted(rows_by_key(examples)) and e0 != e1


def test_global_batch_is_the_same_for_any_number_of_ranks(examples):
    s = spec(examples, num_parts=4)
    whole = StreamingLoader(s)
    ranks = [StreamingLoader(s, rank=r, world_size=2) for r in (0, 1)]
    for _ in range(5):
        next(whole)
        parts = [(next(r), r.last_keys)[1] for r in ranks]
        assert np.array_equal(np.concatenate(parts), whole.last_keys)
        assert not set(map(tuple, parts[0].tolist())) & set(map(tuple, parts[1].tolist()))


def test_worker_processes_give_the_same_batches(examples):
    s = spec(examples, num_parts=2)
    inline, workers = StreamingLoader(s), StreamingLoader(s, num_workers=2)
    workers.set_position(3)
    inline.set_position(3)
    for _ in range(4):
        x, y = next(inline), next(workers)
        assert all(torch.equal(x[k], y[k]) for k in x)
    workers.set_position(0)
    inline.set_position(0)
    assert torch.equal(next(workers)["labels"], next(inline)["labels"])


def test_micro_batches_cut_the_local_batch(examples):
    whole = next(StreamingLoader(spec(examples, num_parts=2)))
    micro = StreamingLoader(spec(examples, num_parts=2), micro_batches=2).next_step()
    assert len(micro) == 2
    for k in whole:
        got = torch.cat([m[k][:, : whole[k].shape[1]] if m[k].dim() == 2 else m[k] for m in micro])
        if whole[k].dim() == 2:  # micro-batches may pad narrower
            w = max(m[k].shape[1] for m in micro)
            assert w <= whole[k].shape[1]
            got = torch.cat(
                [
                    torch.nn.functional.pad(
                        m[k], (0, whole[k].shape[1] - m[k].shape[1]), value=-100 if k == "labels" else 0
                    )
                    for m in micro
                ]
            )
        assert torch.equal(got, whole[k]), k


def test_dynamic_masking_through_the_injected_rule(examples):
    rule = MaskRule()
    dyn = StreamingLoader(spec(examples, num_parts=2, max_predictions=3), mask_fn=rule)
    static = StreamingLoader(spec(examples, num_parts=2))
    rows = rows_by_key(examples)
    b, s = next(dyn), next(static)
    keys = [tuple(k) for k in dyn.last_keys.tolist()]
    masked = b["labels"] != -100
    assert masked.sum(1).tolist() == [min(3, max(1, round(len(rows[k]["input_ids"]) * 0.15))) for k in keys]
    assert not torch.equal(masked, s["labels"] != -100)
    for i, k in enumerate(keys):  # labels are the original tokens; the rest is the unmasked text
        original = list(rows[k]["input_ids"])
        for p, t in zip(rows[k]["masked_positions"], rows[k]["masked_ids"]):
            original[p] = t
        n = len(original)
        m = masked[i, :n]
        assert b["labels"][i, :n][m].tolist() == torch.tensor(original)[m].tolist()
        assert b["input_ids"][i, :n][~m].tolist() == torch.tensor(original)[~m].tolist()
        assert not any(original[p] in (CLS, SEP) for p in torch.nonzero(m).flatten().tolist())
    frac = (b["input_ids"][masked] == MASK).float().mean().item()
    assert frac > 0.5
    # the same on every rank split, and a new epoch re-masks the same example differently
    ranks = [StreamingLoader(spec(examples, num_parts=2, max_predictions=3), r, 2, mask_fn=rule) for r in (0, 1)]
    halves = [next(r) for r in ranks]
    assert torch.equal(torch.cat([h["labels"][:, :8] for h in halves]), b["labels"][:, :8])
    stream = PartStream(list(urls(examples)), plan_units(list(urls(examples))), 0, 1, "p", 40, 16, V)
    data, _ = stream.examples(0, 8)
    masks = [apply_dynamic_masking(data, rule, 3, 1, "p", np.full(8, e)).pos.tolist() for e in (0, 0, 1)]
    assert masks[0] == masks[1] != masks[2]


def test_memory_is_bounded_by_the_buffer(examples):
    loader = StreamingLoader(spec(examples, num_parts=1, buffer_size=24))
    for _ in range(40):
        next(loader)
        stream = loader._streams[0]
        assert len(stream._window) <= 24
        assert len(stream._unit_cache[1]) <= 16  # one row group


def test_bad_input_is_named(examples, tmp_path):
    loader = StreamingLoader(spec(examples, max_seq_length=12, num_parts=1))
    with pytest.raises(
        ValueError, match=r"part-0000\d-of-00003.parquet row \d+: input_ids has \d+ tokens > max_seq_length 12"
    ):
        for _ in range(40):
            next(loader)
    with pytest.raises(ValueError, match="vocab_size 50"):
        next(StreamingLoader(spec(examples, vocab_size=50, num_parts=1)))
    with pytest.raises(ValueError, match="not divisible by the 3 data parts"):
        spec(examples, num_parts=3)


def test_reads_through_fsspec_urls(examples):
    import fsspec

    fs = fsspec.filesystem("memory")
    remote = []
    for u in urls(examples):
        target = f"memory://shards/{u.rsplit('/', 1)[1]}"
        with open(u, "rb") as src, fs.open(target, "wb") as dst:
            dst.write(src.read())
        remote.append(target)
    local, mem = (
        StreamingLoader(spec(examples, num_parts=2)),
        StreamingLoader(spec(examples, urls=tuple(remote), num_parts=2)),
    )
    for _ in range(3):
        a, b = next(local), next(mem)
        assert all(torch.equal(a[k], b[k]) for k in a)


def _arrays(url: str):
    stream = PartStream([url], plan_units([url]), 0, 1, "k", 10**6, 32, V, shuffle=False, max_predictions=5)
    a = stream.examples(0, stream.epoch_rows)[0]
    return [a.ids, a.ids_offsets, a.len_a, a.pos, a.pos_offsets, a.masked_ids, a.sentence_label]


def test_bit_flips_in_a_shard_never_decode_silently(tmp_path):
    """Issue 19 point 4: of 150 random single-bit flips in an example shard (zstd, as the examples
    stage wrote it), 88 decoded without error (77 into different examples, e.g. a masked position
    83 -> 4 that passed validate_examples) and 59 of the 62 errors named no file. With page
    checksums written and verified on every read and the contract checked, every flip that
    changes what the loader would train on is an error naming the shard (11 flips here land in
    bytes no reader uses, e.g. column statistics, and change nothing)."""
    import pathlib
    import random

    from model.data import ShardError

    root = write_example_stage(tmp_path / "examples", lengths=(32,), n=240, shards=1, seed=3)
    url = shard_urls(read_manifest(root), 32)[0]
    original = pathlib.Path(url).read_bytes()
    reference = _arrays(url)
    rng = random.Random(0)
    outcome = {"caught": 0, "unchanged": 0, "silently different": []}
    for i in range(150):
        bit = rng.randrange(len(original) * 8)
        data = bytearray(original)
        data[bit // 8] ^= 1 << (bit % 8)
        flipped = str(tmp_path / f"flip{i}.parquet")
        pathlib.Path(flipped).write_bytes(bytes(data))
        try:
            got = _arrays(flipped)
        except ShardError as exc:
            assert flipped in str(exc), exc
            outcome["caught"] += 1
            continue
        if all(np.array_equal(x, y) for x, y in zip(got, reference)):
            outcome["unchanged"] += 1
        else:
            outcome["silently different"].append(bit)
    assert outcome["silently different"] == [], outcome
    assert outcome["caught"] >= 130, outcome


def test_the_example_contract_is_checked_row_by_row():
    """Positions out of order, on [CLS] or [SEP], past the cap; each names the row."""
    from model.data import ExampleArrays, validate_examples

    def one(pos, len_a=5, length=12):
        pos = np.asarray(pos, dtype=np.int64)
        return ExampleArrays(
            ids=np.full(length, 10, dtype=np.int64), ids_offsets=np.asarray([0, length]), len_a=np.asarray([len_a]),
            pos=pos, pos_offsets=np.asarray([0, len(pos)]), masked_ids=np.full(len(pos), 11, dtype=np.int64),
            sentence_label=np.asarray([False]), keys=np.zeros((1, 2), dtype=np.int64),
        )  # fmt: skip

    where = lambda r: f"shard.parquet row {r}"
    validate_examples(one([1, 3, 8]), 16, V, where, max_predictions=3)
    for pos, message in (
        ([1, 8, 3], r"row 0: masked positions out of order \(8, 3\)"),
        ([1, 3, 3], r"out of order \(3, 3\)"),
        ([0, 3], r"masked position 0 is \[CLS\] or \[SEP\]"),
        ([1, 4], r"masked position 4 is \[CLS\] or \[SEP\]"),
        ([1, 11], r"masked position 11 is \[CLS\] or \[SEP\]"),
        ([1, 12], r"masked position 12 >= length 12"),
        ([1, 2, 3, 6], r"4 masked positions > the cap of 3"),
    ):
        with pytest.raises(ValueError, match=message):
            validate_examples(one(pos), 16, V, where, max_predictions=3)


def test_a_shard_of_another_size_than_its_manifest_lists_is_refused_naming_it(tmp_path):
    import pathlib

    from model.data import ShardError

    root = write_example_stage(tmp_path / "examples", lengths=(16,), n=40, shards=1)
    url = shard_urls(read_manifest(root), 16)[0]
    pathlib.Path(url).write_bytes(pathlib.Path(url).read_bytes()[:-100])  # truncated
    with pytest.raises(ShardError, match=rf"{url}: \d+ bytes, its manifest lists \d+"):
        shard_urls(read_manifest(root), 16)
