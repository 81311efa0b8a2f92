"""Every figure README.md and docs/ quote for a tiny run, printed from a finished root.

    bertflow run --preset tiny --root /tmp/tiny                  # or /usr/bin/time -v ... 2> time.log
    python benchmarks/tiny_figures.py /tmp/tiny [--time-log time.log] [--set FIELD=VALUE ...]

It prints, each under its heading: the machine and its load as the script ran (and, with
``--time-log``, the run's wall time and peak RSS as ``/usr/bin/time -v`` measured them), then the
README's sentences about the run with the root's figures in them, the downstream results table
(``docs/downstream.md``, "The tiny run, measured", for the end-to-end test's root) and the
``bertflow status --set pretrain.learning_rate=5e-4`` example. ``--set`` gives the overrides the
root was run with (the end-to-end test's, for its root), so that the status example compares
against the config the root was made with.

Which figures are deterministic (``tests/flows/test_tiny_figures.py`` checks the README's against
this script's):

1. **The data stages'** (documents, sentences, rejects, vocabulary, examples, random-next shares)
   are pure functions of the bundled sample and the config, seeded by stable digests: equal on
   any machine, any number of workers.
2. **Pretraining's and fine-tuning's** (losses, accuracies, dev scores) are bit-for-bit equal
   between runs on one machine: on the AMD EPYC x 2 dev box SST-2's lr 1e-3 unit gave 77.25 in
   seven runs (the whole run, then alone with ``PYTHONHASHSEED`` 0, 0 and 1, at 2 threads instead
   of 1, with torch's and MKL's AVX2, then SSE kernels forced). Other environments gave 76.50 and
   76.25 with every other quoted figure equal: something none of those changes reaches (not
   pinned down) moves SST-2's 400-row dev set by a row or a few (0.25 points each); compare the
   export's sha256 first. So they are compared only where the machine is the one the page names.
3. **Times and memory** (wall, per stage, peak RSS) depend on the machine and what else ran on it:
   they are printed with the load average, never compared.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

TASK_NAMES = {
    "sst2": "SST-2 sample accuracy",
    "squad1": "SQuAD v1.1 sample F1",
    "conll2003": "CoNLL-2003 sample entity F1",
}
"""The tasks of the tiny preset, as the README names their headline figure."""


def _counts(root: Path, folder: str) -> dict[str, float]:
    return json.loads((root / folder / "_manifest.json").read_text())["counts"]


def _n(v: float) -> str:
    """An integer count as the README writes it: 8,223."""
    return f"{int(v):,}"


def _results(root: Path, task: str) -> dict[str, Any]:
    return json.loads((root / "finetune" / task / "results.json").read_text())


# -- the figures -----------------------------------------------------------------------------------
def data_sentence(root: Path) -> str:
    """The corpus and vocab stages' figures (equal for the tiny preset and the end-to-end test's
    overrides, which change neither stage)."""
    c, v = _counts(root, "corpus"), _counts(root, "vocab")
    return (
        f"{_n(c['documents'])} documents and {_n(c['sentences'])} sentences kept of {_n(c['read'])} pages and books "
        f"read ({_n(c['records_rejected'])} rejects and {_n(c['duplicate_paragraph_corpus'])} paragraphs repeated "
        f"across documents, each with its reason under `corpus/rejects/`), a {_n(v['vocab_size'])}-piece vocabulary"
    )


def examples_sentence(root: Path) -> str:
    e = _counts(root, "examples")
    return (
        f"{_n(e['seq64.examples'])} + {_n(e['seq128.examples'])} examples at lengths 64 and 128 (random-next "
        f"{e['seq64.random_next_share_multi_sentence']:.3f} / {e['seq128.random_next_share_multi_sentence']:.3f} "
        "of multi-sentence chunks)"
    )


def pretraining_sentence(root: Path) -> str:
    p, v = _counts(root, "checkpoints"), _counts(root, "vocab")
    ln = math.log(v["vocab_size"])
    return (
        f"MLM loss {p['first_mlm_loss']:.2f} at the start (ln {int(v['vocab_size'])} = {ln:.2f}) "
        f"and {p['last_mlm_loss']:.2f} after {int(p['steps'])} steps (MLM accuracy {p['mlm_accuracy']:.2f}), NSP loss "
        f"{p['first_nsp_loss']:.2f} to {p['last_nsp_loss']:.2f} (accuracy {p['nsp_accuracy']:.2f})"
    )


def downstream_sentences(root: Path) -> list[str]:
    """The best grid point's dev figure of each task, as the README quotes it."""
    return [f"{name} {_results(root, task)['dev_median']:.2f}" for task, name in TASK_NAMES.items()]


def results_table(root: Path) -> str:
    """``finetune/results.md``'s per-task table (docs/downstream.md quotes it for the e2e root)."""
    lines = [
        "| task | metric | median | min | max | seeds | lr | batch | epochs | failed units |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task in TASK_NAMES:
        r = _results(root, task)
        metric = r["metric"].removeprefix("eval_")
        lines.append(
            f"| {task} | {metric} | {r['dev_median']:.2f} | {r['dev_min']:.2f} | {r['dev_max']:.2f} | {r['seeds']} | "
            f"{r['best']['learning_rate']:g} | {r['best']['batch_size']} | {r['best']['epochs']:g} | "
            f"{len(r['failed'])}/{r['units']} |"
        )
    return "\n".join(lines)


def grid_sentence(root: Path) -> str:
    """Every grid point of every task: 'SST-2 76.00 / 77.25' for lr 5e-4 / 1e-3."""
    parts = []
    for task in TASK_NAMES:
        points = sorted(_results(root, task)["points"], key=lambda p: p["learning_rate"])
        lrs = " / ".join(f"{p['learning_rate']:g}" for p in points)
        parts.append(f"{task} " + " / ".join(f"{p['median']:.2f}" for p in points) + f" (lr {lrs})")
    return "; ".join(parts)


def status_rows(root: Path, overrides: list[str]) -> list[tuple[str, str, str, str]]:
    """``bertflow status --set pretrain.learning_rate=5e-4`` on the root: (stage, state, why, the
    first key figure, with "..." when it has more)."""
    from flows.overrides import parse_overrides
    from flows.presets import load_config
    from flows.status import collect_status

    cfg = load_config("tiny", parse_overrides([*overrides, "pretrain.learning_rate=5e-4"]))
    rows = []
    for r in collect_status(cfg, str(root)):
        figs = list(r["figures"].items())
        shown = f"{figs[0][0]}={_figure(figs[0][1])}" + (" ..." if len(figs) > 1 else "") if figs else ""
        rows.append((r["stage"], r["state"], "; ".join(r["why"]), shown))
    return rows


def status_example(root: Path, overrides: list[str]) -> str:
    """The README's ``bertflow status`` example: :func:`status_rows` in its short form."""
    lines = ["$ bertflow status --set pretrain.learning_rate=5e-4"]
    lines.append(f" {'stage':<18} {'state':<6} {'why':<50} key figures")
    for stage, state, why, shown in status_rows(root, overrides):
        lines.append(f" {stage:<18} {state:<6} {why:<50} {shown}".rstrip())
    lines.append(f" {'':<77}(plus each stage's time and MLflow run)")
    return "\n".join(lines)


def _figure(v: float) -> str:
    from flows.figures import format_figure

    return format_figure(v)


# -- where it ran ----------------------------------------------------------------------------------
def machine() -> dict[str, str]:
    """The machine and its load as this script runs (the run's own load is the caller's to give)."""
    model = ""
    try:
        model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "cpu": f"{model or platform.processor()} x {os.cpu_count()}",
        "load average (1/5/15 min, now)": " / ".join(f"{x:.2f}" for x in load),
        "python / torch": f"{platform.python_version()} / {torch.__version__} ({torch.get_num_threads()} threads here)",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
        "code": commit,
    }


def time_log(path: str) -> dict[str, str]:
    """Wall time and peak RSS from ``/usr/bin/time -v``'s report."""
    text = Path(path).read_text(errors="replace")
    out = {}
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if wall:
        out["wall"] = wall.group(1)
    if rss:
        out["peak RSS"] = f"{int(rss.group(1)) / 1e6:.2f} GB ({int(rss.group(1)):,} kB)"
    return out


def stage_seconds(root: Path) -> str:
    parts = []
    for folder in ("corpus", "vocab", "examples", "checkpoints", "model", "finetune/sst2", "finetune/squad1",
                   "finetune/conll2003"):  # fmt: skip
        m = json.loads((root / folder / "_manifest.json").read_text())
        parts.append(f"{folder} {m['seconds']:.0f} s")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="a finished tiny run's root")
    ap.add_argument("--time-log", help="the run's `/usr/bin/time -v` report (its stderr)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                    help="the overrides the root was run with")  # fmt: skip
    args = ap.parse_args(argv)
    root = args.root.resolve()
    print("## where (not deterministic: the machine and its load)")
    for k, v in {**machine(), **(time_log(args.time_log) if args.time_log else {})}.items():
        print(f"{k}: {v}")
    print(f"stage seconds: {stage_seconds(root)}")
    print("\n## data stages (deterministic anywhere)")
    print(data_sentence(root))
    print(examples_sentence(root))
    print("\n## pretraining and fine-tuning (deterministic on one machine and thread count)")
    print(pretraining_sentence(root))
    print("; ".join(downstream_sentences(root)))
    print(grid_sentence(root))
    print("\n" + results_table(root))
    print("\n## the status example")
    print(status_example(root, args.overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
