"""The downstream grid fanned out by the flow: one Prefect task (and process) per unit, one
gathering task per downstream task, a failing unit reported without losing the others and
retried alone on the next run (the failure here: a unit's process killed, as an OOM kill would).
Real Prefect (a test server), real fine-tuning of the tiny chain's
exported model on the bundled SST-2 sample, MLflow on SQLite."""

import json
import os
import signal
import threading
import time

import pytest

pytest.importorskip("prefect")  # the XLA tier's own environment has no prefect

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.fanout import _set_path, fan_out
from flows.prefect_tasks import session
from flows.presets import load_config
from flows.table import stage_names
from pipeline.schema.manifest import read_manifest
from tasks.registry import get_task
from tasks.units import plan_units

OVERRIDES = {"finetune_tasks": ["sst2"], "finetune.grid.learning_rates": [5e-4, 1e-3], "finetune.epochs": 1}


@flow(task_runner=ThreadPoolTaskRunner(max_workers=4))
def finetune_only(root: str, model: str, uri: str) -> list[str]:
    given = {"model": model}
    with session("fanout-test", "tiny", root, OVERRIDES, uri, ("finetune",), given) as (cfg, root, tracking):
        results = fan_out(stage_names(cfg, ("finetune",)), cfg, root, False, tracking, given, retries=0)
        return [r.status for r in results]


class UnitKiller(threading.Thread):
    """Finds the first ``flows.proc.stage_entry`` process running a unit, reads which unit its spec
    names, waits until that unit is training (its MLflow run has a first ``train_loss``), and
    SIGKILLs it."""

    def __init__(self, uri: str):
        super().__init__(daemon=True)
        self.uri = uri
        self.killed = None

    def _training(self, unit_id: str) -> bool:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.uri)
        exp = client.get_experiment_by_name("bertflow")
        if exp is None:
            return False
        runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`bertflow.unit` = '{unit_id}'")
        return any(client.get_metric_history(r.info.run_id, "train_loss") for r in runs)

    def run(self):
        deadline = time.monotonic() + 300
        while self.killed is None and time.monotonic() < deadline:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                    if b"flows.proc.stage_entry" not in cmd:
                        continue
                    spec = json.loads(open(cmd[cmd.index(b"--spec") + 1].decode()).read())
                except (OSError, ValueError, IndexError):
                    continue
                if not spec.get("unit"):
                    continue
                unit_id = spec["unit"]["unit_id"]
                while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                    if self._training(unit_id):
                        os.kill(int(pid), signal.SIGKILL)
                        self.killed = unit_id
                        return
                    time.sleep(0.1)
            time.sleep(0.05)


def _task_runs(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {r.name: r.state.type.value for r in runs}


def test_units_fan_out_and_a_failed_unit_is_retried_alone(chain, tmp_path, prefect_server):
    model = str(chain[0] / "model")
    root = tmp_path / "run"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    units = root / "finetune" / "sst2" / "units"
    planned = [u["unit_id"] for u in plan_units(get_task("sst2"), load_config("tiny", OVERRIDES).finetune)]
    assert len(planned) == 2
    killer = UnitKiller(uri)
    killer.start()  # SIGKILLs the first unit process it sees training (as the kernel's OOM killer would)
    state = finetune_only(str(root), model, uri, return_state=True)
    killer.join(timeout=5)
    assert state.is_completed(), state.message
    blocked = killer.killed
    assert blocked in planned
    ok = next(u for u in planned if u != blocked)
    runs = _task_runs(state.state_details.flow_run_id)
    assert runs[f"finetune/sst2/{blocked}"] == "FAILED"
    assert runs[f"finetune/sst2/{ok}"] == "COMPLETED"
    assert runs["finetune/sst2"] == "COMPLETED"  # the gathering task
    results = json.loads((root / "finetune" / "sst2" / "results.json").read_text())
    assert [f["unit_id"] for f in results["failed"]] == [blocked]
    assert not (units / blocked / "_manifest.json").exists()
    assert "exited with code -9" in results["failed"][0]["error"]
    assert results["best_unit"] == ok
    manifest = read_manifest(str(root / "finetune" / "sst2"))
    assert manifest.counts["units"] == 2 and manifest.counts["units_failed"] == 1

    # what the unit wrote itself (its manifest is rewritten when gathering removes the weights of
    # a unit that is no longer the best)
    done = units / ok / "metrics.json"
    before = done.stat().st_mtime_ns
    again = finetune_only(str(root), model, uri, return_state=True)
    assert again.is_completed(), again.message
    assert done.stat().st_mtime_ns == before  # the finished unit was not run again
    results = json.loads((root / "finetune" / "sst2" / "results.json").read_text())
    assert results["failed"] == [] and len(results["points"]) == 2
    assert (units / blocked / "_manifest.json").exists()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("bertflow")
    unit_runs = [r for r in client.search_runs([exp.experiment_id]) if "bertflow.unit" in r.data.tags]
    statuses = sorted((r.data.tags["bertflow.unit"], r.info.status) for r in unit_runs)
    assert statuses == sorted([(blocked, "FAILED"), (ok, "FINISHED"), (blocked, "FINISHED"), (ok, "FINISHED")])
    trained = next(r for r in unit_runs if r.data.tags["bertflow.unit"] == blocked and r.info.status == "FINISHED")
    assert client.get_metric_history(trained.info.run_id, "train_loss")  # the unit's process logged its training


def test_secret_paths_go_back_into_a_redacted_config():
    data = {"data": {"wiki": "***"}, "pretrain": {"phases": [{"steps": 1}]}}
    _set_path(data, "data.wiki", "gs://b/x?token=1")
    _set_path(data, "pretrain.phases.0.steps", 5)
    assert data == {"data": {"wiki": "gs://b/x?token=1"}, "pretrain": {"phases": [{"steps": 5}]}}


@flow(task_runner=ThreadPoolTaskRunner(max_workers=4))
def every_task(root: str, model: str, uri: str, overrides: dict) -> list[str]:
    given = {"model": model}
    with session("every-task", "tiny", root, overrides, uri, ("finetune",), given) as (cfg, root, tracking):
        results = fan_out(stage_names(cfg, ("finetune",)), cfg, root, False, tracking, given, retries=0)
        return [r.status for r in results]


@pytest.mark.slow
def test_every_bundled_task_at_once_in_the_flows_threads(chain, tmp_path, prefect_server):
    """Issue 19 point 6: four or more downstream tasks at once crashed with "SystemError: AST
    constructor recursion depth mismatch" (ast.parse of the code versions in parallel threads).
    Every row of the task registry runs here at once, one grid point each, through the flow's fan-out
    on Prefect's thread pool, as `bertflow run` does: JGLUE's and CLUE's from the Japanese and
    Chinese samples (through data.downstream_urls; the English model reads them, its tokens mostly
    [UNK]: this test is about the threads, not the scores)."""
    from flows.presets import SAMPLE_DATA
    from tasks.registry import TASKS

    names = list(TASKS)
    assert len(names) >= 4
    overrides = {"finetune_tasks": names, "finetune.grid.learning_rates": [1e-3], "finetune.epochs": 0.1}
    lang = {"jglue": "ja", "clue": "zh"}
    for name, task in TASKS.items():
        if task.family in lang:
            sample = SAMPLE_DATA.parent / f"{SAMPLE_DATA.name}-{lang[task.family]}"
            overrides[f"data.downstream_urls.{name}"] = str(sample / task.folder)
    root = tmp_path / "run"
    state = every_task(str(root), str(chain[0] / "model"), f"sqlite:///{tmp_path}/mlflow.db", overrides,
                       return_state=True)  # fmt: skip
    assert state.is_completed(), state.message
    assert state.result() == ["done"] * len(names)
    for name in names:
        manifest = read_manifest(str(root / "finetune" / name))
        assert manifest.counts["units"] >= 1 and manifest.counts["units_failed"] == 0, name  # features: a unit per mix
        assert TASKS[name].metric in manifest.counts, name


def test_a_stage_task_retries_only_what_a_retry_can_fix(prefect_server):
    """The stage rows' retries (stage_options) go through retry_condition in Prefect's own engine:
    a lost worker is retried, bad input and anything after the stop request are not."""
    from prefect import task

    from flows.prefect_tasks import stage_options
    from flows.proc.protocol import STOP, StageProcessError

    attempts: list[str] = []
    errors = {"bad input": lambda: ValueError("row 3: bad label"), "lost worker": lambda: RuntimeError("worker lost"),
              "oom": lambda: StageProcessError("unit", -9)}  # fmt: skip

    @task
    def failing(kind: str) -> None:
        attempts.append(kind)
        raise errors[kind]()

    options = {**stage_options("pretrain"), "retry_delay_seconds": 0}  # its row: 3 retries
    assert options["retries"] == 3

    @flow
    def one(kind: str) -> bool:
        return failing.with_options(**options)(kind, return_state=True).is_failed()

    for kind, runs in (("bad input", 1), ("oom", 1), ("lost worker", 4)):
        attempts.clear()
        assert one(kind)
        assert attempts == [kind] * runs, (kind, attempts)
    STOP.request(signal.SIGINT)
    try:
        attempts.clear()
        assert one("lost worker")
        assert attempts == ["lost worker"]  # after Ctrl-C: never retried
    finally:
        STOP.clear()
