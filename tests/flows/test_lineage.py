"""Lineage that stays true across a refresh: the runner keeps the outputs it replaces, a version
names its dump by content and name, and after the refresh v1's tags still lead to v1's data
(real MLflow registry on SQLite; the stages' work replaced by a few bytes, their bookkeeping real)."""

import dataclasses
import os

import pytest

from flows import lineage
from flows.presets import load_config
from flows.runner import run_stage
from flows.table import STAGES, stage_config, stage_url
from flows.tracking import Tracker
from pipeline.schema.manifest import fingerprint_input, has_manifest, write_manifest


def _cheap(c):
    """What a stage writes, made from its inputs' fingerprints (so a new dump changes every stage)."""
    inputs = {k: fingerprint_input(u) for k, u in c.inputs.items()}
    os.makedirs(c.url, exist_ok=True)
    with open(f"{c.url}/out.txt", "w") as f:
        f.write(repr(sorted(inputs.items())))
    counts = {"vocab_size": 990.0} if c.stage == "vocab" else {}
    return write_manifest(c.stage, c.url, stage_config(c.stage, c.cfg, c.inputs), inputs, counts)


@pytest.fixture
def cheap_stages(monkeypatch):
    for name, row in list(STAGES.items()):
        monkeypatch.setitem(STAGES, name, dataclasses.replace(row, run=_cheap, where="inline", preflight=None))


def _dump(folder, name, text):
    for old in os.listdir(folder):
        os.remove(folder / old)
    (folder / name).write_text(text)


def _refresh(cfg, root):
    return [run_stage(name, cfg, root).status for name in STAGES]


def test_after_a_refresh_v1_lineage_still_leads_to_v1_data(tmp_path, cheap_stages):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    _dump(dumps, "enwiki-20261101-pages-articles.xml", "<mediawiki>november</mediawiki>")
    cfg = load_config("tiny", {"data.wiki": str(dumps), "keep_outputs": 1})
    root = str(tmp_path / "root")
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    tracker.use_experiment("bertflow", artifact_root=str(tmp_path / "mlartifacts"))
    client = tracker.client
    client.create_registered_model("bert-x")
    run = tracker.start_run("pretrain-tiny")

    def register():
        tags = lineage.version_tags(cfg, root)
        v = str(client.create_model_version("bert-x", "file:///m", run_id=run, tags=tags).version)
        lineage.rename_moved(client, "bert-x", root, v, cfg.keep_outputs)
        return v

    assert _refresh(cfg, root) == ["done"] * 5
    v1 = register()
    tags1 = client.get_model_version("bert-x", v1).tags
    assert tags1["lineage.raw.wiki.dump"] == "enwiki-20261101"
    assert tags1["lineage.raw.wiki.fingerprint"] == fingerprint_input(str(dumps))
    assert lineage.resolve(tags1, "vocab") == stage_url(root, "vocab")
    assert _refresh(cfg, root) == ["skipped"] * 5  # nothing changed: nothing moved
    assert not os.path.exists(f"{root}/history")

    _dump(dumps, "enwiki-20261201-pages-articles.xml", "<mediawiki>december</mediawiki>")  # the new dump
    assert _refresh(cfg, root) == ["done"] * 5
    v2 = register()
    tags1, tags2 = (client.get_model_version("bert-x", v).tags for v in (v1, v2))
    assert tags2["lineage.raw.wiki.dump"] == "enwiki-20261201"
    assert tags2["lineage.raw.wiki.fingerprint"] != tags1["lineage.raw.wiki.fingerprint"]
    for stage in STAGES:  # v1's tags name where its outputs were kept, and they are v1's
        kept = tags1[f"lineage.{stage}.url"]
        assert kept == lineage.kept_url(root, stage, tags1[f"lineage.{stage}.fingerprint"]) != stage_url(root, stage)
        assert fingerprint_input(kept) == tags1[f"lineage.{stage}.fingerprint"]
        assert lineage.resolve(tags1, stage) == kept
        assert tags1[f"lineage.{stage}.recorded_url"] == stage_url(root, stage)
        assert lineage.resolve(tags2, stage) == stage_url(root, stage) == tags2[f"lineage.{stage}.url"]
    with open(f"{tags1['lineage.vocab.url']}/out.txt") as f:  # v1's vocab: made from november's corpus
        assert tags1["lineage.corpus.fingerprint"] in f.read()

    # another dump: keep_outputs=1 keeps v2's outputs, v1's go; its tags say so
    _dump(dumps, "enwiki-20270101-pages-articles.xml", "<mediawiki>january</mediawiki>")
    assert _refresh(cfg, root) == ["done"] * 5
    register()
    tags1, tags2 = (client.get_model_version("bert-x", v).tags for v in (v1, v2))
    assert tags1["lineage.vocab.url"] == "removed (history keeps 1)" and lineage.resolve(tags1, "vocab") is None
    assert lineage.resolve(tags2, "vocab") == tags2["lineage.vocab.url"] != stage_url(root, "vocab")
    assert sorted(os.listdir(f"{root}/history/vocab")) == [tags2["lineage.vocab.fingerprint"][:16]]


def test_keep_outputs_zero_keeps_nothing(tmp_path, cheap_stages):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    _dump(dumps, "a.xml", "<mediawiki>a</mediawiki>")
    cfg = load_config("tiny", {"data.wiki": str(dumps), "keep_outputs": 0})
    root = str(tmp_path / "root")
    _refresh(cfg, root)
    _dump(dumps, "b.xml", "<mediawiki>b</mediawiki>")
    assert _refresh(cfg, root) == ["done"] * 5
    assert not os.path.exists(f"{root}/history") and has_manifest(stage_url(root, "vocab"))
    assert "lineage.raw.wiki.dump" not in lineage.version_tags(cfg, root)  # no dump name in "b.xml"


def test_a_forced_rerun_that_writes_the_same_output_keeps_no_copy(tmp_path, cheap_stages):
    cfg, root = load_config("tiny"), str(tmp_path / "root")
    assert run_stage("corpus", cfg, root).status == "done"
    assert run_stage("corpus", cfg, root, force=True).status == "done"
    assert os.listdir(f"{root}/history/corpus") == []
