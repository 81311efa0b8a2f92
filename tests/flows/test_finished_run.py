"""A finished root's ``bertflow run`` is answered from the manifests and the tracking store, without
Prefect (``flows.finished``); anything left to do (a stale stage, a registry that is not as its
results say, ``--force``) goes through the flow as before. On copies of the tiny chain's root."""

import shutil
import sqlite3

import pytest

from flows.overrides import parse_overrides
from flows.presets import load_config
from flows.tracking import default_tracking_uri

STAGES = ("corpus", "vocab", "examples", "pretrain", "export", "finetune/sst2", "finetune/squad1", "finetune/conll2003")
PREFECT_STARTS = "Starting temporary server"
ANSWERED = "answered from the manifests"


@pytest.fixture
def env(cli_env):
    """The chain's environment, the root's own store: ``mlflow.set_tracking_uri`` in an earlier
    test sets ``MLFLOW_TRACKING_URI`` in this process, which a run would take as a shared store."""
    return {**cli_env, "MLFLOW_TRACKING_URI": ""}


@pytest.fixture
def root(chain, tmp_path):
    """A copy of the finished tiny chain's root (its store then names the old place: a run follows it)."""
    copy = tmp_path / "root"
    shutil.copytree(chain[0], copy, ignore=shutil.ignore_patterns(".bertflow.lock"))
    return copy


def _parents(root) -> list:
    from mlflow.tracking import MlflowClient

    uri = default_tracking_uri(str(root))
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id])
    parents = sorted((r for r in runs if "mlflow.parentRunId" not in r.data.tags), key=lambda r: r.info.start_time)
    children = {p.info.run_id: [r for r in runs if r.data.tags.get("mlflow.parentRunId") == p.info.run_id]
                for p in parents}  # fmt: skip
    return [(p, children[p.info.run_id]) for p in parents]


def test_a_finished_root_is_answered_without_prefect(root, cli, env, run_command):
    card, results = (root / "model" / "README.md").read_bytes(), (root / "finetune" / "results.md").read_bytes()
    before = _parents(root)
    code, loaded, out, err = run_command(cli(["run", "--preset", "tiny"], root)[3:], env)
    assert code == 0, err[-3000:]
    assert PREFECT_STARTS not in err and ANSWERED in err
    assert not {"prefect", "mlflow", "torch", "apache_beam"} & set(loaded), loaded
    for stage in STAGES:
        assert f"stage {stage}: up to date, skipped" in err, stage
    assert "results:" in out and "skipped" in out and "MLflow runs: http://" in out
    assert "registered model: bert-tiny version 1 (alias champion)" in out

    after = _parents(root)
    assert len(after) == len(before) + 1
    (new, children), (flows_first, _) = after[-1], after[0]
    assert children == [] and new.info.status == "FINISHED" and new.info.run_name == "pretrain-tiny"
    assert new.data.tags["bertflow.outcome"] == "nothing to do"
    assert new.data.tags["mlflow.note.content"] == (
        "Nothing to do: all 8 stages were up to date (no stage run was opened)."
    )
    # what the flow's own parent run of this root recorded: the same config, figures and results
    assert new.data.params == {**flows_first.data.params, "root": str(root)}
    assert new.data.metrics == flows_first.data.metrics and "glue_average" in new.data.metrics
    for tag in ("bertflow.preset", "bertflow.config_fingerprint"):
        assert new.data.tags[tag] == flows_first.data.tags[tag]
    assert new.data.tags["bertflow.root"] == str(root)
    # the card and the results table rewritten as the flow rewrites them: the same bytes
    assert (root / "model" / "README.md").read_bytes() == card
    assert (root / "finetune" / "results.md").read_bytes() == results
    logged = new.info.artifact_uri.removeprefix("file://") + "/results.md"
    assert logged.startswith(f"{root}/mlartifacts/") and open(logged, "rb").read() == results


def test_a_stale_stage_goes_through_the_flow_then_the_root_is_answered_again(root, cli, env, run_command):
    """A run killed after its last task's units finished, before they were gathered: the flow
    gathers them (Prefect's server, a run for the stage); the next run has nothing to do."""
    import subprocess

    (root / "finetune" / "conll2003" / "_manifest.json").unlink()
    before = _parents(root)
    flow = subprocess.run(cli(["run", "--preset", "tiny"], root), env=env, capture_output=True, text=True,
                          timeout=1200)  # fmt: skip
    assert flow.returncode == 0, flow.stderr[-3000:]
    assert PREFECT_STARTS in flow.stderr and ANSWERED not in flow.stderr
    assert "stage finetune/conll2003: gathering its units" in flow.stderr
    (parent, children), *_ = _parents(root)[len(before) :]
    assert "bertflow.outcome" not in parent.data.tags
    assert "finetune/conll2003" in {c.info.run_name for c in children}

    code, loaded, out, err = run_command(cli(["run", "--preset", "tiny"], root)[3:], env)
    assert code == 0 and ANSWERED in err and PREFECT_STARTS not in err, err[-3000:]
    assert "prefect" not in loaded
    assert _parents(root)[-1][0].data.tags["bertflow.outcome"] == "nothing to do"


def _why_not(root, chain_overrides, uri: str | None = None):
    from flows.finished import _finished

    cfg = load_config("tiny", parse_overrides(chain_overrides))
    return _finished(cfg, str(root), uri or default_tracking_uri(str(root)))


@pytest.mark.parametrize(
    "change, why",
    [
        ("delete from registered_model_aliases where alias = 'champion'", "alias champion"),
        ("update model_versions set description = 'edited'", "description"),
        ("update model_version_tags set value = '1.0' where key = 'bertflow.score'", "tag bertflow.score"),
        ("delete from model_version_tags where key = 'bertflow.export_fingerprint'", "no version of bert-tiny holds"),
        ("update runs set status = 'RUNNING' where run_uuid = (select min(run_uuid) from runs)", "left RUNNING"),
        ("alter table metrics add column model_id text", "not in the layout this path writes"),
    ],
)
def test_a_registry_or_store_the_flow_would_change_is_left_to_the_flow(root, chain_overrides, change, why):
    """Each decides without writing: the reason names what the flow's registry step (or its
    session) would change."""
    from flows.finished import Finished

    assert isinstance(_why_not(root, chain_overrides), Finished)
    with sqlite3.connect(root / "mlflow.db") as db:
        db.execute(change)
    assert why in _why_not(root, chain_overrides)


def test_other_stores_and_a_stale_stage_are_left_to_the_flow(root, chain_overrides):
    assert "not an existing SQLite file" in _why_not(root, chain_overrides, "http://127.0.0.1:5000")
    assert "not an existing SQLite file" in _why_not(root, chain_overrides, f"sqlite:///{root}/elsewhere.db")
    (root / "vocab" / "vocab.txt").write_text("[PAD]\n")
    assert _why_not(root, chain_overrides) == "stage vocab is stale"


def test_force_and_stage_commands_never_ask(root, cli, monkeypatch):
    """``--force`` and ``bertflow stage`` go to the flow's worker without asking the manifests."""
    import flows.finished
    import flows.proc.supervisor
    from flows.cli import main

    def refuse(*args, **kwargs):
        raise AssertionError("answer_finished_run asked")

    supervised = []
    monkeypatch.setattr(flows.finished, "answer_finished_run", refuse)
    monkeypatch.setattr(flows.proc.supervisor, "supervise", lambda argv, what: supervised.append(what) or 0)
    assert main(cli(["run", "--preset", "tiny", "--force", "export"], root)[3:]) == 0
    assert main(cli(["stage", "export", "--preset", "tiny"], root)[3:]) == 0
    assert supervised == ["run", "stage"]
