"""The model registry as an outcome: the root's exported model always has a registered version.

Registration is keyed on the export's manifest fingerprint (tag ``bertflow.export_fingerprint``)
and its folder (tag ``bertflow.model_url``), not on "the export stage ran in this run": whenever
the root's export is not a registered version's, a version is registered, whatever happened in
between (a run killed after the export, a store that was locked while it ran). An export already
registered gets no second version; its score is filled in when downstream results arrive later.
Two roots sharing a store register a version each, with its own lineage, even when their exports
are byte-identical (the same data and config): a version's tags lead to one root's files, and
moving or refreshing one root must not change what the other's version says. A root-local store
moved with its root is rewritten to the new folder (``flows.tracking.relocate_store``), so the
moved root still finds its version.

The score (``bertflow.score``) is on one scale, percent: the mean over the downstream tasks of
each task's headline dev metric (the median over seeds of the grid's best point, in percent as
the paper's tables print it: accuracy x 100, F1 as the official scripts give it). The GLUE average
(``bertflow.glue_average``) is the paper's: the GLUE tasks' headline metrics, WNLI left out. Both
definitions are written into the version's description. ``champion`` moves to a version whose
score beats the champion's (or when there is none); otherwise it becomes ``challenger``.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass

from flows.calls import StageResult
from flows.tracking import Tracker, quoted, tag_filter

log = logging.getLogger("bertflow.flow")

TAG_FINGERPRINT = "bertflow.export_fingerprint"
TAG_MODEL_URL = "bertflow.model_url"
TAG_SCORE = "bertflow.score"


@dataclass(frozen=True)
class TaskScore:
    task: str
    metric: str
    percent: float
    glue_average: bool


def task_scores(downstream: list[tuple[str, StageResult]]) -> list[TaskScore]:
    """Each finished downstream task's headline dev metric in percent (``dev_median`` of its
    aggregate manifest, which the task registry's scale put in percent)."""
    from tasks.registry import get_task

    out = []
    for task, result in downstream:
        if "dev_median" in result.counts:
            t = get_task(task)
            out.append(TaskScore(task, t.metric, float(result.counts["dev_median"]), t.glue_average))
    return out


def model_score(scores: list[TaskScore]) -> tuple[float | None, float | None]:
    """(the score: mean of every task's percent metric, the paper's GLUE average), None when empty."""
    score = statistics.fmean(s.percent for s in scores) if scores else None
    glue = [s.percent for s in scores if s.glue_average]
    return score, (statistics.fmean(glue) if glue else None)


def describe(scores: list[TaskScore], score: float | None, glue: float | None) -> str:
    """The version's description: what the score is, and its parts."""
    lines = [
        "BERT pretrained by bertflow (MLM + NSP); pyfunc: fill masks, embed text.",
        "bertflow.score: the mean over the downstream tasks of each task's headline dev metric in percent "
        "(median over seeds of the best grid point; accuracy and GLUE's F1/MCC/Spearman x 100, SQuAD and "
        "CoNLL F1 as their official scripts report them).",
        "bertflow.glue_average: the paper's GLUE average, the same metrics over the GLUE tasks but WNLI.",
    ]
    if scores:
        parts = ", ".join(f"{s.task} {s.metric.removeprefix('eval_')} {s.percent:.2f}" for s in scores)
        lines.append(f"This version: score {score:.2f} ({parts})" + (f"; GLUE average {glue:.2f}" if glue else ""))
    else:
        lines.append("This version: no downstream score yet.")
    return "\n".join(lines)


def find_version(tracker: Tracker, name: str, fingerprint: str, model_url: str | None = None):
    """The registered version of ``name`` made from the export with this fingerprint (in the
    folder ``model_url``, when given: another root's identical export is not this root's), or None."""
    from mlflow.exceptions import MlflowException

    literal = quoted(name)
    filters = [f"name = {literal}" if literal else None, tag_filter(TAG_FINGERPRINT, fingerprint)]
    try:
        versions = tracker.client.search_model_versions(" and ".join(f for f in filters if f))
    except MlflowException:
        return None
    found = [
        v
        for v in versions
        if v.name == name
        and v.tags.get(TAG_FINGERPRINT) == fingerprint
        and (model_url is None or v.tags.get(TAG_MODEL_URL) == model_url)
    ]
    return max(found, key=lambda v: int(v.version)) if found else None


def ensure_registered_model(tracker: Tracker, name: str) -> None:
    from mlflow.exceptions import MlflowException

    def exists() -> bool:
        try:
            tracker.client.get_registered_model(name)
            return True
        except MlflowException:
            return False

    if exists():
        return
    try:
        tracker.client.create_registered_model(
            name, description="BERT pretrained by bertflow (MLM + NSP); pyfunc: fill masks, embed text."
        )
    except MlflowException:
        if not exists():  # else another run registering on the same store made it since the lookup
            raise


def set_alias_by_score(tracker: Tracker, name: str, version: str, score: float | None) -> str:
    """``champion`` moves to ``version`` if its score beats the champion's (or there is none);
    otherwise ``version`` becomes the ``challenger``. Returns the alias given."""
    from mlflow.exceptions import MlflowException

    client = tracker.client
    if score is not None:
        client.set_model_version_tag(name, version, TAG_SCORE, f"{score:.6f}")
    try:
        champion = client.get_model_version_by_alias(name, "champion")
    except MlflowException:
        champion = None
    best = None
    if champion is not None and str(champion.version) != str(version):
        try:
            best = float(champion.tags.get(TAG_SCORE, "nan"))
        except ValueError:
            best = None
    if champion is None or str(champion.version) == str(version):
        client.set_registered_model_alias(name, "champion", version)
        return "champion"
    if score is not None and (best is None or best != best or score > best):
        client.set_registered_model_alias(name, "champion", version)
        return "champion"
    client.set_registered_model_alias(name, "challenger", version)
    return "challenger"


def rescoring(version: str, description: str | None, tags: dict[str, str], aliases: dict[str, str],
              champion_tags: dict[str, str], scores: list[TaskScore]) -> tuple[list[str], str | None]:  # fmt: skip
    """What scoring an already registered ``version`` again (``register_model_task`` on an export a
    version holds) would change, as the names of what it writes with another value ([]: nothing),
    and the alias the version holds after it. ``aliases``: alias -> version of the model;
    ``champion_tags``: the tags of the champion's version. Reads the same rules as the writing
    path (:func:`describe`, :func:`set_alias_by_score`), for a run answered without MLflow's
    client (``flows.finished``)."""
    score, glue = model_score(scores)
    if score is None:  # nothing new to judge it by: it keeps its score and alias
        return [], ", ".join(sorted(a for a, v in aliases.items() if v == version)) or None
    want = {f"{s.task}.score_percent": f"{s.percent:.4f}" for s in scores}
    if glue is not None:
        want["bertflow.glue_average"] = f"{glue:.4f}"
    want[TAG_SCORE] = f"{score:.6f}"
    changes = [f"tag {k}" for k, v in want.items() if tags.get(k) != v]
    if description != describe(scores, score, glue):
        changes.append("description")
    champion = aliases.get("champion")
    if champion == version:
        return changes, "champion"
    try:
        best = float(champion_tags.get(TAG_SCORE, "nan")) if champion is not None else None
    except ValueError:
        best = None
    if champion is None or best is None or best != best or score > best:
        return [*changes, "alias champion"], "champion"
    if aliases.get("challenger") != version:
        changes.append("alias challenger")
    return changes, "challenger"
