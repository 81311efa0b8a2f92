"""``bertflow inspect URL``: a few rows of any stage's output, decoded for a person.

Documents show their sentences (``pipeline.preview``); examples show ``[CLS] A [SEP] B [SEP]``
with each masked position as ``[MASK]→orig`` (or ``<shown>→orig`` for the 10% random / 10% kept;
``pipeline.example_view``); fine-tuning outputs show their predictions; the vocab its first
pieces; the model its config. The stage is read off the folder's manifest (or its parent's, for ``examples/seq128``).
"""

from __future__ import annotations

import json

import fsspec

from pipeline.schema.manifest import ManifestError, has_manifest, read_manifest
from pipeline.schema.storage import join_url


def _stage_of(url: str) -> tuple[str, str]:
    """(stage name, stage folder URL) of ``url`` or the nearest folder above it with a manifest."""
    probe = url.rstrip("/")
    for _ in range(3):
        if has_manifest(probe):
            return read_manifest(probe).stage, probe
        if "/" not in probe:
            break
        probe = probe.rsplit("/", 1)[0]
    raise ManifestError(f"{url}: no stage manifest here or in the two folders above (not a finished stage output)")


def inspect_url(url: str, n: int = 5) -> str:
    stage, folder = _stage_of(url)
    if stage == "corpus":
        from pipeline.preview import format_preview, preview_corpus

        source = url.rstrip("/").rsplit("/", 1)[-1] if url.rstrip("/") != folder else None
        return format_preview(
            preview_corpus(
                folder, n, source=source if source in ("wiki", "books") else None, rejects=source == "rejects"
            )
        )
    if stage == "examples":
        from pipeline.example_view import decode_examples

        sub = url.rstrip("/").rsplit("/", 1)[-1]
        length = int(sub[3:]) if sub.startswith("seq") and sub[3:].isdigit() else None
        return "\n".join(decode_examples(folder, n, max_seq_length=length))
    if stage == "vocab":
        with fsspec.open(join_url(folder, "vocab.txt"), "r") as f:
            return "\n".join(f.read().split("\n")[: max(n, 1)])
    if stage == "export":
        with fsspec.open(join_url(folder, "config.json"), "r") as f:
            return f.read()
    manifest = read_manifest(folder)
    return _predictions(folder, manifest, n)


def _predictions(folder: str, manifest, n: int) -> str:
    lines = [f"{k} = {v}" for k, v in sorted(manifest.counts.items())]
    for f in manifest.files:
        if f.path.startswith("predictions") or f.path.endswith(".tsv"):
            with fsspec.open(join_url(folder, f.path), "r") as fh:
                text = fh.read(200_000)
            if f.path.endswith(".json"):
                data = json.loads(text) if len(text) < 200_000 else {}
                head = list(data.items())[:n] if isinstance(data, dict) else data[:n]
                lines += [f"-- {f.path}"] + [json.dumps(x, ensure_ascii=False) for x in head]
            else:
                lines += [f"-- {f.path}"] + text.split("\n")[: n + 1]
            break
    return "\n".join(lines)
