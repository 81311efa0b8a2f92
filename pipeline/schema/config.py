"""What configuration is made of, for every layer: the one error type, ``check()``, and the
recorded form of a config (flattened, digested, secrets redacted).

Each layer's typed dataclasses (``pipeline/*/config.py``, ``model/config.py``, ``tasks/config.py``,
``flows/presets.py``) validate themselves with :func:`check`, so a bad value fails at load with
a :class:`ConfigError` naming the field, whichever layer it belongs to. Manifests and MLflow
params record configs through :func:`redact` (secrets), :func:`flatten` and :func:`config_digest`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from typing import Any


class ConfigError(ValueError):
    """An invalid configuration value; the message names the field."""


def check(ok: bool, name: str, message: str) -> None:
    """Raise :class:`ConfigError` ``"<name>: <message>"`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{name}: {message}")


def suggest(name: str, choices) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` (``difflib``), or empty: for every
    message that refuses a mistyped name (a field, preset, task, stage, source)."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


_SECRET_WORDS = r"(pass(word|wd)?|secret|token|api[_-]?key|access[_-]?key|credentials?|private[_-]?key|auth)"
_SECRET_KEY = re.compile(rf"(^|[^a-z]){_SECRET_WORDS}$|secret", re.I)  # max_tokens is no secret
_SECRET_ARG = re.compile(rf"^(--?[\w.-]*?{_SECRET_WORDS}=).+$", re.I)
REDACTED = "***"


def redact(obj: Any, key: str = "") -> Any:
    """``obj`` with values that look like secrets replaced by ``***``: values under keys named like
    a password, token, secret or API key, and ``--name=value`` options with such names."""
    if isinstance(obj, dict):
        return {k: redact(v, str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        out, hide_next = [], False
        for v in obj:  # ["--password", "x"]: the value after a secret-named flag
            out.append(REDACTED if hide_next and isinstance(v, str) else redact(v, key))
            hide_next = isinstance(v, str) and v.startswith("-") and "=" not in v and bool(_SECRET_KEY.search(v))
        return type(obj)(out)
    if key and _SECRET_KEY.search(key) and obj not in (None, "", 0, False):
        return REDACTED
    if isinstance(obj, str):
        return _SECRET_ARG.sub(lambda m: m.group(1) + REDACTED, obj)
    return obj


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts and lists -> {"a.b.0.c": value}."""
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(d, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in d):
        out = {}
        for i, v in enumerate(d):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): list(d) if isinstance(d, tuple) else d}


def config_digest(obj: Any) -> str:
    """A stable digest of a JSON-able value (key order ignored)."""
    text = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
