"""Benchmark: our training step vs transformers' BertForPreTraining, and the loader vs the step.

For each shape (small L=4/H=256, medium L=8/H=512, base L=12/H=768; vocab 30,522) it times a
full training step (forward, backward, AdamW step) on the same realistic batch for:
ours (sparse MLM head on the masked positions, batch padded to its longest example rounded to 8)
and transformers' ``BertForPreTraining`` with ``attn_implementation="eager"`` and ``"sdpa"``
(given the same padded batch). Figures: median CPU time per step over ``--steps`` measured steps
after one warm-up, sequences/s, and achieved GFLOP/s, where the FLOPs are the same model FLOPs
for everyone (``model.metrics.step_flops``: the full encoder and our sparse head, so the dense
head of transformers gets no credit for work it need not do; our last layer computes only the
[CLS] and masked rows, so at base/128 our GFLOP/s counts ~5% of work it skips). The models'
steps run round-robin (one step of each in turn) so load on a shared machine hits all alike;
the speed-up line compares ours with the faster of eager and sdpa. Then the streaming loader's examples/s
(static and dynamic masking) against the demand of our small step.

    python benchmarks/bench_pretrain.py --shapes small,medium,base --batch 32,16,8 --threads 1
    python benchmarks/bench_pretrain.py --shapes small,base --batch 32,8 --ours padded,unpadded  # both paths
    python benchmarks/bench_pretrain.py --device cuda --precision bf16 --shapes base,large --seq 128  # then --seq 512

``--ours`` picks our variants: ``padded`` (the CPU default), ``unpadded`` (the packed path,
``pretrain.unpad``: the same batch without its padding, ``model.packing.pack_padded``),
``compiled`` (unpadded + ``pretrain.compile``; compilation is not timed: the warm-up step does it).
The GPU comparison of record is ``benchmarks/device_check.py``.

The batch: ``--seq`` tokens, 10% of the sequences (rounded: 1 of 8, 3 of 32) shorter, uniform
in [8, seq), like short_seq_prob; the rest full length (so the batch pads to ``seq``),
20 masked positions per sequence (``seq * 0.15`` capped at 20, as BERT's phase 1). Threads are
pinned with ``torch.set_num_threads``. Needs the ``bench`` extra (transformers).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

import numpy as np
import torch

from model.bert import BertForPreTraining
from model.compile import compile_regions
from model.config import BertConfig
from model.data import IGNORE_INDEX
from model.metrics import step_flops
from model.optim import build_optimizer
from model.packing import pack_padded

SHAPES = {"small": (4, 256, 4), "medium": (8, 512, 8), "base": (12, 768, 12), "large": (24, 1024, 16)}
V = 30522


def make_batch(batch: int, seq: int, seed: int = 0) -> dict[str, torch.Tensor]:
    rng = random.Random(seed)
    short = set(rng.sample(range(batch), round(batch * 0.1)))  # exactly 10% shorter, whatever the seed
    lengths = [rng.randint(8, seq - 1) if i in short else seq for i in range(batch)]
    width = min(seq, -(-max(lengths) // 8) * 8)
    ids = torch.zeros(batch, width, dtype=torch.long)
    labels = torch.full((batch, width), IGNORE_INDEX, dtype=torch.long)
    segments = torch.zeros(batch, width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1000, V, (n,))
        ids[i, 0], ids[i, n - 1] = 101, 102
        segments[i, n // 2 : n] = 1
        k = min(20, max(1, round(n * 0.15)))
        pos = rng.sample(range(1, n - 1), min(k, n - 2))
        labels[i, pos] = ids[i, pos]
        ids[i, pos] = 103
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return {
        "input_ids": ids,
        "token_type_ids": segments,
        "attention_mask": mask,
        "labels": labels,
        "next_sentence_label": torch.randint(0, 2, (batch,)),
    }


def _context(device: str, precision: str):
    if precision == "bf16":
        return torch.autocast(device, dtype=torch.bfloat16)
    return torch.autocast(device, enabled=False)


class Runner:
    """One model's training step as the training loop runs it: forward, backward, clip, AdamW step.

    The optimizer is ``model.optim.build_optimizer`` for every model (fused AdamW on CPU/CUDA, as
    our training loop and transformers' Trainer default both use), so the comparison is the models'.
    """

    def __init__(self, name: str, model, batch, device: str, precision: str):
        self.name, self.device, self.precision = name, device, precision
        self.model = model.to(device).train()
        self.opt = build_optimizer(self.model, 1e-4, 0.01)
        self.batch = {k: v.to(device) for k, v in batch.items()}
        self.times: list[float] = []

    def step(self, record: bool) -> None:
        clock = time.process_time if self.device == "cpu" else time.perf_counter
        if self.device == "cuda":
            torch.cuda.synchronize()
        t = clock()
        with _context(self.device, self.precision):
            out = self.model(**self.batch)
        loss = out.loss if hasattr(out, "loss") and out.loss is not None else out[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.device == "cuda":
            torch.cuda.synchronize()
        if record:
            self.times.append(clock() - t)


def time_round_robin(runners: list[Runner], steps: int) -> None:
    """One warm-up step each, then ``steps`` rounds of one step per model in turn.

    Interleaving puts every model under the same load at the same moments (the development
    machine is shared), so a slow minute slows all of them instead of one.
    """
    for s in range(steps + 1):
        for r in runners:
            r.step(record=s > 0)


def hf_model(cfg: BertConfig, attn: str):
    import transformers

    hf_cfg = transformers.BertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        attn_implementation=attn,
    )
    return transformers.BertForPreTraining(hf_cfg)


def our_runner(cfg: BertConfig, variant: str, batch: dict, device: str, precision: str) -> Runner:
    """Our model as the training loop builds it, on the padded or the packed batch."""
    torch.manual_seed(0)
    model = BertForPreTraining(cfg)
    if variant == "compiled":
        compile_regions(model)
    name = "ours" if variant == "padded" else f"ours {variant}"
    return Runner(name, model, batch if variant == "padded" else pack_padded(batch), device, precision)


def bench_step(
    shape: str, batch_size: int, seq: int, steps: int, device: str, precision: str, hf: bool, variants=("padded",)
) -> float:
    L, H, A = SHAPES[shape]
    cfg = BertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=A, intermediate_size=4 * H)
    batch = make_batch(batch_size, seq)
    masked = int((batch["labels"] != IGNORE_INDEX).sum())
    real = int(batch["attention_mask"].sum())
    flops = step_flops(cfg, batch_size, batch["input_ids"].shape[1], masked)
    runners = [our_runner(cfg, v, batch, device, precision) for v in variants]
    if hf:
        for attn in ("eager", "sdpa"):
            torch.manual_seed(0)
            runners.append(Runner(f"transformers {attn}", hf_model(cfg, attn), batch, device, precision))
    load_before = os.getloadavg()[0]
    time_round_robin(runners, steps)
    rows = [(r.name, statistics.median(r.times)) for r in runners]
    ours = rows[0][1]
    print(
        f"\n{shape} (L={L} H={H} A={A}), batch {batch_size} x {seq} (padded to {batch['input_ids'].shape[1]}, "
        f"{real} real tokens), {masked} masked, {precision}, {device}; load average {load_before:.2f} -> "
        f"{os.getloadavg()[0]:.2f}"
    )
    print(f"  {'model':<20} {'s/step':>8} {'min':>8} {'seq/s':>8} {'GFLOP/s':>9} {'time / ours':>12}")
    for r, (name, t) in zip(runners, rows):
        print(
            f"  {name:<20} {t:8.3f} {min(r.times):8.3f} {batch_size / t:8.1f} {flops / t / 1e9:9.1f} {t / ours:11.2f}x"
        )
    if hf:
        best_name, best = min(rows[len(variants) :], key=lambda row: row[1])
        for name, t in rows[: len(variants)]:
            print(f"  speed-up of {name} vs the faster transformers ({best_name}): {best / t:.2f}x")
    return batch_size / ours


def write_shards(folder: str, n: int, seq: int, shards: int = 4) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.schema.parquet import example_schema

    rng = np.random.default_rng(0)
    urls = []
    for s in range(shards):
        rows = []
        for _ in range(n // shards):
            length = seq if rng.random() > 0.1 else int(rng.integers(8, seq))
            ids = rng.integers(1000, V, length).tolist()
            ids[0], ids[-1] = 101, 102
            k = min(20, max(1, round(length * 0.15)))
            pos = sorted(rng.choice(np.arange(1, length - 1), k, replace=False).tolist())
            orig = [ids[p] for p in pos]
            for p in pos:
                ids[p] = 103
            rows.append(
                {
                    "input_ids": ids,
                    "len_a": length // 2,
                    "masked_positions": pos,
                    "masked_ids": orig,
                    "is_random_next": bool(rng.random() < 0.5),
                }
            )
        url = os.path.join(folder, f"part-{s:05d}.parquet")
        pq.write_table(pa.Table.from_pylist(rows, schema=example_schema(V, seq)), url, row_group_size=1000)
        urls.append(url)
    return urls


def bench_loader(batch: int, seq: int, n: int, demand: float) -> None:
    from model.stream import LoaderSpec, StreamingLoader
    from pipeline.examples.masking import VocabIds, create_masked_lm_predictions

    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += [f"w{i}" for i in range(V - len(vocab))]
    ids = VocabIds.from_vocab(vocab)

    def mask_fn(tokens, m, rng):
        return create_masked_lm_predictions(tokens, 0.15, m, ids, rng)

    with tempfile.TemporaryDirectory() as work:
        urls = write_shards(work, n, seq)
        print(f"\nloader: {n} examples of length {seq} in {len(urls)} shards, batch {batch}, 1 process")
        print(f"  {'masking':<10} {'examples/s':>11} {'x small-step demand':>20}")
        for name, fn in (("static", None), ("dynamic", mask_fn)):
            spec = LoaderSpec(
                urls=tuple(urls),
                batch_size=batch,
                max_seq_length=seq,
                seed=1,
                buffer_size=10_000,
                vocab_size=V,
                max_predictions=20,
            )
            loader = StreamingLoader(spec, mask_fn=fn)
            next(loader)  # first window read
            batches = max(1, n // batch // 2)
            t = time.perf_counter()
            for _ in range(batches):
                next(loader)
            rate = batches * batch / (time.perf_counter() - t)
            print(f"  {name:<10} {rate:11.0f} {rate / demand:19.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="small,medium,base")
    parser.add_argument("--batch", default="32,16,8", help="one per shape")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="measured steps (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--no-hf", action="store_true", help="skip transformers")
    parser.add_argument("--ours", default="padded", help="ours: padded,unpadded,compiled (first: the reference)")
    parser.add_argument("--loader-examples", type=int, default=20_000, help="0: skip the loader")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {args.steps} measured steps (round-robin); "
        f"medians of {'CPU process time' if args.device == 'cpu' else 'wall time'}"
    )
    shapes = args.shapes.split(",")
    batches = [int(b) for b in args.batch.split(",")]
    batches += [batches[-1]] * (len(shapes) - len(batches))
    rates = {}
    for shape, b in zip(shapes, batches):
        variants = tuple(args.ours.split(","))
        rates[shape] = bench_step(shape, b, args.seq, args.steps, args.device, args.precision, not args.no_hf, variants)
    if args.loader_examples:
        demand = rates.get("small") or next(iter(rates.values()))
        print(f"\nstep demand ({'small' if 'small' in rates else shapes[0]}): {demand:.1f} sequences/s per process")
        bench_loader(batches[0], args.seq, args.loader_examples, demand)


if __name__ == "__main__":
    main()
