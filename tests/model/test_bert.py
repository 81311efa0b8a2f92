"""The network: shapes, padding invariance, weight tying, MLM/NSP losses, HF key names."""

import pytest
import torch
import torch.nn.functional as F
from tiny_bert import tiny_bert_config

from model.bert import IGNORE_INDEX, BertForPreTraining, BertModel, count_parameters, mlm_correct
from model.config import BertConfig

# Sizes that all differ, so a swapped dimension fails instead of passing by luck.
B, T, V, H, NH, FFN, L = 3, 17, 99, 32, 4, 37, 2


def tiny_config(**kw) -> BertConfig:
    return tiny_bert_config(**{"max_position_embeddings": 40, **kw})  # V, H, NH, FFN, L above are its sizes


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    types = (torch.arange(T) >= 8).long().expand(B, T).clone()
    return ids, types


def test_output_shapes():
    torch.manual_seed(0)
    model = BertModel(tiny_config()).eval()
    ids, types = batch()
    out = model(ids, types, torch.ones(B, T, dtype=torch.long))
    assert out.last_hidden_state.shape == (B, T, H)
    assert out.pooler_output.shape == (B, H)
    pre = BertForPreTraining(tiny_config()).eval()
    o = pre(ids, types)
    assert o.prediction_logits.shape == (B, T, V)
    assert o.seq_relationship_logits.shape == (B, 2)
    assert o.loss is None and o.mlm_loss is None and o.nsp_loss is None


def test_state_dict_keys_are_hugging_face_names():
    keys = set(BertForPreTraining(tiny_config()).state_dict())
    for k in [
        "bert.embeddings.word_embeddings.weight",
        "bert.embeddings.position_embeddings.weight",
        "bert.embeddings.token_type_embeddings.weight",
        "bert.embeddings.LayerNorm.weight",
        "bert.encoder.layer.1.attention.self.query.weight",
        "bert.encoder.layer.1.attention.self.key.bias",
        "bert.encoder.layer.0.attention.self.value.weight",
        "bert.encoder.layer.0.attention.output.dense.weight",
        "bert.encoder.layer.0.attention.output.LayerNorm.bias",
        "bert.encoder.layer.0.intermediate.dense.weight",
        "bert.encoder.layer.0.output.dense.weight",
        "bert.encoder.layer.0.output.LayerNorm.weight",
        "bert.pooler.dense.weight",
        "cls.predictions.transform.dense.weight",
        "cls.predictions.transform.LayerNorm.weight",
        "cls.predictions.decoder.weight",
        "cls.predictions.bias",
        "cls.seq_relationship.weight",
        "cls.seq_relationship.bias",
    ]:
        assert k in keys, k
    sd = BertForPreTraining(tiny_config()).state_dict()
    assert sd["bert.encoder.layer.0.intermediate.dense.weight"].shape == (FFN, H)
    assert sd["cls.predictions.bias"].shape == (V,)


def test_init_like_bert():
    torch.manual_seed(0)
    m = BertForPreTraining(tiny_config(initializer_range=0.02))
    w = m.bert.encoder.layer[0].attention.self.query.weight
    assert abs(w.std().item() - 0.02) < 0.004
    assert torch.all(m.bert.encoder.layer[0].attention.self.query.bias == 0)
    assert torch.all(m.bert.embeddings.LayerNorm.weight == 1) and torch.all(m.bert.embeddings.LayerNorm.bias == 0)
    assert torch.all(m.bert.embeddings.word_embeddings.weight[0] == 0)  # [PAD]
    assert torch.all(m.cls.predictions.bias == 0)


def test_padding_does_not_change_real_positions():
    torch.manual_seed(0)
    model = BertModel(tiny_config()).eval()
    ids, types = batch()
    short = 11
    ref = model(ids[:, :short], types[:, :short], torch.ones(B, short, dtype=torch.long))
    padded_ids = ids.clone()
    padded_ids[:, short:] = 0
    padded_ids[1, short:] = 7  # garbage in padded slots must not matter either
    mask = (torch.arange(T) < short).long().expand(B, T)
    out = model(padded_ids, types, mask)
    torch.testing.assert_close(out.last_hidden_state[:, :short], ref.last_hidden_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, atol=1e-5, rtol=1e-5)
    no_mask = model(padded_ids, types)  # sanity: without the mask the outputs do change
    assert not torch.allclose(no_mask.last_hidden_state[:, :short], ref.last_hidden_state, atol=1e-4)


def test_decoder_is_tied_to_word_embeddings():
    m = BertForPreTraining(tiny_config())
    assert m.cls.predictions.decoder.weight is m.bert.embeddings.word_embeddings.weight
    assert m.cls.predictions.decoder.bias is None
    ids, types = batch()
    out = m(ids, types)
    out.prediction_logits.sum().backward()
    assert m.bert.embeddings.word_embeddings.weight.grad is not None
    # counted once
    n = count_parameters(m)
    assert n == sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())
    assert n < sum(p.numel() for p in m.state_dict().values())


def labels_for(ids, positions):
    labels = torch.full_like(ids, IGNORE_INDEX)
    for b, t in positions:
        labels[b, t] = ids[b, t]
    return labels


def test_mlm_loss_only_on_masked_positions_and_sparse_equals_dense():
    torch.manual_seed(0)
    m = BertForPreTraining(tiny_config()).eval()
    ids, types = batch()
    positions = [(0, 1), (0, 5), (1, 16), (2, 3)]
    labels = labels_for(ids, positions)
    out = m(ids, types, labels=labels)
    assert out.prediction_logits.shape == (len(positions), V)  # sparse: masked rows only
    full = m(ids, types).prediction_logits  # (B, T, V)
    rows = torch.stack([full[b, t] for b, t in positions])
    torch.testing.assert_close(out.prediction_logits, rows, atol=1e-5, rtol=1e-5)
    expected = F.cross_entropy(rows, torch.stack([ids[b, t] for b, t in positions]))
    torch.testing.assert_close(out.mlm_loss, expected)
    m.sparse_prediction = False
    dense = m(ids, types, labels=labels)
    assert dense.prediction_logits.shape == (B, T, V)
    torch.testing.assert_close(dense.mlm_loss, out.mlm_loss, atol=1e-6, rtol=1e-6)
    c_sparse, n_sparse = mlm_correct(out.prediction_logits, labels)
    c_dense, n_dense = mlm_correct(dense.prediction_logits, labels)
    assert n_sparse == n_dense == len(positions) and c_sparse == c_dense


def test_mlm_gradient_ignores_unmasked_positions():
    torch.manual_seed(0)
    m = BertForPreTraining(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    ids, types = batch()
    labels = labels_for(ids, [(0, 2)])
    bias = m.cls.predictions.bias
    m(ids, types, labels=labels).mlm_loss.backward()
    g = bias.grad.clone()
    # d(CE)/d(bias) = softmax - onehot at ONE position: sums to zero, single negative entry
    assert abs(g.sum().item()) < 1e-6
    assert (g < 0).sum() == 1 and g.argmin().item() == ids[0, 2].item()


def test_nsp_head_and_total_loss():
    torch.manual_seed(0)
    m = BertForPreTraining(tiny_config()).eval()
    ids, types = batch()
    nsp = torch.tensor([0, 1, 1])
    labels = labels_for(ids, [(0, 1), (2, 4)])
    out = m(ids, types, labels=labels, next_sentence_label=nsp)
    pooled = m.bert(ids, types).pooler_output
    torch.testing.assert_close(out.seq_relationship_logits, m.cls.seq_relationship(pooled))
    torch.testing.assert_close(out.nsp_loss, F.cross_entropy(out.seq_relationship_logits, nsp))
    torch.testing.assert_close(out.loss, out.mlm_loss + out.nsp_loss)
    only_nsp = m(ids, types, next_sentence_label=nsp)
    torch.testing.assert_close(only_nsp.loss, only_nsp.nsp_loss)


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_activations_and_dropout_modes(act):
    torch.manual_seed(0)
    m = BertModel(tiny_config(hidden_act=act, hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5))
    ids, types = batch()
    m.eval()
    a, b = m(ids, types).last_hidden_state, m(ids, types).last_hidden_state
    assert torch.equal(a, b)  # eval: deterministic
    m.train()
    assert not torch.equal(m(ids, types).last_hidden_state, m(ids, types).last_hidden_state)
