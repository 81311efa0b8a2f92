"""Benchmark: what each command costs before it does anything, against issue 26's targets.

Every command runs in a fresh interpreter (``python -m flows.cli ...``) as a user would start
it; the figures are the child's own rusage (``os.wait4``: user + sys CPU seconds of it and every
process it waited for, and its peak resident memory), so a loaded machine changes the wall time
but hardly the CPU seconds. Each command runs ``--repeat`` times; the least CPU is printed, with
the machine's 1-minute load average when that command's runs ended (the wall time means little
on a loaded machine). ``run (finished root)`` is ``bertflow run`` on the finished root: main's
code starts Prefect's temporary server and the flow (whose server the supervisor sweeps rather
than waits for, so its CPU is a lower bound), this change's answers from the manifests and the
tracking store in the command's own process (``flows/finished.py``).

The code measured is whatever ``PYTHONPATH`` names (else this checkout). To put two versions
side by side, measure the old one first and save it, then the new one with ``--before``:

    PYTHONPATH=/work/main python benchmarks/bench_commands.py --root OLD_ROOT --json before.json
    python benchmarks/bench_commands.py --root NEW_ROOT --before before.json

``--root`` is a finished tiny root (``bertflow run --preset tiny --root DIR``) made by the same
code (another code version would find its stages stale and ``run`` would redo them).
``--stage-fit SIZE1,SIZE2`` also runs ``bertflow stage corpus`` on synthetic corpora of two sizes
and prints the fit's intercept: the fixed cost of a stage through the command line. ``--tree``
prints one ``stage corpus`` on the bundled sample by process (supervisor, worker, Prefect's
temporary server, the dump reader), from /proc: where that fixed cost is paid. ``--series`` runs
``stage corpus``, ``vocab`` and ``examples`` on one new root in a row, as a script does, and
counts a shared server's idle time after the last one too.

Prefect's temporary server is shared between commands by default (``flows.shared_server``): it
outlives the command that started it, so ``rusage`` does not see it; its CPU seconds during each
command (its whole start in the command that started it) are read from /proc and added to that
command's figure (printed apart in the stage fit). ``BERTFLOW_PREFECT_SERVER_LINGER_S=0`` measures
a server started and stopped by each command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# command -> (max CPU-s, max RSS MB, max wall s): issue 26's targets (None: no target)
TARGETS = {
    "--help": (0.5, None, None),
    "config error": (0.5, None, None),
    "status": (1.0, 150, None),
    "status --json": (1.0, 150, None),
    "config": (None, None, None),
    "inspect corpus": (None, None, None),
    "run (finished root)": (None, None, 3.0),
    "stage fixed cost": (3.0, None, None),
}


def shared_servers(env: dict[str, str]) -> dict[int, float]:
    """pid -> CPU seconds so far of each of Prefect's temporary servers kept up between commands
    (``flows.shared_server``) in the Prefect home the commands use: not the commands' children
    once they have returned, so ``rusage`` misses them."""
    import glob

    home = env.get("PREFECT_HOME") or os.path.expanduser("~/.prefect")
    found = {}
    for path in glob.glob(os.path.join(home, "*.server-*.json")):
        try:
            with open(path) as f:
                pid = int(json.load(f)["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        st = _proc_stat(pid)
        if st is not None:
            found[pid] = st[0]
    return found


def measure(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """CPU seconds (user + sys, the command and its reaped children, plus what a shared temporary
    server spent meanwhile, its start too when the command started it), peak RSS (MB) and wall
    seconds of one command."""
    servers = shared_servers(env)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd:  # not the checkout: `-m` puts the cwd first on sys.path
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *argv],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        stderr = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    server = sum(cpu - servers.get(pid, 0.0) for pid, cpu in shared_servers(env).items())
    return {
        "cpu": usage.ru_utime + usage.ru_stime + server,
        "server_cpu": server,
        "rss_mb": usage.ru_maxrss / 1024,  # kilobytes on Linux
        "wall": wall,
        "code": os.waitstatus_to_exitcode(status),
        "stderr": stderr.decode(errors="replace")[-300:],
    }


def commands(root: str) -> dict[str, list[str]]:
    return {
        "--help": ["--help"],
        "config error": ["config", "--set", "no_such_field=1"],
        "config": ["config"],
        "status": ["status", "--root", root],
        "status --json": ["status", "--root", root, "--json"],
        "inspect corpus": ["inspect", os.path.join(root, "corpus"), "-n", "3"],
        "run (finished root)": ["run", "--preset", "tiny", "--root", root],
    }


def stage_fit(sizes: list[str], env: dict[str, str], work: str, repeat: int = 1) -> dict[str, float]:
    """``bertflow stage corpus`` on two corpus sizes, each on a new root (its stores created, as
    a first run makes them), the least CPU of ``repeat`` runs: CPU seconds = intercept + slope x MB."""
    points = []
    for size in sizes:
        data = os.path.join(work, f"data-{size}")
        run = measure(["synth-corpus", "--out", data, "--size", size, "--seed", "1"], env)
        if run["code"] != 0:
            raise SystemExit(f"synth-corpus {size} failed: {run['stderr']}")
        mb = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(data) for f in fs) / 1e6
        runs = []
        for i in range(repeat):
            got = measure(
                ["stage", "corpus", "--root", os.path.join(work, f"root-{size}-{i}"),
                 "--set", f"data.wiki={data}/wiki", "--set", f"data.books={data}/books"],
                env,
            )  # fmt: skip
            if got["code"] != 0:
                raise SystemExit(f"stage corpus {size} failed: {got['stderr']}")
            runs.append(got)
        got = min(runs, key=lambda r: r["cpu"])
        points.append((mb, got["cpu"]))
        print(f"  stage corpus on {size} ({mb:.1f} MB on disk): {got['cpu']:.2f} CPU-s, {got['wall']:.1f} s wall "
              f"(least of {', '.join(format(r['cpu'], '.2f') for r in runs)}; of which a shared temporary "
              f"server: {', '.join(format(r['server_cpu'], '.2f') for r in runs)})")  # fmt: skip
    (x1, y1), (x2, y2) = points
    slope = (y2 - y1) / (x2 - x1)
    return {"cpu": y1 - slope * x1, "slope": slope, "rss_mb": 0.0, "wall": 0.0, "code": 0}


def _proc_stat(pid: int) -> tuple[float, str] | None:
    """(CPU seconds of the process itself, command line) from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), cmd


def tree(argv: list[str], env: dict[str, str]) -> tuple[list[tuple[str, float]], float]:
    """One command's process tree, sampled from /proc every 20 ms (Linux): each process's own CPU
    seconds at its last sample (what ``rusage`` adds up, by process), and the wall seconds."""
    sys.path.insert(0, REPO)
    from flows.proc.supervisor import descendants

    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", *argv], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    seen: dict[int, tuple[float, str]] = {proc.pid: (0.0, "bertflow (supervisor)")}
    while proc.poll() is None:
        # every descendant, however deep; one seen before is still read after its parent is gone
        for pid in descendants(proc.pid) | set(seen):
            st = _proc_stat(pid)
            if st is not None:
                seen[pid] = (st[0], seen[pid][1] if pid in seen and seen[pid][1] else st[1])
        time.sleep(0.02)
    wall = time.perf_counter() - start

    def name(cmd: str) -> str:
        for key, label in (("uvicorn", "Prefect's temporary server"),
                           ("shared_server", "Prefect's shared temporary server"),
                           ("flows.cli", "bertflow (worker)"), ("wiki_reader", "dump reader"),
                           ("stage_entry", "stage process")):  # fmt: skip
            if key in cmd:
                return label
        return cmd[:60]

    rows = [(cmd if pid == proc.pid else name(cmd), cpu) for pid, (cpu, cmd) in seen.items() if cmd]
    return rows, wall


def series(env: dict[str, str], work: str) -> None:
    """``bertflow stage corpus``, ``vocab`` and ``examples`` (the tiny preset) on one new root, one
    after the other as a script runs them, then until a shared temporary server has stopped: the
    CPU seconds of the three commands (a shared server's share during each included) and of that
    server's idle time after the last one, its whole life counted."""
    root = os.path.join(work, "series")
    cpus = []
    for stage in ("corpus", "vocab", "examples"):
        got = measure(["stage", stage, "--preset", "tiny", "--root", root], env)
        if got["code"] != 0:
            raise SystemExit(f"stage {stage} failed: {got['stderr']}")
        cpus.append(got["cpu"])
        print(f"  stage {stage}: {got['cpu']:.2f} CPU-s (of which a shared server {got['server_cpu']:.2f}), "
              f"{got['wall']:.1f} s wall")  # fmt: skip
    at_last = shared_servers(env)
    start, seen, alive = time.perf_counter(), dict(at_last), dict(at_last)
    while alive:  # each until it has exited (its state file goes just before)
        time.sleep(0.5)
        alive = {pid: st[0] for pid in alive if (st := _proc_stat(pid)) is not None}
        seen.update(alive)
    idle = sum(seen[pid] - cpu for pid, cpu in at_last.items())
    print(f"  three commands: {sum(cpus):.2f} CPU-s; a shared server after the last one: {idle:.2f} CPU-s over "
          f"{time.perf_counter() - start:.0f} s; in all {sum(cpus) + idle:.2f} CPU-s")  # fmt: skip


def stage_tree(env: dict[str, str], work: str, repeat: int = 1) -> None:
    """``bertflow stage corpus --preset tiny`` on the bundled sample, by process, the least CPU of
    ``repeat`` runs after a first (the root's stores exist, as on a machine that has run before)."""
    argv = ["stage", "corpus", "--preset", "tiny", "--root", os.path.join(work, "tree")]
    tree(argv, env)
    rows, wall = min((tree(argv, env) for _ in range(repeat)), key=lambda t: sum(c for _, c in t[0]))
    print(f"\nstage corpus --preset tiny (bundled sample), by process, least of {repeat}, {wall:.1f} s wall:")
    for label, cpu in rows:
        print(f"  {cpu:7.2f} CPU-s  {label}")
    print(f"  {sum(c for _, c in rows):7.2f} CPU-s  in all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None, help="a finished tiny root made by the code measured")
    parser.add_argument("--repeat", type=int, default=3, help="runs per command; the least CPU is kept")
    parser.add_argument("--skip-run", action="store_true", help="leave out the finished root's `run`")
    parser.add_argument("--stage-fit", default=None, metavar="SIZE1,SIZE2", help="e.g. 1MB,8MB")
    parser.add_argument("--stage-fit-only", action="store_true", help="only the stage fit (no --root needed)")
    parser.add_argument("--tree", action="store_true", help="also: one stage's CPU by process (Linux)")
    parser.add_argument("--series", action="store_true", help="also: three stage commands in a row (no --root needed)")
    parser.add_argument("--json", default=None, help="save the figures here (for --before)")
    parser.add_argument("--before", default=None, help="figures saved by an earlier --json, printed beside")
    args = parser.parse_args()

    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH") or REPO}
    code = env["PYTHONPATH"].split(os.pathsep)[0]
    print(f"code: {code}; root: {args.root}; best of {args.repeat}; CPU-s = user + sys (rusage); "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")  # fmt: skip
    figures: dict[str, dict[str, float]] = {}
    only = args.stage_fit_only or ((args.tree or args.series) and not args.root)
    if not only and not args.root:
        parser.error("--root is needed (or --stage-fit-only, or --tree or --series alone)")
    for name, argv in commands(os.path.abspath(args.root or ".")).items():
        if only or (name.startswith("run") and args.skip_run):
            continue
        runs = [measure(argv, env) for _ in range(args.repeat)]
        figures[name] = {**min(runs, key=lambda r: r["cpu"]), "load": os.getloadavg()[0]}
    if args.stage_fit:
        with tempfile.TemporaryDirectory(prefix="bertflow-bench-") as work:
            figures["stage fixed cost"] = stage_fit(args.stage_fit.split(","), env, work, args.repeat)
    if args.tree:
        with tempfile.TemporaryDirectory(prefix="bertflow-bench-") as work:
            stage_tree(env, work, args.repeat)
    if args.series:
        with tempfile.TemporaryDirectory(prefix="bertflow-bench-") as work:
            print("\nstage corpus, vocab, examples --preset tiny, one after the other:")
            series(env, work)
    before = json.load(open(args.before)) if args.before else {}

    def cell(fig: dict | None, key: str, fmt: str) -> str:
        return format(fig[key], fmt) if fig and fig.get(key) else "-"

    if figures:
        print(f"\n{'command':<22} {'exit':>4} {'CPU-s':>7} {'RSS MB':>7} {'wall s':>7} {'load':>5}   "
              f"{'target':<22} {'before: CPU-s':>13} {'RSS MB':>7} {'wall s':>7} {'load':>5}")  # fmt: skip
    for name, fig in figures.items():
        cpu, rss, wall = TARGETS.get(name, (None, None, None))
        target = ", ".join(t for t in (cpu and f"<= {cpu} CPU-s", rss and f"<= {rss} MB", wall and f"<= {wall} s") if t)
        old = before.get(name)
        now = f"{fig['cpu']:7.2f} {cell(fig, 'rss_mb', '7.0f'):>7} {cell(fig, 'wall', '7.1f'):>7}"
        now += f" {cell(fig, 'load', '5.1f'):>5}"
        then = f"{cell(old, 'cpu', '13.2f'):>13} {cell(old, 'rss_mb', '7.0f'):>7} {cell(old, 'wall', '7.1f'):>7}"
        then += f" {cell(old, 'load', '5.1f'):>5}"
        print(f"{name:<22} {fig['code']:>4} {now}   {target or '-':<22} {then}")
        if name == "stage fixed cost":
            print(f"{'':<22} slope {fig['slope']:.3f} CPU-s per MB" + (f" (before {old['slope']:.3f})" if old else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
