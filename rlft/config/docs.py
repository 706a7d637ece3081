"""`rlft list keys`: every key with its default and the docstring written under its field."""
from __future__ import annotations

import ast
import dataclasses
from enum import Enum
from typing import Optional

from rlft.config.algorithms import ALGO_SCHEMAS
from rlft.config.defaults import TABLE_KEYS
from rlft.config.schema import SECTIONS, Config


def field_docs(schema: type) -> dict[str, str]:
    """Field name -> docstring written under it in the dataclass source."""
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    for klass in reversed(schema.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # installed without sources: no docs, keys still listed
            continue
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def schema_for(section: str, algo_name: Optional[str] = None) -> Optional[type]:
    if section == "algo":
        return ALGO_SCHEMAS.get(algo_name or "", None)
    schema = SECTIONS.get(section)
    return schema if dataclasses.is_dataclass(schema) else None


def describe_keys(section: Optional[str] = None, algo_name: str = "sft") -> list[tuple[str, str, str]]:
    """(dotted key, default, doc) rows for `rlft list keys [section]` (nested sections included)."""
    top_docs = field_docs(Config)
    rows: list[tuple[str, str, str]] = []

    def walk(prefix: str, schema: type) -> None:
        docs = field_docs(schema)
        instance = schema()
        for sub in dataclasses.fields(schema):
            value = getattr(instance, sub.name)
            if dataclasses.is_dataclass(value):
                walk(f"{prefix}.{sub.name}", type(value))
            else:
                shown = repr(value.value) if isinstance(value, Enum) else repr(value)
                if value is None and f"{prefix}.{sub.name}" in TABLE_KEYS:
                    shown = "(table)"  # filled by the defaults table (rlft/config/defaults.py)
                rows.append((f"{prefix}.{sub.name}", shown, docs.get(sub.name, "")))

    for f in dataclasses.fields(Config):
        schema = schema_for(f.name, algo_name)
        if schema is None:
            default = f.default if f.default is not dataclasses.MISSING else ""
            rows.append((f.name, repr(default), top_docs.get(f.name, "")))
        else:
            walk(f.name, schema)
    if section:
        rows = [r for r in rows if r[0] == section or r[0].startswith(section + ".")]
    return rows
