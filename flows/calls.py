"""What a stage's run function gets (:class:`StageCall`) and what running a stage gives back
(:class:`StageResult`): the types the stage table, the runner, the hooks and the flows share."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flows.presets import RunConfig, config_from_dict
from flows.proc.protocol import ProcessSpec
from pipeline.schema.manifest import Manifest

LogFn = Callable[[dict[str, float], int], None]


@dataclass
class StageCall:
    """What a stage's run function gets: the resolved config, its input and output URLs."""

    stage: str
    cfg: RunConfig
    root: str
    url: str
    inputs: dict[str, str]
    log_fn: LogFn | None = None
    restart: bool = False
    """Start over instead of resuming (a resumable stage under ``--force``)."""
    unit: dict[str, Any] | None = None
    """Run only this unit of a fanned-out stage (a downstream grid point x seed)."""
    aggregate_only: bool = False
    """A fanned-out stage whose units ran elsewhere: only gather them into the stage's output."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment for the processes it starts (the MLflow run id travels here)."""
    on_progress: Callable[[int, int], None] | None = None
    """(done, total) while a training stage runs."""

    def spec(self) -> ProcessSpec:
        """What a child process runs this call from (a stage process, the training process)."""
        return ProcessSpec(
            stage=self.stage,
            root=self.root,
            url=self.url,
            inputs=dict(self.inputs),
            config=dataclasses.asdict(self.cfg),
            restart=self.restart,
            unit=self.unit,
        )

    @classmethod
    def from_spec(cls, spec: ProcessSpec, log_fn: LogFn | None = None) -> StageCall:
        """The call a child runs, rebuilt from its spec (the config validated again)."""
        return cls(
            stage=spec.stage,
            cfg=config_from_dict(spec.config),
            root=spec.root,
            url=spec.url,
            inputs=dict(spec.inputs),
            log_fn=log_fn,
            restart=spec.restart,
            unit=spec.unit,
        )


@dataclass
class StageResult:
    stage: str
    status: str  # "done" | "skipped"
    seconds: float
    url: str
    counts: dict[str, float] = field(default_factory=dict)
    manifest: Manifest | None = None
    inputs: dict[str, str] = field(default_factory=dict)
