"""Where a table keeps tokenloom's own keys (schema version, id high-water mark, side-file lists).

They live in the field metadata of the ``id`` column. That is part of the Lance schema, so each
version carries its own values, every Lance operation (append, merge, delete, compaction,
``cleanup_old_versions``) keeps them, and a reader of an old version sees that version's keys —
exactly as with the schema-level metadata they used to live in. The schema level is left empty
because lancedb 0.40.0's permutation builder (run by ``lancedb.streaming.StreamingDataset``)
copies a table's schema-level metadata into its own batches and then panics on the mismatch
("target schema is not superset of current schema"), whatever the key or value; field metadata
does not travel there. Tables written before keep the keys at the schema level:
:func:`table_metadata` reads both places (the field wins) and :func:`with_table_metadata` moves
them into the field at the table's next commit through it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

__all__ = ["META_FIELD", "META_PREFIX", "table_metadata", "with_table_metadata"]

META_FIELD = "id"
"""The base column whose field metadata holds the table's keys (present from creation on)."""
META_PREFIX = "tokenloom."
"""Keys of this prefix are tokenloom's; others at the schema level are left where they are."""


def table_metadata(schema: pa.Schema) -> dict[str, str]:
    """The table-level keys of a dataset's Arrow schema: the schema-level metadata (older
    tables, and keys other tools set) overlaid with the ``id`` field's ``tokenloom.*`` keys."""
    out = _decode(schema.metadata)
    if META_FIELD in schema.names:
        field_meta = _decode(schema.field(META_FIELD).metadata)
        out.update({k: v for k, v in field_meta.items() if k.startswith(META_PREFIX)})
    return out


def with_table_metadata(schema: Any, updates: Mapping[str, str]) -> Any:
    """A Lance schema equal to ``schema`` (a ``LanceSchema``; field ids and every other field
    unchanged) whose ``id`` field carries its current ``tokenloom.*`` keys, those still at the
    schema level (moved, not copied) and ``updates``.

    Raises:
        TableError: when this pylance's schema pickle form is not the one understood here, or
            the rebuilt schema does not read back as written.
    """
    from tokenloom.errors import TableError

    try:
        rebuild, (meta_json, *protos) = schema.__reduce__()  # (JSON, Field protos): pickle form
        top = {k: bytes(v) for k, v in json.loads(meta_json).items()}
        moved = {k: v for k, v in top.items() if k.startswith(META_PREFIX)}
        kept = {k: list(v) for k, v in top.items() if k not in moved}
        index = _meta_field_index(protos)
        fields, entries = _split_metadata(protos[index])
        merged = {**moved, **entries, **{k: v.encode() for k, v in updates.items()}}
        protos[index] = fields + b"".join(_map_entry(k, v) for k, v in sorted(merged.items()))
        out = rebuild(json.dumps(kept), *protos)
    except Exception as exc:  # noqa: BLE001 - name the cause, not a Lance internal
        raise TableError(
            f"cannot update tokenloom's table metadata with this pylance ({exc}); install the "
            "pylance version pinned in tokenloom's requirements"
        ) from exc
    written = table_metadata(out.to_pyarrow())
    expected = {k: v.decode(errors="replace") for k, v in merged.items()}
    if any(written.get(k) != v for k, v in expected.items()):
        raise TableError("tokenloom's table metadata did not read back as written; pin pylance")
    return out


def _decode(meta: Mapping[bytes, bytes] | None) -> dict[str, str]:
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in (meta or {}).items()}


# -- the few protobuf rules needed to edit one map field of Lance's ``Field`` message -----------
# Field: name = 2 (string), parent_id = 4 (int32, -1 at the top level), metadata = 10
# (map<string, bytes>, i.e. repeated entries {key = 1, value = 2}). Other fields are kept as bytes.

_NAME, _PARENT, _METADATA = 2, 4, 10


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _records(buf: bytes) -> list[tuple[int, int, bytes | int, bytes]]:
    """``(field number, wire type, value, raw bytes of the record)`` of a serialised message."""
    out = []
    pos = 0
    while pos < len(buf):
        start = pos
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: bytes | int
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = buf[pos : pos + size], pos + size
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")
        out.append((number, wire, value, buf[start:pos]))
    return out


def _meta_field_index(protos: list[bytes]) -> int:
    for i, proto in enumerate(protos):
        recs = _records(proto)
        name = next((v for n, w, v, _ in recs if n == _NAME and w == 2), b"")
        parent = next((v for n, w, v, _ in recs if n == _PARENT and w == 0), 0)
        if name == META_FIELD.encode() and parent == 2**64 - 1:  # int32 -1 as a varint
            return i
    raise ValueError(f"no top-level {META_FIELD!r} field in the schema")


def _split_metadata(proto: bytes) -> tuple[bytes, dict[str, bytes]]:
    """The message without its metadata entries, and those entries."""
    rest, entries = b"", {}
    for number, wire, value, raw in _records(proto):
        if number == _METADATA and wire == 2:
            assert isinstance(value, bytes)
            parts = {n: v for n, _w, v, _r in _records(value)}
            entries[bytes(parts.get(1, b"")).decode()] = bytes(parts.get(2, b""))
        else:
            rest += raw
    return rest, entries


def _map_entry(key: str, value: bytes) -> bytes:
    k = key.encode()
    entry = b"\x0a" + _encode_varint(len(k)) + k + b"\x12" + _encode_varint(len(value)) + value
    return _encode_varint(_METADATA << 3 | 2) + _encode_varint(len(entry)) + entry
