"""The data contracts between stages, defined once: Parquet schemas and the stage manifest.

Writers (Beam jobs in ``pipeline/``) and readers (``model/``, ``tasks/``) both import this
module, so a column is named in exactly one place. It imports only the standard library,
pyarrow and fsspec, so reading it never pulls in Beam or torch.

A stage writes its files first and its ``_manifest.json`` last. A folder without a manifest is
unfinished, whatever files it holds: readers call :func:`read_manifest`, which refuses it.

Whole small files (manifests, configs, vocabularies, weights) are written with
:func:`write_atomically`, the one commit rule for every storage: on a local folder a temporary
file renamed into place (POSIX rename is atomic); on an object store (``gs://``) a single object
write, because an object appears only when its upload completes, while a "rename" there is a
copy plus a delete (gcsfs first tries GCS's ``moveTo``, which the emulator lacks: 30-40 s of
retries and an error traceback per manifest).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterable
from typing import Any

import fsspec
import pyarrow as pa

MANIFEST_NAME = "_manifest.json"
MANIFEST_VERSION = 1

# -- documents: {root}/corpus/{source}/part-*.parquet ------------------------------------------
DOCUMENT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),  # stable: "wiki:<page id>" or "books:<file>"
        pa.field("source", pa.string(), nullable=False),  # "wiki" | "books"
        pa.field("title", pa.string(), nullable=False),
        pa.field("sentences", pa.list_(pa.string()), nullable=False),  # document order kept
        pa.field("num_sentences", pa.int32(), nullable=False),
        pa.field("num_chars", pa.int64(), nullable=False),
    ]
)


# -- pretraining examples: {root}/examples/seq{N}/part-*.parquet -------------------------------
# input_ids is "[CLS] A [SEP] B [SEP]" unpadded; segment ids derive from len_a (the number of
# tokens of "[CLS] A [SEP]"). masked_ids hold the ORIGINAL tokens at masked_positions.
def example_schema(vocab_size: int, max_seq_length: int) -> pa.Schema:
    """The example schema with the narrowest integer types that fit this vocabulary and length."""
    id_type = pa.uint16() if vocab_size <= 1 << 16 else pa.uint32()
    pos_type = pa.uint16() if max_seq_length <= 1 << 16 else pa.uint32()
    return pa.schema(
        [
            pa.field("input_ids", pa.list_(id_type), nullable=False),
            pa.field("len_a", pos_type, nullable=False),
            pa.field("masked_positions", pa.list_(pos_type), nullable=False),
            pa.field("masked_ids", pa.list_(id_type), nullable=False),
            pa.field("is_random_next", pa.bool_(), nullable=False),
        ]
    )


EXAMPLE_COLUMNS = ("input_ids", "len_a", "masked_positions", "masked_ids", "is_random_next")


# -- the stage manifest -----------------------------------------------------------------------
class ManifestError(RuntimeError):
    """A folder has no manifest (unfinished stage) or an unreadable one."""


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
    url: str  # the stage folder
    config: dict[str, Any]
    inputs: dict[str, str]  # input name -> fingerprint of that input's manifest
    counts: dict[str, float]
    files: list[OutputFile]
    created_at: float = dataclasses.field(default_factory=time.time)
    seconds: float = 0.0
    version: int = MANIFEST_VERSION
    code_version: str = ""
    """Digest of the source of the code that wrote it (stamped by the orchestrator)."""

    @property
    def fingerprint(self) -> str:
        """Digest of what determines this stage's output: stage, config, inputs, file checksums."""
        body = {
            "stage": self.stage,
            "config": self.config,
            "inputs": self.inputs,
            "files": sorted((f.path, f.sha256) for f in self.files),
        }
        return _digest(body)

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
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
        return _digest(self.config) == _digest(redact(config)) and self.inputs == inputs

    def stale_reasons(self, config: dict[str, Any], inputs: dict[str, str], code_version: str = "") -> list[str]:
        """Why this output no longer matches (empty: up to date): changed settings, inputs, code."""
        reasons = []
        old, new = flatten_config(self.config), flatten_config(redact(config))
        changed = sorted(k for k in old.keys() | new.keys() if old.get(k, _MISSING) != new.get(k, _MISSING))
        if changed:
            shown = ", ".join(f"{k}: {old.get(k, '-')!r} -> {new.get(k, '-')!r}" for k in changed[:4])
            reasons.append(f"config changed ({shown}{', ...' if len(changed) > 4 else ''})")
        for name in sorted(self.inputs.keys() | inputs.keys()):
            if self.inputs.get(name) != inputs.get(name):
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


_MISSING = object()
_SECRET_WORDS = r"(pass(word|wd)?|secret|token|api[_-]?key|access[_-]?key|credentials?|private[_-]?key|auth)"
_SECRET_KEY = re.compile(rf"(^|[^a-z]){_SECRET_WORDS}$|secret", re.I)  # max_tokens is no secret
_SECRET_ARG = re.compile(rf"^(--?[\w.-]*?{_SECRET_WORDS}=).+$", re.I)
REDACTED = "***"


def redact(obj: Any, key: str = "") -> Any:
    """``obj`` with values that look like secrets replaced by ``***``: values under keys named like
    a password, token, secret or API key, and ``--name=value`` options with such names."""
    if isinstance(obj, dict):
        return {k: redact(v, str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        out, hide_next = [], False
        for v in obj:  # ["--password", "x"]: the value after a secret-named flag
            out.append(REDACTED if hide_next and isinstance(v, str) else redact(v, key))
            hide_next = isinstance(v, str) and v.startswith("-") and "=" not in v and bool(_SECRET_KEY.search(v))
        return type(obj)(out)
    if key and _SECRET_KEY.search(key) and obj not in (None, "", 0, False):
        return REDACTED
    if isinstance(obj, str):
        return _SECRET_ARG.sub(lambda m: m.group(1) + REDACTED, obj)
    return obj


def flatten_config(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts and lists -> {"a.b.0.c": value}."""
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten_config(v, f"{prefix}{k}."))
        return out
    if isinstance(d, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in d):
        out = {}
        for i, v in enumerate(d):
            out.update(flatten_config(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): list(d) if isinstance(d, tuple) else d}


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def config_digest(obj: Any) -> str:
    return _digest(obj)


def join_url(base: str, *parts: str) -> str:
    base = base.rstrip("/")
    rest = "/".join(p.strip("/") for p in parts if p)
    return f"{base}/{rest}" if rest else base


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
    )
    save_manifest(manifest)
    return manifest


def save_manifest(manifest: Manifest) -> None:
    """Write ``manifest`` into its folder atomically (see :func:`write_atomically`)."""
    write_atomically(manifest_url(manifest.url), manifest.to_json())


def is_local_fs(fs: fsspec.AbstractFileSystem) -> bool:
    """True for the local filesystem (where rename is atomic), False for object stores and the rest."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "file" in protocols or "local" in protocols


def write_atomically(url: str, data: bytes | str) -> None:
    """Write ``data`` (str: UTF-8) as the whole of ``url`` so that no reader ever sees part of it.

    Local folders: a uniquely named temporary file in the same folder, flushed to disk and
    renamed over the target (``os.replace``), removed if anything fails. Object stores: one
    object write (``pipe_file``), no temporary object and no rename: GCS (and S3) publish an
    object only when its upload completes, so the old object or the whole new one is all a
    reader can see. Parent folders are made as needed.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    fs, path = fsspec.core.url_to_fs(url)
    if not is_local_fs(fs):
        fs.makedirs(fs._parent(path), exist_ok=True)
        fs.pipe_file(path, data)
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def clear_stage(stage_url: str) -> None:
    """Remove a stage folder (manifest first, so a crash mid-delete never looks finished)."""
    fs, path = fsspec.core.url_to_fs(stage_url)
    mpath = manifest_url(path)
    if fs.exists(mpath):
        fs.rm(mpath)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def fingerprint_input(url: str) -> str:
    """A fingerprint of a stage input: its manifest's when it has one, else of its raw files.

    Raw corpora (a dump file, a folder of books) have no manifest; their fingerprint is a digest
    of each file's relative path and size, which changes when a file is added, removed or edited
    (sizes), without reading gigabytes.
    """
    if any(ch in url for ch in "*?["):  # a glob: the files it matches
        fs, pattern = fsspec.core.url_to_fs(url)
        matched = sorted(fs.glob(pattern))
        if not matched:
            raise FileNotFoundError(f"input {url} matches no file")
        return _digest([(p.rsplit("/", 1)[-1], fs.size(p)) for p in matched])
    if has_manifest(url):
        return read_manifest(url).fingerprint
    fs, path = fsspec.core.url_to_fs(url)
    if fs.isfile(path):
        entries = [(path.rsplit("/", 1)[-1], fs.size(path))]
    else:
        found = fs.find(path, detail=True)
        if not found:
            raise FileNotFoundError(f"input {url} does not exist or is empty")
        root = path.rstrip("/") + "/"
        entries = sorted((p[len(root) :], int(info.get("size") or 0)) for p, info in found.items())
    return _digest(entries)
