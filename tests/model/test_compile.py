"""``pretrain.compile`` on the CPU through inductor (gcc): the regions compile with fullgraph=True
and dynamic shapes (one graph each for 20 steps of packed batches whose token counts vary) and
train to the eager losses; the whole model has no graph break in forward and backward."""

import shutil

import pytest
import torch
from pretrain_shards import write_example_stage
from test_unpad import ragged_batch
from tiny_bert import tiny_bert_config

from model.bert import BertForPreTraining
from model.compile import is_compiled
from model.config import PhaseConfig, PretrainConfig
from model.contract import ConfigError
from model.packing import pack_padded
from model.train import finish, fit, setup

needs_compiler = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("gcc") is None, reason="no C++ compiler"
)
ONE_LAYER = tiny_bert_config(num_hidden_layers=1, dropout=0.0)


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return write_example_stage(tmp_path_factory.mktemp("examples"), lengths=(16,), n=120, shards=2)


def _losses(examples, out, compile_: str) -> tuple[list[float], bool]:
    cfg = PretrainConfig(
        phases=(PhaseConfig("p1", 16, 20, 8),), learning_rate=2e-3, warmup_steps=2, log_every=1, seed=3, unpad="on"
    )
    cfg = PretrainConfig(**{**cfg.__dict__, "compile": compile_})
    losses: list[float] = []
    s = setup(cfg, ONE_LAYER, examples, str(out), log_fn=lambda d, step: losses.append(d["loss"]))
    compiled = is_compiled(s.model)
    fit(s)
    finish(s)
    return losses, compiled


@needs_compiler
def test_compiled_training_matches_eager_with_one_graph_per_region(examples, tmp_path):
    from torch._dynamo.utils import counters

    eager, was = _losses(examples, tmp_path / "eager", "off")
    counters.clear()
    compiled, now = _losses(examples, tmp_path / "compiled", "on")
    assert not was and now
    assert len(compiled) == len(eager) == 20
    assert compiled == pytest.approx(eager, abs=1e-5)
    # embeddings, the (last) layer with its rows, the heads: compiled once for all token counts
    assert counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])


def test_the_whole_packed_model_has_no_graph_break():
    """fullgraph=True over the whole model, forward and backward (AOTAutograd, no codegen)."""
    torch.manual_seed(0)
    cfg = tiny_bert_config(num_hidden_layers=1, dropout=0.0, vocab_size=97, max_position_embeddings=40)
    model = BertForPreTraining(cfg).train()
    batch = pack_padded(ragged_batch())
    whole = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    got = whole(**batch)
    got.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    want = model(**batch)
    want.loss.backward()
    torch.testing.assert_close(got.loss, want.loss)
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, msg=n)


def test_compile_needs_the_unpadded_path_and_xla_refuses_both():
    with pytest.raises(ConfigError, match="pretrain.compile"):
        PretrainConfig(compile="on", unpad="off")
    with pytest.raises(ConfigError, match="pretrain.unpad/compile"):
        PretrainConfig(backend="xla", unpad="on")
    with pytest.raises(ConfigError, match="pretrain.unpad"):
        PretrainConfig(unpad="yes")
