"""Dotted field paths: ``--text-field doc.text`` reaches into nested JSON objects and Parquet
structs.

The rule, the same for both formats: a key (or top-level column) named exactly like the whole
field wins, so a flat ``"doc.text"`` key keeps working; otherwise the field is split at every
``.`` and followed level by level. The text is *taken out* of its parent (what else the parent
holds stays in ``meta``), so it is never stored twice. Where the path breaks — a level missing, or
not an object — the record is rejected as ``missing_text_field`` with the level named; a value
that is there but not a string is ``non_string_text``, as for a flat field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Missing", "ParquetPath", "take_path", "parquet_path", "drop_path"]


@dataclass(frozen=True, slots=True)
class Missing:
    """Where a path broke in one record."""

    detail: str


def _keys(obj: dict) -> str:
    return ", ".join(sorted(map(str, obj))[:8])


def take_path(obj: dict, field: str) -> Any:
    """Remove and return the value at ``field`` in a JSON object (module rule).

    Returns:
        The value (any JSON value, ``None`` included), or :class:`Missing` saying where the path
        broke; ``obj`` is then unchanged.
    """
    if field in obj or "." not in field:
        if field not in obj:
            return Missing(f"no {field!r} key (keys: {_keys(obj)}); pass --text-field")
        return obj.pop(field)
    parts = field.split(".")
    parent = obj
    for depth, part in enumerate(parts[:-1]):
        here = ".".join(parts[: depth + 1])
        if part not in parent:
            where = f"under {'.'.join(parts[:depth])!r}" if depth else "in the record"
            return Missing(f"no {part!r} key {where} (keys: {_keys(parent)}) for {field!r}")
        child = parent[part]
        if not isinstance(child, dict):
            kind = "null" if child is None else type(child).__name__
            return Missing(f"{here!r} is {kind}, not an object, so {field!r} is missing")
        parent = child
    last = parts[-1]
    if last not in parent:
        under = ".".join(parts[:-1])
        return Missing(f"no {last!r} key under {under!r} (keys: {_keys(parent)}) for {field!r}")
    return parent.pop(last)


@dataclass(frozen=True, kw_only=True)
class ParquetPath:
    """Where a text field lives in a Parquet schema."""

    column: int
    """Index of the top-level column."""
    children: tuple[str, ...] = ()
    """Struct fields below it (empty: the column itself)."""


def parquet_path(names: Sequence[str], types: Sequence[Any], field: str) -> ParquetPath | str:
    """Resolve ``field`` in a Parquet schema (module rule).

    Args:
        names: Top-level column names.
        types: Their Arrow types.
        field: The text field.

    Returns:
        The path, or a message saying why the field is not there (the caller counts every row
        of the file as ``missing_text_field`` or ``duplicate_text_field``).
    """
    import pyarrow as pa

    exact = [i for i, name in enumerate(names) if name == field]
    if len(exact) > 1:
        return f"{len(exact)} columns are named {field!r}; rename all but one"
    if exact:
        return ParquetPath(column=exact[0])
    parts = field.split(".")
    top = [i for i, name in enumerate(names) if name == parts[0]]
    if len(parts) == 1 or len(top) != 1:
        if len(top) > 1:
            return f"{len(top)} columns are named {parts[0]!r}; rename all but one"
        return f"no {field!r} column (columns: {', '.join(names[:8])}); pass --text-field"
    kind = types[top[0]]
    for depth, part in enumerate(parts[1:], start=1):
        here = ".".join(parts[:depth])
        if not pa.types.is_struct(kind):
            return f"column {here!r} is {kind}, not a struct, so {field!r} is missing"
        found = [kind.field(j) for j in range(kind.num_fields) if kind.field(j).name == part]
        if len(found) != 1:
            fields = ", ".join(kind.field(j).name for j in range(kind.num_fields))
            return f"struct {here!r} has no {part!r} field (fields: {fields}) for {field!r}"
        kind = found[0].type
    return ParquetPath(column=top[0], children=tuple(parts[1:]))


def drop_path(value: Any, children: Sequence[str]) -> Any:
    """A struct cell (a dict) without the text at ``children`` (for ``meta``)."""
    if not children or not isinstance(value, dict):
        return value
    out = dict(value)
    head, rest = children[0], children[1:]
    if rest:
        out[head] = drop_path(out.get(head), rest)
    else:
        out.pop(head, None)
    return out
