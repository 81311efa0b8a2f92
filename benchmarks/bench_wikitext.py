"""The wikitext cleaner on adversarial and growing inputs: seconds per input, and time against size.

    python benchmarks/bench_wikitext.py [--repeat 3]

Prints, for each adversarial page (deep nesting, unclosed openers, a table of 5,000 rows ...),
the best of ``--repeat`` wall times, and for one realistic page repeated 200 to 20,000 times the
time per MB, which a linear-time cleaner keeps flat. These figures used to be timed assertions in
the test suite; tests now check only what the cleaner returns.
"""

from __future__ import annotations

import argparse
import time

from pipeline.corpus.wikitext import clean_wikitext

ADVERSARIAL = {
    "nested templates x5000": "{{a|" * 5000 + "x" + "}}" * 5000,
    "nested links x5000": "[[a|" * 5000 + "x" + "]]" * 5000,
    "unclosed {{ x20000": "{{" * 20000 + "x",
    "unclosed [[ x20000": "[[" * 20000 + "x",
    "<ref> x20000": "<ref>" * 20000,
    "table openers x5000": "{|\n" * 5000,
    "'' x50000": "''" * 50000,
}
PAGE = (
    "{{Infobox x|a={{b|c}}}}\n'''Word''' is a [[thing|things]] in [[Place]].<ref>{{cite|x}}</ref> "
    "More prose &amp; text here.\n\n{|\n| a || b\n|}\n== Section ==\nSome more prose. "
)


def best(text: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        clean_wikitext(text)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| adversarial input | chars | seconds (best of %d) |" % args.repeat)
    print("|---|---|---|")
    for name, text in ADVERSARIAL.items():
        print(f"| {name} | {len(text):,} | {best(text, args.repeat):.3f} |")
    print()
    print("| realistic page x N | MB | seconds | seconds per MB |")
    print("|---|---|---|---|")
    for n in (200, 2000, 20000):
        text = PAGE * n
        seconds = best(text, args.repeat)
        mb = len(text.encode()) / 1e6
        print(f"| x{n:,} | {mb:.2f} | {seconds:.3f} | {seconds / mb:.3f} |")


if __name__ == "__main__":
    main()
