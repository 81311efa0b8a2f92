"""Secrets in overrides never reach Prefect's parameters, MLflow params or manifests.

The CLI splits ``--set`` overrides: those whose name or value looks like a credential (see
``pipeline.schema.config.redact``) travel to the flow through the environment of this process, not as
flow parameters (which Prefect stores and shows); everything that is recorded goes through
``redact``. A deployment passes secrets the same way: an environment variable of its job
(``BERTFLOW_SECRET_OVERRIDES``, e.g. from a Prefect Secret block or the pool's job variables).
"""

from __future__ import annotations

import json
import os
from typing import Any

from pipeline.schema.config import redact

ENV_SECRET_OVERRIDES = "BERTFLOW_SECRET_OVERRIDES"


def split_secret_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(public, secret): an override is secret when redacting it changes it."""
    public, secret = {}, {}
    for key, value in overrides.items():
        (secret if redact({key: value}) != {key: value} else public)[key] = value
    return public, secret


def merge_secret_overrides(overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``overrides`` plus the secret ones passed through the environment."""
    merged = dict(overrides or {})
    raw = os.environ.get(ENV_SECRET_OVERRIDES)
    if raw:
        merged.update(json.loads(raw))
    return merged
