"""Every data stage through the CLI on growing synthetic corpora: CPU-s per GB, peak RSS, the fit.

    python benchmarks/bench_scale.py                                   # 0.5, 1, 2 GB; 1 and 2 workers
    python benchmarks/bench_scale.py --sizes 50MB,100MB,200MB --work /tmp/scale   # what fits a busy box

First one unmeasured ``bertflow stage corpus --preset tiny`` (:func:`warm_up`: Prefect's database is
created once, not inside the first row). For each size: ``bertflow synth-corpus`` writes the corpus
once (Wikipedia XML ``.bz2`` and book files; reused when present, not measured), then for each
worker count, in a fresh root, ``bertflow stage corpus``, ``vocab`` and ``examples`` run one after
the other, each as its own command (``python -m flows.cli``, the console script's module), exactly
as a user runs them: the command's start-up, Prefect's temporary server and MLflow's store are part
of the figure. The worker count is set on the Beam stages (``corpus.beam.num_workers``,
``examples.beam.num_workers``); the vocab stage has no workers and runs with each root anyway (its
rows are repeats).

Per stage and size: the CPU-seconds of the whole process tree (user + system of every process
reaped under the command: the CLI, Prefect's server, Beam's workers), CPU-s per GB of input text
(the generator's ``bytes``: wiki text + book text), the peak resident size summed over the tree
(sampled from /proc every 0.5 s), the wall time and the 1-minute load when the row started;
and two figures about the machine rather than the command: the CPU time the hypervisor stole
during the row (``steal`` of /proc/stat, % of all CPUs' time) and the median CPU-s of a fixed
probe (:func:`probe`: bz2, regular expressions, dicts and hashing, the stages' kinds of work) run
just before and just after the row, on an otherwise idle box (run during the row it measured the
row's own use of both cores: 0.63-1.33 CPU-s within one row). On a VM the same code's speed moves
by 25% and more from one minute to the next with no steal and no load of ours (measured here: the
corpus stage's documents per second followed the probe); a row whose probe is slower than the
others' ran on a slower machine. Two point samples do not follow a 10-25 minute row, though
(measured: a row whose probes read 0.95 / 1.17 CPU-s cost what the rows around it did per GB), so
the probe flags a row; it does not correct it.
Then, per stage and worker count, the least-squares line CPU-s = intercept + slope x GB over the
sizes (the intercept is the command's fixed cost, the slope the marginal CPU-s per GB), the
spread of the marginal cost per GB ((CPU-s - intercept) / GB) across sizes and the growth of peak
RSS; and the paper-scale CPU-hours those slopes give (``--paper-gb`` GB of text: 3.3B words x ~6
bytes, ``docs/scale.md``).

CPU-seconds, not wall time, are the comparable figure on a machine shared with other jobs.
"""

from __future__ import annotations

import argparse
import bz2
import hashlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("corpus", "vocab", "examples")
SAMPLE_S = 0.5
"""Seconds between two reads of /proc for the tree's RSS: each read walks every process of the
machine (a busy shared box has hundreds), so 10 Hz cost this script itself ~1 CPU-s a minute."""


def parse_gb(size: str) -> float:
    size = size.strip().upper()
    for unit, scale in (("GB", 1.0), ("MB", 1e-3), ("KB", 1e-6)):
        if size.endswith(unit):
            return float(size[: -len(unit)]) * scale
    return float(size)


def tree_rss_bytes(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(name))
            rss[int(name)] = int(fields[21]) * page
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def probe() -> float:
    """CPU-s of a fixed single-threaded workload (~0.6 s on this machine): the machine's speed now
    (this thread's CPU time, not the process's: the RSS sampler runs beside it)."""
    text = " ".join(f"Sentence {i} of the probe, with words like w{i % 97} and x{i % 13}." for i in range(20000))
    packed = bz2.compress(text.encode())
    start = time.thread_time()
    counts: dict[str, int] = {}
    for _ in range(6):
        data = bz2.decompress(packed).decode()
        for sentence in re.split(r"(?<=[.!?])\s+", data):
            for word in sentence.split():
                counts[word] = counts.get(word, 0) + 1
            hashlib.blake2b(sentence.encode(), digest_size=12).digest()
    return time.thread_time() - start


def steal_jiffies() -> tuple[int, int]:
    """(stolen, total) jiffies of all CPUs so far, from /proc/stat (0, 0 where there is none)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return 0, 0
    return fields[7], sum(fields)


def run_measured(cmd: list[str], env: dict, log: Path) -> tuple[float, float, int, list[float]]:
    """(wall s, CPU s of the whole tree, peak tree RSS bytes, probes) of one command, the probes
    run just before and just after it; raises on failure."""
    probes = [probe()]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        peak = [0]

        def sample():
            while proc.poll() is None:
                peak[0] = max(peak[0], tree_rss_bytes(proc.pid))
                time.sleep(SAMPLE_S)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        proc.wait()
        sampler.join()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {log.read_text()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    probes.append(probe())
    return wall, cpu, peak[0], probes


def warm_up(cli: list[str], env: dict, work: Path) -> None:
    """One unmeasured stage command (the bundled sample, ``tiny``) before the first row.

    A new ``PREFECT_HOME`` (``WORK/prefect-home``) has no database yet: the first command creates
    it (Prefect's migrations, ~6 CPU-s measured here) and its temporary server does its first-start
    work, once per machine for a user, but inside whichever row ran first here (measured: the same
    0.5 GB corpus row cost 154.0 CPU-s first in a series, 137.0 last). The same command also brings
    the packages' files into the page cache."""
    start = time.perf_counter()
    subprocess.run(
        [*cli, "stage", "corpus", "--preset", "tiny", "--root", str(work / "warm-up")],
        env=env,
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    print(f"warm-up (not measured): `bertflow stage corpus --preset tiny`, {time.perf_counter() - start:.1f} s\n")


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (x, y) points."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if n < 2 or sxx == 0:
        return 0.0, my / mx if mx else 0.0
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.5GB,1GB,2GB", help="corpus sizes (synth-corpus --size)")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--preset", default="base", help="the config the stages run with")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="passed to every stage")
    parser.add_argument("--work", default=None, help="folder for corpora and roots (kept; corpora reused)")
    parser.add_argument("--paper-gb", type=float, default=19.8, help="text of the paper-scale corpus, GB")
    parser.add_argument("--json", default=None, help="also write every row to this file")
    parser.add_argument(
        "--stages", default=",".join(STAGES), help="the stages to run, in order (a later one needs the earlier ones)"
    )
    args = parser.parse_args()
    asked = args.stages.split(",")
    if set(asked) - set(STAGES):
        parser.error(f"--stages: {sorted(set(asked) - set(STAGES))} not among {STAGES}")
    stages = [s for s in STAGES if s in asked]

    work = Path(args.work or tempfile.mkdtemp(prefix="bertflow-bench-scale-"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "PREFECT_HOME": str(work / "prefect-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        # every row with its own Prefect temporary server, in its CPU and tree RSS, as in the series
        # of docs/scale.md (a server shared between commands would not be in the rows' rusage)
        "BERTFLOW_PREFECT_SERVER_LINGER_S": "0",
    }
    cli = [sys.executable, "-m", "flows.cli"]
    warm_up(cli, env, work)
    rows = []
    print(
        "| stage | workers | size | GB of text | CPU s | CPU s per GB | peak tree RSS MiB | wall s | load "
        "| steal % | probe CPU s, mean (before / after) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        raw = work / f"raw-{size}"
        meta = raw / "synth.json"
        if not meta.exists():
            out = subprocess.run(
                [*cli, "synth-corpus", "--out", str(raw), "--size", size],
                env=env,
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            meta.write_text(out[out.index("{") : out.rindex("}") + 1])
        gb = json.loads(meta.read_text())["bytes"] / 1e9
        for workers in (int(w) for w in args.workers.split(",")):
            root = work / f"root-{size}-w{workers}"
            sets = [
                f"data.wiki={raw / 'wiki'}",
                f"data.books={raw / 'books'}",
                f"corpus.beam.num_workers={workers}",
                f"examples.beam.num_workers={workers}",
                *args.set,
            ]
            for stage in stages:
                cmd = [*cli, "stage", stage, "--preset", args.preset, "--root", str(root)]
                for s in sets:
                    cmd += ["--set", s]
                load = os.getloadavg()[0]
                stolen, total = steal_jiffies()
                wall, cpu, rss, probes = run_measured(cmd, env, work / f"{root.name}-{stage}.log")
                stolen2, total2 = steal_jiffies()
                steal = 100 * (stolen2 - stolen) / max(1, total2 - total)
                speed = statistics.mean(probes)
                row = {
                    "stage": stage,
                    "workers": workers,
                    "size": size,
                    "gb": gb,
                    "cpu": cpu,
                    "rss_mib": rss / 2**20,
                    "wall": wall,
                    "load": load,
                    "steal_pct": steal,
                    "probe_cpu": speed,
                    "probes": probes,
                }
                rows.append(row)
                print(
                    f"| {stage} | {workers} | {size} | {gb:.3f} | {cpu:.1f} | {cpu / gb:.1f} | {rss / 2**20:,.0f} "
                    f"| {wall:.1f} | {load:.1f} | {steal:.1f} | {speed:.3f} ({probes[0]:.3f} / {probes[1]:.3f}) |",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))

    print(
        "\n| stage | workers | intercept CPU s | slope CPU s per GB | marginal CPU s per GB by size | spread |"
        " peak RSS MiB by size |"
    )
    print("|---|---|---|---|---|---|---|")
    slopes: dict[tuple[str, int], float] = {}
    for stage in stages:
        for workers in sorted({r["workers"] for r in rows}):
            mine = sorted((r for r in rows if r["stage"] == stage and r["workers"] == workers), key=lambda r: r["gb"])
            if not mine:
                continue
            intercept, slope = fit([(r["gb"], r["cpu"]) for r in mine])
            slopes[stage, workers] = slope
            marginal = [(r["cpu"] - intercept) / r["gb"] for r in mine]
            spread = (max(marginal) - min(marginal)) / slope if slope else 0.0
            print(
                f"| {stage} | {workers} | {intercept:.1f} | {slope:.1f} | "
                + " / ".join(f"{m:.1f}" for m in marginal)
                + f" | {spread:.0%} | "
                + " / ".join(f"{r['rss_mib']:,.0f}" for r in mine)
                + " |"
            )
    print(f"\nPaper scale ({args.paper_gb} GB of text), CPU-hours from the slopes (fixed costs left out):")
    for (stage, workers), slope in slopes.items():
        print(f"  {stage:<9} {workers} worker(s): {slope * args.paper_gb / 3600:8.1f} CPU-h")
    print(f"\nwork folder: {work}")


if __name__ == "__main__":
    main()
