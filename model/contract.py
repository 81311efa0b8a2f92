"""The one door from ``model/`` and ``tasks/`` to the data contract (``pipeline/schema/``).

Every name of ``pipeline/`` that the training side uses is listed here, so this is the only file
of ``model/`` and ``tasks/`` that imports ``pipeline``, and the arrows stay
``tasks -> model -> pipeline.schema`` (``tests/test_architecture.py``). The contract itself is
defined once, in ``pipeline/schema/``; its Parquet columns, manifest and commit rule are what the
Beam jobs write and the loader and fine-tuning read.
"""

from pipeline.schema import config as _config
from pipeline.schema import manifest as _manifest
from pipeline.schema import objectives as _objectives
from pipeline.schema import outputs as _outputs
from pipeline.schema import parquet as _parquet
from pipeline.schema import storage as _storage
from pipeline.schema import tokenization as _tokenization

# the Parquet columns of the examples stage and how its files are read (pipeline/schema/parquet.py)
EXAMPLE_COLUMNS = _parquet.EXAMPLE_COLUMNS
PARQUET_READ_OPTIONS = _parquet.READ_OPTIONS
example_columns = _parquet.example_columns

# the pretraining objectives (pipeline/schema/objectives.py) and what the examples stage produced
# (pipeline/schema/outputs.py)
DEFAULT_OBJECTIVE = _objectives.DEFAULT_OBJECTIVE
ExampleLength = _outputs.ExampleLength
Objective = _objectives.Objective
example_lengths = _outputs.example_lengths
get_objective = _objectives.get_objective
objective_of = _outputs.objective_of
seq_folder = _outputs.seq_folder

# the stage manifest (pipeline/schema/manifest.py)
Manifest = _manifest.Manifest
ManifestError = _manifest.ManifestError
clear_stage = _manifest.clear_stage
describe_file = _manifest.describe_file
fingerprint_input = _manifest.fingerprint_input
has_manifest = _manifest.has_manifest
list_files = _manifest.list_files
manifest_url = _manifest.manifest_url
read_manifest = _manifest.read_manifest
save_manifest = _manifest.save_manifest
write_manifest = _manifest.write_manifest
write_attempt = _manifest.write_attempt

# URLs and whole-file commits (pipeline/schema/storage.py)
join_url = _storage.join_url
write_atomically = _storage.write_atomically

# configuration: the one error type and check(), digests (pipeline/schema/config.py)
ConfigError = _config.ConfigError
check = _config.check
check_at_most = _config.check_at_most
LIMITS = _config.LIMITS
config_digest = _config.config_digest

# the segmenting tokenizers of MeCab and jieba vocabularies (pipeline/schema/tokenization.py)
WordTokenizer = _tokenization.WordTokenizer
word_tokenizer_of = _tokenization.word_tokenizer_of

__all__ = [
    "DEFAULT_OBJECTIVE",
    "EXAMPLE_COLUMNS",
    "ExampleLength",
    "Objective",
    "example_columns",
    "example_lengths",
    "get_objective",
    "objective_of",
    "seq_folder",
    "LIMITS",
    "PARQUET_READ_OPTIONS",
    "ConfigError",
    "Manifest",
    "ManifestError",
    "WordTokenizer",
    "check",
    "check_at_most",
    "clear_stage",
    "config_digest",
    "describe_file",
    "fingerprint_input",
    "has_manifest",
    "join_url",
    "list_files",
    "manifest_url",
    "read_manifest",
    "save_manifest",
    "word_tokenizer_of",
    "write_atomically",
    "write_attempt",
    "write_manifest",
]
