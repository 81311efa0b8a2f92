"""The Prefect tasks every flow uses, and the session a flow run holds.

Each stage is one Prefect task around a plain call (``flows.runner.run_stage``) with the retries
of its row, its own MLflow child run under the flow's parent run, and a Prefect markdown
artifact listing what it wrote. Our own manifests decide skipping (Prefect's result cache is
off); a skipped stage ends in a Completed state named ``Skipped``. bertflow's log lines (the
training and fine-tuning processes' included) reach the Prefect API; training progress is a
Prefect progress artifact. The flows import this module; it imports no flow.

Retries are for what a retry can fix (a lost worker, a busy database): a stage or unit task is
retried only when :func:`retry_condition` says so (``flows.proc.protocol.worth_retrying``): never
after the stop request (Ctrl-C, SIGTERM), never for a deterministic error (bad config or input,
a missing file, a divergence, a child killed by SIGKILL). After the stop request no stage task
starts, and the MLflow runs it ends are ``KILLED``.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed

from flows.checks import RootLock, absolute_root, preflight
from flows.figures import format_figure, key_figures
from flows.presets import RunConfig, as_dict, load_config
from flows.proc.protocol import STOP, DiskFullError, StageProcessError, describe_disk_full, disk_full, worth_retrying
from flows.reporting import log_stage_artifacts, stage_markdown
from flows.runner import run_stage, stage_state
from flows.table import (
    CHAIN,
    StageResult,
    card_sources,
    get_stage,
    stage_config,
    stage_inputs,
    stage_names,
    stage_url,
)
from flows.tracker_sqlite import open_tracker
from flows.tracking import (
    ENV_RUN_ID,
    ENV_TRACKING_URI,
    EXPERIMENT,
    Tracker,
    default_tracking_uri,
    follow_moved_root,
    git_commit,
    store_artifact_root,
)
from pipeline.schema.config import config_digest
from pipeline.schema.manifest import ManifestError, fingerprint_input, read_manifest
from pipeline.schema.storage import join_url

log = logging.getLogger("bertflow.flow")


def default_root(preset: str) -> str:
    return os.path.abspath(os.path.join("runs", preset))


class SetupError(Exception):
    """A flow refused before it started (a bad preset or field, a remote root without
    ``mlflow_uri``, a missing input): its message is the one line the CLI prints."""


def refused(exc: SetupError):
    """The final state of a flow whose :func:`session` refused to start: Failed with the one-line
    message, logged once, and no traceback in the flow run's log (a deployment's log reads like
    the CLI's ``bertflow: configuration error: ...``)."""
    from prefect import get_run_logger
    from prefect.states import Failed

    get_run_logger().error("%s", exc)
    return Failed(message=str(exc))


@dataclass(frozen=True)
class Tracking:
    """Where a flow's stages log: the tracking URI, the experiment and the flow's parent run."""

    uri: str
    experiment_id: str
    parent_run_id: str

    def tracker(self) -> Tracker:
        t = open_tracker(self.uri)
        t.experiment_id = self.experiment_id
        return t


@contextmanager
def session(
    name: str,
    preset: str,
    root: str | None,
    overrides: dict | None,
    mlflow_uri: str | None,
    groups: tuple[str, ...] = CHAIN,
    given: dict[str, str] | None = None,
    forced: set[str] | None = None,
):
    """Config, checks, the root's lock, the parent MLflow run and log forwarding, for one flow run.
    ``forced``: the groups a run skipping finished stages reruns (None: all run; see ``preflight``).
    Raises :class:`SetupError` (one line, as the CLI prints it) when the configuration, the
    root, the tracking URI or an input is refused, before anything starts."""
    from flows.secrets import merge_secret_overrides
    from pipeline.schema.config import ConfigError

    try:
        cfg = load_config(preset, merge_secret_overrides(overrides))
        root = absolute_root(root or default_root(preset))  # tags and lineage name where it is, wherever run from
        tracking_uri = mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(root)
        preflight(cfg, root, stage_names(cfg, groups), tracking_uri, given, forced)
    except (ConfigError, OSError, ValueError, KeyError) as exc:
        raise SetupError(f"{name}: configuration error: {exc}") from None
    with RootLock(root), _prefect_logs():
        follow_moved_root(root, tracking_uri)
        tracker = open_tracker(tracking_uri)
        tracker.use_experiment(EXPERIMENT, artifact_root=store_artifact_root(tracking_uri, root))
        killed = tracker.mark_killed_runs(root)
        if killed:
            log.warning("marked %d run(s) of %s left RUNNING by a killed process as KILLED", len(killed), root)
        tags = {
            "bertflow.preset": preset,
            "bertflow.root": root,
            "bertflow.git_commit": git_commit(),
            "bertflow.config_fingerprint": config_digest(as_dict(cfg)),
            "prefect.flow_run_id": _flow_run_id(),
        }
        parent = tracker.start_run(name, tags=tags)
        tracker.log_params(parent, {"preset": preset, "root": root, **as_dict(cfg)})
        ok = False
        try:
            yield cfg, root, Tracking(tracking_uri, tracker.experiment_id, parent)
            ok = True
        finally:
            end_run(tracker, parent, ok)


def end_run(tracker: Tracker, run_id: str, ok: bool) -> None:
    """End an MLflow run: FINISHED, FAILED, or KILLED once the stop request came."""
    killed = not ok and STOP.requested is not None  # in a finally: the error on its way out stays the one reported
    tracker.end_run(run_id, ok, quiet=not ok, status="KILLED" if killed else None)


def _flow_run_id() -> str:
    from prefect.runtime import flow_run

    return str(flow_run.id or "")


@contextmanager
def _prefect_logs():
    """Send the ``bertflow`` loggers' records to the Prefect API while a flow runs, from this
    process only. Beam's local workers are forked from it (``pipeline.beam.local_workers``) and
    inherit the handler, but run no flow: Prefect's handler printed "UserWarning: Logger
    'bertflow.corpus' attempted to send logs to the API without a flow run id" (two lines) for
    each of their records in the stage's log. Their records reach that log through Beam as before."""
    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger("bertflow")
    handler = APILogHandler()
    pid = os.getpid()
    handler.addFilter(lambda record: os.getpid() == pid)
    logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def stage_options(stage: str) -> dict[str, Any]:
    """A stage task's options from its row. The row's timeout is enforced on its process
    (``flows.proc.launch``): a Prefect timeout cannot interrupt a task blocked in a worker thread."""
    return {"retries": get_stage(stage).retries, "retry_delay_seconds": 10, "retry_condition_fn": retry_condition}


def failure_of(state) -> BaseException | None:
    """The exception a Failed state holds (None when it holds none)."""
    data = getattr(state, "data", None)
    if isinstance(data, BaseException):
        return data
    try:
        result = state.result(raise_on_failure=False)
    except Exception:  # a result that cannot be read back: no exception to judge
        return None
    return result if isinstance(result, BaseException) else None


def retry_condition(task, task_run, state) -> bool:
    """Prefect's ``retry_condition_fn`` of every stage and unit task: retry only what a retry can
    fix (``flows.proc.protocol.worth_retrying``)."""
    exc = failure_of(state)
    if worth_retrying(exc):
        return True
    why = "the stop request" if STOP.requested is not None else f"{type(exc).__name__}, a retry meets it again"
    log.warning("%s: not retried (%s)", getattr(task_run, "name", "task"), why)
    return False


def unwrap(value: Any) -> StageResult:
    """A stage task's result: a skipped stage returns its ``Skipped`` state, holding the result."""
    from prefect.states import State

    return value.result() if isinstance(value, State) else value


@task(name="stage", task_run_name="{stage}", cache_policy=NO_CACHE)
def stage_task(
    stage: str,
    cfg: RunConfig,
    root: str,
    force: bool,
    tracking: Tracking,
    given: dict[str, str] | None = None,
    aggregate_only: bool = False,
) -> StageResult:
    """Run one stage inside an MLflow child run and publish what it wrote. A stage that is up to
    date opens no MLflow run (a run that does nothing adds none) and ends ``Skipped``."""
    from prefect.runtime import task_run

    STOP.check(f"stage {stage}")
    skipped = None if force or aggregate_only else up_to_date(stage, cfg, root, given)
    if skipped is not None:
        create_markdown_artifact(key=_artifact_key(stage), markdown=stage_markdown(skipped),
                                 description=f"{stage}: up to date, skipped")  # fmt: skip
        return Completed(name="Skipped", message=f"{stage} is up to date: {skipped.url}", data=skipped)
    tracker = tracking.tracker()
    run_id = tracker.start_run(
        stage, parent_id=tracking.parent_run_id, tags={"bertflow.stage": stage, "bertflow.root": root}
    )
    ok = False
    try:
        env = {ENV_RUN_ID: run_id, ENV_TRACKING_URI: tracking.uri}
        # a retry resumes (pretraining from its last checkpoint): only the first attempt starts over
        first_attempt = (task_run.run_count or 1) <= 1
        try:
            result = run_stage(
                stage,
                cfg,
                root,
                force=force and first_attempt,
                log_fn=lambda m, step: tracker.log_metrics(run_id, m, step),
                env=env,
                given=given,
                on_progress=_progress_artifact(stage) if get_stage(stage).where == "training" else None,
                aggregate_only=aggregate_only,
            )
        except Exception as exc:  # a full disk is named as the disk (a stage process names it itself)
            full = disk_full(exc)
            if full is None or isinstance(exc, (StageProcessError, DiskFullError)):
                raise
            raise DiskFullError(describe_disk_full(full, stage_url(root, stage))) from exc
        _log_stage(tracker, run_id, stage, cfg, result)
        create_markdown_artifact(
            key=_artifact_key(stage),
            markdown=stage_markdown(result),
            description=f"{stage}: what the stage wrote",
        )
        ok = True
        if result.status == "skipped":
            return Completed(name="Skipped", message=f"{stage} is up to date: {result.url}", data=result)
        return result
    finally:
        end_run(tracker, run_id, ok)


def _artifact_key(stage: str) -> str:
    return stage.replace("/", "-").replace("_", "-").lower() + "-output"


def up_to_date(stage: str, cfg: RunConfig, root: str, given: dict[str, str] | None) -> StageResult | None:
    """The result of a stage that is up to date (``flows.runner.stage_state``), as ``run_stage``
    gives it when it skips; None when the stage must run."""
    current = stage_state(stage, cfg, root, given)
    if current.state != "done":
        return None
    log.info("stage %s: up to date, skipped (%s)", stage, current.url)
    m = current.manifest
    return StageResult(stage, "skipped", 0.0, current.url, m.counts, m, stage_inputs(stage, cfg, root, given))


def _log_stage(tracker: Tracker, run_id: str, stage: str, cfg: RunConfig, result: StageResult) -> None:
    try:
        tracker.log_params(run_id, stage_config(stage, cfg, result.inputs))
    except (ManifestError, FileNotFoundError, KeyError) as exc:
        log.warning("stage %s: params not logged (%s)", stage, exc)
    tracker.set_tags(run_id, {"bertflow.status": result.status, "bertflow.url": result.url})
    fingerprints = {}
    for name, url in result.inputs.items():
        try:
            fingerprints[name] = fingerprint_input(url)
        except (FileNotFoundError, ManifestError):
            pass
    tracker.log_datasets(run_id, result.inputs, fingerprints)
    tracker.log_metrics(run_id, {f"stage.{k}": v for k, v in result.counts.items()})
    tracker.log_metrics(run_id, {"stage_seconds": result.seconds})
    log_stage_artifacts(tracker, run_id, get_stage(stage), result)


def _progress_artifact(stage: str):
    """A Prefect progress artifact for a training stage, made at its first progress line (a
    skipped stage makes none) and updated at most every 2 s."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    from flows.proc.protocol import notify_progress

    artifact: list[Any] = []
    last = [0.0]

    def update(done: int, total: int) -> None:
        notify_progress(stage, done, total)
        now = time.monotonic()
        if not total or (now - last[0] <= 2.0 and done < total):
            return
        last[0] = now
        if not artifact:
            key = stage.replace("/", "-") + "-progress"
            artifact.append(create_progress_artifact(100.0 * done / total, key=key, description=f"{stage}: steps done"))
        else:
            update_progress_artifact(artifact[0], 100.0 * done / total)

    return update


@task(name="results-table", cache_policy=NO_CACHE)
def results_table_task(cfg: RunConfig, root: str, tracking: Tracking) -> dict:
    """The per-model table over every downstream task (median/min/max over seeds, the GLUE
    average), written next to the task folders and shown in Prefect and MLflow."""
    import fsspec

    from tasks.results import summarize

    out = join_url(root, "finetune")
    summary = summarize({t: stage_url(root, f"finetune/{t}") for t in cfg.finetune_tasks}, out, model=cfg.model_name)
    with fsspec.open(join_url(out, "results.md"), "r") as f:
        markdown = f.read()
    tracking.tracker().log_text(tracking.parent_run_id, markdown, "results.md")
    create_markdown_artifact(key="downstream-results", markdown=markdown, description="downstream results")
    if summary.get("glue_average") is not None:
        tracking.tracker().log_metrics(tracking.parent_run_id, {"glue_average": summary["glue_average"]})
    return summary


@task(name="register-model", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def register_model_task(cfg: RunConfig, model: StageResult, downstream: list[StageResult], tracking: Tracking) -> dict:
    """The root's exported model as a registered version, once per export (``flows.model_registry``):
    logged as a pyfunc model and registered when no version has its fingerprint; scored on one
    scale (percent) when downstream results are there; ``champion`` moved if it scores better."""
    import mlflow

    from flows import model_registry as registry
    from flows.card import write_model_card
    from flows.mlflow_model import log_bert_model

    tracker = tracking.tracker()
    name = cfg.model_name
    fingerprint = (model.manifest or read_manifest(model.url)).fingerprint
    if not cfg.data.finetune_model:  # the downstream scores are this model's: its card shows them
        root = model.url.rsplit("/", 1)[0]
        scored = _results_of(cfg, root, fingerprint, downstream)
        write_model_card(cfg, model.url, card_sources(cfg, root), [(get_stage(r.stage).task.name, r) for r in scored])
    scores = registry.task_scores([(get_stage(r.stage).task.name, r) for r in downstream])
    score, glue = registry.model_score(scores)
    version = registry.find_version(tracker, name, fingerprint, model.url)
    created = version is None
    if created:
        mlflow.set_tracking_uri(tracking.uri)
        mlflow.set_registry_uri(tracking.uri)
        info = log_bert_model(tracking.parent_run_id, _local_copy(model.url))
        registry.ensure_registered_model(tracker, name)
        # register_model (not create_model_version) passes the logged model's id: a tracking server
        # refuses a models:/ source without it
        tags = {**_version_tags(cfg, model, downstream), registry.TAG_FINGERPRINT: fingerprint}
        version = _quiet_register(mlflow, info.model_uri, name, tags)
    number = str(version.version)
    from flows.lineage import rename_moved

    # the other versions: their lineage leads to where a refresh kept their outputs (idempotent)
    rename_moved(tracker.client, name, model.url.rsplit("/", 1)[0], number, cfg.keep_outputs)
    if score is None and not created:  # nothing new to judge it by: it keeps its score and alias
        log.info("%s version %s already holds this export (%s)", name, number, fingerprint[:12])
        return {"version": number, "alias": ", ".join(version.aliases) or None, "score": None, "new": False}
    client = tracker.client
    client.update_model_version(name, number, description=registry.describe(scores, score, glue))
    for s in scores:
        client.set_model_version_tag(name, number, f"{s.task}.score_percent", f"{s.percent:.4f}")
    if glue is not None:
        client.set_model_version_tag(name, number, "bertflow.glue_average", f"{glue:.4f}")
    alias = registry.set_alias_by_score(tracker, name, number, score)
    log.info("registered %s version %s (%s, score %s)", name, number, alias, score)
    return {"version": number, "alias": alias, "score": score, "new": created}


def _results_of(cfg: RunConfig, root: str, fingerprint: str, downstream: list[StageResult]) -> list[StageResult]:
    """The downstream results of the export with ``fingerprint``: this run's, and those the root
    holds of the tasks that did not run now (a lone ``stage export`` keeps the scores its
    unchanged model already has)."""
    out = list(downstream)
    ran = {r.stage for r in downstream}
    for name in stage_names(cfg, ("finetune",)):
        if name in ran:
            continue
        try:
            manifest = read_manifest(stage_url(root, name))
        except ManifestError:
            continue
        if manifest.inputs.get("model") == fingerprint:
            out.append(StageResult(name, "skipped", 0.0, manifest.url, manifest.counts, manifest))
    return out


_REGISTER_CHATTER = ("Registered model ", "Successfully registered model ", "Created version ")


def _quiet_register(mlflow, model_uri: str, name: str, tags: dict[str, str]):
    """``mlflow.register_model`` without its progress lines on stderr: "Registered model 'bert-tiny'
    already exists. Creating a new version" (printed on a brand-new registry too, since
    ``ensure_registered_model`` creates the model first, with its description) and "Created version
    '1'": our own log line says which version was registered. Anything else it prints is passed on
    as a warning."""
    import contextlib
    import io

    captured = io.StringIO()
    with contextlib.redirect_stderr(captured):  # MLflow prints through a stream that follows sys.stderr
        version = mlflow.register_model(model_uri, name, tags=tags)
    for line in captured.getvalue().splitlines():
        if line.strip() and not line.startswith(_REGISTER_CHATTER):
            log.warning("MLflow: %s", line)
    return version


def _version_tags(cfg: RunConfig, model: StageResult, downstream: list[StageResult]) -> dict[str, str]:
    """Tags that lead from a model version back to its data: every upstream stage's URL and
    fingerprint (the dump files, the vocab, the shards, the checkpoint), and the raw inputs."""
    from flows.lineage import version_tags
    from flows.model_registry import TAG_MODEL_URL

    tags = {"preset": cfg.preset, TAG_MODEL_URL: model.url}
    tags.update(version_tags(cfg, model.url.rsplit("/", 1)[0]))  # by URL and by content (flows/lineage.py)
    for r in downstream:
        for k, v in key_figures(get_stage(r.stage).figures, r.counts).items():
            tags[f"{get_stage(r.stage).task.name}.{k}"] = format_figure(v)
    return tags


def _local_copy(url: str) -> str:
    """A local folder holding ``url``'s files (MLflow logs artifacts from local paths)."""
    if "://" not in url or url.startswith("file://"):
        return url.removeprefix("file://")
    import tempfile

    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    local = tempfile.mkdtemp(prefix="bertflow-model-")
    fs.get(path.rstrip("/") + "/", local + "/", recursive=True)
    return local


def summary(preset: str, root: str, tracking: Tracking, cfg: RunConfig, results: list[StageResult],
            registered: dict | None, start: float) -> dict[str, Any]:  # fmt: skip
    """What a flow run returns (and the CLI prints): :func:`flows.reporting.run_summary`."""
    from flows.reporting import run_summary

    ids = (tracking.uri, tracking.experiment_id, tracking.parent_run_id)
    version = (registered["version"], registered["alias"]) if registered else (None, None)
    return run_summary(preset, root, cfg, results, ids, version, start)
