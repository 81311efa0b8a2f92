"""The GPU device check: one command that measures what issue 20's targets are about, side by side.

    python benchmarks/device_check.py                 # on one H100/H200: <= 8 minutes
    python benchmarks/device_check.py --smoke         # tiny shapes, a few steps, every code path (CPU: seconds)

It needs the repository, its Python dependencies (torch, pyarrow, numpy, safetensors, fsspec)
and nothing else; where ``transformers`` is missing it says so and skips that column. In order:

1. ``pytest -m gpu`` (the GPU tier) in a subprocess, its summary line kept;
2. for BERT-Large then BERT-Base, at seq 128 then 512, the bf16 training step (forward,
   backward, clipping, fused AdamW) on one batch (``bench_pretrain.make_batch``: 10% of the
   sequences shorter, 20 masked positions per full sequence) of: ours padded (the sparse head,
   eager), ours unpadded (``pretrain.unpad``), ours unpadded + compiled (``pretrain.compile``),
   ours unpadded + compiled with attention dropout 0 (the only case where the flash
   ``varlen_attn`` kernel runs: it has no dropout), ``transformers``' ``BertForPreTraining``
   with ``attn_implementation="sdpa"``, eager and under ``torch.compile``; every row the paper's
   config otherwise (dropout 0.1, exact GELU). Printed: seq/s, tokens/s (real tokens), model
   TFLOP/s and MFU against the device's dense bf16 peak (``model.metrics.PEAK_BF16_TFLOPS``, or
   ``--peak-tflops``), and the ratio to ``transformers`` sdpa. The FLOPs are the same for
   every row: those of the real tokens (``model.metrics.step_flops`` with ``tokens``/``pairs``,
   the MLM head on the masked tokens), so padding earns nobody credit. Compilation happens in the
   warm-up steps and is reported apart. Rows are measured in that order (the targets first) while
   the time budget lasts; a row that would overrun it is listed as skipped;
3. the ``small`` preset's model (L=4, H=256, A=4, FFN 1024, vocab 8,192) pretrained for
   ``--train-seconds`` (180) with ``run_pretrain`` on the GPU (bf16, unpadded, compiled: the
   backend's defaults) on example shards written here (documents of consecutive token ids, so
   MLM and NSP are learnable; the pipeline's Parquet contract), with MLM accuracy against time;
4. one JSON (``device_check.json``) and one markdown table (``device_check.md``) in ``--out``.

``--smoke`` runs every step on tiny shapes for a few steps on whatever device there is, the
compiled rows through ``backend="eager"`` (dynamo's capture with ``fullgraph=True``, no code
generation; ``tests/model/test_compile.py`` covers inductor), the GPU tier's own file only, so
the default test tier checks this script end to end on the CPU (``tests/model/test_device_check.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# E402 below: run as a script from any folder, the imports need the two paths above first.
from bench_pretrain import Runner, hf_model, make_batch  # noqa: E402 - after the sys.path lines

from model.bert import BertForPreTraining  # noqa: E402 - after the sys.path lines
from model.compile import compile_regions  # noqa: E402 - after the sys.path lines
from model.config import BertConfig, PhaseConfig, PretrainConfig  # noqa: E402 - after the sys.path lines
from model.data import IGNORE_INDEX  # noqa: E402 - after the sys.path lines
from model.metrics import PEAK_BF16_TFLOPS, step_flops  # noqa: E402 - after the sys.path lines
from model.packing import pack_padded  # noqa: E402 - after the sys.path lines

SHAPES = {"large": (24, 1024, 16), "base": (12, 768, 12), "tiny": (2, 64, 4)}
IMPLEMENTATIONS = (
    "ours unpadded compiled",
    "transformers sdpa",
    "transformers sdpa compiled",
    "ours padded",
    "ours unpadded",
    "ours unpadded compiled, attention dropout 0 (flash)",
)


def environment(device: str, peak: float) -> dict:
    try:
        import transformers

        hf = transformers.__version__
    except ImportError:
        hf = None
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    if not peak and device == "cuda":
        peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), 0.0)
    env = {"torch": torch.__version__, "transformers": hf, "device": name, "peak_bf16_tflops": peak}
    env["matmul_bf16_tflops"] = matmul_ceiling(device) if device == "cuda" else None
    return env


def matmul_ceiling(device: str, n: int = 8192, warmup: int = 3, repeat: int = 10) -> float:
    """The bf16 rate this device reaches on a plain n x n x n matrix product of random data (the
    mean of ``repeat`` after ``warmup``): the ceiling every row's TFLOP/s is also read against."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(warmup):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeat):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * repeat / (time.perf_counter() - t) / 1e12


def run_gpu_tier(args) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *args.pytest_args]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.pytest_timeout)
        lines = [x for x in p.stdout.splitlines() if x.strip()]
        summary, rc, text = (lines[-1] if lines else p.stderr.strip()[-300:]), p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        summary, rc, text = f"timed out after {args.pytest_timeout} s", -1, str(exc.stdout or "")
    out = {"command": " ".join(cmd[1:]), "returncode": rc, "summary": summary, "seconds": time.perf_counter() - t}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "pytest_gpu.txt"), "w") as f:  # the failures' tracebacks, whole
        f.write(text)
    print(f"\npytest -m gpu: {summary} (exit {rc}, {out['seconds']:.0f} s)", flush=True)
    return out


# -- the step table ---------------------------------------------------------------------------------
def _config(shape: str, attention_dropout: float = 0.1) -> BertConfig:
    L, H, A = SHAPES[shape]
    return BertConfig(
        vocab_size=30522,  # bench_pretrain.make_batch draws ids below it
        hidden_size=H,
        num_hidden_layers=L,
        num_attention_heads=A,
        intermediate_size=4 * H,
        attention_probs_dropout_prob=attention_dropout,
    )


def _runner(impl: str, shape: str, batch: dict, device: str, compile_backend: str) -> Runner:
    torch.manual_seed(0)
    if impl.startswith("transformers"):
        model = hf_model(_config(shape), "sdpa")
        if "compiled" in impl:
            model = torch.compile(model, backend=compile_backend)
        return Runner(impl, model, batch, device, "bf16")
    model = BertForPreTraining(_config(shape, 0.0 if "dropout 0" in impl else 0.1))
    if "compiled" in impl:
        compile_regions(model, backend=compile_backend)
    return Runner(impl, model, batch if impl == "ours padded" else pack_padded(batch), device, "bf16")


def measure(impl: str, shape: str, seq: int, batch_size: int, args, peak: float) -> dict:
    batch = make_batch(batch_size, seq)
    lengths = batch["attention_mask"].sum(1)
    real, masked = int(lengths.sum()), int((batch["labels"] != IGNORE_INDEX).sum())
    flops = step_flops(
        _config(shape), batch_size, int(batch["input_ids"].shape[1]), masked, real, int((lengths**2).sum())
    )
    row = {"model": shape, "seq": seq, "batch": batch_size, "implementation": impl, "real_tokens": real}
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        r = _runner(impl, shape, batch, args.device, args.compile_backend)
        t = time.perf_counter()
        for _ in range(args.warmup):  # compilation happens here
            r.step(record=False)
        row["warmup_s"] = time.perf_counter() - t
        for _ in range(args.steps):
            r.step(record=True)
        step = statistics.median(r.times)
        row.update(
            step_s=step,
            seq_per_s=batch_size / step,
            tokens_per_s=real / step,
            tflops=flops / step / 1e12,
            mfu=(flops / step / 1e12 / peak) if peak else None,
        )
        if args.device == "cuda":
            row["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    except torch.OutOfMemoryError:
        row["error"] = "out of memory"
    except Exception as exc:  # a row that fails is reported, the check goes on
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        row["traceback"] = traceback.format_exc()[-6000:]
    finally:
        r = None
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return row


TARGET_ROWS = 3
"""The first model's first three implementations (ours unpadded compiled and the two transformers
rows it is compared with) are the targets: measured at every length before any other row."""


def row_order(args) -> list[tuple[str, int, int, str]]:
    """Every (model, seq, batch, implementation) of the table, the target rows first, then the
    first model's other rows, then the other models' (each group length by length)."""
    rows = [
        (shape, seq, batch, impl)
        for shape in args.shapes
        for seq, batch in zip(args.seqs, args.batch)
        for impl in args.implementations
    ]

    def group(row):
        first = row[0] == args.shapes[0]
        return 0 if first and IMPLEMENTATIONS.index(row[3]) < TARGET_ROWS else 1 if first else 2

    return sorted(rows, key=group)  # stable: each group keeps the table's order


def step_table(args, peak: float, hf: bool, deadline: float, on_row=None) -> list[dict]:
    """The rows measured in ``row_order``, returned in the table's order; ``on_row(rows)`` after
    each one (the report is rewritten then: a check stopped at its limit keeps what it measured)."""
    done, spent, rows = {}, {}, []
    for key in row_order(args):
        shape, seq, batch, impl = key
        base = {"model": shape, "seq": seq, "batch": batch, "implementation": impl}
        # the same row at another length: its last cost; a first one: a guess (compiling costs most)
        guess = spent.get((shape, impl), args.first_guess_s * (3 if "compiled" in impl else 1))
        if impl.startswith("transformers") and not hf:
            done[key] = {**base, "skipped": "transformers is not installed"}
        elif time.perf_counter() + guess > deadline:
            done[key] = {**base, "skipped": "time budget"}
        else:
            t = time.perf_counter()
            done[key] = measure(impl, shape, seq, batch, args, peak)
            spent[(shape, impl)] = time.perf_counter() - t
            _print_row(done[key])
        rows = [done[k] for k in sorted(done, key=_table_order(args))]
        _ratios(rows)
        if on_row:
            on_row(rows)
    return rows


def _table_order(args):
    def key(row: tuple[str, int, int, str]) -> tuple[int, int, int]:
        shape, seq, _, impl = row
        return args.shapes.index(shape), args.seqs.index(seq), IMPLEMENTATIONS.index(impl)

    return key


def _ratios(rows: list[dict]) -> None:
    """Each measured row's ratio to transformers sdpa at the same model, length and batch."""
    for row in rows:
        ref = next(
            (r for r in rows if r["implementation"] == "transformers sdpa" and _same(r, row) and "seq_per_s" in r), None
        )
        if ref and "seq_per_s" in row:
            row["vs_transformers_sdpa"] = row["seq_per_s"] / ref["seq_per_s"]


def _same(a: dict, b: dict) -> bool:
    return (a["model"], a["seq"], a["batch"]) == (b["model"], b["seq"], b["batch"])


def _print_row(row: dict) -> None:
    head = f"  {row['model']:<5} {row['seq']:>4} x {row['batch']:<4} {row['implementation']:<52}"
    if "error" in row:
        print(f"{head} {row['error'].splitlines()[0]}", flush=True)
        return
    mfu = f"{row['mfu']:6.1%}" if row.get("mfu") is not None else "     -"
    print(
        f"{head} {row['seq_per_s']:9.1f} seq/s {row['tokens_per_s']:10.0f} tok/s {row['tflops']:7.1f} TFLOP/s "
        f"MFU {mfu}  (warm-up {row['warmup_s']:.0f} s)",
        flush=True,
    )


# -- the small preset's pretraining ---------------------------------------------------------------
def write_example_shards(
    folder: str, n: int, seq: int, vocab: int, shards: int = 4, seed: int = 0, objective: str = ""
) -> str:
    """An examples stage of ``n`` masked examples of length ``seq`` for ``objective`` (a row of
    ``pipeline.schema.objectives``; the default's if empty): each document a run of consecutive token
    ids, 15% masked 80/10/10. A pair objective writes ``[CLS] A [SEP] B [SEP]`` with its sentence
    label: B the true continuation unless random-next (NSP), or A and B swapped (sentence order);
    a one-segment objective writes ``[CLS] run [SEP]``, no ``len_a``, no label."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.schema.manifest import write_manifest
    from pipeline.schema.objectives import DEFAULT_OBJECTIVE, get_objective
    from pipeline.schema.outputs import ExampleLength, lengths_record
    from pipeline.schema.parquet import example_schema

    row = get_objective(objective or DEFAULT_OBJECTIVE)
    swaps = row.builder == "sentence_order"  # the label swaps A and B instead of drawing another B
    rng = np.random.default_rng(seed)
    first, cls, sep, mask = 5, 2, 3, 4
    span = vocab - first
    lengths = np.where(rng.random(n) < 0.1, rng.integers(16, seq, n), seq)
    for s in range(shards):
        rows = range(s, n, shards)
        columns: dict[str, list] = {name: [] for name in row.columns}
        for i in rows:
            length = int(lengths[i])
            if row.segments:  # the default's draws in the order they always were: its shards unchanged
                body = length - 3
                la = int(rng.integers(1, body))
                start = int(rng.integers(span))
                a = first + (start + np.arange(la)) % span
                label = bool(rng.random() < 0.5)
                b_start = int(rng.integers(span)) if label and not swaps else start + la
                b = first + (b_start + np.arange(body - la)) % span
                if label and swaps:
                    a, b = b, a
                tokens = np.concatenate([[cls], a, [sep], b, [sep]]).astype(np.int64)
                columns["len_a"].append(len(a) + 2)
                columns[row.sentence_label].append(label)
            else:
                start = int(rng.integers(span))
                tokens = np.concatenate([[cls], first + (start + np.arange(length - 2)) % span, [sep]])
                tokens = tokens.astype(np.int64)
            cand = np.flatnonzero((tokens != cls) & (tokens != sep))
            k = max(1, min(round(length * 0.15), 20))
            pos = np.sort(rng.choice(cand, k, replace=False))
            orig = tokens[pos].copy()
            u = rng.random(k)
            ids = tokens.copy()
            ids[pos[u < 0.8]] = mask
            rand = pos[(u >= 0.8) & (u < 0.9)]
            ids[rand] = rng.integers(first, vocab, len(rand))
            columns["input_ids"].append(ids.tolist())
            columns["masked_positions"].append(pos.tolist())
            columns["masked_ids"].append(orig.tolist())
        path = os.path.join(folder, f"seq{seq}")
        os.makedirs(path, exist_ok=True)
        table = pa.table(columns, schema=example_schema(vocab, seq, row.name))
        pq.write_table(table, os.path.join(path, f"part-{s:05d}-of-{shards:05d}.parquet"))
    lengths = lengths_record([ExampleLength(seq, 20, "static", 0.15, False, row.name)])
    config = {"max_seq_lengths": [seq], "max_predictions_per_seq": [20], "objective": row.name}
    write_manifest("examples", folder, config, {}, {"examples": n}, outputs=lengths)
    return folder


class _TimeUp(Exception):
    pass


def pretrain_small(args, objective: str = "", on_point=None) -> dict:
    """The small preset's network pretrained on ``objective``'s examples (the default's if empty)
    for ``--train-seconds``: its MLM (and sentence-level) accuracy against time. ``on_point(run)``
    with the run so far after each held-out evaluation."""
    from flows.presets import load_config  # the small preset's network (needs what model.train needs)
    from model.train import run_pretrain

    seq, batch = args.train_seq, args.train_batch
    model = load_config("small").model
    # the preset's vocab_size is the trained vocabulary's (None until the vocab stage): 8,192 here
    model = dataclasses.replace(model, vocab_size=512 if args.smoke else model.vocab_size or 8192)
    with tempfile.TemporaryDirectory() as work:
        t = time.perf_counter()
        examples = write_example_shards(
            os.path.join(work, "examples"), args.train_examples, seq, model.vocab_size, objective=objective
        )
        written = time.perf_counter() - t
        cfg = PretrainConfig(
            phases=(PhaseConfig("phase1", seq, 10**7, batch),),
            learning_rate=1e-3,
            warmup_steps=args.train_warmup,
            log_every=args.train_log_every,
            checkpoint_every=10**9,
            eval_every=args.train_log_every * 4,
            eval_batches=2,
            backend=args.device,
            seed=1,
        )
        curve: list[dict] = []
        start = time.perf_counter()

        def log_fn(metrics: dict, step: int) -> None:
            elapsed = time.perf_counter() - start
            point = {"seconds": elapsed, "step": step}
            point.update({k: metrics[k] for k in ("mlm_accuracy", "mlm_loss", "examples_per_sec") if k in metrics})
            point.update({k: v for k, v in metrics.items() if k.endswith("_accuracy")})  # every loss's, held-out too
            curve.append(point)
            if on_point and any(k.startswith("eval_") for k in point):
                on_point(_pretrain_result(args, objective, seq, batch, written, curve))
            if "mlm_accuracy" in metrics:
                print(
                    f"  {elapsed:6.0f} s step {step:6d} mlm_acc {metrics['mlm_accuracy']:.3f} "
                    f"{metrics.get('examples_per_sec', 0):8.0f} seq/s",
                    flush=True,
                )
            evaluated = any("eval_mlm_accuracy" in p for p in curve)  # the curve has a held-out point
            if elapsed > args.train_seconds and step >= args.train_min_steps and evaluated:
                raise _TimeUp

        try:
            run_pretrain(cfg, model, examples, os.path.join(work, "run"), log_fn=log_fn)
        except _TimeUp:
            pass
    return _pretrain_result(args, objective, seq, batch, written, curve)


def _pretrain_result(args, objective: str, seq: int, batch: int, written: float, curve: list[dict]) -> dict:
    evals = [p for p in curve if "eval_mlm_accuracy" in p]
    return {
        "objective": objective or "the default",
        "model": "small preset (L=4, H=256, A=4, FFN 1024, vocab 8192)" if not args.smoke else "small, vocab 512",
        "seq": seq,
        "batch": batch,
        "shards_written_s": written,
        "seconds": args.train_seconds,
        "curve": list(curve),
        "last_eval_mlm_accuracy": evals[-1]["eval_mlm_accuracy"] if evals else None,
    }


# -- report -----------------------------------------------------------------------------------------
def markdown(result: dict) -> str:
    env = result["environment"]
    ceiling = env.get("matmul_bf16_tflops") or float("nan")
    out = [
        f"# Device check: {env['device']}, torch {env['torch']}, transformers {env['transformers'] or 'not installed'}",
        "",
        f"`pytest -m gpu`: {result['pytest']['summary']}",
        "",
        f"bf16 training step, peak {env['peak_bf16_tflops'] or '?'} TFLOP/s (dense, datasheet); measured bf16 "
        f"matrix product {ceiling:.0f} TFLOP/s; FLOPs of the real tokens for every row".replace(" nan TFLOP/s", " -"),
        "",
        "| model | seq | batch | implementation | seq/s | tokens/s | TFLOP/s | MFU | of the measured product "
        "| × transformers sdpa | warm-up s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["steps"]:
        lead = f"| {r['model']} | {r['seq']} | {r['batch']} | {r['implementation']} |"
        if "seq_per_s" not in r:
            why = (r.get("skipped") or r.get("error") or "").splitlines()[0]
            out.append(f"{lead} {why} | | | | | | |")
            continue
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-"
        ratio = f"{r['vs_transformers_sdpa']:.2f}" if "vs_transformers_sdpa" in r else "-"
        of_product = f"{r['tflops'] / ceiling:.1%}" if ceiling == ceiling else "-"
        out.append(
            f"{lead} {r['seq_per_s']:.1f} | {r['tokens_per_s']:.0f} | {r['tflops']:.1f} | {mfu} | {of_product} | "
            f"{ratio} | {r['warmup_s']:.0f} |"
        )
    runs = result.get("pretrain_by_objective") or {"": result.get("pretrain")}
    for objective, p in runs.items():
        if not p:
            continue
        if "error" in p:
            out += ["", f"Pretraining ({objective}): {p['error'][:300]}"]
            continue
        out += [
            "",
            f"Pretraining{f' ({objective})' if objective else ''}, {p['model']}, seq {p['seq']}, batch "
            f"{p['batch']}, {p['seconds']:.0f} s:",
            "",
            "| seconds | step | MLM accuracy (training window) | held-out MLM accuracy | seq/s |",
            "|---|---|---|---|---|",
        ]
        for c in p["curve"]:
            if "mlm_accuracy" in c:
                held = next((e for e in p["curve"] if e["step"] == c["step"] and "eval_mlm_accuracy" in e), None)
                acc = f"{held['eval_mlm_accuracy']:.3f}" if held else ""
                rate = c["examples_per_sec"]
                out.append(f"| {c['seconds']:.0f} | {c['step']} | {c['mlm_accuracy']:.3f} | {acc} | {rate:.0f} |")
    return "\n".join(out) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes, a few steps, every code path")
    p.add_argument("--out", default="device_check", help="folder for device_check.json and device_check.md")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--budget-s", type=float, default=480.0, help="the whole check's time budget")
    p.add_argument("--shapes", default="large,base")
    p.add_argument("--seqs", default="128,512")
    p.add_argument("--batch", default="128,32", help="sequences per step, one per --seqs")
    p.add_argument(
        "--implementations",
        default="",
        help="the rows: indices into IMPLEMENTATIONS (0: ours unpadded compiled), comma-separated; default all",
    )
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=8, help="measured steps per row (median)")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="the device's dense bf16 peak; 0: known GPUs")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--train-seconds", type=float, default=180.0)
    p.add_argument("--train-seq", type=int, default=64, help="the small preset's phase 1 length")
    p.add_argument("--train-batch", type=int, default=64)
    p.add_argument("--train-examples", type=int, default=100_000)
    p.add_argument("--train-warmup", type=int, default=200)
    p.add_argument("--train-log-every", type=int, default=50)
    p.add_argument("--train-min-steps", type=int, default=0, help="train at least this many steps")
    p.add_argument(
        "--objective",
        default="",
        help="examples.objective(s) to pretrain the small preset on, comma-separated, each for --train-seconds "
        "(default: the default objective)",
    )
    p.add_argument(
        "--first-guess-s",
        type=float,
        default=20.0,
        help="what a row not yet measured at any length is taken to cost when the budget is checked (x3 compiled)",
    )
    p.add_argument("--pytest-timeout", type=float, default=120.0)
    p.add_argument("--no-pytest", action="store_true")
    args = p.parse_args(argv)
    args.pytest_args = []
    if args.smoke:
        args.shapes, args.seqs, args.batch = "tiny", "32", "4"
        args.warmup, args.steps, args.compile_backend, args.first_guess_s = 1, 2, "eager", 0.0
        args.train_seconds, args.train_seq, args.train_batch = 2.0, 32, 8
        args.train_examples, args.train_warmup, args.train_log_every = 400, 2, 2
        args.train_min_steps = 8  # two log windows and a held-out evaluation, however loaded the machine
        args.pytest_args = [
            os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests/model/test_gpu.py")
        ]
    from pipeline.schema.objectives import DEFAULT_OBJECTIVE, get_objective

    args.objective = [get_objective(o, "--objective").name for o in (args.objective or DEFAULT_OBJECTIVE).split(",")]
    picked = args.implementations.split(",") if args.implementations else range(len(IMPLEMENTATIONS))
    if any(str(i) not in {str(n) for n in range(len(IMPLEMENTATIONS))} for i in picked):
        rows = "; ".join(f"{n}: {name}" for n, name in enumerate(IMPLEMENTATIONS))
        p.error(f"--implementations {args.implementations!r}: indices from 0 to {len(IMPLEMENTATIONS) - 1} ({rows})")
    args.implementations = [IMPLEMENTATIONS[int(i)] for i in picked]
    args.shapes = args.shapes.split(",")
    args.seqs = [int(x) for x in args.seqs.split(",")]
    args.batch = [int(x) for x in args.batch.split(",")]
    args.batch += [args.batch[-1]] * (len(args.seqs) - len(args.batch))
    return args


def save(result: dict, out: str) -> None:
    """The JSON and the markdown as they stand (rewritten after every step)."""
    os.makedirs(out, exist_ok=True)
    for name, text in (
        ("device_check.json", json.dumps(result, indent=1, default=str)),
        ("device_check.md", markdown(result)),
    ):
        with open(os.path.join(out, name + ".tmp"), "w") as f:
            f.write(text)
        os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    started = time.perf_counter()
    env = environment(args.device, args.peak_tflops)
    print(f"device check: {env}", flush=True)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    result: dict = {"environment": env, "arguments": {k: v for k, v in vars(args).items()}}
    result["pytest"] = (
        {"summary": "not run (--no-pytest)", "returncode": None} if args.no_pytest else run_gpu_tier(args)
    )
    result["steps"], result["pretrain_by_objective"] = [], {}
    save(result, args.out)
    deadline = started + args.budget_s - len(args.objective) * args.train_seconds - 20  # pretraining keeps its time
    print("\nbf16 training step (median of the measured steps):", flush=True)

    def on_row(rows: list[dict]) -> None:
        result["steps"] = rows
        save(result, args.out)

    result["steps"] = step_table(args, env["peak_bf16_tflops"], env["transformers"] is not None, deadline, on_row)
    for objective in args.objective:
        print(f"\npretraining the small preset for {args.train_seconds:.0f} s ({objective}):", flush=True)

        def on_point(run: dict, objective: str = objective) -> None:
            result["pretrain_by_objective"][objective] = run
            save(result, args.out)

        try:
            result["pretrain_by_objective"][objective] = pretrain_small(args, objective, on_point)
        except Exception as exc:  # reported, the other objectives still run
            result["pretrain_by_objective"][objective] = {
                "objective": objective,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-6000:],
            }
            print(f"  failed: {traceback.format_exc()[-3000:]}", flush=True)
    result["pretrain"] = result["pretrain_by_objective"][args.objective[0]]
    result["seconds"] = time.perf_counter() - started
    save(result, args.out)
    print(f"\n{markdown(result)}\nwritten to {args.out}/ in {result['seconds']:.0f} s", flush=True)
    return result


if __name__ == "__main__":
    main()
