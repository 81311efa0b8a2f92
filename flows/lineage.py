"""Lineage that stays true: what a registered version was made from, named by content, and kept.

A root is rewritten in place by every refresh (a new dump reruns corpus, vocab, examples,
pretraining and export into the same folders), so a version that only named those folders would,
after the next refresh, point at the next version's data. Three things keep its record true:

1. **Named by content** (:func:`version_tags`, at registration): every stage's folder and its
   manifest fingerprint (``lineage.<stage>.url`` / ``.fingerprint``), and each raw input's URL,
   the content fingerprint the corpus manifest recorded for it (``lineage.raw.<input>.fingerprint``)
   and, where the file names say it, the dump it is (``lineage.raw.<input>.dump``, e.g.
   ``enwiki-20261101``, from MediaWiki's ``<db>-<date>-pages-articles`` names).
2. **Kept** (:func:`keep_previous`, called by ``flows.runner.run_stage``): a finished stage output
   that a rerun is about to replace is moved, whole, to ``{root}/history/<folder>/<fingerprint,
   16 hex>/`` first; ``keep_outputs`` (``RunConfig.keep_outputs``, default 1) of them are kept per
   stage, the oldest removed beyond that once the rerun has finished (0: replaced outputs are
   deleted, as before; a rerun that wrote the same output again keeps no copy). Not moved:
   a resumable stage that continues its checkpoints (same inputs, a tunable setting changed).
   Cost: the disk of ``keep_outputs`` more copies of each stage; on ``gs://`` a move is a copy
   then a delete.
3. **Named on the old version** (:func:`rename_moved`, when a new version is registered): every
   other version of the model whose ``lineage.<stage>.fingerprint`` is no longer its folder's
   gets ``lineage.<stage>.url`` set to where that output was kept (or ``removed (history kept
   N)``), so reading v1's tags after a refresh leads to v1's data. :func:`resolve` answers the
   same from the tags alone (the folder if its fingerprint still matches, else its kept copy).

Nothing here imports MLflow or Prefect at module level: the runner calls :func:`keep_previous`.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import fsspec

from flows.table import STAGES, get_stage, producer, stage_inputs, stage_url
from pipeline.schema.manifest import MANIFEST_NAME, ManifestError, fingerprint_input, has_manifest, read_manifest
from pipeline.schema.storage import join_url

log = logging.getLogger("bertflow.flow")

HISTORY = "history"
"""The folder under the root where replaced stage outputs are kept."""
_DUMP = re.compile(r"([a-z][a-z0-9_]*wiki(?:[a-z]+)?)-(\d{8}|latest)-")


def kept_url(root: str, stage: str, fingerprint: str) -> str:
    """Where the output of ``stage`` with this manifest fingerprint is kept once replaced."""
    return join_url(root, HISTORY, get_stage(stage).folder, fingerprint[:16])


def keep_previous(stage: str, root: str, keep: int) -> str | None:
    """Move the finished output of ``stage`` aside (it is about to be replaced); return where it
    went (None: nothing finished there, or ``keep`` 0). :func:`settle` follows the rerun."""
    url = stage_url(root, stage)
    if not has_manifest(url):
        return None
    fs, path = fsspec.core.url_to_fs(url)
    if keep <= 0:
        return None
    fingerprint = read_manifest(url).fingerprint
    dest = kept_url(root, stage, fingerprint)
    _, dest_path = fsspec.core.url_to_fs(dest)
    if fs.exists(dest_path):  # the same output kept before (a rerun of an identical stage)
        fs.rm(dest_path, recursive=True)
    fs.makedirs(dest_path.rsplit("/", 1)[0], exist_ok=True)
    fs.mv(path, dest_path, recursive=True)
    log.info("stage %s: its previous output (%s) kept at %s", stage, fingerprint[:16], dest)
    return dest


def settle(stage: str, root: str, kept: str | None, fingerprint: str, keep: int) -> None:
    """After a rerun wrote the output with ``fingerprint``: drop the kept copy if it is the same
    output (a forced rerun of an unchanged stage), then apply the retention ``keep``."""
    if kept is not None and kept == kept_url(root, stage, fingerprint):
        fs, path = fsspec.core.url_to_fs(kept)
        fs.rm(path, recursive=True)
    if kept is not None:
        _prune(root, stage, keep)


def _prune(root: str, stage: str, keep: int) -> list[str]:
    """Remove all but the ``keep`` newest kept outputs of ``stage`` (by their manifest's time)."""
    fs, base = fsspec.core.url_to_fs(join_url(root, HISTORY, get_stage(stage).folder))
    if not fs.exists(base):
        return []
    kept = []
    for path in fs.ls(base, detail=False):
        mpath = join_url(path, MANIFEST_NAME)
        created = json.loads(fs.cat(mpath)).get("created_at", 0.0) if fs.exists(mpath) else 0.0
        kept.append((created, path))
    doomed = [p for _, p in sorted(kept, reverse=True)[keep:]]
    for p in doomed:
        fs.rm(p, recursive=True)
        log.info("stage %s: removed the kept output %s (history keeps %d)", stage, p, keep)
    return doomed


def dump_names(url: str) -> list[str]:
    """The MediaWiki dumps a raw input is, from its file names (``enwiki-20261101``); [] if none says."""
    try:
        fs, path = fsspec.core.url_to_fs(url)
        if any(ch in url for ch in "*?["):
            names = fs.glob(path)
        elif fs.isdir(path):
            names = fs.find(path)
        else:
            names = [path]
    except OSError:
        return []
    found = {f"{m.group(1)}-{m.group(2)}" for n in names for m in [_DUMP.search(n.rsplit("/", 1)[-1])] if m}
    return sorted(found)


def version_tags(cfg, root: str) -> dict[str, str]:
    """Every stage's folder and fingerprint, and each raw input by URL, content and dump name."""
    tags: dict[str, str] = {}
    for name in STAGES:
        url = stage_url(root, name)
        tags[f"lineage.{name}.url"] = url
        try:
            manifest = read_manifest(url)
        except (FileNotFoundError, ManifestError):
            continue
        tags[f"lineage.{name}.fingerprint"] = manifest.fingerprint
        for input_name, input_url in stage_inputs(name, cfg, root).items():
            if producer(input_name) is None:  # raw data, not an earlier stage's output
                tags[f"lineage.raw.{input_name}"] = input_url
                if input_name in manifest.inputs:  # the content it was made from, as its manifest recorded
                    tags[f"lineage.raw.{input_name}.fingerprint"] = manifest.inputs[input_name]
                dumps = dump_names(input_url)
                if dumps:
                    tags[f"lineage.raw.{input_name}.dump"] = ",".join(dumps)
    return tags


def resolve(tags: dict[str, str], stage: str) -> str | None:
    """Where a version's ``stage`` output is now: its recorded URL if that folder still holds the
    recorded fingerprint, else its kept copy under ``history/``; None when neither is there."""
    url, fingerprint = tags.get(f"lineage.{stage}.url", ""), tags.get(f"lineage.{stage}.fingerprint", "")
    if not fingerprint:
        return None
    candidates = [url]
    original = tags.get(f"lineage.{stage}.recorded_url", url)
    folder = get_stage(stage).folder
    root = original[: -len(folder) - 1] if original.endswith("/" + folder) else ""
    if root:
        candidates.append(kept_url(root, stage, fingerprint))
    for candidate in candidates:
        try:
            if candidate and has_manifest(candidate) and fingerprint_input(candidate) == fingerprint:
                return candidate
        except (FileNotFoundError, ManifestError, OSError):
            continue
    return None


def rename_moved(client: Any, name: str, root: str, current: str, keep: int) -> dict[str, dict[str, str]]:
    """Point the lineage of ``name``'s other versions made under ``root`` at where their outputs
    were kept (:func:`keep_previous`); return {version: {tag: new value}} of what changed."""
    from flows.tracking import quoted

    literal = quoted(name)
    versions = client.search_model_versions(f"name = {literal}" if literal else "")
    changed = moved_lineage(versions, name, root, current, keep)
    for version, updates in changed.items():
        for k, val in updates.items():
            client.set_model_version_tag(name, version, k, val)
    return changed


def moved_lineage(versions: Any, name: str, root: str, current: str, keep: int) -> dict[str, dict[str, str]]:
    """What :func:`rename_moved` changes, {version: {tag: new value}}, from ``versions`` (objects
    with ``name``, ``version`` and ``tags``, as MLflow's search returns them); writes nothing.
    A finished root's run answered without MLflow's client (``flows.finished``) asks it too."""
    changed: dict[str, dict[str, str]] = {}
    for v in versions:
        if v.name != name or str(v.version) == str(current):
            continue
        for stage in STAGES:
            here = stage_url(root, stage)
            url = v.tags.get(f"lineage.{stage}.url", "")
            recorded = v.tags.get(f"lineage.{stage}.recorded_url", url)
            fingerprint = v.tags.get(f"lineage.{stage}.fingerprint", "")
            if recorded != here or not fingerprint:
                continue  # another root's, or nothing recorded
            now = resolve(v.tags, stage)
            if now == url:
                continue  # still true
            new = now or f"removed (history keeps {keep})"
            updates = {f"lineage.{stage}.url": new, f"lineage.{stage}.recorded_url": recorded}
            changed.setdefault(str(v.version), {}).update(updates)
    return changed
