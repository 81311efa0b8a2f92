"""One Prefect flow per group of the stage table, so a data engineer reruns one stage without the rest.

``stage-corpus``, ``stage-vocab``, ... ``stage-finetune`` take the preset, the root and, as typed
parameters, the URLs of the group's inputs (``corpus_url``, ``vocab_url``, ...; empty: the root's
own folders). Each is made from the table (``flows.table.CHAIN``) by :func:`make_stage_flow` and
named here in one line, so a new group adds that line and its deployment in ``prefect.yaml``
(both checked against the table by a test). ``force``
defaults to true: asking for a stage means running it.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.chain import finish, run_stages
from flows.prefect_tasks import SetupError, refused, session
from flows.presets import load_config
from flows.table import CHAIN, get_stage, group_input_names, stage_names

_TINY = load_config("tiny")
"""What names a group's inputs and its doc, loaded once for every group (12 loads were 0.06 of a
stage command's CPU-seconds)."""


def make_stage_flow(group: str):
    urls = group_input_names(group, _TINY)

    def run_group(**params: Any) -> dict[str, Any]:
        start = time.time()
        given = {n: params.get(f"{n}_url") for n in urls if params.get(f"{n}_url")}
        preset = params["preset"]
        try:
            with session(
                f"stage-{group}", preset, params.get("root"), params.get("overrides"), params.get("mlflow_uri"),
                (group,), given,
            ) as (cfg, root, tracking):  # fmt: skip
                results = run_stages(stage_names(cfg, (group,)), cfg, root, params.get("force", True), tracking, given)
                return finish(preset, root, cfg, tracking, results, start)
        except SetupError as exc:  # refused before it started: one line, as the CLI says it
            return refused(exc)

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
    first = get_stage(stage_names(_TINY, (group,))[0])
    run_group.__doc__ = f"Run the {group} stage alone: {first.doc}."
    return flow(run_group, name=f"stage-{group}", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=True)


# The entry points of prefect.yaml's stage deployments (``flows/stage_flows.py:<group>``), written
# out so that a reader (and ``prefect deploy``) finds them in the source; a group of the table
# without its line here fails tests/flows/test_table.py.
corpus = make_stage_flow("corpus")
vocab = make_stage_flow("vocab")
examples = make_stage_flow("examples")
pretrain = make_stage_flow("pretrain")
export = make_stage_flow("export")
finetune = make_stage_flow("finetune")

STAGE_FLOWS = {group: globals()[group] for group in CHAIN if group in globals()}
"""Every group's flow, in chain order."""
