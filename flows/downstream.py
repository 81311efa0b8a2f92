"""The downstream tasks the flow can fan out to, and one call that runs any of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pipeline.schema import Manifest
from tasks.config import FinetuneConfig


@dataclass(frozen=True)
class DownstreamTask:
    name: str
    kind: str  # "glue" | "squad"
    data_subdir: str  # under the downstream data root
    glue_task: str = ""  # GLUE task name for kind == "glue"
    squad_version: str = "1.1"
    metric: str = ""  # the headline metric in the manifest counts


TASKS = {
    "sst2": DownstreamTask("sst2", "glue", "glue/SST-2", glue_task="SST-2", metric="eval_accuracy"),
    "squad1": DownstreamTask("squad1", "squad", "squad", squad_version="1.1", metric="eval_f1"),
}


def run_downstream(
    name: str,
    config: FinetuneConfig,
    data_url: str,
    model_url: str,
    output_url: str,
    log_fn: Callable[[dict[str, float], int], None] | None = None,
) -> Manifest:
    """Fine-tune and evaluate task ``name`` on the data at ``data_url`` (the task's folder)."""
    task = TASKS[name]
    if task.kind == "glue":
        from tasks.glue import run_glue

        return run_glue(config, task.glue_task, data_url, model_url, output_url, log_fn=log_fn)
    from tasks.squad import run_squad

    return run_squad(config, data_url, model_url, output_url, version=task.squad_version, log_fn=log_fn)


def manifest_config(name: str, config: FinetuneConfig) -> dict:
    """What a task's manifest records (what decides whether its output is stale)."""
    task = TASKS[name]
    if task.kind == "glue":
        from tasks.glue import manifest_config as glue_config

        return glue_config(config, task.glue_task)
    from tasks.squad import manifest_config as squad_config

    return squad_config(config, task.squad_version)
