"""The data loader, checkpoints and run_pretrain on synthetic example shards written as Parquet.

Synthetic examples follow the pipeline's contract: "[CLS] A [SEP] B [SEP]" where a document is
a run of consecutive token ids, B is the true continuation unless is_random_next, and 15% of
non-special positions are masked 80/10/10. Both MLM and NSP are learnable from that.
"""

import logging
import random
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import safetensors.torch
import torch

from model.checkpoint import find_latest_checkpoint, list_checkpoints
from model.config import BertConfig, PhaseConfig, PretrainConfig
from model.data import DynamicMasking, ExampleLoader, LoaderPosition, infer_mask_token_id, read_examples, shard_urls
from model.export import load_pretrained
from model.bert import BertForPreTraining
from model.train import run_pretrain
from pipeline.schema import example_schema, read_manifest, write_manifest

V, PAD, CLS, SEP, MASK, FIRST = 99, 0, 2, 3, 4, 5
MODEL = BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=37, max_position_embeddings=64)


def make_example(rng: random.Random, max_len: int) -> dict:
    n = max_len if rng.random() > 0.1 else rng.randint(8, max_len)  # some shorter, like short_seq_prob
    body = n - 3
    la = rng.randint(1, body - 1)
    start = rng.randrange(V - FIRST)
    seq = [FIRST + (start + i) % (V - FIRST) for i in range(body + 1)]
    a = seq[:la]
    random_next = rng.random() < 0.5
    if random_next:
        s2 = rng.randrange(V - FIRST)
        b = [FIRST + (s2 + i) % (V - FIRST) for i in range(body - la)]
    else:
        b = seq[la : body]
    tokens = [CLS] + a + [SEP] + b + [SEP]
    cand = [i for i, t in enumerate(tokens) if t not in (CLS, SEP)]
    k = max(1, min(round(len(tokens) * 0.15), 20))
    positions = sorted(rng.sample(cand, k))
    ids = list(tokens)
    for p in positions:
        u = rng.random()
        if u < 0.8:
            ids[p] = MASK
        elif u < 0.9:
            ids[p] = rng.randrange(FIRST, V)
    return {"input_ids": ids, "len_a": la + 2, "masked_positions": positions,
            "masked_ids": [tokens[p] for p in positions], "is_random_next": random_next}


def write_example_stage(root, lengths=(16, 32), n=240, shards=2, seed=0) -> str:
    rng = random.Random(seed)
    for T in lengths:
        rows = [make_example(rng, T) for _ in range(n)]
        folder = root / f"seq{T}"
        folder.mkdir(parents=True)
        for s in range(shards):
            part = rows[s::shards]
            table = pa.Table.from_pylist(part, schema=example_schema(V, T))
            pq.write_table(table, folder / f"part-{s:05d}-of-{shards:05d}.parquet")
    write_manifest("examples", str(root), {"max_seq_lengths": list(lengths)}, {}, {"examples": n})
    return str(root)


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return write_example_stage(tmp_path_factory.mktemp("examples"))


def load(examples_url, T=16):
    return read_examples(shard_urls(read_manifest(examples_url), T), T, V)


# -- the loader ---------------------------------------------------------------------------------
def test_batches_follow_the_contract(examples):
    data = load(examples)
    loader = ExampleLoader(data, batch_size=7, max_seq_length=16, seed=1, key="p")
    b = next(loader)
    assert b["input_ids"].shape == b["token_type_ids"].shape == b["attention_mask"].shape == (7, 16)
    assert b["labels"].shape == (7, 16) and b["next_sentence_label"].shape == (7,)
    assert all(t.dtype == torch.long for t in b.values())
    rows = loader.permutation(0)[:7]
    for i, row in enumerate(rows):
        lo, hi = data.ids_offsets[row], data.ids_offsets[row + 1]
        n, la = hi - lo, data.len_a[row]
        assert b["input_ids"][i, :n].tolist() == data.ids[lo:hi].tolist()
        assert torch.all(b["input_ids"][i, n:] == PAD)
        assert b["attention_mask"][i].tolist() == [1] * n + [0] * (16 - n)
        assert b["token_type_ids"][i].tolist() == [0] * la + [1] * (n - la) + [0] * (16 - n)
        plo, phi = data.pos_offsets[row], data.pos_offsets[row + 1]
        expected = torch.full((16,), -100)
        expected[torch.as_tensor(data.pos[plo:phi])] = torch.as_tensor(data.masked_ids[plo:phi].astype(np.int64))
        assert torch.equal(b["labels"][i], expected)
        assert b["next_sentence_label"][i].item() == int(data.is_random_next[row])


def test_shuffle_is_deterministic_per_epoch_and_loops(examples):
    data = load(examples)
    a = ExampleLoader(data, 50, 16, seed=1, key="p")
    b = ExampleLoader(data, 50, 16, seed=1, key="p")
    assert a.batches_per_epoch == 4  # 240 // 50, the partial batch dropped
    seq_a = [next(a)["input_ids"] for _ in range(9)]  # runs past two epochs
    seq_b = [next(b)["input_ids"] for _ in range(9)]
    assert all(torch.equal(x, y) for x, y in zip(seq_a, seq_b))
    assert a.position == LoaderPosition(epoch=2, batch=1)
    assert not np.array_equal(a.permutation(0), a.permutation(1))
    assert sorted(a.permutation(1)) == list(range(240))
    c = ExampleLoader(data, 50, 16, seed=2, key="p")
    assert not torch.equal(next(c)["input_ids"], seq_a[0])
    # resuming at a position reproduces the rest exactly
    d = ExampleLoader(data, 50, 16, seed=1, key="p")
    d.set_position(LoaderPosition(1, 2))
    assert torch.equal(next(d)["input_ids"], seq_a[6])


def test_ranks_split_the_global_batch(examples):
    data = load(examples)
    whole = next(ExampleLoader(data, 6, 16, seed=1))["input_ids"]
    parts = [next(ExampleLoader(data, 6, 16, seed=1, rank=r, world_size=2))["input_ids"] for r in (0, 1)]
    assert torch.equal(torch.cat(parts), whole)


def test_dynamic_masking(examples):
    data = load(examples)
    assert infer_mask_token_id(data) == MASK
    dyn = DynamicMasking(MASK, V)
    l0 = ExampleLoader(data, 40, 16, seed=1, dynamic_masking=dyn)
    static = ExampleLoader(data, 40, 16, seed=1)
    b, s = l0.batch_at(0, 0), static.batch_at(0, 0)
    masked = b["labels"] != -100
    assert torch.equal(masked.sum(1), (s["labels"] != -100).sum(1))  # same count per example
    assert not torch.equal(masked, s["labels"] != -100)  # different positions
    # the originals: unmasked input == static input with its static mask undone
    original = s["input_ids"].clone()
    original[s["labels"] != -100] = s["labels"][s["labels"] != -100]
    assert torch.equal(b["labels"][masked], original[masked])
    assert torch.equal(b["input_ids"][~masked], original[~masked])
    frac_mask = (b["input_ids"][masked] == MASK).float().mean().item()
    assert 0.6 < frac_mask < 0.95
    # never masks [CLS] or [SEP]
    assert not torch.any(masked & ((original == CLS) | (original == SEP)))
    # deterministic per (seed, epoch, example); a new epoch re-masks
    assert torch.equal(ExampleLoader(data, 40, 16, seed=1, dynamic_masking=dyn).batch_at(0, 0)["labels"], b["labels"])
    again = l0.make_batch(l0.permutation(0)[:40], epoch=1)["labels"]  # same rows, next epoch
    assert not torch.equal(again, b["labels"])


def test_bad_input_is_named(examples, tmp_path):
    with pytest.raises(ValueError, match=r"part-0000\d-of-00002.parquet row \d+: input_ids has \d+ tokens > max_seq_length 12"):
        read_examples(shard_urls(read_manifest(examples), 16), 12, V)
    with pytest.raises(ValueError, match="vocab_size 50"):
        read_examples(shard_urls(read_manifest(examples), 16), 16, 50)
    with pytest.raises(FileNotFoundError, match="length 64"):
        shard_urls(read_manifest(examples), 64)
    with pytest.raises(ValueError, match="fewer than one batch"):
        ExampleLoader(load(examples), 1000, 16, seed=1, key="p")


# -- pretraining ------------------------------------------------------------------------------
def config(**kw) -> PretrainConfig:
    base = dict(
        phases=(PhaseConfig("p1", 16, 12, 8), PhaseConfig("p2", 32, 8, 6)),
        learning_rate=2e-3, warmup_steps=3, log_every=2, checkpoint_every=5, seed=7,
    )
    return PretrainConfig(**{**base, **kw})


def final_weights(run_url):
    # clone: load_file memory-maps, and a rerun rewrites the same file
    return {k: v.clone() for k, v in safetensors.torch.load_file(f"{run_url}/final/model.safetensors").items()}


def test_pretrain_loss_falls_and_writes_stage(examples, tmp_path, caplog):
    cfg = PretrainConfig(phases=(PhaseConfig("p1", 16, 150, 16),), learning_rate=3e-3,
                         warmup_steps=10, log_every=25, checkpoint_every=100, seed=1)
    logged = []
    with caplog.at_level(logging.INFO, logger="bertflow.pretrain"):
        m = run_pretrain(cfg, MODEL, examples, str(tmp_path / "run"), log_fn=lambda d, s: logged.append((s, d)))
    assert [s for s, _ in logged] == [25, 50, 75, 100, 125, 150]
    assert set(logged[0][1]) == {"loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "lr",
                                 "examples_per_sec", "tokens_per_sec", "phase_index"}
    assert m.counts["last_mlm_loss"] < m.counts["first_mlm_loss"] - 0.5
    assert m.counts["first_mlm_loss"] == logged[0][1]["mlm_loss"]
    assert m.counts["steps"] == 150 and m.counts["examples_seen"] == 150 * 16
    assert m.counts["parameters"] == sum(p.numel() for p in BertForPreTraining(MODEL).parameters())
    assert m.stage == "pretrain" and m.config["model"]["hidden_size"] == 32
    assert m.config["phases"][0]["steps"] == 150 and "examples" in m.inputs
    assert {f.path for f in m.files} == {"final/config.json", "final/model.safetensors"}
    assert any("step 150/150" in r.getMessage() for r in caplog.records)
    assert [s for s, _ in list_checkpoints(str(tmp_path / "run"))] == [100, 150]
    model = load_pretrained(str(tmp_path / "run" / "final"), BertForPreTraining)
    assert model.config == MODEL


def test_exact_resume_after_crashes_matches_straight_run(examples, tmp_path):
    cfg = config(dynamic_masking=True)
    model = BertConfig(**{**MODEL.__dict__, "hidden_dropout_prob": 0.2})  # RNG state matters
    straight_log = []
    run_pretrain(cfg, model, examples, str(tmp_path / "straight"), log_fn=lambda d, s: straight_log.append(s))
    straight = final_weights(tmp_path / "straight")

    class Crash(Exception):
        pass

    def crash_at(step):
        def log_fn(metrics, s):
            if s == step:
                raise Crash
        return log_fn

    run = str(tmp_path / "resumed")
    with pytest.raises(Crash):  # mid phase 1: latest checkpoint is step 5
        run_pretrain(cfg, model, examples, run, log_fn=crash_at(8))
    assert find_latest_checkpoint(run).endswith("p1/step-00000005")
    with pytest.raises(Crash):  # mid phase 2: resumes from 5, dies at 16 (latest: 15)
        run_pretrain(cfg, model, examples, run, log_fn=crash_at(16))
    assert find_latest_checkpoint(run).endswith("p2/step-00000015")
    m = run_pretrain(cfg, model, examples, run)
    resumed = final_weights(tmp_path / "resumed")
    assert resumed.keys() == straight.keys()
    for k in straight:
        assert torch.equal(resumed[k], straight[k]), k
    assert m.counts["steps"] == 20 and m.counts["examples_seen"] == 12 * 8 + 8 * 6
    # phase-end checkpoint (12) kept, plus the last two periodic ones
    assert [s for s, _ in list_checkpoints(run)] == [12, 15, 20]


def test_resume_skips_partial_checkpoint_and_refuses_other_config(examples, tmp_path):
    cfg = config(phases=(PhaseConfig("p1", 16, 6, 8),), checkpoint_every=3)
    run = tmp_path / "run"
    run_pretrain(cfg, MODEL, examples, str(run))
    straight = final_weights(run)
    # a half-written newer checkpoint (no _complete marker) is never picked
    (run / "p1" / "step-00000009").mkdir()
    (run / "p1" / "step-00000009" / "state.pt").write_bytes(b"garbage")
    assert find_latest_checkpoint(str(run)).endswith("step-00000006")
    shutil.rmtree(run / "p1" / "step-00000006")
    m = run_pretrain(cfg, MODEL, examples, str(run))  # resumes from step 3
    assert m.counts["steps"] == 6
    for k, v in final_weights(run).items():
        assert torch.equal(v, straight[k]), k
    with pytest.raises(ValueError, match="different config"):
        run_pretrain(config(phases=(PhaseConfig("p1", 16, 6, 8),), checkpoint_every=3, learning_rate=1e-3),
                     MODEL, examples, str(run))
    m = run_pretrain(config(phases=(PhaseConfig("p1", 16, 6, 8),), learning_rate=1e-3), MODEL, examples,
                     str(run), resume=False)
    assert m.counts["steps"] == 6


def test_missing_length_is_named(examples, tmp_path):
    cfg = config(phases=(PhaseConfig("p1", 16, 2, 4), PhaseConfig("long", 48, 2, 4)))
    with pytest.raises(FileNotFoundError, match="length 48"):
        run_pretrain(cfg, MODEL, examples, str(tmp_path / "run"))


@pytest.mark.gpu
def test_pretrain_on_cuda(examples, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    m = run_pretrain(config(backend="cuda"), MODEL, examples, str(tmp_path / "run"))
    assert m.counts["steps"] == 20 and np.isfinite(m.counts["last_mlm_loss"])
    assert load_pretrained(str(tmp_path / "run" / "final"), BertForPreTraining).config == MODEL


@pytest.mark.xla
def test_pretrain_on_xla(examples, tmp_path, monkeypatch):
    pytest.importorskip("torch_xla")
    monkeypatch.setenv("PJRT_DEVICE", "CPU")  # the XLA CPU device when no TPU is attached
    m = run_pretrain(config(backend="xla"), MODEL, examples, str(tmp_path / "run"))
    assert m.counts["steps"] == 20 and np.isfinite(m.counts["last_mlm_loss"])
