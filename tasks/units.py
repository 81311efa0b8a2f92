"""A downstream task's grid, unit by unit: plan, run (anywhere), and gather into the task's results.

A *unit* is one fine-tuning run: a grid point (``tasks.grid``) and a seed. The stage table runs a
task either

- whole, in one process (``run_downstream``: plan its grid, run each unit, aggregate), or
- fanned out (what the flows do, ``flows.fanout``): ``prepare_units`` -> ``run_unit_safely`` for
  each unit, anywhere (a process each, or a deployment run each; a finished unit is skipped, a
  failed one retried alone) -> ``aggregate_task``.

``manifest_config(task, config)`` is what decides whether a task's output is stale: the whole
``FinetuneConfig`` (grid and task options included) plus the task name. ``task_data_url``
resolves where a task's files are (a per-task URL in ``data.downstream_urls``, else the
downstream root plus the task's folder, ``tasks.registry``).

Layout of a task folder: ``units/<unit_id>/`` (each run, with its manifest), then the task's
own ``results.json``/``results.md``, the best unit's predictions and metrics copied up, and
``_manifest.json`` last.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from collections.abc import Callable
from typing import Any

import fsspec

from model.contract import (
    Manifest,
    clear_stage,
    config_digest,
    fingerprint_input,
    has_manifest,
    join_url,
    read_manifest,
    save_manifest,
    write_manifest,
)
from tasks.config import FINETUNED_FOLDER, FinetuneConfig
from tasks.grid import point_key
from tasks.registry import Task

logger = logging.getLogger("bertflow.finetune")
LogFn = Callable[[dict[str, float], int], None]


def task_data_url(task: Task, downstream_root: str, overrides: dict[str, str] | None = None) -> str:
    """Where task ``task.name`` reads its files: ``overrides[task.name]`` (``data.downstream_urls``) when
    given, else ``downstream_root/<the task's folder>``."""
    return (overrides or {}).get(task.name) or join_url(downstream_root, task.folder)


def manifest_config(task: Task, config: FinetuneConfig) -> dict[str, Any]:
    """What decides whether a task's output is stale (the aggregate manifest's config): the
    whole config but where and how many units run at once, which do not change results."""
    data = dataclasses.asdict(config)
    for key in RUN_PLACEMENT:
        data["grid"].pop(key, None)
    return {**data, "task": task.name}


RUN_PLACEMENT = ("workers", "dispatch", "deployment")
"""Grid fields that say where units run, not what they compute."""


# -- the fan-out ----------------------------------------------------------------------------------
def plan_units(task: Task, config: FinetuneConfig) -> list[dict[str, Any]]:
    from tasks.grid import plan_grid

    return plan_grid(config, config.features.layer_mixes if task.feature_based else ())


def unit_config(config: FinetuneConfig, unit: dict[str, Any]) -> FinetuneConfig:
    """The run's config for one unit: its hyper-parameters, and nothing of the rest of the plan
    (the grid's other values, the other layer mixes), so a unit stays valid when the grid grows
    or shrinks around it."""
    from tasks.config import GridConfig

    features = config.features
    if unit.get("feature_mix"):
        features = dataclasses.replace(features, layer_mixes=(unit["feature_mix"],))
    return dataclasses.replace(
        config,
        learning_rate=unit["learning_rate"],
        batch_size=unit["batch_size"],
        epochs=unit["epochs"],
        seed=unit["seed"],
        features=features,
        grid=GridConfig(save_models=config.grid.save_models),
    )


def unit_manifest_config(task: Task, config: FinetuneConfig, unit: dict[str, Any]) -> dict[str, Any]:
    """What a unit's manifest records (and what decides whether it is current): its own config."""
    return run_manifest_config(task, unit_config(config, unit), unit)


def run_manifest_config(task: Task, config: FinetuneConfig, unit: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config one run of ``task`` records (:func:`tasks.driver.run_unit`): the whole
    ``config``, the task's name, and the unit's ``feature_mix`` when it has one."""
    mix = (unit or {}).get("feature_mix")
    return {**dataclasses.asdict(config), "task": task.name, **({"feature_mix": mix} if mix else {})}


def unit_url(output_url: str, unit: dict[str, Any]) -> str:
    return join_url(output_url, "units", unit["unit_id"])


def run_planned_unit(
    task: Task,
    config: FinetuneConfig,
    unit: dict[str, Any],
    data_url: str,
    model_url: str,
    unit_output_url: str,
    log_fn: LogFn | None = None,
) -> Manifest:
    """Run one unit (:meth:`tasks.registry.Task.run`: :func:`tasks.driver.run_unit`) unless its
    folder already holds a manifest of exactly this run."""
    data_url = _task_folder(task, data_url)
    if unit_is_current(task, config, unit, data_url, model_url, unit_output_url):
        logger.info("%s unit %s: up to date, skipped", task.name, unit["unit_id"])
        return read_manifest(unit_output_url)
    # every unit keeps its weights until the gathering knows the best (``prune_models``)
    return task.run(
        unit_config(config, unit), data_url, model_url, unit_output_url, log_fn=log_fn, save_model=True, unit=unit
    )


def unit_is_current(
    task: Task, config: FinetuneConfig, unit: dict[str, Any], data_url: str, model_url: str, unit_output_url: str
) -> bool:
    """Whether the unit's folder holds the manifest of exactly this run (config, model, data)."""
    if not has_manifest(unit_output_url):
        return False
    data_url = _task_folder(task, data_url)
    inputs = {"model": fingerprint_input(model_url), "data": fingerprint_input(data_url)}
    return read_manifest(unit_output_url).matches(unit_manifest_config(task, config, unit), inputs)


def _task_folder(task: Task, data_url: str) -> str:
    """Accept the downstream root too: descend into the task's sub-folder when it is there."""
    fs, path = fsspec.core.url_to_fs(data_url)
    sub = f"{path.rstrip('/')}/{task.folder}"
    return join_url(data_url, task.folder) if fs.isdir(sub) else data_url


def run_downstream(
    task: Task,
    config: FinetuneConfig,
    data_url: str,
    model_url: str,
    output_url: str,
    log_fn: LogFn | None = None,
) -> Manifest:
    """The whole task here: plan, run each unit (a failure is recorded, not fatal), aggregate."""
    data_url = _task_folder(task, data_url)
    units, urls = prepare_units(task, config, output_url)
    workers = min(config.grid.workers, len(units))
    if workers <= 1:
        for unit, url in zip(units, urls):
            run_unit_safely(task, config, unit, data_url, model_url, url, log_fn)
    else:
        _run_in_processes(task, config, units, urls, data_url, model_url, workers)
    return aggregate_task(task, config, data_url, model_url, output_url)


def prepare_units(task: Task, config: FinetuneConfig, output_url: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The task's units and their folders; folders of units no longer in the plan are removed."""
    units = plan_units(task, config)
    _remove_stale_units(output_url, {u["unit_id"] for u in units})
    return units, [unit_url(output_url, u) for u in units]


def aggregate_task(task: Task, config: FinetuneConfig, data_url: str, model_url: str, output_url: str) -> Manifest:
    """``aggregate`` over the task's planned units, its manifest recording the model and data."""
    data_url = _task_folder(task, data_url)
    units = plan_units(task, config)
    urls = [unit_url(output_url, u) for u in units]
    inputs = {"model": fingerprint_input(model_url), "data": fingerprint_input(data_url)}
    return aggregate(task, config, urls, output_url, units=units, inputs=inputs)


def find_unit(task: Task, config: FinetuneConfig, unit_id: str) -> dict[str, Any]:
    """The planned unit called ``unit_id``; a clear error when the plan has none."""
    units = plan_units(task, config)
    for unit in units:
        if unit["unit_id"] == unit_id:
            return unit
    raise KeyError(f"{task.name}: no unit {unit_id!r} in the grid; planned: {[u['unit_id'] for u in units]}")


def run_unit_safely(
    task: Task,
    config: FinetuneConfig,
    unit: dict[str, Any],
    data_url: str,
    model_url: str,
    url: str,
    log_fn: LogFn | None = None,
    threads: int = 0,
    force: bool = False,
) -> bool:
    """``run_planned_unit``; a failure is logged and written to the unit's ``error.txt`` (for aggregate),
    not raised. True when the unit finished. ``force``: run it again even when it is up to date."""
    return try_unit(task, config, unit, data_url, model_url, url, log_fn, threads, force) is None


def try_unit(
    task: Task,
    config: FinetuneConfig,
    unit: dict[str, Any],
    data_url: str,
    model_url: str,
    url: str,
    log_fn: LogFn | None = None,
    threads: int = 0,
    force: bool = False,
) -> Exception | None:
    """:func:`run_unit_safely`, returning the exception a failed unit raised (None: it finished),
    so that a caller can tell bad input (never worth a retry) from the rest."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        if force:
            clear_stage(url)
        else:
            _remove_error(url)
        run_planned_unit(task, config, unit, data_url, model_url, url, log_fn)
        return None
    except Exception as exc:  # a failing unit is reported by aggregate, the rest go on
        text = traceback.format_exc()
        logger.error("%s unit %s failed:\n%s", task.name, unit["unit_id"], text)
        fs, path = fsspec.core.url_to_fs(join_url(url, "error.txt"))
        fs.makedirs(fs._parent(path), exist_ok=True)
        with fs.open(path, "w") as f:
            f.write(text)
        return exc


def record_unit_error(url: str, text: str) -> None:
    """Write ``text`` to the unit's ``error.txt`` unless the unit wrote its own traceback there."""
    fs, path = fsspec.core.url_to_fs(join_url(url, "error.txt"))
    if not fs.exists(path):
        fs.makedirs(fs._parent(path), exist_ok=True)
        with fs.open(path, "w") as f:
            f.write(text + "\n")


def _remove_error(url: str) -> None:
    fs, path = fsspec.core.url_to_fs(join_url(url, "error.txt"))
    if fs.exists(path):
        fs.rm(path)


def _run_in_processes(task, config, units, urls, data_url, model_url, workers: int) -> None:
    """Units over a pool of fresh (spawned) processes; each unit's torch RNG is its own, so the
    results are those of a sequential run. Training metrics are not streamed from the workers
    (no log_fn); each unit's manifest and metrics.json hold them."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    threads = max(1, (os.cpu_count() or 1) // workers)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [
            pool.submit(run_unit_safely, task, config, unit, data_url, model_url, url, None, threads)
            for unit, url in zip(units, urls)
        ]
        for future in futures:
            future.result()


def _remove_stale_units(output_url: str, keep: set[str]) -> None:
    fs, root = fsspec.core.url_to_fs(join_url(output_url, "units"))
    if not fs.exists(root):
        return
    for path in fs.ls(root, detail=False):
        unit = path.rstrip("/").rsplit("/", 1)[-1]
        if unit not in keep:
            clear_stage(join_url(output_url, "units", unit))  # a URL: fs paths lose gs://


# -- gathering the units into the task's results ----------------------------------------------
def aggregate(
    task: Task,
    config: FinetuneConfig,
    unit_urls: list[str],
    output_url: str,
    units: list[dict[str, Any]] | None = None,
    inputs: dict[str, str] | None = None,
) -> Manifest:
    """Read the units' results, write results.{json,md} and the best unit's outputs to
    ``output_url``, then its manifest. ``units`` defaults to the plan (same order as the URLs)."""
    from tasks.grid import best_point, collect, copy_tree, summarise, write_results

    units = units or plan_units(task, config)
    if len(units) != len(unit_urls):
        raise ValueError(f"{task.name}: {len(unit_urls)} unit URLs for {len(units)} units")
    finished, failed = collect(units, unit_urls)
    for u in [u for u in finished if u["counts"].get("dev_examples", 1) < 1]:  # a unit of an older run
        finished.remove(u)
        failed.append({**u, "error": "0 usable dev rows: its score means nothing"})
    for f in failed:
        logger.warning("%s unit %s failed: %s", task.name, f["unit_id"], f["error"])
    if not finished:
        raise RuntimeError(
            f"{task.name}: all {len(units)} units failed; first: {failed[0]['unit_id']}: {failed[0]['error']}"
        )
    _clear_top(output_url)
    points = summarise(finished, task.metric)
    families = sorted({p["feature_mix"] for p in points}, key=lambda m: (m is not None, m or ""))
    per_family = {m: best_point([p for p in points if p["feature_mix"] == m]) for m in families}
    best = best_point(list(per_family.values()))
    best_unit = max((u for u in finished if point_key(u) == _key(best)), key=lambda u: u["counts"][task.metric])
    copy_tree(best_unit["url"], output_url)
    model_kept = _has_model(output_url)
    if not model_kept and not task.feature_based:
        logger.warning(
            "%s: the best unit %s has no fine-tuned weights (removed by an earlier gathering, when it was not the "
            "best): rerun it with --force to keep them", task.name, best_unit["unit_id"],
        )  # fmt: skip
    if not config.grid.save_models:
        prune_models([u["url"] for u in finished if u is not best_unit])
    scale = task.scale
    results = {
        "task": task.name,
        "metric": task.metric,
        "percent": True,
        "dev_median": best["median"] * scale,
        "dev_min": best["min"] * scale,
        "dev_max": best["max"] * scale,
        "seeds": best["seeds"],
        "best": {k: best[k] for k in ("learning_rate", "batch_size", "epochs", "feature_mix")},
        "best_unit": best_unit["unit_id"],
        "model": FINETUNED_FOLDER if model_kept else None,
        "points": [
            {
                **{k: v for k, v in p.items() if k != "units"},
                **{k: p[k] * scale for k in ("median", "min", "max")},
                "units": p["units"],
            }
            for p in points
        ],
        "mixes": {
            m: {
                "median": p["median"] * scale,
                "min": p["min"] * scale,
                "max": p["max"] * scale,
                "learning_rate": p["learning_rate"],
                "batch_size": p["batch_size"],
                "epochs": p["epochs"],
            }
            for m, p in per_family.items()
            if m
        },
        "failed": [{"unit_id": f["unit_id"], "error": f["error"]} for f in failed],
        "units": len(units),
    }
    write_results(output_url, results, task_markdown(results))
    counts = dict(best_unit["counts"])
    counts.update(
        dev_median=results["dev_median"],
        dev_min=results["dev_min"],
        dev_max=results["dev_max"],
        units=float(len(units)),
        units_failed=float(len(failed)),
        seeds=float(best["seeds"]),
        model_kept=float(model_kept),
    )
    seconds = sum(u["counts"].get("seconds", 0.0) for u in finished)
    inputs = inputs if inputs is not None else {"units": _units_digest(unit_urls, finished)}
    return write_manifest(
        f"finetune-{task.name}", output_url, manifest_config(task, config), inputs, counts, seconds=seconds
    )


def _has_model(url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(join_url(url, FINETUNED_FOLDER, "model.safetensors"))
    return fs.exists(path)


def prune_models(unit_urls: list[str]) -> None:
    """Remove the fine-tuned weights (``model/``) of these units, and the files from their
    manifests, so that a manifest still lists only what is there (disk: a grid of 120 units of
    BERT-base would otherwise keep 120 copies of 440 MB)."""
    for url in unit_urls:
        if not _has_model(url):
            continue
        manifest = read_manifest(url)
        clear_stage(join_url(url, FINETUNED_FOLDER))
        manifest.files = [f for f in manifest.files if not f.path.startswith(FINETUNED_FOLDER + "/")]
        save_manifest(manifest)


def _key(point: dict[str, Any]) -> tuple:
    return (point["feature_mix"], point["learning_rate"], point["batch_size"], point["epochs"])


def _units_digest(unit_urls: list[str], finished: list[dict]) -> str:
    return config_digest(sorted(u["unit_id"] for u in finished))


def _clear_top(output_url: str) -> None:
    """Remove the task folder's own files (manifest first), keeping ``units/``."""
    fs, root = fsspec.core.url_to_fs(output_url)
    root = root.rstrip("/")
    if not fs.exists(root):
        return
    manifest = f"{root}/_manifest.json"
    if fs.exists(manifest):
        fs.rm(manifest)
    for path in fs.ls(root, detail=False):
        if path.rstrip("/").rsplit("/", 1)[-1] != "units":
            fs.rm(path, recursive=True)


# -- results across tasks -------------------------------------------------------------------------
def task_markdown(r: dict[str, Any]) -> str:
    lines = [
        f"# {r['task']}: {r['metric']} on dev (percent)",
        "",
        "| mix | lr | batch | epochs | seeds | median | min | max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in r["points"]:
        lines.append(
            f"| {p['feature_mix'] or '-'} | {p['learning_rate']:g} | {p['batch_size']} | {p['epochs']:g} "
            f"| {p['seeds']} | {p['median']:.2f} | {p['min']:.2f} | {p['max']:.2f} |"
        )
    b = r["best"]
    lines += [
        "",
        f"Best: lr {b['learning_rate']:g}, batch {b['batch_size']}, epochs {b['epochs']:g}"
        + (f", mix {b['feature_mix']}" if b.get("feature_mix") else "")
        + f" (median {r['dev_median']:.2f}, min {r['dev_min']:.2f}, max {r['dev_max']:.2f} over {r['seeds']} seeds);"
        f" predictions from {r['best_unit']}.",
    ]
    if r["failed"]:
        lines += ["", f"Failed units ({len(r['failed'])} of {r['units']}):"]
        lines += [f"- {f['unit_id']}: {f['error']}" for f in r["failed"]]
    return "\n".join(lines) + "\n"
