"""Where a command's processes spend their time, from a py-spy profile: by process, then by the
first module each import started from, or by a function's inclusive samples.

    pip install py-spy
    py-spy record --subprocesses -r 100 -f raw -o spy.txt -- python -m flows.cli stage corpus --preset tiny --root R
    python benchmarks/spy_summary.py spy.txt                  # by process, then imports / the rest
    python benchmarks/spy_summary.py spy.txt --functions 'flows/|pipeline/' --process flows.cli

py-spy samples the threads that are not idle, ``-r`` times a second; the figures are samples /
rate, in seconds (close to CPU seconds on a quiet machine, above them on a loaded one).
"""

from __future__ import annotations

import argparse
import collections
import re

_PREFIX = re.compile(r"/[^ ]*?/(site-packages|python3\.\d+)/|/[^ ]*?/(flows|pipeline|model|tasks)/(?=[\w/]+\.py)")
_MODULE = re.compile(r"<module> \(([^:)]+)\.py")


def _short(frame: str) -> str:
    return _PREFIX.sub(lambda m: "" if m.group(1) else f"{m.group(2)}/", re.sub(r":\d+\)", ")", frame))


def read(path: str):
    """(process, frames, samples) per line of py-spy's raw (collapsed) output."""
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            procs = [f for f in frames if f.startswith("process ")]
            yield (procs[-1] if procs else "?"), [_short(f) for f in frames if not f.startswith("process ")], int(n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", help="py-spy record -f raw output")
    ap.add_argument("--rate", type=float, default=100.0, help="the -r given to py-spy")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--process", default=None, help="only processes whose command line holds this")
    ap.add_argument("--functions", default=None, help="regex: inclusive samples of the matching functions")
    args = ap.parse_args()

    per_process: collections.Counter[str] = collections.Counter()
    kinds: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    functions: collections.Counter[str] = collections.Counter()
    pattern = re.compile(args.functions) if args.functions else None
    for proc, frames, n in read(args.profile):
        if args.process and args.process not in proc:
            continue
        per_process[proc] += n
        first = next((i for i, f in enumerate(frames) if f.startswith("_find_and_load")), None)
        module = next((m.group(1) for f in frames[first or 0 :] if (m := _MODULE.match(f))), None)
        kind = "import " + "/".join(module.split("/")[:2]) if first is not None and module else "running"
        kinds[proc][kind] += n
        if pattern:
            for f in set(frames):
                if pattern.search(f):
                    functions[f] += n
    for proc, n in per_process.most_common():
        print(f"{n / args.rate:7.2f} s  {proc[:110]}")
        for kind, m in kinds[proc].most_common(args.top):
            print(f"         {m / args.rate:6.2f}  {kind}")
    if pattern:
        print("\ninclusive, by function:")
        for f, n in functions.most_common(args.top * 3):
            print(f"{n / args.rate:7.2f} s  {f[:140]}")


if __name__ == "__main__":
    main()
