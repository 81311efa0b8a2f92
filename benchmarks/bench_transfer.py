"""Benchmark: does pretraining transfer? Pretrained vs randomly initialised, same fine-tuning.

Generates a synthetic corpus (seed 0: the world the bundled downstream sets speak of), runs the
data stages and pretraining of a preset (``small`` by default), exports the model, then
fine-tunes the pretrained model and a randomly initialised one of the same shape, with the same
vocabulary, seeds and budget, on every bundled downstream task, and prints both scores side by
side. Stages already finished in ``--work`` are reused (rerun with another ``--finetune-*`` to
compare fine-tuning budgets without pretraining again).

    python benchmarks/bench_transfer.py --size 30MB --work /tmp/transfer            # the full run
    python benchmarks/bench_transfer.py --size 5MB --steps 300,0 --work /tmp/t5     # shortened
    python benchmarks/bench_transfer.py --preset tiny-ja --tasks jnli,jsquad --work /tmp/tja  # a bundled sample
    python benchmarks/bench_transfer.py --size 30MB --work /tmp/transfer --objective mlm+nsp,mlm,sop  # per objective

``--steps`` overrides the preset's steps per phase (the warm-up shrinks with it); the printout
states the schedule actually run. ``--models random`` fine-tunes only the random-init arm, which
needs no pretraining: run it on a spare core beside a ``--models pretrained`` run of the same
``--work`` once its data stages are done, then run both to print the table from the results.

``--objective`` (``examples.objective``, one or several, comma-separated) pretrains one model per
objective on the same corpus and vocabulary (the default ``mlm+nsp`` in ``run/``, another objective
in ``run/<objective>/``), prints each examples stage's figures and each pretraining's, and puts the
objectives' scores side by side with the random init as the floor. One objective per process runs
the objectives at once on the same ``--work`` (start the second once ``run/vocab`` is written).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import time

import torch

from flows.calls import StageCall
from flows.presets import load_config, resolve_data
from flows.proc.launch import launch_pretrain
from flows.table import model_config
from model.bert import BertForPreTraining
from model.export import copy_tokenizer, run_export, save_pretrained
from pipeline.schema.manifest import has_manifest, read_manifest
from pipeline.schema.objectives import DEFAULT_OBJECTIVE
from pipeline.schema.storage import join_url
from synth.corpus import SAMPLE_DIR, parse_size, write_corpus
from tasks.registry import TASKS
from tasks.units import run_downstream


def stage(name: str, url: str, fn) -> None:
    if has_manifest(url):
        print(f"  {name}: reusing {url}")
        return
    t = time.time()
    fn()
    print(f"  {name}: {time.time() - t:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--size", default="30MB", help="synthetic corpus size")
    parser.add_argument("--work", required=True, help="work folder (stages are reused when finished)")
    parser.add_argument("--steps", default="", help="steps per phase, e.g. 300,0 (default: the preset's)")
    parser.add_argument("--nproc", type=int, default=1, help="training processes (torchrun when > 1)")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--finetune-epochs", type=float, default=0, help="0: the preset's")
    parser.add_argument(
        "--seeds",
        default="42",
        help="fine-tuning seeds (both models), e.g. 42,43,44: "
        "each task is fine-tuned once per seed and the mean is printed",
    )
    parser.add_argument(
        "--objective", default="", help="examples.objective, one or several (mlm+nsp,mlm,sop); default: the preset's"
    )
    parser.add_argument("--models", default="pretrained,random", help="arms to fine-tune: pretrained, random or both")
    args = parser.parse_args()
    models = args.models.split(",")
    if not models or set(models) - {"pretrained", "random"}:
        parser.error(f"--models: pretrained, random or both, not {args.models!r}")
    logging.basicConfig(level=logging.WARNING)

    data, root = join_url(args.work, "data"), join_url(args.work, "run")
    overrides = {
        "data.wiki": join_url(data, "wiki"),
        "data.books": join_url(data, "books"),
        "data.downstream": str(SAMPLE_DIR),
    }
    seeds = [int(x) for x in args.seeds.split(",")]
    sample = load_config(args.preset).data.sample
    if sample:  # tiny-ja, tiny-zh: the bundled corpus and sets of that language, not a generated corpus
        bundled = resolve_data(load_config(args.preset).data)
        overrides = {"data.wiki": bundled.wiki, "data.books": bundled.books, "data.downstream": bundled.downstream}
    names = args.objective.split(",") if args.objective else [load_config(args.preset).examples.objective]
    configs = {o: schedule(load_config(args.preset, {**overrides, "examples.objective": o}), args) for o in names}
    cfg = configs[names[0]]
    print(
        f"preset {args.preset}: L={cfg.model.num_hidden_layers} H={cfg.model.hidden_size} "
        f"A={cfg.model.num_attention_heads}; corpus {args.size}; pretraining "
        + ", ".join(f"{p.name} {p.steps} steps x {p.batch_size} x {p.max_seq_length}" for p in cfg.pretrain.phases)
        + f" (warm-up {cfg.pretrain.warmup_steps}); fine-tuning {cfg.finetune.epochs} epochs, lr "
        f"{cfg.finetune.learning_rate}, seeds {args.seeds}; objective "
        + ", ".join(f"{o} (masking {c.examples.masked_lm_prob:g})" for o, c in configs.items())
    )

    if not sample and not os.path.exists(os.path.join(data, "books")):
        t = time.time()
        counts = write_corpus(data, parse_size(args.size), seed=0)
        print(f"  corpus written: {counts['bytes'] / 1e6:.1f} MB in {time.time() - t:.0f} s")
    from pipeline.corpus.job import run_corpus
    from pipeline.vocab.job import run_vocab

    corpus, vocab, random_init = (join_url(root, s) for s in ("corpus", "vocab", "random-init"))
    stage("corpus", corpus, lambda: run_corpus(cfg.corpus, {"wiki": cfg.data.wiki, "books": cfg.data.books}, corpus))
    stage("vocab", vocab, lambda: run_vocab(cfg.vocab, corpus, vocab))
    model_cfg = model_config(cfg, vocab)  # model.vocab_size unset: the trained vocabulary's
    if not os.path.exists(os.path.join(random_init, "model.safetensors")):
        torch.manual_seed(cfg.pretrain.seed)
        save_pretrained(BertForPreTraining(model_cfg), random_init)
        copy_tokenizer(vocab, random_init, model_cfg.max_position_embeddings)
    # the arms: a pretrained model per objective (the preset's own in run/, another in run/<objective>/)
    arms = {"random": (random_init, "random", root)} if "random" in models else {}
    if "pretrained" in models:
        for o, c in configs.items():
            home = root if o == DEFAULT_OBJECTIVE else join_url(root, o)
            arms[o if len(configs) > 1 else "pretrained"] = pretrain_arm(c, corpus, vocab, home, args.nproc)
    random_last = [a for a in arms if a != "random"] + (["random"] if "random" in arms else [])
    arms = {a: arms[a] for a in random_last}

    labels = list(arms)
    pair = labels == ["pretrained", "random"]  # one objective against the floor: the difference too
    head = f"\n{'task':<18} {'metric':<14} " + " ".join(f"{a:>11}" for a in labels)
    if pair:
        head += f" {'difference':>11}" + ("   per seed (pretrained - random)" if len(seeds) > 1 else "")
    print(head)
    for name in args.tasks.split(","):
        task = TASKS[name]
        scores: dict[str, list[float]] = {a: [] for a in arms}
        for seed in seeds:
            finetune = dataclasses.replace(cfg.finetune, seed=seed)
            for label, (model_url, tag, home) in arms.items():
                # a folder per model, pretraining schedule (random: any), fine-tuning budget and seed
                tag = tag + f"-ep{finetune.epochs:g}" + ("" if seed == 42 else f"-s{seed}")
                out = join_url(home, "finetune", tag, name)
                t = time.time()
                if has_manifest(out):
                    m = read_manifest(out)
                else:
                    m = run_downstream(task, finetune, cfg.data.downstream, model_url, out)
                    print(f"  ({name} {label} seed {seed}: {time.time() - t:.0f} s)", flush=True)
                key = task.metric if task.metric in m.counts else f"eval_{task.metric}"
                scores[label].append(task.percent(float(m.counts[key])))  # all as percentages
        means = {a: sum(v) / len(v) for a, v in scores.items()}
        line = f"{name:<18} {task.metric:<14} " + " ".join(f"{means[a]:11.2f}" for a in labels)
        if pair:
            per_seed = " ".join(f"{a - b:+.1f}" for a, b in zip(scores["pretrained"], scores["random"]))
            line += f" {means['pretrained'] - means['random']:+11.2f}" + (f"   {per_seed}" if len(seeds) > 1 else "")
        print(line, flush=True)


def schedule(cfg, args):
    """``cfg`` with ``--steps`` and ``--finetune-epochs`` applied."""
    if args.steps:
        steps = [int(x) for x in args.steps.split(",")]
        steps += [0] * len(cfg.pretrain.phases)
        phases = [dataclasses.replace(p, steps=s) for p, s in zip(cfg.pretrain.phases, steps)]
        total = sum(p.steps for p in phases)
        scale = total / max(cfg.pretrain.total_steps, 1)
        cfg = dataclasses.replace(
            cfg,
            pretrain=dataclasses.replace(
                cfg.pretrain,
                phases=tuple(phases),
                warmup_steps=max(1, round(cfg.pretrain.warmup_steps * scale)),
                eval_every=min(cfg.pretrain.eval_every, max(total, 1)),
            ),
        )
    if args.finetune_epochs:
        cfg = dataclasses.replace(cfg, finetune=dataclasses.replace(cfg.finetune, epochs=args.finetune_epochs))
    return cfg


def pretrain_arm(cfg, corpus: str, vocab: str, home: str, nproc: int) -> tuple[str, str, str]:
    """The examples, pretraining and export of ``cfg``'s objective in ``home``, with their figures
    printed: (the export's URL, the fine-tuning folders' tag, ``home``)."""
    from pipeline.examples.job import run_examples

    objective = cfg.examples.objective
    examples, pretrain, export = (join_url(home, s) for s in ("examples", "pretrain", "export"))
    stage(f"examples ({objective})", examples, lambda: run_examples(cfg.examples, corpus, vocab, examples))
    m = read_manifest(examples)
    sizes = {}
    for f in m.files:
        if f.path.endswith(".parquet"):
            sizes[f.path.split("/")[0]] = sizes.get(f.path.split("/")[0], 0) + f.size
    print(
        f"  examples ({objective}): {m.seconds:.0f} s, "
        + ", ".join(
            f"{d}: {m.counts[d + '.examples']:.0f} examples, {m.counts[d + '.tokens'] / 1e6:.2f}M tokens, "
            f"{m.counts[d + '.masked_share']:.3f} masked, {sizes.get(d, 0) / 1e6:.1f} MB"
            for d in sorted(sizes)
        )
    )
    spec = StageCall("pretrain", cfg, home, pretrain, {"examples": examples, "vocab": vocab}).spec()

    def train():
        code = launch_pretrain(spec, nproc)
        if code:
            raise SystemExit(f"pretraining exited with {code}")

    if has_manifest(pretrain) and read_manifest(pretrain).counts["steps"] != cfg.pretrain.total_steps:
        # another schedule: the trainer resumes from the latest checkpoint (steps and warm-up
        # are tunable, see model/resume.py) and trains on to the new total
        from pipeline.schema.manifest import manifest_url

        for url in (pretrain, export):  # the export follows the pretraining
            if has_manifest(url):
                os.remove(manifest_url(url))
    stage(f"pretrain ({objective})", pretrain, train)
    stage(f"export ({objective})", export, lambda: run_export(pretrain, vocab, export))
    counts = read_manifest(pretrain).counts
    print(
        f"  pretraining ({objective}): {counts['steps']:.0f} steps, {counts['seconds']:.0f} s, MLM loss "
        f"{counts['first_mlm_loss']:.3f} -> {counts['last_mlm_loss']:.3f}, MLM acc {counts['mlm_accuracy']:.3f}"
        + "".join(  # the objective's sentence-level task, if it has one (NSP, SOP)
            f", {k.split('_')[0].upper()} acc {v:.3f}"
            for k, v in counts.items()
            if k.endswith("_accuracy") and not k.startswith(("mlm", "eval"))
        )
        + (f", held-out MLM acc {counts['eval_mlm_accuracy']:.3f}" if "eval_mlm_accuracy" in counts else "")
    )
    return export, f"pretrained-{cfg.pretrain.total_steps}", home


if __name__ == "__main__":
    main()
