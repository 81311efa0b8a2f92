"""AdamW parameter groups and the warm-up + linear-decay schedule."""

import pytest
import torch

from model.bert import BertForPreTraining
from model.config import BertConfig
from model.optim import build_optimizer, warmup_linear_schedule


def tiny():
    return BertForPreTraining(
        BertConfig(
            vocab_size=99,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=40,
        )
    )


def test_param_groups_exclude_biases_and_layernorm_from_decay():
    model = tiny()
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.01)
    decay, plain = opt.param_groups
    assert decay["weight_decay"] == 0.01 and plain["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decay_names = {names[id(p)] for p in decay["params"]}
    plain_names = {names[id(p)] for p in plain["params"]}
    assert "bert.embeddings.word_embeddings.weight" in decay_names
    assert "bert.encoder.layer.0.attention.self.query.weight" in decay_names
    assert "cls.seq_relationship.weight" in decay_names
    assert "bert.encoder.layer.0.attention.self.query.bias" in plain_names
    assert "bert.embeddings.LayerNorm.weight" in plain_names
    assert "cls.predictions.transform.LayerNorm.weight" in plain_names
    assert "cls.predictions.bias" in plain_names
    assert all(not n.endswith("bias") and "LayerNorm" not in n for n in decay_names)
    # every parameter exactly once; the tied decoder weight is the word embedding
    all_ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(all_ids) == len(set(all_ids)) == len(list(model.parameters()))
    assert opt.defaults["eps"] == 1e-6 and opt.defaults["betas"] == (0.9, 0.999)


def test_decay_does_not_touch_layernorm_weights():
    model = tiny()
    opt = build_optimizer(model, lr=0.1, weight_decay=0.5)
    ln = model.bert.embeddings.LayerNorm.weight
    w = model.bert.encoder.layer[0].intermediate.dense.weight
    before_ln, before_w = ln.detach().clone(), w.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # no gradient: only decoupled decay can move weights
    opt.step()
    assert torch.equal(ln, before_ln)
    torch.testing.assert_close(w, before_w * (1 - 0.1 * 0.5))


def test_fused_adamw_on_cpu_gives_the_foreach_update():
    torch.manual_seed(0)
    model, ref = tiny(), tiny()
    ref.load_state_dict(model.state_dict())
    opt = build_optimizer(model, lr=1e-2, weight_decay=0.01)
    assert opt.defaults["fused"] is True
    groups = [
        {
            "params": [
                dict(ref.named_parameters())[n] for n, p in model.named_parameters() if any(p is q for q in g["params"])
            ],
            "weight_decay": g["weight_decay"],
        }
        for g in opt.param_groups
    ]
    ref_opt = torch.optim.AdamW(groups, lr=1e-2, eps=1e-6, foreach=True)
    for step in range(3):
        for m in (model, ref):
            for i, p in enumerate(m.parameters()):
                p.grad = torch.sin(torch.arange(p.numel(), dtype=torch.float32) * (i + step + 1)).view_as(p)
        opt.step()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6, msg=name)


def test_schedule_warmup_then_linear_decay_to_zero():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=2.0)
    sched = warmup_linear_schedule(opt, warmup_steps=4, total_steps=10)
    lrs = []
    for _ in range(12):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [0.0, 0.5, 1.0, 1.5, 2.0, 2 * 5 / 6, 2 * 4 / 6, 2 * 3 / 6, 2 * 2 / 6, 2 * 1 / 6, 0.0, 0.0]
    assert lrs == pytest.approx(expected)


def test_schedule_state_round_trip():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1.0)
    sched = warmup_linear_schedule(opt, 3, 9)
    for _ in range(5):
        opt.step()
        sched.step()
    opt2 = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched2 = warmup_linear_schedule(opt2, 3, 9)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sched.state_dict())
    for _ in range(2):
        opt.step()
        sched.step()
        opt2.step()
        sched2.step()
        assert opt.param_groups[0]["lr"] == opt2.param_groups[0]["lr"]


def test_no_warmup():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1.0)
    sched = warmup_linear_schedule(opt, 0, 4)
    assert opt.param_groups[0]["lr"] == 1.0
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.75)
