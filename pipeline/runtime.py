"""How bertflow's own processes use Python's garbage collector: less often, and not at exit.

Python collects the youngest generation every 700 allocations net of frees (3.11), and every
collection of the oldest walks every object alive. A process that imports Prefect, MLflow and
Beam holds ~480,000 objects after its imports, and a stage's work allocates millions more, so
the collector ran ~1,200 times in the worker of ``bertflow stage corpus`` on the bundled sample
and took 0.82 of its 4.32 CPU-seconds (timed with ``gc.callbacks``); the corpus job on the real
enwiki dump ×10 spent 0.40 CPU-s in it, Prefect's temporary server 0.28 of its 2.9 CPU-s to
start. Then, at exit, the interpreter's shutdown collected again (``gc_collect_main`` under the
finalisation in py-spy): 0.3 CPU-s for the corpus job's driver after its work was done, ~0.7 for
the command's worker.

:func:`economical_gc` is called first thing by each of the project's entry points (the command,
its stage and training processes, the dump reader); the command's worker and Prefect's temporary
server are started through :func:`module_command`, so that it runs before their first import.
The youngest generation is then collected every :data:`GEN0_THRESHOLD` allocations (Python 3.13
raised its own default to 2,000 for the same reason), and what is alive at exit is frozen
(``gc.freeze``, by an ``atexit`` handler) so that the shutdown's collections skip it. Memory:
garbage in reference cycles waits a little longer (most objects are freed by their reference
count, not by the collector); the peak resident size of the corpus job moved by under 1%.
Nothing is skipped at exit but those collections: every ``atexit`` handler runs (logging's
flush, Prefect's, MLflow's, ``weakref.finalize``), objects whose last reference goes are freed
as before; objects in cycles at exit are left to the OS, as Python does not promise their
``__del__`` at exit anyway (every output is closed explicitly, the manifest last). Results do
not depend on when garbage is collected: the outputs are byte-identical.
"""

from __future__ import annotations

import atexit
import gc
import sys

GEN0_THRESHOLD = 10_000
"""Allocations (net of frees) between collections of the youngest generation (Python: 700)."""

_frozen_at_exit = False


def economical_gc() -> None:
    """Collect less often in this process, and not at its exit (see the module docstring).
    Once per process; a higher threshold set by the user is kept."""
    global _frozen_at_exit
    threshold, *older = gc.get_threshold()
    if 0 < threshold < GEN0_THRESHOLD:
        gc.set_threshold(GEN0_THRESHOLD, *older)
    if not _frozen_at_exit:
        atexit.register(gc.freeze)
        _frozen_at_exit = True


_RUN_MODULE = (
    "import runpy, sys; from pipeline.runtime import economical_gc; economical_gc(); "
    "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
)


def module_command(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS``, with :func:`economical_gc` in force from the process's first
    import (the module's own imports are most of a short process's allocations: the command's
    worker collected 37 times more, 0.14 CPU-s, when ``main`` set it after them). The module runs
    as ``-m`` runs it (``runpy``, ``__main__``, ``sys.argv[0]`` its file, the same arguments)."""
    return [sys.executable, "-c", _RUN_MODULE, module, *args]
