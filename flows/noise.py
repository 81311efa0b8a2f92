"""Library messages that are nobody's to act on, silenced where bertflow's processes start.

A newcomer reads every warning of a successful run as trouble, so a run prints only what its user
can act on. What the libraries print that is not (each silenced by the narrowest means, never a
whole logger):

1. Beam's ``apitools not found, and bigquery client libraries are not available despite the
   import not raising an ImportError`` (a root-logger warning from ``import apache_beam`` when the
   ``gcp`` extra is absent): bertflow reads and writes no BigQuery; a ``gs://`` root says what it
   needs when it needs it. Dropped by a filter on the root logger, for that message only.
2. MLflow's artifact progress bars (``Downloading artifacts: 14%|...`` on stderr, rewritten in a
   file as one line per update) while the model is logged: ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR``.

Elsewhere, by the same rule: MLflow's "Add type hints to the `predict` method" at logging and at
every load (``flows/served_model.py``), its "Registered model ... already exists" on a new
registry (``flows.prefect_tasks.register_model_task``), and the pretraining heads a fine-tuning
backbone drops (``model.export.load_hf_state_dict``, now a ``--verbose`` line).
"""

from __future__ import annotations

import logging
import os

DROPPED = ("apitools not found, and bigquery client libraries are not available",)
"""Beginnings of root-logger messages that are dropped."""


class _Dropped(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(DROPPED)


def silence_library_noise() -> None:
    """Install the filters and settings above in this process (idempotent); call it before the
    libraries are imported."""
    root = logging.getLogger()
    if not any(isinstance(f, _Dropped) for f in root.filters):
        root.addFilter(_Dropped())
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
