"""The one door from ``model/`` and ``tasks/`` to the data contract (``pipeline/schema/``).

Every name of ``pipeline/`` that the training side uses is listed here, so this is the only file
of ``model/`` and ``tasks/`` that imports ``pipeline``, and the arrows stay
``tasks -> model -> pipeline.schema`` (``tests/test_architecture.py``). The contract itself is
defined once, in ``pipeline/schema/``; its Parquet columns, manifest and commit rule are what the
Beam jobs write and the loader and fine-tuning read.
"""

from pipeline.schema import config as _config  # the standard library only: eager
from pipeline.schema import objectives as _objectives  # the standard library only: eager
from pipeline.schema import outputs as _outputs  # the standard library only: eager

# the pretraining objectives (pipeline/schema/objectives.py) and what the examples stage produced
# (pipeline/schema/outputs.py)
DEFAULT_OBJECTIVE = _objectives.DEFAULT_OBJECTIVE
ExampleLength = _outputs.ExampleLength
Objective = _objectives.Objective
example_lengths = _outputs.example_lengths
get_objective = _objectives.get_objective
objective_of = _outputs.objective_of
seq_folder = _outputs.seq_folder

# configuration: the one error type and check(), digests (pipeline/schema/config.py)
ConfigError = _config.ConfigError
check = _config.check
check_at_most = _config.check_at_most
LIMITS = _config.LIMITS
config_digest = _config.config_digest

# The rest is imported on first use (PEP 562): the Parquet columns bring pyarrow and numpy, the
# manifest and storage fsspec, the tokenizers their library, and the presets (through
# model.config) would otherwise pay for all of them in every command, ``bertflow --help`` too.
_PARQUET = {
    "EXAMPLE_COLUMNS": "EXAMPLE_COLUMNS",  # the Parquet columns of the examples stage (pipeline/schema/parquet.py)
    "PARQUET_READ_OPTIONS": "READ_OPTIONS",  # and how its files are read
    "example_columns": "example_columns",  # the columns an objective's shards carry
}
_MANIFEST = {  # the stage manifest (pipeline/schema/manifest.py)
    n: n
    for n in (
        "Manifest", "ManifestError", "clear_stage", "describe_file", "fingerprint_input", "has_manifest",
        "list_files", "manifest_url", "read_manifest", "save_manifest", "write_manifest", "write_attempt",
    )
}  # fmt: skip
_STORAGE = {"join_url": "join_url", "write_atomically": "write_atomically"}  # URLs, whole-file commits
_TOKENIZATION = {  # the segmenting tokenizers of MeCab and jieba vocabularies (pipeline/schema/tokenization.py)
    "WordTokenizer": "WordTokenizer",
    "word_tokenizer_of": "word_tokenizer_of",
}


def __getattr__(name: str):
    if name in _PARQUET:
        from pipeline.schema import parquet as module

        attr = _PARQUET[name]
    elif name in _MANIFEST:
        from pipeline.schema import manifest as module

        attr = _MANIFEST[name]
    elif name in _STORAGE:
        from pipeline.schema import storage as module

        attr = _STORAGE[name]
    elif name in _TOKENIZATION:
        from pipeline.schema import tokenization as module

        attr = _TOKENIZATION[name]
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(module, attr)
    return value


__all__ = sorted(["ConfigError", "LIMITS", "check", "check_at_most", "config_digest", "DEFAULT_OBJECTIVE",
                  "ExampleLength", "Objective", "example_lengths", "get_objective", "objective_of", "seq_folder",
                  *_PARQUET, *_MANIFEST, *_STORAGE, *_TOKENIZATION])  # fmt: skip


def __dir__() -> list[str]:
    return __all__
