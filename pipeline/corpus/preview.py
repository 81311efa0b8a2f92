"""A look at a finished corpus stage: a few documents with their sentences, and its rejects.

Backs ``bertflow inspect corpus URL -n 5``. Reads only the first row groups it needs (never a
whole shard set), through the manifest, so an unfinished stage is refused like downstream does.
"""

from __future__ import annotations

import fsspec
import pyarrow.parquet as pq

from pipeline.schema.manifest import read_manifest
from pipeline.schema.storage import join_url

__all__ = ["preview_corpus", "format_preview"]


def _first_rows(url: str, n: int) -> list[dict]:
    fs, path = fsspec.core.url_to_fs(url)
    rows: list[dict] = []
    with fs.open(path, "rb") as f:
        pf = pq.ParquetFile(f)
        for i in range(pf.num_row_groups):
            rows += pf.read_row_group(i).to_pylist()
            if len(rows) >= n:
                break
    return rows[:n]


def preview_corpus(corpus_url: str, n: int = 5, source: str | None = None, rejects: bool = False) -> list[dict]:
    """Up to ``n`` document rows (or reject rows) of a finished corpus stage, in shard order."""
    manifest = read_manifest(corpus_url)
    if rejects:
        fs, path = fsspec.core.url_to_fs(join_url(corpus_url, "rejects"))
        urls = (
            sorted(join_url(corpus_url, "rejects", p.rsplit("/", 1)[-1]) for p in fs.glob(path + "/*.parquet"))
            if fs.exists(path)
            else []
        )
    else:
        urls = [
            u
            for f, u in zip(manifest.files, manifest.file_urls())
            if f.path.endswith(".parquet") and (source is None or f.path.startswith(source + "/"))
        ]
    rows: list[dict] = []
    for url in urls:
        if len(rows) >= n:
            break
        rows += _first_rows(url, n - len(rows))
    return rows


def format_preview(rows: list[dict], max_sentences: int = 8) -> str:
    """Plain text: each document's id and title, then its sentences numbered (or a reject's
    reason, detail and sample)."""
    out = []
    for row in rows:
        if "reason" in row:
            out.append(f"{row['record_id'] or row['url']}  [{row['reason']}] {row['title'] or ''}")
            if row["detail"]:
                out.append(f"    {row['detail']}")
            if row["sample"]:
                out.append(f"    {row['sample'][:300]!r}")
            continue
        out.append(f"{row['doc_id']}  {row['title']}  ({row['num_sentences']} sentences)")
        for i, s in enumerate(row["sentences"][:max_sentences], 1):
            out.append(f"  {i:3d}. {s}")
        if row["num_sentences"] > max_sentences:
            out.append(f"       ... {row['num_sentences'] - max_sentences} more")
    return "\n".join(out)
