"""``bertflow inspect URL``: a few rows of any stage's output, decoded for a person.

Documents show their sentences; examples show ``[CLS] A [SEP] B [SEP]`` with each masked
position as ``[MASK>orig]`` (or ``{shown>orig}`` for the 10% random / 10% kept) and the NSP
label; fine-tuning outputs show their predictions; the vocab its first pieces; the model its
config. The stage is read off the folder's manifest (or its parent's, for ``examples/seq128``).
"""

from __future__ import annotations

import json

import fsspec
import pyarrow.parquet as pq

from pipeline.schema import ManifestError, has_manifest, join_url, read_manifest


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


def _parquet_files(url: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(url)
    files = sorted(p for p in fs.find(path) if p.endswith(".parquet") and "/rejects/" not in p)
    protocol = url.split("://", 1)[0] + "://" if "://" in url else ""
    return [protocol + p if protocol and not p.startswith(protocol) else p for p in files]


def _rows(url: str, n: int, columns=None) -> list[dict]:
    out: list[dict] = []
    for f in _parquet_files(url):
        with fsspec.open(f, "rb") as fh:
            pf = pq.ParquetFile(fh)
            for batch in pf.iter_batches(batch_size=max(n, 1), columns=columns):
                out += batch.to_pylist()[: n - len(out)]
                if len(out) >= n:
                    return out
    return out


def inspect_url(url: str, n: int = 5) -> str:
    stage, folder = _stage_of(url)
    if stage == "corpus":
        from pipeline.preview import format_preview, preview_corpus

        source = url.rstrip("/").rsplit("/", 1)[-1] if url.rstrip("/") != folder else None
        return format_preview(preview_corpus(folder, n, source=source if source in ("wiki", "books") else None,
                                             rejects=source == "rejects"))
    if stage == "examples":
        return _examples(url, folder, n)
    if stage == "vocab":
        with fsspec.open(join_url(folder, "vocab.txt"), "r") as f:
            return "\n".join(f.read().split("\n")[: max(n, 1)])
    if stage == "export":
        with fsspec.open(join_url(folder, "config.json"), "r") as f:
            return f.read()
    manifest = read_manifest(folder)
    return _predictions(folder, manifest, n)


def _examples(url: str, folder: str, n: int) -> str:
    vocab_url = join_url(folder.rsplit("/", 1)[0], "vocab", "vocab.txt")
    with fsspec.open(vocab_url, "r") as f:
        vocab = f.read().split("\n")
    lines = []
    for row in _rows(url, n):
        masked = dict(zip(row["masked_positions"], row["masked_ids"]))
        shown = []
        for i, t in enumerate(row["input_ids"]):
            token = vocab[t] if t < len(vocab) else f"<{t}>"
            if i in masked:
                orig = vocab[masked[i]]
                token = f"[MASK>{orig}]" if token == "[MASK]" else f"{{{token}>{orig}}}"
            shown.append(token)
        nsp = "random next" if row["is_random_next"] else "actual next"
        lines.append(f"({nsp}, {len(row['input_ids'])} tokens, {len(masked)} masked) " + " ".join(shown))
    return "\n".join(lines)


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
