"""The stage contract (manifests, URL helpers) as model/ and tasks/ use it.

Defined once in ``pipeline/schema.py``; re-exported here so that ``tasks/`` reaches it through
``model/`` (its one allowed dependency of ours) and the import arrows stay
``tasks -> model -> pipeline.schema``.
"""

from pipeline.schema import (
    EXAMPLE_COLUMNS,
    Manifest,
    ManifestError,
    clear_stage,
    describe_file,
    fingerprint_input,
    join_url,
    list_files,
    read_manifest,
    write_manifest,
)

__all__ = [
    "EXAMPLE_COLUMNS",
    "Manifest",
    "ManifestError",
    "clear_stage",
    "describe_file",
    "fingerprint_input",
    "join_url",
    "list_files",
    "read_manifest",
    "write_manifest",
]
