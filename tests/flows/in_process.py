"""The chain as Python calls: the runner's own path for every stage, in this process (the quick
tier's ``quick_chain`` fixture, tests/flows/conftest.py; ``from in_process import ...`` in any test
under tests/flows)."""

import pytest

QUICK_OVERRIDES = {
    "examples.dupe_factor": 1,
    "pretrain.phases.0.steps": 20,
    "pretrain.phases.1.steps": 4,
    "pretrain.warmup_steps": 4,
    "pretrain.log_every": 4,
    "pretrain.checkpoint_every": 10,
    "finetune.epochs": 1,
    "finetune.grid.learning_rates": [1e-3],
    "finetune_tasks": ["sst2"],
}
"""The tiny preset cut to a few minutes' work: one pass over the sample for the examples, 24
pretraining steps over both phases, one fine-tuning unit (SST-2, one epoch, one learning rate)."""


def quick_cli_args() -> list[str]:
    """``--set`` arguments giving the CLI the config of :data:`QUICK_OVERRIDES`."""
    import json

    args: list[str] = []
    for key, value in QUICK_OVERRIDES.items():
        args += ["--set", f"{key}={json.dumps(value) if isinstance(value, list) else value}"]
    return args


def _pretrain_in_process(call):
    """The pretrain row's work in this process (the chain runs it in a training process)."""
    from flows.proc.train_entry import masking_from, training_setup
    from model.train import run_pretrain

    run = training_setup(call.spec())  # what the training process derives from its spec
    mask_fn, pad_id = masking_from(run.vocab_url, run.examples_url)
    return run_pretrain(run.pretrain, run.model, run.examples_url, run.output_url, restart=run.restart,
                        mask_fn=mask_fn, init_from=run.init_from, pad_id=pad_id, vocab_url=run.vocab_url)  # fmt: skip


def run_chain_in_process(cfg, root: str) -> dict:
    """Every stage of ``cfg`` through the runner (``flows.runner``), each as a Python call in this
    process: no CLI, no Prefect, no stage or training process. Returns ``{stage: StageResult}``;
    a fanned-out stage runs its units here, then gathers them, unless it is done (then skipped)."""
    import dataclasses

    from flows import table
    from flows.runner import run_stage, run_stage_unit, stage_state

    results = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(table.STAGES, "pretrain", dataclasses.replace(table.STAGES["pretrain"], run=_pretrain_in_process,
                                                                  where="inline"))  # fmt: skip
        for stage in table.stage_names(cfg):
            row = table.get_stage(stage)
            if row.units is None or stage_state(stage, cfg, root).state == "done":
                results[stage] = run_stage(stage, cfg, root)  # a finished fanned-out stage: skipped
                continue
            for unit in row.units.plan(cfg):
                run_stage_unit(stage, cfg, root, unit["unit_id"], in_process=True)
            results[stage] = run_stage(stage, cfg, root, aggregate_only=True)
    return results
