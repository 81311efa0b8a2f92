"""AdamW parameter groups and the warm-up + linear-decay schedule."""

import pytest
import torch
from tiny_bert import tiny_bert_config

from model.bert import BertForPreTraining
from model.optim import build_optimizer, warmup_linear_schedule


def tiny():
    return BertForPreTraining(tiny_bert_config(max_position_embeddings=40))


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


def _lamb_reference(params, grads_per_step, lr, betas, eps, wd):
    """LAMB one tensor at a time (the paper's algorithm as written before the multi-tensor version)."""
    b1, b2 = betas
    params = [p.detach().clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_per_step, start=1):
        for p, g, mi, vi in zip(params, grads, m, v):
            mi.mul_(b1).add_(g, alpha=1 - b1)
            vi.mul_(b2).addcmul_(g, g, value=1 - b2)
            update = (mi / (1 - b1**t)) / ((vi / (1 - b2**t)).sqrt().add_(eps))
            update.add_(p, alpha=wd)
            w_norm, u_norm = p.norm(), update.norm()
            trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
            p.add_(update * trust, alpha=-lr)
    return params


def test_multi_tensor_lamb_is_the_per_tensor_algorithm():
    from model.optim import Lamb

    torch.manual_seed(0)
    params = [
        torch.randn(7, 5, requires_grad=True),
        torch.randn(11, requires_grad=True),
        torch.zeros(3, requires_grad=True),
    ]
    grads_per_step = [[torch.randn_like(p) for p in params] for _ in range(4)]
    want = _lamb_reference(params, grads_per_step, 1e-2, (0.9, 0.999), 1e-6, 0.01)
    opt = Lamb(params, lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
    for got, ref in zip(params, want):
        torch.testing.assert_close(got.detach(), ref, atol=1e-7, rtol=1e-6)
    assert float(opt.state[params[0]]["step"]) == 4.0 and opt.state[params[0]]["step"].device.type == "cpu"
