"""Fanning a stage made of units (the downstream grid) out over Prefect tasks.

A downstream task is many independent fine-tuning runs, one per grid point x seed (a *unit*,
``Stage.units`` in the stage table). The flows do not run a task as one opaque job: every unit is
a Prefect task of its own (``<stage>/<unit_id>`` in the UI, its own retries, its own MLflow child
run under the flow's run), then one aggregation task per stage gathers whatever finished into the
stage's results and manifest. A failing unit fails only its own task run; the aggregation still
runs, lists it with the last line of its error, and fails only when every unit failed.

Where a unit runs (``finetune.grid.dispatch``):

- ``process`` (default): a child process of the flow's process, ``finetune.grid.workers`` units of
  a stage at a time (the flow's thread pool bounds the total); torch threads split the cores.
- ``deployment``: ``run_deployment`` of ``finetune.grid.deployment`` (``finetune-unit/default`` in
  ``prefect.yaml``), so each unit lands on the infrastructure of that deployment's work pool (a
  GPU node per unit at scale) as a subflow run. The unit's config travels as a flow parameter
  with secrets redacted; the worker's job supplies them (``BERTFLOW_SECRET_OVERRIDES``).

A stage that is up to date is skipped whole, with no unit task; a unit whose folder already
holds the manifest of exactly its run is skipped without starting a process, so a rerun after
a failure retries only the units that did not finish. A unit task is retried only for what a
retry can fix (``flows.prefect_tasks.retry_condition``); after the stop request (Ctrl-C) no unit
starts and none is retried.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture
from prefect.utilities.annotations import allow_failure

from flows.calls import StageResult
from flows.prefect_tasks import end_run, retry_condition, stage_task, unwrap
from flows.presets import RunConfig, config_from_dict
from flows.proc.protocol import STOP
from flows.runner import check_inputs_ready, run_stage_unit, stage_state
from flows.table import get_stage, stage_url
from flows.tracker_sqlite import open_tracker
from flows.tracking import ENV_RUN_ID, ENV_TRACKING_URI
from pipeline.schema.config import redact

log = logging.getLogger("bertflow.flow")

_SLOTS: dict[tuple[str, str, int], threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def _slot(root: str, stage: str, workers: int) -> threading.BoundedSemaphore:
    """At most ``workers`` units of one stage run at once in this process."""
    with _SLOTS_LOCK:
        return _SLOTS.setdefault((root, stage, workers), threading.BoundedSemaphore(max(1, workers)))


@task(name="unit", task_run_name="{stage}/{unit_id}", cache_policy=NO_CACHE)
def unit_task(
    stage: str, unit_id: str, cfg: RunConfig, root: str, force: bool, tracking: Any, given: dict[str, str] | None = None
) -> float:
    """One unit of a fanned-out stage, in its MLflow child run; raises when it failed."""
    from prefect.runtime import task_run

    first_attempt = (task_run.run_count or 1) <= 1
    row = get_stage(stage)
    with _slot(root, stage, row.units.slots(cfg)):
        STOP.check(f"{stage} unit {unit_id}")
        tracker = tracking.tracker()
        run_id = tracker.start_run(
            f"{stage}/{unit_id}",
            parent_id=tracking.parent_run_id,
            tags={"bertflow.stage": stage, "bertflow.unit": unit_id, "bertflow.root": root},
        )
        ok = False
        try:
            unit = next(u for u in row.units.plan(cfg) if u["unit_id"] == unit_id)
            tracker.log_params(run_id, {k: v for k, v in unit.items() if k != "unit_id"})
            dispatch = row.units.dispatch(cfg)
            if dispatch != "process":
                seconds = _via_deployment(
                    dispatch, stage, unit_id, cfg, root, force and first_attempt, tracking.uri, run_id, given
                )
            else:
                env = {ENV_RUN_ID: run_id, ENV_TRACKING_URI: tracking.uri}
                seconds = run_stage_unit(stage, cfg, root, unit_id, force=force and first_attempt, env=env, given=given)
            tracker.log_metrics(run_id, {"unit_seconds": seconds})
            ok = True
            return seconds
        finally:
            end_run(tracker, run_id, ok)


def _via_deployment(
    name: str,
    stage: str,
    unit_id: str,
    cfg: RunConfig,
    root: str,
    force: bool,
    tracking_uri: str,
    run_id: str,
    given: dict[str, str] | None,
) -> float:
    import time

    from prefect.deployments import run_deployment

    start = time.time()
    flow_run = run_deployment(
        name,
        parameters={
            "stage": stage,
            "unit_id": unit_id,
            "config": redact(dataclasses.asdict(cfg)),
            "root": root,
            "force": force,
            "mlflow_uri": tracking_uri,
            "run_id": run_id,
            "given": given or {},
        },
        as_subflow=True,
    )
    state = flow_run.state
    if state is None or not state.is_completed():
        kind = state.type.value if state is not None else "no state"
        raise RuntimeError(
            f"{stage} unit {unit_id}: deployment run {flow_run.name} of {name} ended {kind}"
            + (f": {state.message}" if state is not None and state.message else "")
        )
    return time.time() - start


@flow(name="finetune-unit", log_prints=True)
def finetune_unit(
    stage: str,
    unit_id: str,
    config: dict[str, Any],
    root: str,
    force: bool = False,
    mlflow_uri: str | None = None,
    run_id: str | None = None,
    given: dict[str, str] | None = None,
) -> float:
    """One unit of a downstream task's grid, run here (the deployment ``finetune-unit/default``).

    ``config`` is the flow's whole run config with secrets redacted; the job's environment
    (``BERTFLOW_SECRET_OVERRIDES``) puts them back."""
    from flows.secrets import merge_secret_overrides

    data = json.loads(json.dumps(config))
    for path, value in merge_secret_overrides({}).items():
        _set_path(data, path, value)
    cfg = config_from_dict(data)
    log_fn = None
    if run_id and mlflow_uri:
        tracker = open_tracker(mlflow_uri)
        log_fn = lambda metrics, step: tracker.log_metrics(run_id, metrics, step)
    return run_stage_unit(stage, cfg, root, unit_id, force=force, log_fn=log_fn, given=given or None, in_process=True)


def _set_path(data: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    node: Any = data
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    if isinstance(node, list):
        node[int(keys[-1])] = value
    else:
        node[keys[-1]] = value


def fan_out(
    names: list[str],
    cfg: RunConfig,
    root: str,
    forced: set[str] | bool,
    tracking: Any,
    given: dict[str, str] | None = None,
    retries: int | None = None,
    after: Any = None,
) -> list[StageResult]:
    """Run the stages ``names`` (rows with units) unit by unit, then gather each; their results
    in the order of ``names``. Call from a flow whose task runner runs tasks concurrently.
    ``retries``: of each unit task (default: the stage row's). ``after``: the state of the stage
    they follow (the export), which every unit and gathering task waits for (the run graph's edges)."""
    upstream = [after] if after is not None else None

    def is_forced(name: str) -> bool:
        return forced if isinstance(forced, bool) else name in forced

    unit_futures: dict[str, list[PrefectFuture]] = {}
    for name in names:
        row = get_stage(name)
        if row.units is None:
            raise ValueError(f"stage {name} has no units to fan out")
        if not is_forced(name) and stage_state(name, cfg, root, given).state == "done":
            continue
        check_inputs_ready(name, cfg, root, given)
        units = row.units.prepare(cfg, stage_url(root, name))
        dispatch = row.units.dispatch(cfg)
        log.info(
            "stage %s: running -> %s (%d units, one %s each)",
            name,
            stage_url(root, name),
            len(units),
            "process" if dispatch == "process" else f"run of {dispatch}",
        )
        unit_futures[name] = [
            unit_task.with_options(
                retries=row.retries if retries is None else retries,
                retry_delay_seconds=10,
                retry_condition_fn=retry_condition,
            ).submit(name, u["unit_id"], cfg, root, is_forced(name), tracking, given, wait_for=upstream)
            for u in units
        ]
    # submitted after every unit (the pool is first-in first-out): a gathering task waiting for
    # its units never holds a thread a unit needs
    futures = []
    for name in names:
        if name in unit_futures:
            futures.append(
                stage_task.with_options(retries=0).submit(
                    name,
                    cfg,
                    root,
                    True,
                    tracking,
                    given,
                    aggregate_only=True,
                    wait_for=[allow_failure(f) for f in unit_futures[name]],
                )
            )
        else:
            futures.append(stage_task.submit(name, cfg, root, False, tracking, given, wait_for=upstream))
    return [unwrap(f.result()) for f in futures]
