"""``bertflow inspect URL``: a few rows of any stage's output, decoded for a person.

The stage is read off the folder's manifest (or its parent's, for ``examples/seq128``); its row's
``preview`` (``flows.hooks``) decodes it: documents with their sentences, examples with their
masks visible, the vocab's first pieces, the model's config, fine-tuning's predictions.
"""

from __future__ import annotations

from pipeline.schema.manifest import ManifestError, has_manifest, read_manifest


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
    """A few rows of the stage output at ``url``, decoded by its row's ``preview``."""
    from flows.hooks import counts_preview
    from flows.table import STAGES

    stage, folder = _stage_of(url)
    row = STAGES.get(stage)  # fine-tuning writes finetune-<task> manifests: their counts and predictions
    preview = row.preview if row is not None and row.preview is not None else counts_preview
    return preview(folder, url, n)
