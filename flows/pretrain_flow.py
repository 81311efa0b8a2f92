"""The Prefect flow ``pretrain``: raw text to a registered, evaluated BERT.

The flow body reads top to bottom like the chain it runs: open a session (config, checks, the
root's lock, the parent MLflow run), run every stage of the table in order (finished ones are
skipped, downstream tasks fan out unit by unit), then the results table and the registered
model (``flows.chain``). The stage tasks live in ``flows.prefect_tasks``.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.task_runners import ThreadPoolTaskRunner

from flows.chain import finish, run_stages
from flows.prefect_tasks import SetupError, refused, session
from flows.reporting import summary_markdown
from flows.table import CHAIN, stage_names, stages_after


def _forced(force: list[str] | None) -> set[str]:
    forced: set[str] = set()
    for s in force or []:
        forced.update(stages_after(s))
    return forced


@flow(name="pretrain", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=True)
def pretrain(
    preset: str = "tiny",
    root: str | None = None,
    force: list[str] | None = None,
    stages: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
    mlflow_uri: str | None = None,
) -> dict[str, Any]:
    """Run (or skip, when finished) every stage of the chain for one preset under ``root``.

    ``force``: stages to rerun together with every stage after them. ``stages``: run only these
    groups (each forced), e.g. ``["pretrain"]``; the stages before must have finished.
    """
    start = time.time()
    forced_groups = _forced(force) | set(stages or ())
    groups = tuple(g for g in CHAIN if not stages or g in stages)
    try:
        opened = session(f"pretrain-{preset}", preset, root, overrides, mlflow_uri, groups, forced=forced_groups)
        with opened as (cfg, root, tracking):
            names = stage_names(cfg, groups)
            forced = {n for n in names if n.split("/", 1)[0] in forced_groups}
            results = run_stages(names, cfg, root, forced, tracking)
            out = finish(preset, root, cfg, tracking, results, start)
    except SetupError as exc:  # refused before it started: one line, as the CLI says it
        return refused(exc)
    create_markdown_artifact(key="pretrain-summary", markdown=summary_markdown(out), description="pipeline summary")
    return out
