"""How a Beam job runs (runner, workers, cluster options), and what a stage's manifest records of its config."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from pipeline.schema.config import check


@dataclass(frozen=True)
class BeamConfig:
    """How a Beam job runs: the local runner by default; Dataflow, Flink or Spark by setting the
    runner and its options here (``--set corpus.beam.runner=DataflowRunner``). Every field maps
    to one Beam pipeline option (see :func:`pipeline.beam.io.beam_args`); ``options`` and
    ``extra_args`` pass anything else through as it is."""

    runner: str = "FnApiRunner"
    """Beam runner. FnApiRunner runs offline; DataflowRunner, FlinkRunner, SparkRunner at scale."""
    num_workers: int = 1
    """Local runners: worker processes (DirectRunner multi_processing when > 1). DataflowRunner:
    the initial number of worker VMs (--num_workers)."""
    max_num_workers: int = 0
    """DataflowRunner: the autoscaling ceiling (--max_num_workers); 0: the service's default."""
    project: str = ""
    """DataflowRunner: the Google Cloud project (--project)."""
    region: str = ""
    """DataflowRunner: the region that runs the job, e.g. us-central1 (--region)."""
    temp_location: str = ""
    """DataflowRunner: a gs:// folder for temporary and staged files (--temp_location)."""
    machine_type: str = ""
    """DataflowRunner: the worker VM type, e.g. n2-highmem-4 (--machine_type); empty: the default."""
    sdk_container_image: str = ""
    """Worker image with our code and pinned dependencies (--sdk_container_image), built from
    infra/dataflow/Dockerfile. DataflowRunner needs it or ``setup_file``."""
    setup_file: str = ""
    """A setup.py that packages our Beam code for the workers (--setup_file); the alternative to
    a worker image (see infra/dataflow/run.sh --setup-file)."""
    fork_workers: bool = True
    """FnApiRunner at num_workers > 1: fork the worker processes from the driver (they share its
    imports and start in milliseconds, see pipeline.beam.local_workers) instead of starting each as a
    fresh Python (~1.5 s of imports each). False: Beam's own subprocess workers. Linux only."""
    shared_filesystem: bool = False
    """A runner whose workers run elsewhere (every runner but FnApiRunner and DirectRunner) sees
    this machine's local paths too (a Flink or Spark cluster on this host, a job service with its
    workers here, a mount shared by every worker): local inputs and outputs allowed. False: they
    are refused before any work (workers would write their shards to their own disks)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Further pipeline options by name: {"flink_master": "host:8081"} -> --flink_master=host:8081;
    true -> a bare flag, false/null -> left out, a list -> the option repeated."""
    extra_args: tuple[str, ...] = ()
    """Further pipeline options as command-line words, passed last, e.g. ("--experiments=x",)."""

    def __post_init__(self):
        check(isinstance(self.runner, str) and bool(self.runner), "beam.runner", "must name a runner")
        check(self.num_workers >= 1, "beam.num_workers", f"must be >= 1, got {self.num_workers}")
        check(self.max_num_workers >= 0, "beam.max_num_workers", f"must be >= 0, got {self.max_num_workers}")
        check(
            self.max_num_workers == 0 or self.max_num_workers >= self.num_workers,
            "beam.max_num_workers",
            f"{self.max_num_workers} is below beam.num_workers={self.num_workers}",
        )
        for key in self.options:
            check(
                isinstance(key, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", key) is not None,
                f"beam.options.{key}",
                "must be a pipeline option name without dashes, e.g. flink_master",
            )
        if self.runner == "DataflowRunner":
            given = self._named_options()
            for name in ("project", "region", "temp_location"):
                check(
                    bool(getattr(self, name)) or name in given,
                    f"beam.{name}",
                    "DataflowRunner needs it (e.g. --set corpus.beam.%s=...)" % name,
                )
            temp = self.temp_location or str(self.options.get("temp_location", "gs://"))
            check(temp.startswith("gs://"), "beam.temp_location", f"must be a gs:// folder for Dataflow, got {temp!r}")
            check(
                bool(self.sdk_container_image or self.setup_file)
                or bool(given & {"sdk_container_image", "setup_file", "extra_package", "extra_packages"}),
                "beam.sdk_container_image",
                "DataflowRunner workers need our code: set beam.sdk_container_image (an image built "
                "from infra/dataflow/Dockerfile) or beam.setup_file (infra/dataflow/run.sh --setup-file)",
            )

    def _named_options(self) -> set[str]:
        """Option names given through ``options`` or ``extra_args``."""
        names = {k for k, v in self.options.items() if v not in (None, False, "")}
        names |= {a[2:].split("=", 1)[0] for a in self.extra_args if a.startswith("--")}
        return names


def to_dict(cfg) -> dict:
    """A plain dict of a config (tuples as lists), for manifests and MLflow params."""
    return dataclasses.asdict(cfg)


def output_config(cfg) -> dict:
    """What a Beam stage's manifest records and its skip check compares: the config without
    ``beam``. How a job runs (runner, workers, project, image) does not change what it writes,
    since the shards are byte-identical whatever the runner and its parallelism, so moving a
    stage from the local runner to Dataflow does not make it, and every stage after it, rerun."""
    out = to_dict(cfg)
    out.pop("beam", None)
    return out
