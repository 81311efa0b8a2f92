import pytest

from flows.overrides import parse_overrides
from flows.presets import PRESETS, load_config
from pipeline.schema.config import ConfigError, flatten


def test_presets_have_the_paper_shapes():
    base = load_config("base")
    assert (base.model.num_hidden_layers, base.model.hidden_size, base.model.num_attention_heads) == (12, 768, 12)
    assert base.model.intermediate_size == 3072
    large = load_config("large")
    assert (large.model.num_hidden_layers, large.model.hidden_size, large.model.num_attention_heads) == (24, 1024, 16)
    assert large.model.intermediate_size == 4096
    for cfg in (base, large):
        assert cfg.vocab.vocab_size == 30522
        assert cfg.pretrain.total_steps == 1_000_000
        assert [p.max_seq_length for p in cfg.pretrain.phases] == [128, 512]
        assert cfg.pretrain.phases[0].steps == 900_000  # 90% at 128, 10% at 512
        assert (cfg.pretrain.learning_rate, cfg.pretrain.warmup_steps, cfg.pretrain.weight_decay) == (
            1e-4,
            10_000,
            0.01,
        )
        assert (cfg.pretrain.beta1, cfg.pretrain.beta2, cfg.pretrain.eps) == (0.9, 0.999, 1e-6)
        assert cfg.examples.masked_lm_prob == 0.15 and cfg.examples.random_next_prob == 0.5


def test_overrides_are_typed_and_validated():
    cfg = load_config(
        "tiny", parse_overrides(["pretrain.phases.0.steps=7", "pretrain.learning_rate=5e-4", "vocab.lowercase=false"])
    )
    assert cfg.pretrain.phases[0].steps == 7
    assert cfg.pretrain.learning_rate == 5e-4
    assert cfg.vocab.lowercase is False
    cfg = load_config(
        "tiny", {"examples.max_seq_lengths": [64, 128, 256], "examples.max_predictions_per_seq": [10, 20, 40]}
    )
    assert cfg.examples.max_seq_lengths == (64, 128, 256)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"model.num_attention_heads": 3}, "model.hidden_size"),
        ({"examples.masked_lm_prob": 1.2}, "examples.masked_lm_prob"),
        ({"examples.short_seq_prob": -0.1}, "examples.short_seq_prob"),
        ({"pretrain.phases.1.max_seq_length": 256}, "pretrain.phases[phase2].max_seq_length"),
        ({"finetune.max_seq_length": 4096}, "finetune.max_seq_length"),
        ({"pretrain.nosuchfield": 1}, "pretrain.nosuchfield"),
        ({"pretrain.phases.5.steps": 1}, "pretrain.phases.5"),
        ({"pretrain.warmup_steps": 2.5}, "pretrain.warmup_steps"),
        ({"finetune_tasks": ["nosuchtask"]}, "finetune_tasks"),
    ],
)
def test_invalid_config_names_the_field(overrides, field):
    with pytest.raises((ConfigError, ValueError)) as err:
        load_config("tiny", overrides)
    assert field in str(err.value)


def test_unknown_preset_and_bad_override_syntax():
    with pytest.raises(ConfigError, match="preset"):
        load_config("huge")
    with pytest.raises(ConfigError, match="FIELD=VALUE"):
        parse_overrides(["pretrain.learning_rate"])


def test_flatten_for_mlflow_params():
    flat = flatten({"a": {"b": 1, "c": [{"d": 2}, {"d": 3}]}, "e": [1, 2]})
    assert flat == {"a.b": 1, "a.c.0.d": 2, "a.c.1.d": 3, "e": [1, 2]}


def test_every_preset_with_squad_has_a_window_that_fits_and_a_bad_one_is_refused():
    from tasks.registry import TASKS

    for name in PRESETS:
        cfg = load_config(name, {"finetune_tasks": sorted(t for t in TASKS if TASKS[t].family == "squad")})
        cfg.finetune.squad.check_window(cfg.finetune.max_seq_length)
    with pytest.raises(ConfigError, match="finetune.max_seq_length: a SQuAD window of 64 tokens cannot hold"):
        load_config("tiny", {"finetune.squad.max_query_length": 64})  # the tiny preset's former window
    load_config("tiny", {"finetune.squad.max_query_length": 64, "finetune_tasks": ["sst2"]})  # no SQuAD: no check
