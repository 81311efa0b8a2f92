"""Synthetic example shards for the loader and training tests (the pipeline's Parquet contract).

"[CLS] A [SEP] B [SEP]" where a document is a run of consecutive token ids, B is the true
continuation unless is_random_next, and 15% of non-special positions are masked 80/10/10.
Both MLM and NSP are learnable from that.
"""

import random

import pyarrow as pa
import pyarrow.parquet as pq
from tiny_bert import tiny_bert_config

from pipeline.examples.masking import VocabIds, create_masked_lm_predictions
from pipeline.schema.manifest import write_manifest
from pipeline.schema.objectives import DEFAULT_OBJECTIVE, get_objective
from pipeline.schema.outputs import ExampleLength, lengths_record
from pipeline.schema.parquet import WRITE_OPTIONS, example_schema

V, PAD, CLS, SEP, MASK, FIRST = 99, 0, 2, 3, 4, 5
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(FIRST, V)]
MODEL = tiny_bert_config(vocab_size=V)


class MaskRule:
    """The one masking rule (pipeline.examples.masking) in the loader's mask_fn shape, as train_entry builds it."""

    def __init__(self, prob: float = 0.15):
        self.vocab, self.prob = VocabIds.from_vocab(VOCAB), prob

    def __call__(self, tokens, max_predictions, rng):
        return create_masked_lm_predictions(tokens, self.prob, max_predictions, self.vocab, rng)


def make_example(rng: random.Random, max_len: int) -> dict:
    n = max_len if rng.random() > 0.1 else rng.randint(8, max_len)  # some shorter, like short_seq_prob
    body = n - 3
    la = rng.randint(1, body - 1)
    start = rng.randrange(V - FIRST)
    seq = [FIRST + (start + i) % (V - FIRST) for i in range(body + 1)]
    a = seq[:la]
    random_next = rng.random() < 0.5
    if random_next:
        s2 = rng.randrange(V - FIRST)
        b = [FIRST + (s2 + i) % (V - FIRST) for i in range(body - la)]
    else:
        b = seq[la:body]
    tokens = [CLS] + a + [SEP] + b + [SEP]
    cand = [i for i, t in enumerate(tokens) if t not in (CLS, SEP)]
    k = max(1, min(round(len(tokens) * 0.15), 20))
    positions = sorted(rng.sample(cand, k))
    ids = list(tokens)
    for p in positions:
        u = rng.random()
        if u < 0.8:
            ids[p] = MASK
        elif u < 0.9:
            ids[p] = rng.randrange(FIRST, V)
    return {
        "input_ids": ids,
        "len_a": la + 2,
        "masked_positions": positions,
        "masked_ids": [tokens[p] for p in positions],
        "is_random_next": random_next,
    }


def as_objective(row: dict, objective: str) -> dict:
    """``row`` (a pair, ``make_example``'s) in ``objective``'s columns: one segment (the [SEP]
    between A and B stays, as between packed documents) or its sentence label under its name."""
    o = get_objective(objective)
    out = {"input_ids": row["input_ids"], "masked_positions": row["masked_positions"], "masked_ids": row["masked_ids"]}
    if o.segments:
        out["len_a"] = row["len_a"]
    if o.sentence_label:
        out[o.sentence_label] = row["is_random_next"]
    return out


def write_example_stage(
    root, lengths=(16, 32), n=240, shards=2, seed=0, row_group_size=None, objective=DEFAULT_OBJECTIVE
) -> str:
    rng = random.Random(seed)
    for T in lengths:
        rows = [as_objective(make_example(rng, T), objective) for _ in range(n)]
        folder = root / f"seq{T}"
        folder.mkdir(parents=True)
        for s in range(shards):
            part = rows[s::shards]
            table = pa.Table.from_pylist(part, schema=example_schema(V, T, objective))
            # as the examples stage writes its shards: zstd pages with checksums
            path = folder / f"part-{s:05d}-of-{shards:05d}.parquet"
            pq.write_table(table, path, row_group_size=row_group_size, **WRITE_OPTIONS)
    caps = dict(zip(lengths, [3, 5, 20], strict=False))
    record = [ExampleLength(T, caps.get(T, 20), "static", 0.15, False, objective) for T in lengths]
    write_manifest(
        "examples",
        str(root),
        {"max_seq_lengths": list(lengths), "max_predictions_per_seq": [caps.get(T, 20) for T in lengths]},
        {},
        {"examples": n},
        outputs=lengths_record(record),
    )
    return str(root)


def train_spec(pretrain, model, examples, out, vocab="", restart=False):
    """The training process's spec (``flows.proc.protocol.ProcessSpec``) for these configs, as the
    pretrain row builds it: a run config holding them, the examples (and vocabulary) as inputs."""
    from pathlib import Path

    from flows.calls import StageCall
    from flows.presets import RunConfig
    from pipeline.examples.config import ExamplesConfig
    from tasks.config import FinetuneConfig

    lengths = tuple(sorted({p.max_seq_length for p in pretrain.phases}))
    finetune = FinetuneConfig(max_seq_length=min(FinetuneConfig.max_seq_length, model.max_position_embeddings))
    cfg = RunConfig(examples=ExamplesConfig(max_seq_lengths=lengths), model=model, pretrain=pretrain, finetune=finetune)
    inputs = {"examples": str(examples), **({"vocab": str(vocab)} if vocab else {})}
    return StageCall("pretrain", cfg, str(Path(out).parent), str(out), inputs, restart=restart).spec()
