"""Reading finished example shards for people: decoded examples with the masks visible.

Pure functions over a finished examples stage (it imports pyarrow and fsspec, never Beam), for
``bertflow inspect examples URL -n 5`` and for tests. The vocabulary is the ``vocab.txt`` the
examples stage copies next to its shards, so the ids are read with the vocabulary they were
written with.
"""

from __future__ import annotations

import fsspec
import pyarrow.parquet as pq

from pipeline.schema.manifest import read_manifest
from pipeline.schema.objectives import DEFAULT_OBJECTIVE, get_objective
from pipeline.schema.outputs import example_lengths, seq_folder
from pipeline.schema.storage import join_url

HIST_BINS = 16


def histogram_width(max_seq_length: int) -> int:
    return max(1, -(-(max_seq_length + 1) // HIST_BINS))


def histogram_bins(max_seq_length: int) -> list[int]:
    """Lower bounds of the example-length histogram's bins (16 equal bins over 0..max)."""
    w = histogram_width(max_seq_length)
    return [i * w for i in range(HIST_BINS) if i * w <= max_seq_length]


def histogram_bin(num_tokens: int, max_seq_length: int) -> int:
    return min(num_tokens // histogram_width(max_seq_length), len(histogram_bins(max_seq_length)) - 1)


def render_example(row: dict, vocab: list[str], objective: str = DEFAULT_OBJECTIVE) -> str:
    """One example as text: ``[CLS] a b [SEP] c d [SEP]``; a masked position shows what the model
    sees and the label, ``[MASK]→word``; the sentence-level label (its column) and ``len_a`` lead
    the line when the objective has them."""
    labels = dict(zip(row["masked_positions"], row["masked_ids"], strict=True))
    words = []
    for pos, tid in enumerate(row["input_ids"]):
        token = vocab[tid] if tid < len(vocab) else f"<{tid}>"
        if pos in labels:
            original = vocab[labels[pos]]
            token = f"[MASK]→{original}" if token == "[MASK]" else f"<{token}>→{original}"
        words.append(token)
    o = get_objective(objective)
    head = [o.label_words[bool(row[o.sentence_label])]] if o.sentence_label else []
    head += [f"len_a={row['len_a']}"] if o.segments else []
    return f"({', '.join([*head, f'{len(labels)} masked'])}) " + " ".join(words)


def decode_examples(url: str, n: int = 5, max_seq_length: int | None = None) -> list[str]:
    """The first ``n`` examples of a finished examples stage at ``url``, decoded.

    ``max_seq_length`` picks the shard set (default: the first of the stage's lengths). A masked
    position reads ``[MASK]→original`` (or ``<replacement>→original`` for the 10% random / 10%
    kept cases); dynamic-masking shards show their unmasked pairs.
    """
    manifest = read_manifest(url)
    produced = example_lengths(manifest)
    lengths = list(produced)
    length = max_seq_length or (lengths[0] if lengths else None)
    prefix = f"{seq_folder(length)}/" if length else "-"
    objective = produced[length].objective if length in produced else DEFAULT_OBJECTIVE
    shard_urls = [join_url(manifest.url, f.path) for f in manifest.files if f.path.startswith(prefix)]
    if not shard_urls:
        raise ValueError(f"{url}: no shards of length {length} (lengths: {lengths})")
    from pipeline.vocab.tokenizer import VOCAB_FILE, read_vocab  # keeps tokenizers lazy

    vocab = read_vocab(join_url(manifest.url, VOCAB_FILE))
    out: list[str] = []
    for shard in sorted(shard_urls):
        fs, path = fsspec.core.url_to_fs(shard)
        with fs.open(path, "rb") as f:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=max(1, n)):
                for row in batch.to_pylist():
                    out.append(render_example(row, vocab, objective))
                    if len(out) >= n:
                        return out
    return out
