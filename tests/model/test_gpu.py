"""The CUDA paths (``pytest -m gpu``; each skips without a CUDA device): the flash varlen kernel
against the reference, a packed bf16 step that never waits for the device, the pinned
one-step-ahead feed, and compiled training on the GPU against eager.

The sync check runs whole optimizer steps under ``torch.cuda.set_sync_debug_mode("error")``: a
synchronising call anywhere in them fails it, ours or one inside a torch kernel, and the error
names the call. Written without a GPU to run it on: the first GPU run is its test too."""

import pytest
import torch
from pretrain_shards import MODEL, write_example_stage
from tiny_bert import tiny_bert_config

from model import kernels
from model.config import PhaseConfig, PretrainConfig
from model.train import PhaseRun, StopSignals, _train_step, finish, fit, setup

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return write_example_stage(tmp_path_factory.mktemp("examples"), lengths=(16, 32), n=240, shards=2)


def _config(**kw) -> PretrainConfig:
    base = dict(phases=(PhaseConfig("p1", 32, 12, 16),), learning_rate=2e-3, warmup_steps=2, log_every=4, seed=3)
    return PretrainConfig(**{**base, "backend": "cuda", **kw})


def test_flash_varlen_matches_the_reference():
    torch.manual_seed(0)
    cu = torch.tensor([0, 70, 75, 200], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(200, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    assert (
        kernels.flash_varlen(q, 0.0) and not kernels.flash_varlen(q, 0.1) and not kernels.flash_varlen(q.float(), 0.0)
    )
    y = kernels.varlen_attend(q, k, v, cu, cu, 125, 125, 0.0, True)
    ref = kernels.varlen_reference(q.float(), k.float(), v.float(), cu, cu, 125, 125, 0.0, True)
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=2e-2)
    g = torch.randn_like(y)
    for a, r in zip(torch.autograd.grad(y, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g.float())):
        torch.testing.assert_close(a.float(), r.float(), atol=5e-2, rtol=5e-2)  # r: the bf16 leaves' grads


@pytest.mark.parametrize("attention_dropout", [0.0, 0.1])  # flash, and the reference with dropout
def test_a_packed_cuda_step_never_waits_for_the_device(examples, tmp_path, attention_dropout):
    model = tiny_bert_config(attention_probs_dropout_prob=attention_dropout)
    s = setup(_config(compile="off"), model, examples, str(tmp_path / "run"))
    assert s.unpad and s.backend.feed_ahead and s.backend.precision == "bf16"
    from model.feed import StepFeed
    from model.metrics import Window
    from model.train import make_loader

    phase = s.config.phases[0]
    feed = StepFeed(make_loader(s, phase), s.backend, ahead=True)
    run = PhaseRun(phase, 0, feed, Window(s.backend.device), StopSignals())
    _train_step(s, run)  # first step: lazy initialisations (optimizer state, allocator)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            _train_step(s, run)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        feed.close()
    assert run.window.steps == 4 and torch.isfinite(run.window.sums).all()


def test_compiled_training_on_the_gpu_follows_eager(examples, tmp_path):
    losses = {}
    for mode in ("off", "on"):
        got: list[float] = []
        s = setup(
            _config(compile=mode, log_every=1),
            MODEL,
            examples,
            str(tmp_path / mode),
            log_fn=lambda d, k, out=got: out.append(d["loss"]),
        )
        fit(s)
        finish(s)
        losses[mode] = got
    assert len(losses["on"]) == 12
    # bf16, dropout, another random stream when compiled: the same curve, not the same bits
    assert abs(sum(losses["on"][-4:]) - sum(losses["off"][-4:])) / 4 < 0.25
    assert losses["on"][-1] < losses["on"][0]
