"""Typed columns at ingest: fields promoted out of ``meta`` into real, filterable columns.

``--columns score:float,lang:string,image:binary`` names record fields that become columns of
their own type (``score >= 3`` then works as SQL); every other field stays in the ``meta`` JSON.
A Parquet file's own binary columns are always promoted (as ``blob``), so bytes are never stored
as a Python ``repr`` string; a field named without a type takes its Parquet type.

Kinds and their Arrow types:

========  ==================  ============================================================
kind      Arrow type          a JSON value accepted
========  ==================  ============================================================
int       int64               an integer (a float with no fraction, a decimal string)
float     float64             a number (a numeric string)
string    string              a string (numbers and booleans as their JSON text)
bool      bool                true/false
binary    large_binary        a base64 string (JSON has no bytes); Parquet binary as is
blob      large_binary, Lance blob encoding (read lazily with ``take_blobs``)
========  ==================  ============================================================

A value that does not convert rejects its record as ``bad_column_value`` (never a silent null);
a missing field or JSON ``null`` is a null.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from tokenloom.errors import IngestError
from tokenloom.table.names import ColumnNameError, validate_column_name
from tokenloom.table.schema import BASE_SCHEMA

__all__ = [
    "KINDS",
    "BLOB_METADATA",
    "INGEST_COLUMN_KEY",
    "ColumnSpec",
    "BadColumnValue",
    "parse_columns",
    "kind_of_arrow",
    "resolve_columns",
    "arrow_field",
    "convert",
]

BLOB_METADATA = {"lance-encoding:blob": "true"}
"""Field metadata that makes Lance store a large_binary column out of line (blob encoding)."""

INGEST_COLUMN_KEY = "tokenloom.ingest_column"
"""Field metadata marking a typed column made by ingest: later ingests fill it too (a record
field of that name goes to the column, not to ``meta``), so the column means one thing."""

KINDS: dict[str, pa.DataType] = {
    "int": pa.int64(),
    "float": pa.float64(),
    "string": pa.string(),
    "bool": pa.bool_(),
    "binary": pa.large_binary(),
    "blob": pa.large_binary(),
}
"""Column kinds ``--columns`` accepts, and their Arrow types."""


class BadColumnValue(ValueError):
    """A record's value cannot be stored in its typed column."""


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """One typed column."""

    name: str
    """The record field, and the column's name."""
    kind: str | None
    """One of :data:`KINDS`; ``None`` until resolved from a Parquet schema."""


def parse_columns(text: str | Sequence[str] | None) -> tuple[ColumnSpec, ...]:
    """Parse ``"score:float,lang:string,image"`` (a field without a type takes its Parquet type).

    Raises:
        IngestError: A bad name, an unknown kind, a base column or a repeated name.
    """
    if not text:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[ColumnSpec] = []
    for item in items:
        name, _, kind = item.strip().partition(":")
        name, kind = name.strip(), kind.strip().lower()
        try:
            validate_column_name(name, what="--columns name")
        except ColumnNameError as exc:
            raise IngestError(str(exc)) from exc
        if name in BASE_SCHEMA.names:
            raise IngestError(
                f"--columns {name!r}: {name!r} is a base column of every table; rename the field "
                f"or leave it in meta"
            )
        if kind and kind not in KINDS:
            raise IngestError(
                f"--columns {item.strip()!r}: unknown type {kind!r}; use one of {', '.join(KINDS)}"
            )
        out.append(ColumnSpec(name, kind or None))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise IngestError(f"--columns names a field twice: {', '.join(names)}")
    return tuple(out)


def kind_of_arrow(dtype: pa.DataType) -> str | None:
    """The kind an Arrow (Parquet) type is stored as, or ``None`` when it has none."""
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if pa.types.is_integer(dtype):
        return "int"
    if pa.types.is_floating(dtype) or pa.types.is_decimal(dtype):
        return "float"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "string"
    if pa.types.is_boolean(dtype):
        return "bool"
    if (
        pa.types.is_binary(dtype)
        or pa.types.is_large_binary(dtype)
        or pa.types.is_fixed_size_binary(dtype)
    ):
        return "blob"
    return None


def resolve_columns(
    declared: Sequence[ColumnSpec],
    parquet_schemas: Iterable[pa.Schema],
    *,
    text_field: str,
    table_schema: pa.Schema | None,
) -> tuple[ColumnSpec, ...]:
    """The run's typed columns: the declared ones (types from Parquet where not given), then
    every Parquet binary column not declared (as ``blob``), then every typed column an earlier
    ingest made (marked with :data:`INGEST_COLUMN_KEY`), so a field keeps its column.

    Raises:
        IngestError: A declared column has no type and no Parquet file types it, or its type
            differs from the table's column of that name.
    """
    out = {c.name: c for c in declared}
    for schema in parquet_schemas:
        for field in schema:
            if field.name in (text_field, "source") or field.name in BASE_SCHEMA.names:
                continue
            kind = kind_of_arrow(field.type)
            have = out.get(field.name)
            if have is not None and have.kind is None and kind is not None:
                out[field.name] = ColumnSpec(field.name, kind)
            elif have is None and kind == "blob":
                _check_name(field.name)
                out[field.name] = ColumnSpec(field.name, "blob")
    if table_schema is not None:
        for field in table_schema:
            if (field.metadata or {}).get(INGEST_COLUMN_KEY.encode()) and field.name not in out:
                out[field.name] = ColumnSpec(field.name, None)
    for c in list(out.values()):
        if c.kind is None:
            existing = _table_kind(table_schema, c.name)
            if existing is None:
                raise IngestError(
                    f"--columns {c.name!r} has no type and no Parquet input types it; "
                    f"write {c.name}:TYPE with TYPE one of {', '.join(KINDS)}"
                )
            out[c.name] = ColumnSpec(c.name, existing)
    for c in out.values():
        existing = _table_kind(table_schema, c.name)
        if existing is not None and not _same_storage(existing, c.kind):
            raise IngestError(
                f"column {c.name!r} is already a {existing} column of the table, but this ingest "
                f"makes it {c.kind}; pass --columns {c.name}:{existing}"
            )
        if existing is not None:  # keep the table's kind (binary vs blob)
            out[c.name] = ColumnSpec(c.name, existing)
    return tuple(out.values())


def _check_name(name: str) -> None:
    try:
        validate_column_name(name, what="Parquet binary column")
    except ColumnNameError as exc:
        raise IngestError(f"{exc}; rename the column in the Parquet file") from exc


def _same_storage(a: str | None, b: str | None) -> bool:
    binary = {"binary", "blob"}
    return a == b or (a in binary and b in binary)


def _table_kind(schema: pa.Schema | None, name: str) -> str | None:
    if schema is None or name not in schema.names:
        return None
    field = schema.field(name)
    if (field.metadata or {}).get(b"lance-encoding:blob") == b"true":
        return "blob"
    kind = kind_of_arrow(field.type)
    if kind == "blob":
        return "binary"
    if kind is None:
        raise IngestError(
            f"the table already has a column {name!r} of type {field.type}, which ingest "
            f"cannot fill; leave the field in meta (drop it from --columns)"
        )
    return kind


def arrow_field(spec: ColumnSpec) -> pa.Field:
    """The column's Arrow field (nullable; blob columns carry :data:`BLOB_METADATA`)."""
    assert spec.kind is not None, "resolve_columns gives every column a kind"
    meta = {INGEST_COLUMN_KEY: spec.kind, **(BLOB_METADATA if spec.kind == "blob" else {})}
    return pa.field(spec.name, KINDS[spec.kind], nullable=True, metadata=meta)


def convert(value: Any, kind: str) -> Any:
    """A record's value as the column's Python value (``None`` stays null).

    Raises:
        BadColumnValue: The value does not convert (the message says what it was).
    """
    if value is None:
        return None
    if kind == "int":
        if isinstance(value, bool):
            raise BadColumnValue(f"expected an integer, got {value!r}")
        if isinstance(value, int):
            if not -(2**63) <= value < 2**63:
                raise BadColumnValue(f"integer {value} does not fit 64 bits")
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return convert(int(value.strip()), kind)
            except ValueError:
                pass
        raise BadColumnValue(f"expected an integer, got {_show(value)}")
    if kind == "float":
        if isinstance(value, bool):
            raise BadColumnValue(f"expected a number, got {value!r}")
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        if type(value).__name__ == "Decimal":
            return float(value)
        raise BadColumnValue(f"expected a number, got {_show(value)}")
    if kind == "string":
        if isinstance(value, str):
            return value
        if isinstance(value, bool | int | float):
            return str(value).lower() if isinstance(value, bool) else str(value)
        raise BadColumnValue(f"expected a string, got {_show(value)}")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise BadColumnValue(f"expected true or false, got {_show(value)}")
    if kind in ("binary", "blob"):
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        if isinstance(value, str):
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise BadColumnValue(
                    f"expected base64 text (JSON carries bytes as base64), got {_show(value)}"
                ) from None
        raise BadColumnValue(f"expected bytes or base64 text, got {_show(value)}")
    raise AssertionError(f"unknown kind {kind!r}")


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
