"""Config attribute docstrings (the string under a dataclass field) for ``--help``."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import typing
from functools import cache
from typing import Any


@cache
def attribute_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` read off the class source: a string right after an annotated field."""
    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def field_default(f: dataclasses.Field) -> Any:
    """A field's default value (its factory called), or ``dataclasses.MISSING``."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def format_default(value: Any) -> str:
    """A default as it is written on the command line: JSON (``""``, ``[128, 512]``, ``null``)."""
    if value is dataclasses.MISSING:
        return "required"
    return json.dumps(value, default=str)


def describe_fields(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted name, type, default as JSON, doc) of every leaf field under ``cls``, nested
    dataclasses expanded (the default of a class's own field: presets change many)."""
    out = []
    hints = typing.get_type_hints(cls)
    docs = attribute_docs(cls)
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name, f.type)
        if dataclasses.is_dataclass(hint):
            out += describe_fields(hint, f"{prefix}{f.name}.")
            continue
        args = typing.get_args(hint)
        if typing.get_origin(hint) is tuple and args and dataclasses.is_dataclass(args[0]):
            out += describe_fields(args[0], f"{prefix}{f.name}.N.")
            continue
        kind = str(hint).replace("typing.", "") if args else getattr(hint, "__name__", None) or str(hint)
        out.append((f"{prefix}{f.name}", kind, format_default(field_default(f)), docs.get(f.name, "")))
    return out
