"""Results across a model's downstream tasks: the per-model table, the GLUE average, GLUE's submission folder."""

from __future__ import annotations

import json
from typing import Any

import fsspec

from model.contract import join_url
from tasks.registry import TASKS


def summarize(task_urls: dict[str, str], output_url: str, model: str = "") -> dict[str, Any]:
    """The per-model results table over finished task folders, plus the GLUE average as the paper
    computes it (each GLUE task's headline metric: MCC CoLA, F1 MRPC/QQP, Spearman STS-B,
    accuracy else, MNLI matched; WNLI left out), as results.md and results.json in ``output_url``;
    the GLUE test-set files gathered under ``glue_submission/``."""

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
        {n: u for n, u in task_urls.items() if TASKS[n].family == "glue"}, join_url(output_url, "glue_submission")
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
