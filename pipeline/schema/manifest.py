"""The stage manifest: what a stage wrote, from what, and how to tell whether it is still current.

A stage writes its files first and its ``_manifest.json`` last. A folder without a manifest is
unfinished, whatever files it holds: readers call :func:`read_manifest`, which refuses it.
A manifest records the stage's config (secrets redacted), the fingerprints of its inputs, its
counts and every output file with its size and sha256; its own :attr:`Manifest.fingerprint` is
what the next stage records as its input.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Iterable
from typing import Any

import fsspec

from pipeline.schema.config import config_digest, flatten, redact
from pipeline.schema.storage import join_url, write_atomically

MANIFEST_NAME = "_manifest.json"
MANIFEST_VERSION = 1
_MISSING = object()


class ManifestError(RuntimeError):
    """A folder has no manifest (unfinished stage) or an unreadable one."""


class InputsDisagreeError(ManifestError):
    """Two inputs of a stage do not belong together: one was made from another version of the other."""

    deterministic = True  # a retry reads the same two folders


@dataclasses.dataclass
class OutputFile:
    path: str  # relative to the stage folder
    size: int
    sha256: str
    rows: int | None = None


@dataclasses.dataclass
class Manifest:
    """What a stage wrote: config, input fingerprints, counts and every output file."""

    stage: str
    url: str  # the stage folder (where it was read from; stored as ".")
    config: dict[str, Any]
    inputs: dict[str, str]  # input name -> fingerprint of that input's manifest
    counts: dict[str, float]
    files: list[OutputFile]
    created_at: float = dataclasses.field(default_factory=time.time)
    seconds: float = 0.0
    version: int = MANIFEST_VERSION
    code_version: str = ""
    """Digest of the source of the code that wrote it (stamped by the orchestrator)."""
    outputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Typed records of what the stage produced, for the stages after it (the examples stage's
    lengths: ``pipeline.schema.objectives.example_lengths`` reads them back)."""

    @property
    def fingerprint(self) -> str:
        """Digest of what determines this stage's output: stage, config, inputs, file checksums."""
        body = {
            "stage": self.stage,
            "config": self.config,
            "inputs": self.inputs,
            "files": sorted((f.path, f.sha256) for f in self.files),
        }
        return config_digest(body)

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        # the folder is where the manifest is read from (read_manifest sets it): the file holds no
        # path, so a folder moved, copied or uploaded (a model to the Hub) carries none of this machine's
        data["url"] = "."
        data["fingerprint"] = self.fingerprint
        return json.dumps(data, indent=2, sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str, url: str | None = None) -> Manifest:
        data = json.loads(text)
        data.pop("fingerprint", None)
        data["files"] = [OutputFile(**f) for f in data.get("files", [])]
        if url is not None:
            data["url"] = url
        return cls(**data)

    def file_urls(self, suffix: str = "") -> list[str]:
        return [join_url(self.url, f.path) for f in self.files if f.path.endswith(suffix)]

    def matches(self, config: dict[str, Any], inputs: dict[str, str]) -> bool:
        """True when this output was made from exactly this config and these inputs."""
        return config_digest(self.config) == config_digest(redact(config)) and self.inputs == inputs

    def stale_reasons(self, config: dict[str, Any], inputs: dict[str, str], code_version: str = "") -> list[str]:
        """Why this output no longer matches (empty: up to date): changed settings, inputs, code."""
        reasons = []
        old, new = flatten(self.config), flatten(redact(config))
        changed = sorted(k for k in old.keys() | new.keys() if old.get(k, _MISSING) != new.get(k, _MISSING))
        if changed:
            shown = ", ".join(f"{k}: {old.get(k, '-')!r} -> {new.get(k, '-')!r}" for k in changed[:4])
            reasons.append(f"config changed ({shown}{', ...' if len(changed) > 4 else ''})")
        for name in sorted(self.inputs.keys() | inputs.keys()):
            if name not in self.inputs:  # a manifest that lists fewer inputs than the stage reads is not believed
                reasons.append(f"input {name} not recorded in its manifest")
            elif name not in inputs:
                reasons.append(f"input {name} recorded in its manifest is not one the stage reads")
            elif self.inputs[name] != inputs[name]:
                reasons.append(f"input {name} changed")
        if code_version and self.code_version != code_version:
            reasons.append("code changed")
        return reasons

    def missing_files(self, checksums: bool = False) -> list[str]:
        """Files the manifest lists that are absent, of another size or (``checksums``) content."""
        fs, root = fsspec.core.url_to_fs(self.url)
        root = root.rstrip("/")
        try:
            sizes = {p[len(root) + 1 :]: int(i.get("size") or 0) for p, i in fs.find(root, detail=True).items()}
        except FileNotFoundError:
            sizes = {}
        problems = []
        for f in self.files:
            if f.path not in sizes:
                problems.append(f"{f.path}: missing")
            elif sizes[f.path] != f.size:
                problems.append(f"{f.path}: {sizes[f.path]} bytes, manifest says {f.size}")
            elif checksums and describe_file(self.url, f.path).sha256 != f.sha256:
                problems.append(f"{f.path}: checksum differs")
        return problems


def manifest_url(stage_url: str) -> str:
    return join_url(stage_url, MANIFEST_NAME)


def has_manifest(stage_url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(manifest_url(stage_url))
    return fs.exists(path)


def read_manifest(stage_url: str) -> Manifest:
    """The manifest of a finished stage; raises ManifestError for an unfinished folder."""
    url = manifest_url(stage_url)
    fs, path = fsspec.core.url_to_fs(url)
    if not fs.exists(path):
        raise ManifestError(
            f"{stage_url} has no {MANIFEST_NAME}: the stage that writes it did not finish (rerun that stage)"
        )
    try:
        with fs.open(path, "r") as f:
            return Manifest.from_json(f.read(), url=stage_url.rstrip("/"))
    except (ValueError, TypeError, KeyError) as exc:
        raise ManifestError(f"{url} is not a valid manifest: {exc}") from exc


def describe_file(stage_url: str, rel_path: str, rows: int | None = None) -> OutputFile:
    """Size and sha256 of one written file, for the manifest."""
    fs, path = fsspec.core.url_to_fs(join_url(stage_url, rel_path))
    h = hashlib.sha256()
    size = 0
    with fs.open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return OutputFile(path=rel_path, size=size, sha256=h.hexdigest(), rows=rows)


def list_files(stage_url: str) -> list[str]:
    """Every file under a stage folder, relative to it, sorted; the manifest itself excluded."""
    fs, root = fsspec.core.url_to_fs(stage_url)
    if not fs.exists(root):
        return []
    root = root.rstrip("/")
    found = []
    for p in fs.find(root):
        rel = p[len(root) + 1 :] if p.startswith(root + "/") else p
        if rel != MANIFEST_NAME:
            found.append(rel)
    return sorted(found)


def write_manifest(
    stage: str,
    stage_url: str,
    config: dict[str, Any],
    inputs: dict[str, str],
    counts: dict[str, float],
    files: Iterable[OutputFile] | None = None,
    seconds: float = 0.0,
    outputs: dict[str, Any] | None = None,
) -> Manifest:
    """Describe every file under ``stage_url`` (unless given) and write the manifest last."""
    if files is None:
        rows = {}
        files = [describe_file(stage_url, rel, rows.get(rel)) for rel in list_files(stage_url)]
    manifest = Manifest(
        stage=stage,
        url=stage_url.rstrip("/"),
        config=redact(config),
        inputs=dict(inputs),
        counts=dict(counts),
        files=list(files),
        seconds=seconds,
        outputs=dict(outputs or {}),
    )
    save_manifest(manifest)
    return manifest


def save_manifest(manifest: Manifest) -> None:
    """Write ``manifest`` into its folder atomically (see :func:`write_atomically`)."""
    write_atomically(manifest_url(manifest.url), manifest.to_json())


ATTEMPT_NAME = "_attempt.json"
"""In the folder of a stage that keeps state between attempts (pretraining's checkpoints): the
input fingerprints that state was made from, written when an attempt starts. With no manifest
there (an attempt failed), it tells whether a rerun resumes or, its inputs changed, starts over."""


def write_attempt(stage_url: str, inputs: dict[str, str]) -> None:
    """Record the input fingerprints the state under ``stage_url`` is (from now on) made from."""
    write_atomically(join_url(stage_url, ATTEMPT_NAME), json.dumps({"inputs": inputs}, sort_keys=True) + "\n")


def read_attempt(stage_url: str) -> dict[str, str] | None:
    """The input fingerprints :func:`write_attempt` recorded (None: none recorded)."""
    fs, path = fsspec.core.url_to_fs(join_url(stage_url, ATTEMPT_NAME))
    if not fs.exists(path):
        return None
    with fs.open(path, "r") as f:
        return dict(json.load(f)["inputs"])


def clear_stage(stage_url: str) -> None:
    """Remove a stage folder (manifest first, so a crash mid-delete never looks finished)."""
    fs, path = fsspec.core.url_to_fs(stage_url)
    mpath = manifest_url(path)
    if fs.exists(mpath):
        fs.rm(mpath)
    if fs.exists(path):
        fs.rm(path, recursive=True)


FULL_HASH_BYTES = 8 << 20
"""Files up to this size are hashed whole for their fingerprint; larger ones are sampled."""
SAMPLE_BLOCKS = 64
SAMPLE_BYTES = 64 << 10
"""A larger file's fingerprint reads ``SAMPLE_BLOCKS`` blocks of ``SAMPLE_BYTES`` (4 MiB), the
first and the last included, at offsets spread evenly over the file."""
_STORE_CHECKSUMS = ("crc32c", "md5Hash", "ETag", "etag", "md5", "checksum")
"""Keys of ``fs.info()`` that hold an object store's own digest of the content (GCS: crc32c and
md5Hash; S3: ETag), used instead of reading the object."""
_CONTENT_CACHE: dict[tuple, str] = {}


def content_digest(fs: fsspec.AbstractFileSystem, path: str, info: dict[str, Any] | None = None) -> str:
    """A cheap digest of one raw file's content.

    An object store's own checksum when ``info`` has one (no read); else the whole file's blake2b
    when it is at most :data:`FULL_HASH_BYTES`, else a blake2b of its size and
    :data:`SAMPLE_BLOCKS` evenly spread blocks (4 MiB read whatever the size). A same-size edit is
    always seen in a small file, in a store's object, and in a large local file when it touches a
    sampled block; a large file edited elsewhere keeps its fingerprint (``--force`` reruns).
    Memoised per process by (path, size, mtime) so one command reads a file once.
    """
    info = info if info is not None else fs.info(path)
    for key in _STORE_CHECKSUMS:
        if info.get(key):
            return f"{key}:{str(info[key]).strip(chr(34))}"
    size = int(info.get("size") or 0)
    memo = (str(fs.protocol), path, size, info.get("mtime"), info.get("ino"))
    if memo in _CONTENT_CACHE:
        return _CONTENT_CACHE[memo]
    h = hashlib.blake2b(digest_size=16)
    with fs.open(path, "rb") as f:
        if size <= FULL_HASH_BYTES:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        else:
            h.update(str(size).encode())
            step = (size - SAMPLE_BYTES) / (SAMPLE_BLOCKS - 1)
            for i in range(SAMPLE_BLOCKS):
                f.seek(int(i * step))
                h.update(f.read(SAMPLE_BYTES))
    digest = h.hexdigest()
    if info.get("mtime") is not None:
        _CONTENT_CACHE[memo] = digest
    return digest


def fingerprint_input(url: str) -> str:
    """A fingerprint of a stage input: its manifest's when it has one, else of its raw files.

    Raw corpora (a dump file, a folder of books, a glob) have no manifest; their fingerprint is a
    digest of each file's relative path, size and content digest (:func:`content_digest`: whole
    small files, sampled blocks of large ones, the object store's checksum on ``gs://``), so a
    file added, removed, resized or edited in place (same size) changes it, without reading a
    multi-GB dump whole.
    """
    if any(ch in url for ch in "*?["):  # a glob: the files it matches
        fs, pattern = fsspec.core.url_to_fs(url)
        matched = sorted(fs.glob(pattern))
        if not matched:
            raise FileNotFoundError(f"input {url} matches no file")
        entries = []
        for p in matched:
            info = fs.info(p)
            entries.append((p.rsplit("/", 1)[-1], int(info.get("size") or 0), content_digest(fs, p, info)))
        return config_digest(entries)
    if has_manifest(url):
        return read_manifest(url).fingerprint
    fs, path = fsspec.core.url_to_fs(url)
    if fs.isfile(path):
        info = fs.info(path)
        entries = [(path.rsplit("/", 1)[-1], int(info.get("size") or 0), content_digest(fs, path, info))]
    else:
        found = fs.find(path, detail=True)
        if not found:
            raise FileNotFoundError(f"input {url} does not exist or is empty")
        root = path.rstrip("/") + "/"
        entries = sorted(
            (p[len(root) :], int(info.get("size") or 0), content_digest(fs, p, info)) for p, info in found.items()
        )
    return config_digest(entries)


def check_inputs_agree(inputs: dict[str, str], pairs: Iterable[tuple[str, str]]) -> None:
    """Refuse inputs that do not belong together, from what their manifests record.

    Each pair ``(a, b)`` says: input ``a`` was made from an input named ``b`` (its manifest records
    ``b``'s fingerprint), and the stage reads both, so ``a``'s record must be the fingerprint of
    the ``b`` it is given (the examples' vocabulary is the vocabulary pretraining sizes its
    embeddings by and export ships). Raises :class:`InputsDisagreeError` naming both fingerprints
    and both folders; a pair whose ``a`` has no manifest (a raw input) or records no ``b`` passes.
    """
    for a, b in pairs:
        if a not in inputs or b not in inputs or not has_manifest(inputs[a]):
            continue
        made_from = read_manifest(inputs[a]).inputs.get(b)
        if made_from is None:
            continue
        given = fingerprint_input(inputs[b])
        if made_from != given:
            raise InputsDisagreeError(
                f"inputs do not belong together: {a} at {inputs[a]} was made from a {b} of fingerprint "
                f"{made_from[:12]} ({manifest_url(inputs[a])}), but the {b} given is {inputs[b]}, fingerprint "
                f"{given[:12]} ({manifest_url(inputs[b]) if has_manifest(inputs[b]) else 'its files'}): "
                f"give the {b} that {a} was made from, or rebuild {a} from this {b}"
            )
