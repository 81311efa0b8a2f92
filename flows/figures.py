"""Key figures of a stage: which of its manifest counts to show, and how to print one."""

from __future__ import annotations

import fnmatch
from typing import Any


def key_figures(figures: tuple[str, ...], counts: dict[str, float]) -> dict[str, float]:
    """The counts a row's ``figures`` patterns name (the first three if none match)."""
    picked = {k: v for k, v in counts.items() if any(fnmatch.fnmatchcase(k, w) for w in figures)}
    return picked or dict(list(counts.items())[:3])


def format_figure(v: Any) -> str:
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.4g}"
    return str(int(v)) if isinstance(v, float) else str(v)
