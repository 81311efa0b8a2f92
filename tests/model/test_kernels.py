"""The CPU fast paths (model/kernels.py) and the pruned last layer compute what the plain ops compute.

Values and gradients are compared with the reference ops to float tolerance: oneDNN linear vs
``F.linear``, the plain attention maths vs ``scaled_dot_product_attention``, the sparse training
path (last layer on [CLS] + masked rows only) vs the dense one, and the whole model with and
without the fast paths.
"""

import pytest
import torch
import torch.nn.functional as F
from tiny_bert import tiny_bert_config

from model import kernels
from model.bert import IGNORE_INDEX, BertForPreTraining, head_rows
from model.config import BertConfig

onednn = pytest.mark.skipif(
    kernels._linear_pointwise is None or not torch.backends.mkldnn.is_available(),
    reason="this torch build has no oneDNN",
)


def _config(dropout: float = 0.0) -> BertConfig:
    return tiny_bert_config(
        vocab_size=97,
        hidden_size=48,
        num_hidden_layers=3,
        intermediate_size=72,
        max_position_embeddings=40,
        dropout=dropout,
    )


def _batch(lengths=(31, 12, 31, 20), width=32, masked=(5, 2, 0, 4), seed=0):
    """Mixed lengths, padding, a sequence with no masked position, one with position 0 labelled."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    ids = torch.randint(5, 97, (B, width), generator=g)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    ids = ids * mask
    labels = torch.full((B, width), IGNORE_INDEX)
    for b, (n, k) in enumerate(zip(lengths, masked)):
        pos = torch.randperm(n - 2, generator=g)[:k] + 1
        labels[b, pos] = ids[b, pos]
    labels[3, 0] = ids[3, 0]
    types = (torch.arange(width) >= 10).long().expand(B, width) * mask
    return dict(
        input_ids=ids,
        token_type_ids=types,
        attention_mask=mask,
        labels=labels,
        next_sentence_label=torch.tensor([0, 1, 1, 0]),
    )


def _grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


@onednn
@pytest.mark.parametrize("shape,bias", [((7, 24), True), ((3, 5, 24), True), ((3, 5, 24), False)])
def test_onednn_linear_matches_f_linear_values_and_gradients(shape, bias):
    torch.manual_seed(0)
    x = torch.randn(shape, requires_grad=True)
    w = torch.randn(40, 24, requires_grad=True)
    b = torch.randn(40, requires_grad=True) if bias else None
    assert kernels._onednn(x, w)  # the fast path really runs here
    y = kernels.linear(x, w, b)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, [t for t in (x, w, b) if t is not None], g)
    ref_y = F.linear(x, w, b)
    ref = torch.autograd.grad(ref_y, [t for t in (x, w, b) if t is not None], g)
    torch.testing.assert_close(y, ref_y, atol=1e-5, rtol=1e-5)
    for a, r in zip(got, ref):
        torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-5)


def test_linear_falls_back_outside_cpu_fp32():
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    assert not kernels._onednn(x.double(), w.double())
    torch.testing.assert_close(kernels.linear(x.double(), w.double()), F.linear(x.double(), w.double()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not kernels._onednn(x, w)
        assert kernels.linear(x, w).dtype == F.linear(x, w).dtype == torch.bfloat16


def test_dropout_rate_scale_gradient_and_eval():
    torch.manual_seed(0)
    x = torch.rand(400, 500) + 0.5  # no zeros of its own
    x.requires_grad_(True)
    y = kernels.dropout(x, 0.1, True)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.003  # 200k draws: sd 0.0007
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / 0.9)
    (gx,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(gx, kept.float() / 0.9)  # the same mask in the backward pass
    assert kernels.dropout(x, 0.1, False) is x and kernels.dropout(x, 0.0, True) is x
    torch.manual_seed(1)
    a = kernels.dropout(x, 0.3, True)
    torch.manual_seed(1)
    assert torch.equal(a, kernels.dropout(x, 0.3, True))  # seeded: resumable


def test_attention_maths_path_matches_sdpa(monkeypatch):
    """With dropout made the identity, the CPU dropout path is the attention maths alone."""
    torch.manual_seed(0)
    B, nh, T, hs = 3, 2, 9, 8
    q, k, v = (torch.randn(B, nh, T, hs, requires_grad=True) for _ in range(3))
    mask = (torch.arange(T)[None] < torch.tensor([9, 4, 6])[:, None])[:, None, None, :]
    monkeypatch.setattr(kernels, "dropout", lambda x, p, training: x)
    y = kernels.attend(q, k, v, mask, 0.1, True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    real = mask[:, 0, 0, :, None].expand(B, T, hs)[:, None].expand(B, nh, T, hs)  # rows of real queries
    torch.testing.assert_close(y[real], ref[real], atol=1e-6, rtol=1e-5)
    g = torch.randn_like(y) * real
    for a, r in zip(torch.autograd.grad(y, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-5)


def test_attention_with_dropout_ignores_padded_keys():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 4) for _ in range(3))
    mask = (torch.arange(6)[None] < torch.tensor([6, 3])[:, None])[:, None, None, :]
    torch.manual_seed(5)
    a = kernels.attend(q, k, v, mask, 0.2, True)
    v2, k2 = v.clone(), k.clone()
    v2[1, :, 3:], k2[1, :, 3:] = 1e3, -1e3
    torch.manual_seed(5)
    assert torch.equal(a, kernels.attend(q, k2, v2, mask, 0.2, True))


def test_head_rows_layout():
    selected = torch.tensor([[0, 1, 0, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 1, 0]], dtype=torch.bool)
    rows, valid = head_rows(selected)
    assert rows.tolist() == [[0, 1, 3, 4], [0, 0, 0, 0], [0, 3, 0, 0]]
    assert valid.tolist() == [[True] * 4, [True, False, False, False], [True, True, False, False]]


@pytest.mark.parametrize("fast", [True, False])
def test_pruned_last_layer_equals_the_full_model(fast, monkeypatch):
    """Sparse path (last layer on [CLS] + masked rows) vs dense path: losses, logits, every gradient."""
    monkeypatch.setitem(kernels.ONEDNN, "enabled", fast)
    torch.manual_seed(0)
    model = BertForPreTraining(_config()).train()
    batch = _batch()
    sparse, g_sparse = _grads(model, batch)
    model.sparse_prediction = False
    dense, g_dense = _grads(model, batch)
    selected = batch["labels"] != IGNORE_INDEX
    torch.testing.assert_close(sparse.prediction_logits, dense.prediction_logits[selected], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sparse.mlm_loss, dense.mlm_loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(sparse.seq_relationship_logits, dense.seq_relationship_logits, atol=1e-6, rtol=1e-5)
    for name, g in g_dense.items():
        torch.testing.assert_close(g_sparse[name], g, atol=1e-6, rtol=1e-4, msg=name)


@onednn
def test_fast_paths_equal_plain_ops_on_the_whole_model(monkeypatch):
    """The model with oneDNN linear layers vs with ``F.linear``: same loss and gradients."""
    torch.manual_seed(0)
    model = BertForPreTraining(_config()).train()
    batch = _batch(seed=1)
    fast, g_fast = _grads(model, batch)
    monkeypatch.setitem(kernels.ONEDNN, "enabled", False)
    plain, g_plain = _grads(model, batch)
    torch.testing.assert_close(fast.loss, plain.loss, atol=1e-6, rtol=1e-6)
    for name, g in g_plain.items():
        torch.testing.assert_close(g_fast[name], g, atol=1e-6, rtol=1e-4, msg=name)
