import pytest

from flows.presets import load_config
from flows.stages import check_inputs_ready, stage_inputs, stage_url, stages_after
from pipeline.schema import ManifestError


def test_stage_folders_follow_the_design(tmp_path):
    root = str(tmp_path)
    assert stage_url(root, "pretrain") == f"{root}/checkpoints"
    assert stage_url(root, "export") == f"{root}/model"
    assert stage_url(root, "finetune/sst2") == f"{root}/finetune/sst2"
    assert stage_url("gs://bucket/run", "corpus") == "gs://bucket/run/corpus"
    cfg = load_config("tiny")
    assert stage_inputs("examples", cfg, root) == {"corpus": f"{root}/corpus", "vocab": f"{root}/vocab"}
    assert stage_inputs("finetune/sst2", cfg, root)["data"].endswith("glue/SST-2")


def test_force_reaches_every_later_stage():
    assert stages_after("examples") == ["examples", "pretrain", "export", "finetune"]
    assert stages_after("finetune/sst2") == ["finetune"]
    with pytest.raises(KeyError, match="unknown stage"):
        stages_after("bogus")


def test_missing_upstream_is_named_before_work(tmp_path):
    cfg = load_config("tiny")
    with pytest.raises(ManifestError, match="bertflow stage corpus"):
        check_inputs_ready("vocab", cfg, str(tmp_path))
    missing = load_config("tiny", {"data.wiki": str(tmp_path / "no-such-dump.xml.bz2")})
    with pytest.raises(FileNotFoundError, match="no-such-dump"):
        check_inputs_ready("corpus", missing, str(tmp_path))
