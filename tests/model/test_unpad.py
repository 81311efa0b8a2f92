"""The unpadded (packed) path computes what the padded one does: the loader's layout, the
reference varlen attention, logits, losses and every gradient of the whole model (fp32, CPU, to
1e-5), batches from the streaming loader, and training through run_pretrain."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pretrain_shards import write_example_stage
from tiny_bert import tiny_bert_config

from model import kernels
from model.bert import IGNORE_INDEX, BertForPreTraining
from model.config import BertConfig, PhaseConfig, PretrainConfig
from model.contract import read_manifest
from model.data import shard_urls
from model.feed import micro_info
from model.metrics import step_flops
from model.packing import pack_padded
from model.stream import LoaderSpec, StreamingLoader
from model.train import run_pretrain


def _config(dropout: float = 0.0, layers: int = 3) -> BertConfig:
    return tiny_bert_config(
        vocab_size=97,
        hidden_size=48,
        num_hidden_layers=layers,
        intermediate_size=72,
        max_position_embeddings=40,
        dropout=dropout,
    )


def ragged_batch(lengths=(31, 12, 29, 20, 5), width=32, masked=(5, 2, 0, 4, 1), seed=0):
    """Ragged lengths, padding, a sequence without masked tokens, one with [CLS] labelled."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(5, 97, (B, width), generator=g) * mask
    labels = torch.full((B, width), IGNORE_INDEX)
    for b, (n, k) in enumerate(zip(lengths, masked)):
        pos = torch.randperm(n - 2, generator=g)[:k] + 1
        labels[b, pos] = ids[b, pos]
    labels[3, 0] = ids[3, 0]
    types = (torch.arange(width)[None] >= torch.tensor([n // 2 for n in lengths])[:, None]).long() * mask
    nsp = torch.tensor([0, 1, 1, 0, 1])
    return dict(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels, next_sentence_label=nsp)


def test_the_packed_layout():
    padded = ragged_batch()
    packed = pack_padded(padded)
    p = packed["packing"]
    lengths = padded["attention_mask"].sum(1)
    assert p.cu_seqlens.tolist() == [0, *torch.cumsum(lengths, 0).tolist()] and p.cu_seqlens.dtype == torch.int32
    assert p.max_seqlen == 31 and packed["input_ids"].shape == (int(lengths.sum()),)
    real = padded["attention_mask"].bool()
    assert torch.equal(packed["input_ids"], padded["input_ids"][real])
    assert torch.equal(packed["token_type_ids"], padded["token_type_ids"][real])
    assert torch.equal(p.position_ids, torch.arange(32).expand(5, 32)[real])
    # heads' rows: each sequence's [CLS] and masked tokens, ascending; the masked ones row-major
    selected = padded["labels"] != IGNORE_INDEX
    assert torch.equal(packed["labels"], padded["labels"][selected])
    token = torch.arange(real.sum()).new_zeros(real.shape)
    token[real] = torch.arange(int(real.sum()))
    assert torch.equal(p.rows[p.mlm_slots], token[selected])
    assert torch.equal(p.rows[p.cls_slots], p.cu_seqlens[:-1].long())
    per_seq = [int((selected[b] | (torch.arange(32) == 0)).sum()) for b in range(5)]
    assert torch.diff(p.cu_rows).tolist() == per_seq and p.max_rows == max(per_seq)
    # the step's FLOPs count what each path computes: real tokens only when packed
    a, b = micro_info(padded), micro_info(packed)
    assert (a.rows, a.width, a.masked, a.tokens) == (5, 32, 13, 97) and b.tokens == b.packed_tokens == 97
    assert b.pairs == int((lengths**2).sum()) and (b.rows, b.width, b.masked) == (5, 31, 13)
    cfg = _config()
    assert step_flops(cfg, 5, 32, 13, b.packed_tokens, b.pairs) < step_flops(cfg, 5, 32, 13)
    assert step_flops(cfg, 5, 32, 13, 5 * 32, 5 * 32 * 32) == step_flops(cfg, 5, 32, 13)


@pytest.mark.parametrize("p", [0.0, 0.2])
def test_varlen_reference_is_attention_per_sequence(p, monkeypatch):
    """Queries of other lengths than keys (the last layer's rows), each sequence on its own."""
    torch.manual_seed(0)
    nh, hs = 2, 8  # keys 7, 3, 5 per sequence; queries 2, 3, 1
    cu_k = torch.tensor([0, 7, 10, 15], dtype=torch.int32)
    cu_q = torch.tensor([0, 2, 5, 6], dtype=torch.int32)
    q = torch.randn(6, nh, hs, requires_grad=True)
    k, v = (torch.randn(15, nh, hs, requires_grad=True) for _ in range(2))
    monkeypatch.setattr(kernels, "dropout", lambda x, p, training: x)  # the maths alone
    y = kernels.varlen_attend(q, k, v, cu_q, cu_k, 3, 7, p, True)
    ref = []
    for b in range(3):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        one = F.scaled_dot_product_attention(*(t[s].transpose(0, 1)[None] for t, s in ((q, qs), (k, ks), (v, ks))))
        ref.append(one[0].transpose(0, 1))
    ref = torch.cat(ref)
    torch.testing.assert_close(y, ref, atol=1e-6, rtol=1e-5)
    g = torch.randn_like(y)
    for a, r in zip(torch.autograd.grad(y, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-5)
    assert not kernels.flash_varlen(q, 0.0)  # CPU: never the flash kernel


def _grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("fast", [True, False])
def test_unpadded_equals_padded_logits_losses_and_gradients(fast, monkeypatch):
    monkeypatch.setitem(kernels.ONEDNN, "enabled", fast)
    torch.manual_seed(0)
    model = BertForPreTraining(_config()).train()
    padded = ragged_batch()
    ref, g_ref = _grads(model, padded)
    out, g = _grads(model, pack_padded(padded))
    assert out.prediction_logits.shape == ref.prediction_logits.shape == (13, 97)  # the masked tokens only
    torch.testing.assert_close(out.prediction_logits, ref.prediction_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.seq_relationship_logits, ref.seq_relationship_logits, atol=1e-5, rtol=1e-5)
    for name in ("loss", "mlm_loss", "nsp_loss"):
        torch.testing.assert_close(getattr(out, name), getattr(ref, name), atol=1e-5, rtol=1e-5, msg=name)
    assert torch.equal(out.mlm_labels, ref.mlm_labels)
    assert g.keys() == g_ref.keys()
    for name in g_ref:
        torch.testing.assert_close(g[name], g_ref[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return write_example_stage(tmp_path_factory.mktemp("examples"), lengths=(16,), n=120, shards=2)


def test_the_loader_packs_the_padded_batches(examples):
    urls = tuple(shard_urls(read_manifest(examples), 16))
    spec = LoaderSpec(urls=urls, batch_size=8, max_seq_length=16, seed=1, num_parts=2)
    padded = StreamingLoader(spec, micro_batches=2)
    packed = StreamingLoader(LoaderSpec(**{**spec.__dict__, "unpad": True}), micro_batches=2)
    for _ in range(4):
        for a, b in zip(padded.next_step(), packed.next_step()):
            want = pack_padded(a)
            for k in ("input_ids", "token_type_ids", "labels", "next_sentence_label"):
                assert torch.equal(b[k], want[k]), k
            for k, v in vars(want["packing"]).items():
                got = getattr(b["packing"], k)
                assert torch.equal(got, v) if torch.is_tensor(v) else got == v, k
        assert np.array_equal(padded.last_keys, packed.last_keys)


def test_training_unpadded_matches_padded(examples, tmp_path):
    import safetensors.torch

    model = tiny_bert_config(dropout=0.0)
    base = dict(phases=(PhaseConfig("p1", 16, 8, 8, micro_batch_size=4),), learning_rate=2e-3, warmup_steps=2)
    runs = {}
    for unpad in ("off", "on"):
        cfg = PretrainConfig(**base, log_every=4, eval_every=4, eval_batches=1, seed=3, unpad=unpad)
        logged: list = []
        m = run_pretrain(cfg, model, examples, str(tmp_path / unpad), log_fn=lambda d, s, out=logged: out.append(d))
        runs[unpad] = (m, safetensors.torch.load_file(str(tmp_path / unpad / "final" / "model.safetensors")), logged)
    (m0, w0, log0), (m1, w1, log1) = runs["off"], runs["on"]
    for k in w0:
        torch.testing.assert_close(w1[k], w0[k], atol=1e-5, rtol=1e-4, msg=k)
    for key in ("last_mlm_loss", "mlm_accuracy", "eval_mlm_loss", "eval_mlm_accuracy", "eval_nsp_accuracy"):
        assert m1.counts[key] == pytest.approx(m0.counts[key], rel=1e-4, abs=1e-5), key
    assert [sorted(d) for d in log1] == [sorted(d) for d in log0]  # the same metrics, evaluation included


def test_padded_index_places_each_row_in_its_sequences_slot():
    """Sequences of 3, 0 (empty), 4 and 1 rows in a layout 5 wide: row r of sequence b at
    b * 5 + its place in b (the searchsorted over the whole ``cu``, less one)."""
    cu = torch.tensor([0, 3, 3, 7, 8], dtype=torch.int32)
    want = [b * 5 + i for b, n in enumerate((3, 0, 4, 1)) for i in range(n)]
    assert kernels._padded_index(cu, 8, 5).tolist() == want
