"""The hyper-parameter grid: units to run, and the results over seeds.

A *unit* is one fine-tuning run: a grid point (learning rate, batch size, epochs, and for the
feature-based task a layer mix) and a seed, as a JSON-serialisable dict with a stable
``unit_id``. Units are independent: each writes its own folder and ``_manifest.json``, so a
finished one is skipped and a failed one retried alone, on any process or machine.

Aggregation (as the paper reports GLUE): for every grid point, the median, min and max of the
task's headline dev metric over its seeds; the best point is the one with the highest median
(ties: the first in plan order); its best seed's predictions become the task's. A unit without
a manifest counts as failed and is listed, with its ``error.txt`` when it wrote one; only when
every unit failed is that an error.
"""

from __future__ import annotations

import itertools
import json
import statistics
from typing import Any

import fsspec

from model.contract import ManifestError, join_url, read_manifest
from tasks.config import FinetuneConfig

HPARAMS = ("learning_rate", "batch_size", "epochs")


def unit_id(unit: dict[str, Any]) -> str:
    parts = [f"lr{unit['learning_rate']:g}", f"bs{unit['batch_size']}", f"ep{unit['epochs']:g}"]
    if unit.get("feature_mix"):
        parts.insert(0, unit["feature_mix"])
    return "_".join(parts) + f"_seed{unit['seed']}"


def plan_grid(config: FinetuneConfig, mixes: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every grid point x seed (x layer mix), in a fixed order."""
    g = config.grid
    axes = (
        g.learning_rates or (config.learning_rate,),
        g.batch_sizes or (config.batch_size,),
        g.epochs or (config.epochs,),
        g.seeds or (config.seed,),
    )
    units = []
    for mix in mixes or (None,):
        for lr, bs, ep, seed in itertools.product(*axes):
            unit: dict[str, Any] = {
                "learning_rate": float(lr),
                "batch_size": int(bs),
                "epochs": float(ep),
                "seed": int(seed),
            }
            if mix:
                unit["feature_mix"] = mix
            unit["unit_id"] = unit_id(unit)
            units.append(unit)
    return units


def point_key(unit: dict[str, Any]) -> tuple:
    return (unit.get("feature_mix"),) + tuple(unit[k] for k in HPARAMS)


def read_text_or(url: str, default: str = "") -> str:
    fs, path = fsspec.core.url_to_fs(url)
    if not fs.exists(path):
        return default
    with fs.open(path, "r") as f:
        return f.read()


def collect(units: list[dict[str, Any]], unit_urls: list[str]) -> tuple[list[dict], list[dict]]:
    """(finished, failed): each finished entry is the unit plus its manifest counts and URL."""
    finished, failed = [], []
    for unit, url in zip(units, unit_urls):
        try:
            manifest = read_manifest(url)
        except ManifestError:
            error = read_text_or(join_url(url, "error.txt"), "no manifest (did not run or did not finish)")
            failed.append({**unit, "url": url, "error": error.strip().splitlines()[-1] if error.strip() else ""})
            continue
        finished.append({**unit, "url": url, "counts": manifest.counts})
    return finished, failed


def summarise(finished: list[dict], metric: str) -> list[dict[str, Any]]:
    """One entry per grid point: its hyper-parameters, seeds, and the metric's median/min/max."""
    points: dict[tuple, dict[str, Any]] = {}
    for u in finished:
        key = point_key(u)
        entry = points.setdefault(key, {"feature_mix": u.get("feature_mix"), **{k: u[k] for k in HPARAMS}, "units": []})
        if metric not in u["counts"]:
            raise KeyError(f"unit {u['unit_id']} ({u['url']}) has no {metric!r} in its manifest counts")
        entry["units"].append({"unit_id": u["unit_id"], "seed": u["seed"], "score": u["counts"][metric]})
    out = []
    for entry in points.values():
        scores = [x["score"] for x in entry["units"]]
        entry.update(median=statistics.median(scores), min=min(scores), max=max(scores), seeds=len(scores))
        out.append(entry)
    return out


def best_point(points: list[dict[str, Any]]) -> dict[str, Any]:
    best = points[0]
    for p in points[1:]:
        if p["median"] > best["median"]:
            best = p
    return best


def write_results(output_url: str, results: dict[str, Any], markdown: str) -> None:
    fs, root = fsspec.core.url_to_fs(output_url)
    fs.makedirs(root, exist_ok=True)
    with fs.open(f"{root.rstrip('/')}/results.json", "w") as f:
        f.write(json.dumps(results, indent=2, sort_keys=True) + "\n")
    with fs.open(f"{root.rstrip('/')}/results.md", "w") as f:
        f.write(markdown)


def copy_tree(src_url: str, dst_url: str, skip: tuple[str, ...] = ("_manifest.json", "error.txt")) -> list[str]:
    """Copy every file under ``src_url`` to ``dst_url`` (same relative paths); return them."""
    src_fs, src = fsspec.core.url_to_fs(src_url)
    dst_fs, dst = fsspec.core.url_to_fs(dst_url)
    src = src.rstrip("/")
    copied = []
    for path in sorted(src_fs.find(src)):
        rel = path[len(src) + 1 :]
        if rel.rsplit("/", 1)[-1] in skip:
            continue
        target = f"{dst.rstrip('/')}/{rel}"
        dst_fs.makedirs(dst_fs._parent(target), exist_ok=True)
        with src_fs.open(path, "rb") as fin, dst_fs.open(target, "wb") as fout:
            fout.write(fin.read())
        copied.append(rel)
    return copied


def fmt(value: float, percent: bool) -> str:
    return f"{value:.2f}" if percent else f"{100 * value:.2f}"
