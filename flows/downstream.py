"""The registry of downstream tasks the flow reads, and the calls that run any of them.

One row of :data:`TASKS` per task: its data sub-folder, headline metric and the callable that
runs one fine-tuning; adding a task adds a row. The flow uses either

- ``run_downstream(name, config, data_url, model_url, output_url, log_fn)``: the whole task in
  this process (plan its grid, run each unit, aggregate), or
- the fan-out (what the flows do, ``flows.fanout``): ``prepare_units`` -> ``run_unit_safely`` for
  each unit, anywhere (a process each, or a deployment run each; a finished unit is skipped, a
  failed one retried alone) -> ``aggregate_task``.

``manifest_config(name, config)`` is what decides whether a task's output is stale: the whole
``FinetuneConfig`` (grid and task options included) plus the task name. ``task_data_url``
resolves where a task's files are (a per-task URL in ``data.downstream_urls``, else the
downstream root plus the task's sub-folder). ``summarize`` writes the per-model results table
and the GLUE average over the task folders; ``glue_submission`` gathers the GLUE test-set files.

Layout of a task folder: ``units/<unit_id>/`` (each run, with its manifest), then the task's
own ``results.json``/``results.md``, the best unit's predictions and metrics copied up, and
``_manifest.json`` last.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec

from pipeline.schema.manifest import (
    Manifest,
    clear_stage,
    fingerprint_input,
    has_manifest,
    read_manifest,
    write_manifest,
)
from pipeline.schema.storage import join_url
from tasks.config import FinetuneConfig

logger = logging.getLogger("bertflow.finetune")
LogFn = Callable[[dict[str, float], int], None]


def _glue(task: str) -> Callable:
    def run(config, data_url, model_url, output_url, log_fn=None, save_model=True, unit=None):
        from tasks.glue import run_glue

        return run_glue(config, task, data_url, model_url, output_url, log_fn=log_fn, save_model=save_model)

    return run


def _squad(version: str) -> Callable:
    def run(config, data_url, model_url, output_url, log_fn=None, save_model=True, unit=None):
        from tasks.squad import run_squad

        return run_squad(config, data_url, model_url, output_url, version=version, log_fn=log_fn, save_model=save_model)

    return run


def _ner(config, data_url, model_url, output_url, log_fn=None, save_model=True, unit=None):
    from tasks.ner import run_ner

    mix = (unit or {}).get("feature_mix")
    return run_ner(config, data_url, model_url, output_url, log_fn=log_fn, save_model=save_model, feature_mix=mix)


def _swag(config, data_url, model_url, output_url, log_fn=None, save_model=True, unit=None):
    from tasks.swag import run_swag

    return run_swag(config, data_url, model_url, output_url, log_fn=log_fn, save_model=save_model)


@dataclass(frozen=True)
class DownstreamTask:
    name: str
    kind: str  # "glue" | "squad" | "ner" | "swag"
    data_subdir: str  # under the downstream data root
    metric: str  # the headline metric: a key of the unit manifests' counts
    run: Callable  # (config, data_url, model_url, output_url, log_fn, save_model, unit) -> Manifest
    percent: bool = False  # metric already in percent (SQuAD, NER) rather than a fraction
    glue_task: str = ""  # GLUE folder name for kind == "glue"
    squad_version: str = "1.1"
    feature_based: bool = False  # units also vary finetune.features.layer_mixes
    glue_average: bool = False  # counts in the paper's GLUE average (WNLI is left out there)


def _glue_row(name: str, folder: str, metric: str, average: bool = True) -> DownstreamTask:
    return DownstreamTask(name, "glue", f"glue/{folder}", metric, _glue(folder), glue_task=folder, glue_average=average)


TASKS: dict[str, DownstreamTask] = {
    t.name: t
    for t in (
        _glue_row("cola", "CoLA", "eval_mcc"),
        _glue_row("sst2", "SST-2", "eval_accuracy"),
        _glue_row("mrpc", "MRPC", "eval_f1"),
        _glue_row("stsb", "STS-B", "eval_spearman"),
        _glue_row("qqp", "QQP", "eval_f1"),
        _glue_row("mnli", "MNLI", "eval_accuracy"),  # matched dev; mismatched is eval_mm_accuracy
        _glue_row("qnli", "QNLI", "eval_accuracy"),
        _glue_row("rte", "RTE", "eval_accuracy"),
        _glue_row("wnli", "WNLI", "eval_accuracy", average=False),
        DownstreamTask("squad1", "squad", "squad", "eval_f1", _squad("1.1"), percent=True, squad_version="1.1"),
        DownstreamTask("squad2", "squad", "squad", "eval_f1", _squad("2.0"), percent=True, squad_version="2.0"),
        DownstreamTask("conll2003", "ner", "conll2003", "eval_f1", _ner, percent=True),
        DownstreamTask("conll2003_features", "ner", "conll2003", "eval_f1", _ner, percent=True, feature_based=True),
        DownstreamTask("swag", "swag", "swag", "eval_accuracy", _swag),
    )
}


def get_task(name: str) -> DownstreamTask:
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    return TASKS[name]


def task_data_url(name: str, downstream_root: str, overrides: dict[str, str] | None = None) -> str:
    """Where task ``name`` reads its files: ``overrides[name]`` (``data.downstream_urls``) when
    given, else ``downstream_root/<data_subdir>``."""
    task = get_task(name)
    return (overrides or {}).get(name) or join_url(downstream_root, task.data_subdir)


def manifest_config(name: str, config: FinetuneConfig) -> dict[str, Any]:
    """What decides whether a task's output is stale (the aggregate manifest's config): the
    whole config but where and how many units run at once, which do not change results."""
    get_task(name)
    data = dataclasses.asdict(config)
    for key in RUN_PLACEMENT:
        data["grid"].pop(key, None)
    return {**data, "task": name}


RUN_PLACEMENT = ("workers", "dispatch", "deployment")
"""Grid fields that say where units run, not what they compute."""


# -- the fan-out ----------------------------------------------------------------------------------
def plan_units(name: str, config: FinetuneConfig) -> list[dict[str, Any]]:
    from tasks.grid import plan_grid

    task = get_task(name)
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


def unit_manifest_config(name: str, config: FinetuneConfig, unit: dict[str, Any]) -> dict[str, Any]:
    extra = {"feature_mix": unit["feature_mix"]} if unit.get("feature_mix") else {}
    return {**dataclasses.asdict(unit_config(config, unit)), "task": name, **extra}


def unit_url(output_url: str, unit: dict[str, Any]) -> str:
    return join_url(output_url, "units", unit["unit_id"])


def run_unit(
    name: str,
    config: FinetuneConfig,
    unit: dict[str, Any],
    data_url: str,
    model_url: str,
    unit_output_url: str,
    log_fn: LogFn | None = None,
) -> Manifest:
    """Run one unit unless its folder already holds a manifest of exactly this run."""
    task = get_task(name)
    data_url = _task_folder(task, data_url)
    if unit_is_current(name, config, unit, data_url, model_url, unit_output_url):
        logger.info("%s unit %s: up to date, skipped", name, unit["unit_id"])
        return read_manifest(unit_output_url)
    save = config.grid.save_models or len(plan_units(name, config)) == 1
    return task.run(
        unit_config(config, unit), data_url, model_url, unit_output_url, log_fn=log_fn, save_model=save, unit=unit
    )


def unit_is_current(
    name: str, config: FinetuneConfig, unit: dict[str, Any], data_url: str, model_url: str, unit_output_url: str
) -> bool:
    """Whether the unit's folder holds the manifest of exactly this run (config, model, data)."""
    if not has_manifest(unit_output_url):
        return False
    data_url = _task_folder(get_task(name), data_url)
    inputs = {"model": fingerprint_input(model_url), "data": fingerprint_input(data_url)}
    return read_manifest(unit_output_url).matches(unit_manifest_config(name, config, unit), inputs)


def _task_folder(task: DownstreamTask, data_url: str) -> str:
    """Accept the downstream root too: descend into the task's sub-folder when it is there."""
    fs, path = fsspec.core.url_to_fs(data_url)
    sub = f"{path.rstrip('/')}/{task.data_subdir}"
    return join_url(data_url, task.data_subdir) if fs.isdir(sub) else data_url


def aggregate(
    name: str,
    config: FinetuneConfig,
    unit_urls: list[str],
    output_url: str,
    units: list[dict[str, Any]] | None = None,
    inputs: dict[str, str] | None = None,
) -> Manifest:
    """Read the units' results, write results.{json,md} and the best unit's outputs to
    ``output_url``, then its manifest. ``units`` defaults to the plan (same order as the URLs)."""
    from tasks.grid import best_point, collect, copy_tree, summarise, write_results

    task = get_task(name)
    units = units or plan_units(name, config)
    if len(units) != len(unit_urls):
        raise ValueError(f"{name}: {len(unit_urls)} unit URLs for {len(units)} units")
    finished, failed = collect(units, unit_urls)
    for f in failed:
        logger.warning("%s unit %s failed: %s", name, f["unit_id"], f["error"])
    if not finished:
        raise RuntimeError(
            f"{name}: all {len(units)} units failed; first: {failed[0]['unit_id']}: {failed[0]['error']}"
        )
    _clear_top(output_url)
    points = summarise(finished, task.metric)
    families = sorted({p["feature_mix"] for p in points}, key=lambda m: (m is not None, m or ""))
    per_family = {m: best_point([p for p in points if p["feature_mix"] == m]) for m in families}
    best = best_point(list(per_family.values()))
    best_unit = max((u for u in finished if point_key(u) == _key(best)), key=lambda u: u["counts"][task.metric])
    copy_tree(best_unit["url"], output_url)
    scale = 1.0 if task.percent else 100.0
    results = {
        "task": name,
        "metric": task.metric,
        "percent": True,
        "dev_median": best["median"] * scale,
        "dev_min": best["min"] * scale,
        "dev_max": best["max"] * scale,
        "seeds": best["seeds"],
        "best": {k: best[k] for k in ("learning_rate", "batch_size", "epochs", "feature_mix")},
        "best_unit": best_unit["unit_id"],
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
    )
    seconds = sum(u["counts"].get("seconds", 0.0) for u in finished)
    inputs = inputs if inputs is not None else {"units": _units_digest(unit_urls, finished)}
    return write_manifest(
        f"finetune-{name}", output_url, manifest_config(name, config), inputs, counts, seconds=seconds
    )


def _key(point: dict[str, Any]) -> tuple:
    return (point["feature_mix"], point["learning_rate"], point["batch_size"], point["epochs"])


def point_key(unit: dict[str, Any]) -> tuple:
    from tasks.grid import point_key as key

    return key(unit)


def _units_digest(unit_urls: list[str], finished: list[dict]) -> str:
    from pipeline.schema.config import config_digest

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


def run_downstream(
    name: str,
    config: FinetuneConfig,
    data_url: str,
    model_url: str,
    output_url: str,
    log_fn: LogFn | None = None,
) -> Manifest:
    """The whole task here: plan, run each unit (a failure is recorded, not fatal), aggregate."""
    task = get_task(name)
    data_url = _task_folder(task, data_url)
    units, urls = prepare_units(name, config, output_url)
    workers = min(config.grid.workers, len(units))
    if workers <= 1:
        for unit, url in zip(units, urls):
            run_unit_safely(name, config, unit, data_url, model_url, url, log_fn)
    else:
        _run_in_processes(name, config, units, urls, data_url, model_url, workers)
    return aggregate_task(name, config, data_url, model_url, output_url)


def prepare_units(name: str, config: FinetuneConfig, output_url: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The task's units and their folders; folders of units no longer in the plan are removed."""
    units = plan_units(name, config)
    _remove_stale_units(output_url, {u["unit_id"] for u in units})
    return units, [unit_url(output_url, u) for u in units]


def aggregate_task(name: str, config: FinetuneConfig, data_url: str, model_url: str, output_url: str) -> Manifest:
    """``aggregate`` over the task's planned units, its manifest recording the model and data."""
    data_url = _task_folder(get_task(name), data_url)
    units = plan_units(name, config)
    urls = [unit_url(output_url, u) for u in units]
    inputs = {"model": fingerprint_input(model_url), "data": fingerprint_input(data_url)}
    return aggregate(name, config, urls, output_url, units=units, inputs=inputs)


def find_unit(name: str, config: FinetuneConfig, unit_id: str) -> dict[str, Any]:
    """The planned unit called ``unit_id``; a clear error when the plan has none."""
    units = plan_units(name, config)
    for unit in units:
        if unit["unit_id"] == unit_id:
            return unit
    raise KeyError(f"{name}: no unit {unit_id!r} in the grid; planned: {[u['unit_id'] for u in units]}")


def run_unit_safely(
    name: str,
    config: FinetuneConfig,
    unit: dict[str, Any],
    data_url: str,
    model_url: str,
    url: str,
    log_fn: LogFn | None = None,
    threads: int = 0,
    force: bool = False,
) -> bool:
    """``run_unit``; a failure is logged and written to the unit's ``error.txt`` (for aggregate),
    not raised. True when the unit finished. ``force``: run it again even when it is up to date."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        if force:
            clear_stage(url)
        else:
            _remove_error(url)
        run_unit(name, config, unit, data_url, model_url, url, log_fn)
        return True
    except Exception:  # a failing unit is reported by aggregate, the rest go on
        text = traceback.format_exc()
        logger.error("%s unit %s failed:\n%s", name, unit["unit_id"], text)
        fs, path = fsspec.core.url_to_fs(join_url(url, "error.txt"))
        fs.makedirs(fs._parent(path), exist_ok=True)
        with fs.open(path, "w") as f:
            f.write(text)
        return False


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


def _run_in_processes(name, config, units, urls, data_url, model_url, workers: int) -> None:
    """Units over a pool of fresh (spawned) processes; each unit's torch RNG is its own, so the
    results are those of a sequential run. Training metrics are not streamed from the workers
    (no log_fn); each unit's manifest and metrics.json hold them."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    threads = max(1, (os.cpu_count() or 1) // workers)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [
            pool.submit(run_unit_safely, name, config, unit, data_url, model_url, url, None, threads)
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


def summarize(task_urls: dict[str, str], output_url: str, model: str = "") -> dict[str, Any]:
    """The per-model results table over finished task folders, plus the GLUE average as the paper
    computes it (each GLUE task's headline metric: MCC CoLA, F1 MRPC/QQP, Spearman STS-B,
    accuracy else, MNLI matched; WNLI left out), as results.md and results.json in ``output_url``;
    the GLUE test-set files gathered under ``glue_submission/``."""
    import json

    from tasks.grid import read_text_or, write_results

    rows = []
    for name, url in task_urls.items():
        text = read_text_or(join_url(url, "results.json"))
        if not text:
            rows.append({"task": name, "missing": True})
            continue
        r = json.loads(text)
        rows.append(
            {
                "task": name,
                "metric": r["metric"],
                "dev_median": r["dev_median"],
                "dev_min": r["dev_min"],
                "dev_max": r["dev_max"],
                "seeds": r["seeds"],
                "best": r["best"],
                "mixes": r.get("mixes", {}),
                "failed": len(r["failed"]),
                "units": r["units"],
            }
        )
    glue = [row for row in rows if not row.get("missing") and TASKS[row["task"]].glue_average]
    average = sum(row["dev_median"] for row in glue) / len(glue) if glue else None
    summary = {"model": model, "tasks": rows, "glue_average": average, "glue_average_tasks": [r["task"] for r in glue]}
    lines = [
        f"# Downstream results{f' of {model}' if model else ''} (dev, percent)",
        "",
        "| task | metric | median | min | max | seeds | lr | batch | epochs | failed units |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.get("missing"):
            lines.append(f"| {row['task']} | (no results) | | | | | | | | |")
            continue
        b = row["best"]
        lines.append(
            f"| {row['task']} | {row['metric'].removeprefix('eval_')} | {row['dev_median']:.2f} | "
            f"{row['dev_min']:.2f} | {row['dev_max']:.2f} | {row['seeds']} | {b['learning_rate']:g} | "
            f"{b['batch_size']} | {b['epochs']:g} | {row['failed']}/{row['units']} |"
        )
        for mix, m in row["mixes"].items():
            lines.append(
                f"| {row['task']} [{mix}] | {row['metric'].removeprefix('eval_')} | {m['median']:.2f} | "
                f"{m['min']:.2f} | {m['max']:.2f} | | {m['learning_rate']:g} | {m['batch_size']} | "
                f"{m['epochs']:g} | |"
            )
    if average is not None:
        lines += ["", f"GLUE average over {', '.join(summary['glue_average_tasks'])}: {average:.2f}"]
    write_results(output_url, summary, "\n".join(lines) + "\n")
    glue_submission(
        {n: u for n, u in task_urls.items() if TASKS[n].kind == "glue"}, join_url(output_url, "glue_submission")
    )
    return summary


def glue_submission(task_urls: dict[str, str], output_url: str) -> list[str]:
    """Copy each GLUE task's ``submission/*.tsv`` (GLUE's file names: CoLA.tsv, MNLI-m.tsv ...)
    into one folder, ready to zip for the GLUE server."""
    written = []
    for url in task_urls.values():
        fs, root = fsspec.core.url_to_fs(join_url(url, "submission"))
        if not fs.exists(root):
            continue
        for path in sorted(fs.ls(root, detail=False)):
            name = path.rstrip("/").rsplit("/", 1)[-1]
            dst_fs, dst = fsspec.core.url_to_fs(join_url(output_url, name))
            dst_fs.makedirs(dst_fs._parent(dst), exist_ok=True)
            with fs.open(path, "rb") as fin, dst_fs.open(dst, "wb") as fout:
                fout.write(fin.read())
            written.append(name)
    return written
