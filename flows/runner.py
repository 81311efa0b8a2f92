"""Running a row of the stage table: whether it is up to date, and running it (or one of its units).

A stage is skipped when its folder holds a manifest made from the same config, the same input
fingerprints and the same code (``flows.versions``: a digest of the modules its row lists), and
every file it lists is there with its size (``status --verify``: checksums). ``force`` reruns a
stage whatever its manifest says. A finished output that a rerun replaces is first moved to
``{root}/history/`` (``flows.lineage``: a registered version may name it), unless the stage
continues its own checkpoints. The orchestrator stamps the code version into the manifest
after the run; a crash before the stamp only makes the stage rerun. Nothing here imports Prefect
or MLflow: the Prefect tasks (``flows.prefect_tasks``) wrap these calls, and tests call them
directly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from flows.calls import LogFn, StageCall, StageResult
from flows.lineage import keep_previous, settle
from flows.presets import RunConfig
from flows.table import (
    get_stage,
    producer,
    stage_config,
    stage_inputs,
    stage_names,
    stage_url,
)
from flows.table import written_by_this_run as written_by_this_run
from flows.versions import code_version
from pipeline.schema.manifest import (
    Manifest,
    ManifestError,
    check_inputs_agree,
    fingerprint_input,
    has_manifest,
    read_attempt,
    read_manifest,
    save_manifest,
)

log = logging.getLogger("bertflow.flow")


@dataclass
class StageState:
    stage: str
    url: str
    state: str  # "done" | "stale" | "missing" | "running" | "blocked"
    reasons: list[str] = field(default_factory=list)
    manifest: Manifest | None = None


def stage_code_version(stage: str) -> str:
    return code_version(get_stage(stage).code)


def stage_state(
    stage: str,
    cfg: RunConfig,
    root: str,
    given: dict[str, str] | None = None,
    checksums: bool = False,
    inputs: dict[str, str] | None = None,
) -> StageState:
    """Whether a stage's output is up to date, and if not, why. ``inputs``: the stage's
    :func:`stage_inputs` when the caller has them already."""
    url = stage_url(root, stage)
    row = get_stage(stage)
    if not has_manifest(url):
        attempt = read_attempt(url) if row.resumable else None
        if attempt is None:
            return StageState(stage, url, "missing", ["no manifest: never run or unfinished"])
        return _unfinished(stage, url, attempt, cfg, root, given, inputs)
    try:
        manifest = read_manifest(url)
    except ManifestError as exc:
        return StageState(stage, url, "stale", [str(exc)])
    try:
        inputs = stage_inputs(stage, cfg, root, given) if inputs is None else inputs
        # every input the stage table declares, never only those the manifest lists: a manifest
        # that records fewer (or other) inputs than the table says the stage reads is stale
        fingerprints = {k: fingerprint_input(u) for k, u in inputs.items()}
        expected = stage_config(stage, cfg, inputs)
    except (ManifestError, FileNotFoundError, KeyError) as exc:
        return StageState(stage, url, "stale", [f"inputs not ready: {exc}"], manifest)
    reasons = manifest.stale_reasons(expected, fingerprints, stage_code_version(stage))
    if row.resumable:  # its checkpoints are not resumed on other inputs (model/resume.py)
        reasons = [_restarts(r[len("input ") : -len(" changed")]) if r.startswith("input ") else r for r in reasons]
    reasons += manifest.missing_files(checksums)
    if manifest.counts.get("units_failed"):  # a partial grid: the next run retries its failed units
        reasons.append(f"{int(manifest.counts['units_failed'])} of {int(manifest.counts.get('units', 0))} units failed")
    return StageState(stage, url, "stale" if reasons else "done", reasons, manifest)


def _continues(
    stage: str,
    cfg: RunConfig,
    root: str,
    given: dict[str, str] | None,
    force: bool,
    inputs: dict[str, str] | None = None,
) -> bool:
    """Whether a rerun continues the stage's state (a resumable stage on the inputs its
    checkpoints came from) instead of replacing its output."""
    if force or not get_stage(stage).resumable or not has_manifest(stage_url(root, stage)):
        return False
    manifest = read_manifest(stage_url(root, stage))
    inputs = stage_inputs(stage, cfg, root, given) if inputs is None else inputs
    return all(fingerprint_input(inputs[k]) == fp for k, fp in manifest.inputs.items() if k in inputs)


def _restarts(name: str) -> str:
    return f"{name} changed — restarts (its checkpoints, made from other {name}, are set aside)"


def _unfinished(
    stage: str,
    url: str,
    attempt: dict[str, str],
    cfg: RunConfig,
    root: str,
    given: dict[str, str] | None,
    inputs: dict[str, str] | None = None,
) -> StageState:
    """A resumable stage with no manifest but an attempt's record (``_attempt.json``): whether a
    rerun resumes its checkpoints or, its inputs changed since they were made, starts over."""
    try:
        inputs = stage_inputs(stage, cfg, root, given) if inputs is None else inputs
        changed = sorted(k for k, fp in attempt.items() if k in inputs and fingerprint_input(inputs[k]) != fp)
    except (ManifestError, FileNotFoundError, KeyError) as exc:
        return StageState(stage, url, "stale", [f"unfinished; inputs not ready: {exc}"])
    if changed:
        return StageState(stage, url, "stale", [_restarts(k) for k in changed])
    return StageState(stage, url, "stale", ["unfinished: a rerun resumes from its last checkpoint"])


def check_inputs_ready(
    stage: str, cfg: RunConfig, root: str, given: dict[str, str] | None = None, inputs: dict[str, str] | None = None
) -> None:
    """Fail before any work when an input is missing (an upstream stage unfinished, a raw file
    absent) or when two inputs do not belong together (the row's ``agree`` pairs)."""
    inputs = stage_inputs(stage, cfg, root, given) if inputs is None else inputs
    for name, url in inputs.items():
        if written_by_this_run(name, url, root):
            if not has_manifest(url):
                raise ManifestError(
                    f"stage {stage} needs {name} at {url}, which has no finished manifest: run "
                    f"`bertflow stage {producer(name).name}` (or `bertflow run`) first"
                )
        else:
            fingerprint_input(url)  # raises FileNotFoundError naming the URL
    check_inputs_agree(inputs, get_stage(stage).agree)


def run_stage(
    stage: str,
    cfg: RunConfig,
    root: str,
    force: bool = False,
    log_fn: LogFn | None = None,
    env: dict[str, str] | None = None,
    given: dict[str, str] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    aggregate_only: bool = False,
) -> StageResult:
    """Run one stage unless it is up to date (or ``force``); return what it did.

    ``aggregate_only``: the stage's units ran already (``run_stage_unit``, fanned out by the
    flow); gather them here, in this process, whatever the stage's state."""
    row = get_stage(stage)
    url = stage_url(root, stage)
    start = time.time()
    if aggregate_only and row.units is None:
        raise ValueError(f"stage {stage} has no units to aggregate")
    inputs = stage_inputs(stage, cfg, root, given)  # once per trip: the checks below take them
    if not force and not aggregate_only:
        current = stage_state(stage, cfg, root, given, inputs=inputs)
        if current.state == "done":
            log.info("stage %s: up to date, skipped (%s)", stage, url)
            m = current.manifest
            return StageResult(stage, "skipped", time.time() - start, url, m.counts, m, inputs)
        if current.manifest is not None:
            log.info("stage %s: stale (%s)", stage, "; ".join(current.reasons))
    check_inputs_ready(stage, cfg, root, given, inputs)
    if row.preflight is not None and not aggregate_only:  # again, now that the earlier stages' outputs exist
        row.preflight(cfg, inputs)
    kept = None
    if row.units is None and not aggregate_only and not _continues(stage, cfg, root, given, force, inputs):
        kept = keep_previous(stage, root, cfg.keep_outputs)  # a registered version may name it (flows/lineage.py)
    call = StageCall(stage, cfg, root, url, inputs, log_fn, restart=force and row.resumable,
                     aggregate_only=aggregate_only, env=dict(env or {}), on_progress=on_progress)  # fmt: skip
    log.info("stage %s: %s -> %s", stage, "gathering its units" if aggregate_only else "running", url)
    if row.where == "process" and not aggregate_only:
        from flows.proc.launch import run_entry

        parallel = len(stage_names(cfg, (row.group,)))  # the group's stages run side by side
        run_entry(call.spec(), f"stage {stage}", f"bertflow.{row.group}", call.env, parallel, on_progress,
                  row.timeout_s)  # fmt: skip
        manifest = read_manifest(url)
    else:
        manifest = row.run(call)
    manifest.code_version = stage_code_version(stage)
    save_manifest(manifest)
    settle(stage, root, kept, manifest.fingerprint, cfg.keep_outputs)
    # a gathered stage's own time is the gathering; its manifest has the units' total
    seconds = manifest.seconds if aggregate_only and manifest.seconds else time.time() - start
    log.info("stage %s: done in %.1f s", stage, seconds)
    return StageResult(stage, "done", seconds, url, manifest.counts, manifest, inputs)


def run_stage_unit(
    stage: str,
    cfg: RunConfig,
    root: str,
    unit_id: str,
    force: bool = False,
    log_fn: LogFn | None = None,
    env: dict[str, str] | None = None,
    given: dict[str, str] | None = None,
    in_process: bool = False,
) -> float:
    """Run one unit of a fanned-out stage (its own process unless ``in_process``); a unit that
    is up to date is skipped by the row itself. Raises when the unit failed (its ``error.txt``
    keeps the traceback for the stage's aggregation). Returns the seconds it took."""
    row = get_stage(stage)
    if row.units is None:
        raise ValueError(f"stage {stage} is not made of units")
    units = row.units.plan(cfg)
    unit = next((u for u in units if u["unit_id"] == unit_id), None)
    if unit is None:
        raise KeyError(f"stage {stage}: no unit {unit_id!r}; planned: {[u['unit_id'] for u in units]}")
    inputs = stage_inputs(stage, cfg, root, given)
    check_inputs_ready(stage, cfg, root, given, inputs)
    call = StageCall(stage, cfg, root, stage_url(root, stage), inputs, log_fn, restart=force, unit=unit)
    start = time.time()
    if not force and row.units.done(call):
        log.info("%s unit %s: up to date, skipped", stage, unit_id)
        return 0.0
    if in_process:
        row.run(call)
        return time.time() - start
    from flows.proc.launch import run_entry

    # as many such children share this machine as the group's grids run at once: threads split the cores
    parallel = sum(get_stage(n).units.slots(cfg) for n in stage_names(cfg, (row.group,)))
    try:
        run_entry(call.spec(), f"{stage} unit {unit_id}", f"bertflow.{row.group}", dict(env or {}), parallel,
                  None, row.timeout_s)  # fmt: skip
    except RuntimeError as exc:  # e.g. killed: leave the reason where the aggregation reads it
        row.units.failed(call, str(exc))
        raise
    return time.time() - start
