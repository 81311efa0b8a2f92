"""One Prefect flow per stage group, so a data engineer reruns one stage without the rest.

``stage-corpus``, ``stage-vocab``, ``stage-examples``, ``stage-pretrain``, ``stage-export`` and
``stage-finetune`` take the preset, the root and, as typed parameters, the URLs of the stage's
inputs (``corpus_url``, ``vocab_url``, ...; empty: the root's own folders). They are built from
the stage table, so a new stage gets its flow (and its deployment in ``prefect.yaml``) from its
row. ``force`` defaults to true: asking for a stage means running it.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.presets import load_config
from flows.pretrain_flow import (
    _options,
    _summary,
    register_model_task,
    results_table_task,
    session,
    stage_task,
    unwrap,
)
from flows.stages import CHAIN, get_stage, stage_inputs, stage_names


def input_names(group: str) -> list[str]:
    """The inputs a group's flow takes as URL parameters (those every stage of it reads)."""
    cfg = load_config("tiny")
    names = stage_names(cfg, (group,))
    common = [n for n in get_stage(names[0]).inputs(cfg, "/root")]
    for name in names[1:]:
        common = [n for n in common if n in stage_inputs(name, cfg, "/root")]
    return [n for n in common if group != "finetune" or n == "model"]


def make_stage_flow(group: str):
    urls = input_names(group)

    def run_group(**params: Any) -> dict[str, Any]:
        start = time.time()
        given = {n: params.get(f"{n}_url") for n in urls if params.get(f"{n}_url")}
        with session(
            f"stage-{group}",
            params["preset"],
            params.get("root"),
            params.get("overrides"),
            params.get("mlflow_uri"),
            (group,),
            given,
        ) as (cfg, root, tracking):
            names = stage_names(cfg, (group,))
            if group == "finetune":
                from flows.fanout import fan_out

                results = fan_out(names, cfg, root, params.get("force", True), tracking, given)
            else:
                futures = [
                    stage_task.with_options(**_options(n)).submit(
                        n, cfg, root, params.get("force", True), tracking, given
                    )
                    for n in names
                ]
                results = [unwrap(f.result()) for f in futures]
            registered = None
            if group == "finetune":
                results_table_task(cfg, root, tracking)
            if group == "export" and results[0].status == "done":
                registered = register_model_task(cfg, results[0], [], tracking)
            return _summary(params["preset"], root, tracking, cfg, results, registered, start)

    P = inspect.Parameter
    params = [
        P("preset", P.KEYWORD_ONLY, default="tiny", annotation=str),
        P("root", P.KEYWORD_ONLY, default=None, annotation=str | None),
        *[P(f"{n}_url", P.KEYWORD_ONLY, default=None, annotation=str | None) for n in urls],
        P("overrides", P.KEYWORD_ONLY, default=None, annotation=dict[str, Any] | None),
        P("force", P.KEYWORD_ONLY, default=True, annotation=bool),
        P("mlflow_uri", P.KEYWORD_ONLY, default=None, annotation=str | None),
    ]
    run_group.__signature__ = inspect.Signature(params, return_annotation=dict[str, Any])
    run_group.__name__ = f"stage_{group}"
    run_group.__doc__ = f"Run the {group} stage alone: {get_stage(stage_names(load_config('tiny'), (group,))[0]).doc}."
    return flow(run_group, name=f"stage-{group}", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=True)


STAGE_FLOWS = {group: make_stage_flow(group) for group in CHAIN}
corpus = STAGE_FLOWS["corpus"]
vocab = STAGE_FLOWS["vocab"]
examples = STAGE_FLOWS["examples"]
pretrain = STAGE_FLOWS["pretrain"]
export = STAGE_FLOWS["export"]
finetune = STAGE_FLOWS["finetune"]
