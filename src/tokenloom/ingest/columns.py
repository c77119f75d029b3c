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

**Source types are kept.** A numeric column typed by Parquet/Arrow inputs keeps their type
(``int8``...``int64``, ``uint8``...``uint64``, ``float16``/``float32``/``float64``): a ``float32``
score stays ``float32``. Inputs that disagree are promoted to a type holding both (``int32`` and
``int64``: ``int64``; ``int32`` and ``uint32``: ``int64``; ``int16`` and ``float32``:
``float32``; ``int32``/``int64`` and a float: ``float64``, exact up to 2**53); an unsigned
64-bit column beside a signed one has no such type and is refused, naming both files. A column
the table already has keeps the table's type; JSONL values (which have no width) are converted
into the column's type, and one that does not fit (``300`` in ``int8``) rejects its record as
``bad_column_value``. A declared kind of another family (``--columns n:float`` over an ``int32``
column) is stored as that kind's default type (the table above).
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
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
    "promote_numeric",
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
    arrow: pa.DataType | None = None
    """The exact storage type when a source or the table gives one (``int32``, ``float32``...);
    ``None``: the kind's type in :data:`KINDS`."""


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


def _numeric(dtype: pa.DataType) -> pa.DataType | None:
    """The numeric storage type a source type keeps (``None``: not numeric; decimals are
    stored as float64)."""
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype):
        return dtype
    if pa.types.is_decimal(dtype):
        return pa.float64()
    return None


def _float_of(bits: int) -> pa.DataType:
    return {16: pa.float16(), 32: pa.float32()}.get(bits, pa.float64())


def promote_numeric(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The narrowest numeric type holding every value of both, or ``None`` when none does
    (``uint64`` beside a signed type). Integers and floats meet in a float wide enough for the
    integer's values (float64 for 32 and 64-bit integers: exact up to 2**53)."""
    if a == b:
        return a
    fa, fb = pa.types.is_floating(a), pa.types.is_floating(b)
    if fa and fb:
        return a if a.bit_width >= b.bit_width else b
    if fa or fb:
        f, i = (a, b) if fa else (b, a)
        need = i.bit_width + (0 if pa.types.is_signed_integer(i) else 1)
        bits = 32 if need <= 24 else 64  # float32 holds integers of 24 bits exactly
        return _float_of(max(f.bit_width, bits))
    sa, sb = pa.types.is_signed_integer(a), pa.types.is_signed_integer(b)
    if sa == sb:
        return a if a.bit_width >= b.bit_width else b
    signed, unsigned = (a, b) if sa else (b, a)
    bits = max(signed.bit_width, 2 * unsigned.bit_width)
    return None if bits > 64 else getattr(pa, f"int{bits}")()


def resolve_columns(
    declared: Sequence[ColumnSpec],
    parquet_schemas: Iterable[pa.Schema | tuple[str, pa.Schema]],
    *,
    text_field: str,
    table_schema: pa.Schema | None,
) -> tuple[ColumnSpec, ...]:
    """The run's typed columns: the declared ones (types from Parquet where not given), then
    every Parquet binary column not declared (as ``blob``), then every typed column an earlier
    ingest made (marked with :data:`INGEST_COLUMN_KEY`), so a field keeps its column. Numeric
    columns keep their source type (see the module docstring).

    Args:
        parquet_schemas: The schema of each Parquet/Arrow input, or ``(file name, schema)``.

    Raises:
        IngestError: A declared column has no type and no Parquet file types it, its type
            differs from the table's column of that name, or its inputs' numeric types have
            no common type.
    """
    out = {c.name: c for c in declared}
    explicit = {c.name for c in declared if c.kind is not None}
    source: dict[str, tuple[pa.DataType, str]] = {}  # numeric source type, and whose it is
    for item in parquet_schemas:
        where, schema = item if isinstance(item, tuple) else ("a Parquet input", item)
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
            numeric = _numeric(field.type)
            if numeric is not None and field.name in out:
                source[field.name] = _promoted(field.name, source.get(field.name), numeric, where)
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
    for c in list(out.values()):
        existing = _table_kind(table_schema, c.name)
        if existing is not None and not _same_storage(existing, c.kind):
            raise IngestError(
                f"column {c.name!r} is already a {existing} column of the table, but this ingest "
                f"makes it {c.kind}; pass --columns {c.name}:{existing}"
            )
        if existing is not None:  # keep the table's kind (binary vs blob) and its exact type
            assert table_schema is not None
            out[c.name] = ColumnSpec(c.name, existing, table_schema.field(c.name).type)
        elif c.name in source:
            typed = source[c.name][0]
            if c.name not in explicit:  # the kind follows the promoted type (int and float)
                out[c.name] = ColumnSpec(c.name, kind_of_arrow(typed), typed)
            elif kind_of_arrow(typed) == c.kind:
                out[c.name] = ColumnSpec(c.name, c.kind, typed)
    return tuple(out.values())


def _promoted(
    name: str, have: tuple[pa.DataType, str] | None, new: pa.DataType, where: str
) -> tuple[pa.DataType, str]:
    if have is None:
        return new, where
    both = promote_numeric(have[0], new)
    if both is None:
        raise IngestError(
            f"column {name!r} is {have[0]} in {have[1]} but {new} in {where}: no integer type "
            f"holds both; cast one file's column, or pass --columns {name}:float (or leave "
            "the field in meta)"
        )
    return both, where if both == new else have[1]


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
    """The column's Arrow field: its exact type, else the kind's (nullable; blob columns carry
    :data:`BLOB_METADATA`)."""
    assert spec.kind is not None, "resolve_columns gives every column a kind"
    meta = {INGEST_COLUMN_KEY: spec.kind, **(BLOB_METADATA if spec.kind == "blob" else {})}
    return pa.field(spec.name, spec.arrow or KINDS[spec.kind], nullable=True, metadata=meta)


def convert(value: Any, kind: str, arrow: pa.DataType | None = None) -> Any:
    """A record's value as the column's Python value (``None`` stays null).

    Args:
        arrow: The column's exact type, when narrower than the kind's: a value outside its
            range does not convert.

    Raises:
        BadColumnValue: The value does not convert (the message says what it was).
    """
    out = _convert(value, kind)
    if out is None or arrow is None or isinstance(out, bool):
        return out
    if pa.types.is_integer(arrow) and isinstance(out, int):
        bits = arrow.bit_width
        low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1)) if arrow.id in _SIGNED else (0, 2**bits)
        if not low <= out < high:
            raise BadColumnValue(f"integer {out} does not fit the column's type {arrow}")
    elif pa.types.is_floating(arrow) and arrow.bit_width < 64 and isinstance(out, float):
        if math.isfinite(out) and not math.isfinite(_rounded(out, arrow.bit_width)):
            raise BadColumnValue(f"number {out!r} does not fit the column's type {arrow}")
    return out


_SIGNED = frozenset(t.id for t in (pa.int8(), pa.int16(), pa.int32(), pa.int64()))


def _rounded(value: float, bits: int) -> float:
    """``value`` rounded to a float of ``bits`` bits (infinite when it overflows)."""
    try:
        return struct.unpack(
            "e" if bits == 16 else "f", struct.pack("e" if bits == 16 else "f", value)
        )[0]
    except OverflowError:
        return math.inf


def _convert(value: Any, kind: str) -> Any:
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
                return _convert(int(value.strip()), kind)
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
