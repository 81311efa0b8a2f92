"""What the Prefect UI draws of a flow run: each stage task waits for the one before (the run
graph's edges), a stage that is up to date ends in a Completed state named ``Skipped``, and a run
that did nothing opens no MLflow run but its parent, which says so. Real Prefect (a test server),
real MLflow on SQLite; two small stages of the real table's shape stand in for the chain."""

import pytest

pytest.importorskip("prefect")

from prefect import flow

from flows import table
from flows.calls import StageCall
from flows.chain import finish, run_stages
from flows.prefect_tasks import Tracking
from flows.presets import load_config
from flows.table import Stage
from flows.tracking import Tracker
from pipeline.schema.manifest import fingerprint_input, write_manifest


def _write(name: str):
    def run(c: StageCall):
        from pipeline.schema.storage import join_url, write_atomically

        write_atomically(join_url(c.url, "out.txt"), f"{name} from {sorted(c.inputs)}\n")
        # the fingerprints of every input the row declares, as a real stage records them
        fingerprints = {k: fingerprint_input(u) for k, u in c.inputs.items()}
        return write_manifest(name, c.url, {"n": 1}, fingerprints, {"lines": 1.0})

    return run


def _row(name: str, before: str) -> Stage:
    def inputs(cfg, root):
        return {before: f"{root}/{before}"} if before else {}

    return Stage(name, name, inputs=inputs, config=lambda cfg, inputs: {"n": 1}, run=_write(name), code=(),
                 provides=name)  # fmt: skip


@pytest.fixture
def three_stages(monkeypatch):
    rows = {name: _row(name, before) for name, before in (("alpha", ""), ("beta", "alpha"), ("gamma", "beta"))}
    monkeypatch.setattr(table, "STAGES", {**table.STAGES, **rows})
    return list(rows)


@flow
def three_stage_flow(names: list[str], root: str, uri: str) -> list[str]:
    cfg = load_config("tiny")
    tracker = Tracker(uri)
    tracker.use_experiment("bertflow")
    parent = tracker.start_run("graph-test")
    tracking = Tracking(uri, tracker.experiment_id, parent)
    results = run_stages(names, cfg, root, False, tracking)
    finish("tiny", root, cfg, tracking, results, 0.0)
    tracker.end_run(parent)
    return [r.status for r in results]


def _task_runs(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def test_the_run_graph_draws_the_chain_and_skipped_stages_say_so(three_stages, tmp_path, prefect_server):
    from mlflow.tracking import MlflowClient

    root, uri = str(tmp_path / "root"), f"sqlite:///{tmp_path}/mlflow.db"
    first = three_stage_flow(three_stages, root, uri, return_state=True)
    assert first.is_completed() and first.result() == ["done"] * 3
    runs = {r.name: r for r in _task_runs(first.state_details.flow_run_id)}
    assert {n: runs[n].state.name for n in three_stages} == {n: "Completed" for n in three_stages}
    # each stage's task run names the one before as what it waited for: the graph's edges
    for name, before in (("beta", "alpha"), ("gamma", "beta")):
        parents = {i.id for inputs in runs[name].task_inputs.values() for i in inputs}
        assert runs[before].id in parents, (name, runs[name].task_inputs)
    assert not [i for inputs in runs["alpha"].task_inputs.values() for i in inputs]

    second = three_stage_flow(three_stages, root, uri, return_state=True)
    assert second.is_completed() and second.result() == ["skipped"] * 3
    runs = {r.name: r for r in _task_runs(second.state_details.flow_run_id)}
    assert {n: (runs[n].state.type.value, runs[n].state.name) for n in three_stages} == {
        n: ("COMPLETED", "Skipped") for n in three_stages
    }
    parents = {i.id for inputs in runs["gamma"].task_inputs.values() for i in inputs}
    assert runs["beta"].id in parents  # a skipped stage is still a link of the chain

    # MLflow: the first run opened a run per stage under its parent; the second only its parent, which says why
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("bertflow")
    mlflow_runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    assert [r.info.run_name for r in mlflow_runs] == ["graph-test", *three_stages, "graph-test"]
    assert mlflow_runs[-1].data.tags["bertflow.outcome"] == "nothing to do"
    assert "bertflow.outcome" not in mlflow_runs[0].data.tags
