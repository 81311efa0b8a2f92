"""Config attribute docstrings (the string under a dataclass field) for ``--help``."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from functools import cache


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


def describe_fields(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, type, doc) of every leaf field under ``cls``, nested dataclasses expanded."""
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
        kind = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
        out.append((f"{prefix}{f.name}", kind, docs.get(f.name, "")))
    return out
