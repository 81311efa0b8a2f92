"""What ``bertflow`` exits with: the table ``--help`` and the README list, and the code of a failed
``run`` or ``stage`` (the code its stage's process ended with, ``flows.proc.protocol``)."""

from __future__ import annotations

EXIT_CODES = {
    0: "done (status: every stage done)",
    1: "a stage failed (its error is the last line on stderr; a rerun resumes)",
    2: "a configuration or input error (the last line names the field, file or root): found before any "
    "work, or by a stage, which a rerun meets again; status: no run root at that URL",
    3: "status: the root exists and some stage is not done (stale, missing or running); run, stage: "
    "pretraining's checkpoints cannot continue under this config (rerun with --force pretrain)",
    4: "run, stage: the pretraining loss diverged (NaN/inf; the last line names the step and the "
    "checkpoint; never retried: lower the learning rate)",
    5: "run, stage: a disk is full (the last line names the file, its filesystem and the space left; never "
    "retried: free space and rerun, which resumes)",
    6: "run, stage: the MLflow tracking server went away and did not come back within the wait "
    "(BERTFLOW_TRACKING_WAIT_S, 120 s; the last line names the server; never retried: restart it and rerun)",
    130: "interrupted by Ctrl-C (SIGINT); finished stages are kept",
    141: "the reader of the output went away (`bertflow config | head`): ended quietly",
    143: "stopped by SIGTERM; finished stages are kept",
}
"""What ``bertflow`` exits with; ``--help`` and the README list the same. A failed ``run`` or
``stage`` exits with the code its stage's process ended with (:func:`failure_code`)."""


def exit_codes_help() -> str:
    return "exit codes:\n" + "\n".join(f"  {code:>3}  {what}" for code, what in EXIT_CODES.items())


def failure_code(exc: BaseException) -> int:
    """What a failed ``run`` or ``stage`` exits with: the code of the stage process that failed
    when it is one of :data:`EXIT_CODES` (2 bad input, 3 a refused resume, 4 a divergence, 5 a full
    disk, 6 the tracking server gone), else the code a stage process would have exited with for
    ``exc`` (``exit_code_for``: an inline stage's bad input 2, a divergence 4, the server gone 6,
    anything a retry might fix 1)."""
    from flows.proc.protocol import EXIT_FAILED, StageProcessError, exit_code_for

    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:  # Prefect re-raises ours; units wrap theirs
        seen.add(id(cause))
        if isinstance(cause, StageProcessError):
            return cause.code if cause.code in EXIT_CODES and 0 < cause.code < 128 else EXIT_FAILED
        cause = cause.__cause__
    code = exit_code_for(exc)
    return code if code in EXIT_CODES else EXIT_FAILED


CLOSED_PIPE = 141
"""The exit code when the reader of stdout went away (``bertflow config | head``): 128 + SIGPIPE,
what a shell tool killed by it answers."""
