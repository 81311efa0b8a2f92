"""Configs from plain data: ``--set FIELD=VALUE`` overrides and JSON specs, built back into the typed dataclasses.

One path for both: a config is turned into plain data (``dataclasses.asdict``), overrides are
set into that data by dotted path (``pretrain.phases.0.steps=50``; all of them before anything
is built, so coupled fields such as ``examples.max_seq_lengths`` and
``examples.max_predictions_per_seq`` change together), and :func:`build` makes the dataclasses
again, so every value goes back through their own validation (``__post_init__``) and a bad one
fails before any work starts, naming the field. A misspelt field, task or preset gets the
closest name as a suggestion.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

from pipeline.schema.config import ConfigError, suggest

__all__ = ["apply_overrides", "build", "parse_overrides", "suggest"]


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["pretrain.learning_rate=5e-4", "data.wiki=gs://b/dump"]`` -> dict (values JSON when they
    parse, else the text as it is)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected FIELD=VALUE, e.g. pretrain.learning_rate=5e-4")
        key, raw = item.split("=", 1)
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def apply_overrides(cls: type, data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``data`` (of dataclass ``cls``, as ``asdict`` gives it) with each dotted-path override set."""
    data = json.loads(json.dumps(data))  # a deep copy of plain data
    for path, value in overrides.items():
        _set(cls, data, path.split("."), value, path)
    return data


def _set(hint: Any, node: Any, keys: list[str], value: Any, path: str) -> None:
    head, rest = keys[0], keys[1:]
    done = path[: len(path) - len(".".join(rest))].rstrip(".")
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        if head not in hints:
            raise ConfigError(
                f"{done}: {hint.__name__} has no field {head!r}{suggest(head, hints)}; fields: {sorted(hints)}"
            )
        if not rest:
            node[head] = value
        else:
            _set(hints[head], node.setdefault(head, {}), rest, value, path)
        return
    if isinstance(node, list):
        try:
            index = int(head)
            node[index]
        except (ValueError, IndexError):
            raise ConfigError(f"{done}: not an index of a {len(node)}-entry list") from None
        if not rest:
            node[index] = value
        else:
            _set(_item_hint(hint), node[index], rest, value, path)
        return
    if isinstance(node, dict):  # a free str -> value map (data.downstream_urls.<task>=...)
        if rest:
            raise ConfigError(f"{done}: a map of plain values, cannot descend into {head!r}")
        node[head] = value
        return
    raise ConfigError(f"{done}: cannot descend into a {type(node).__name__}")


def _item_hint(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not Ellipsis]
    return args[0] if args else object


def build(cls: Any, data: Any, path: str = "") -> Any:
    """A value of type ``cls`` from plain data: dataclasses (validated by their ``__post_init__``),
    tuples (from lists, a single value, or "a,b" / "[a, b]" text), numbers and booleans from text."""
    if dataclasses.is_dataclass(cls):
        if not isinstance(data, dict):
            raise ConfigError(f"{path or cls.__name__}: expected an object of {cls.__name__} fields, got {data!r}")
        hints = typing.get_type_hints(cls)
        unknown = sorted(set(data) - set(hints))
        if unknown:
            raise ConfigError(
                f"{path + '.' if path else ''}{unknown[0]}: {cls.__name__} has no field {unknown[0]!r}"
                f"{suggest(unknown[0], hints)}; fields: {sorted(hints)}"
            )
        kwargs = {k: build(hints[k], v, f"{path}.{k}" if path else k) for k, v in data.items()}
        try:
            return cls(**kwargs)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path or cls.__name__}: {exc}") from exc
    origin = typing.get_origin(cls)
    if origin in (typing.Union, types.UnionType):
        arms = typing.get_args(cls)
        if data is None and type(None) in arms:
            return None
        arm = next((a for a in arms if a is not type(None)), object)
        return build(arm, data, path)
    if origin is tuple:
        if isinstance(data, str):  # "a,b" or "[a, b]" from a command line
            data = [s.strip().strip("'\"") for s in data.strip().removeprefix("[").removesuffix("]").split(",")]
            data = [s for s in data if s]
        elif not isinstance(data, (list, tuple)):
            data = [data]
        inner = _item_hint(cls)
        return tuple(build(inner, v, f"{path}.{i}") for i, v in enumerate(data))
    if origin is dict:
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a map, got {data!r}")
        return dict(data)
    return _scalar(cls, data, path)


def _scalar(kind: Any, value: Any, path: str) -> Any:
    if kind is bool:
        if isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ConfigError(f"{path}: expected true/false, got {value!r}")
            return value.lower() in ("true", "1")
        return bool(value)
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: expected int, got {value!r}") from None
    if kind in (float, str):
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: expected {kind.__name__}, got {value!r}") from None
    return value
