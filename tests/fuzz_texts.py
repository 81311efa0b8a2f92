"""Random texts for the differential tests: a fast path against the plain form it replaces."""

import random
from collections.abc import Iterator, Sequence


def random_texts(pieces: Sequence[str], count: int, longest: int, seed: int) -> Iterator[str]:
    """``count`` texts, each of 0 to ``longest - 1`` pieces drawn from ``pieces`` (seeded: the same
    texts on every run)."""
    rng = random.Random(seed)
    for _ in range(count):
        yield "".join(rng.choice(pieces) for _ in range(rng.randrange(0, longest)))
