"""The monthly refresh through a real deployment: a real `prefect server` on 127.0.0.1, a process
work pool, `prefect deploy --all` from prefect.yaml and a deployment of the real `pretrain` flow
whose parameters hold the root and the dump's folder; run once (v1), a new dump lands, the same
deployment run again with no parameters, as its schedule fires it: every stage reruns (pretraining
starts over by itself, no `force`), v2 is registered, the champion is decided on the downstream
score, v2's lineage names the new dump, vocabulary and shards, and v1's still leads to v1's.
Slow tier: `python -m pytest -m slow tests/flows/test_refresh_slow.py` (about 20 minutes on 2
loaded cores: two runs of the short tiny chain)."""

import bz2
import json
import os

import pytest
from test_deployments_slow import REPO, SHORT, prefect, run_deployment

pytestmark = [pytest.mark.slow, pytest.mark.production]
SAMPLE = REPO / "data" / "sample" / "wiki" / "synthwiki-0-pages-articles.xml.bz2"


def _land_dump(folder, name: str, extra: str = "") -> None:
    """The bundled sample as the dump ``name`` (the only file of ``folder``), with ``extra``
    prose added to its first article."""
    for old in folder.iterdir():
        old.unlink()
    xml = bz2.decompress(SAMPLE.read_bytes()).decode()
    if extra:
        at = xml.index("\n'''")
        xml = xml[:at] + f"\n{extra}\n" + xml[at:]
    (folder / name).write_bytes(bz2.compress(xml.encode()))


def test_a_new_dump_rebuilds_registers_and_decides_the_champion_through_the_deployment(tmp_path, prefect_server_at):
    from mlflow.tracking import MlflowClient

    from flows import lineage
    from flows.presets import load_config
    from flows.status import collect_status
    from flows.table import STAGES, stage_url
    from pipeline.schema.manifest import fingerprint_input, read_manifest

    dumps, root = tmp_path / "dumps", tmp_path / "root"
    dumps.mkdir()
    (tmp_path / "prefect").mkdir()
    _land_dump(dumps, "enwiki-20261101-pages-articles.xml.bz2")
    overrides = {**SHORT, "data.wiki": str(dumps)}
    with prefect_server_at(tmp_path / "prefect", BERTFLOW_HOME=str(REPO)) as env:
        prefect(env, "work-pool", "create", "local-process", "--type", "process")
        for pool, kind in (("k8s-gpu", "kubernetes"), ("vertex-tpu", "vertex-ai")):  # what base/large target
            template = f"infra/prefect/{pool}.json"
            prefect(env, "work-pool", "create", pool, "--type", kind, "--base-job-template", template)
        prefect(env, "--no-prompt", "deploy", "--all")  # the project's deployments, as shipped
        # the operator's refresh deployment of the real flow: root and data in its parameters
        params = {"preset": "tiny", "root": str(root), "overrides": overrides}
        prefect(env, "--no-prompt", "deploy", "flows/pretrain_flow.py:pretrain", "-n", "refresh",
                "-p", "local-process", "--params", json.dumps(params))  # fmt: skip
        first = run_deployment(env, "pretrain/refresh", {})
        assert first["state"] == "COMPLETED", first
        uri = f"sqlite:///{root}/mlflow.db"
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        v1 = client.get_model_version_by_alias("bert-tiny", "champion")
        before = read_manifest(stage_url(str(root), "corpus")).counts["sentences"]

        _land_dump(dumps, "enwiki-20261201-pages-articles.xml.bz2",
                   "The December dump brings news of the valley. Its people say so at length.")  # fmt: skip
        cfg = load_config("tiny", overrides)
        rows = {r["stage"]: r for r in collect_status(cfg, str(root))}
        assert rows["corpus"]["why"] == ["input wiki changed"]
        assert rows["pretrain"]["why"] == ["after corpus: restarts if that changes its input"]

        second = run_deployment(env, "pretrain/refresh", {})  # no parameters: what the schedule sends
    assert second["state"] == "COMPLETED", (second["message"], second["logs"][-30:])
    ran = {k: v for k, v in second["tasks"].items() if k.split("/")[0] in STAGES}
    assert ran and set(ran.values()) == {"Completed"}, second["tasks"]
    logs = "\n".join(second["logs"])
    assert "stage pretrain: its previous output" in logs  # the runner kept the old run aside whole first,
    assert "were made from other examples" not in logs  # so the trainer met no checkpoint to set aside
    assert read_manifest(stage_url(str(root), "corpus")).counts["sentences"] > before
    assert all(r["state"] == "done" for r in collect_status(cfg, str(root))), collect_status(cfg, str(root))

    numbers = sorted(str(v.version) for v in client.search_model_versions("name = 'bert-tiny'"))
    assert len(numbers) == 2 and str(v1.version) == numbers[0]
    v1, v2 = (client.get_model_version("bert-tiny", n) for n in numbers)
    s1, s2 = float(v1.tags["bertflow.score"]), float(v2.tags["bertflow.score"])
    champion = str(client.get_model_version_by_alias("bert-tiny", "champion").version)
    assert champion == (numbers[1] if s2 > s1 else numbers[0]), (s1, s2, champion)
    # v2 names the new dump, vocabulary and shards by content
    assert v2.tags["lineage.raw.wiki.dump"] == "enwiki-20261201"
    assert v1.tags["lineage.raw.wiki.dump"] == "enwiki-20261101"
    assert v2.tags["lineage.raw.wiki.fingerprint"] == fingerprint_input(str(dumps))
    for stage in STAGES:  # corpus, vocab, examples, pretrain, export
        assert v2.tags[f"lineage.{stage}.fingerprint"] == fingerprint_input(stage_url(str(root), stage))
        assert v2.tags[f"lineage.{stage}.fingerprint"] != v1.tags[f"lineage.{stage}.fingerprint"]
        # v1's lead to its own outputs, kept aside by the refresh
        kept = v1.tags[f"lineage.{stage}.url"]
        assert kept.startswith(f"{root}/history/") and lineage.resolve(v1.tags, stage) == kept
        assert fingerprint_input(kept) == v1.tags[f"lineage.{stage}.fingerprint"]
    assert not any(p.startswith("_previous-") for p in os.listdir(root / "checkpoints"))
