"""How a token column is stored, and reading it back: the one owner of the token layouts.

A token column holds one document's token ids per row, in one of two layouts:

* ``list`` (the default): ``list<uint16>`` when the vocabulary fits, else ``list<int32>``.
* ``bytes``: one ``large_binary`` value per row holding the ids as raw little-endian integers
  (no list offsets), the id type named in the field's metadata (``tokenloom.token_layout``:
  ``bytes:uint16`` or ``bytes:int32``). A random read of one row from an object store then
  fetches about the row's bytes (measured through 20 ms on a local S3 server, random takes of
  1,000 rows from 200k: 1.47x the bytes used, against 4.4x for ``list<uint16>``, whose pages
  are read in mini-block chunks of ~2 KiB).

Every reader of a token column goes through :func:`token_lists` (flat values and offsets) or
:func:`as_token_lists` (an Arrow list array), so both layouts read the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from tokenloom.errors import TokenloomError

__all__ = [
    "LAYOUTS",
    "LAYOUT_META_KEY",
    "TokenLayoutError",
    "TokenLists",
    "as_token_lists",
    "is_bytes_layout",
    "join_token_lists",
    "layout_field",
    "layout_name",
    "to_layout",
    "token_dtype",
    "token_lists",
]

LAYOUTS = ("list", "bytes")
"""Names of the token layouts (``tokenloom tokenize --layout``)."""
LAYOUT_META_KEY = b"tokenloom.token_layout"
"""Field metadata of a ``bytes`` token column: ``bytes:<id type>``."""
_ID_TYPES = {"uint16": pa.uint16(), "int32": pa.int32(), "uint32": pa.uint32()}


class TokenLayoutError(TokenloomError):
    """A column is not a token column in a layout tokenloom reads."""


@dataclass(frozen=True, kw_only=True, eq=False)
class TokenLists:
    """A token column's rows as one flat array of ids and offsets into it."""

    values: np.ndarray
    """Every row's ids, one after another (the column's id type)."""
    offsets: np.ndarray
    """``(n + 1,)`` int64: row ``i`` is ``values[offsets[i] : offsets[i + 1]]``."""
    valid: np.ndarray | None
    """``(n,)`` bool: rows that are not null (``None``: every row)."""

    @property
    def used(self) -> np.ndarray:
        """The rows' ids, concatenated (a view: no ids of rows outside the array)."""
        return self.values[int(self.offsets[0]) : int(self.offsets[-1])]

    @property
    def lengths(self) -> np.ndarray:
        """``(n,)`` int64 ids per row (0 for a null row)."""
        out = np.diff(self.offsets)
        if self.valid is not None:
            out[~self.valid] = 0
        return out


def _meta_type(field: pa.Field) -> pa.DataType | None:
    """The id type a ``bytes`` field's metadata names (``None``: no layout recorded)."""
    raw = (field.metadata or {}).get(LAYOUT_META_KEY)
    if raw is None:
        return None
    kind, _, name = raw.decode().partition(":")
    if kind != "bytes" or name not in _ID_TYPES:
        raise TokenLayoutError(
            f"column {field.name!r} records token layout {raw.decode()!r}; tokenloom reads "
            f"'bytes:' followed by one of {', '.join(_ID_TYPES)}; tokenize it again with "
            f"`tokenloom tokenize --column {field.name} --layout bytes`"
        )
    return _ID_TYPES[name]


def is_bytes_layout(field: pa.Field) -> bool:
    """Whether ``field`` is a token column in the ``bytes`` layout (its metadata says so)."""
    return LAYOUT_META_KEY in (field.metadata or {})


def layout_name(field: pa.Field) -> str:
    """``"list"`` or ``"bytes"``: how the token column ``field`` is stored.

    Raises:
        TokenLayoutError: The field is neither a list of integers nor a binary column with its
            layout recorded.
    """
    token_dtype(field)
    return "list" if _is_list(field.type) else "bytes"


def token_dtype(field: pa.Field) -> np.dtype:
    """The numpy type of one id of the token column ``field`` (either layout).

    Raises:
        TokenLayoutError: The field is not a token column in a known layout.
    """
    t = field.type
    if _is_list(t) and pa.types.is_integer(t.value_type):
        return np.dtype(t.value_type.to_pandas_dtype())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        id_type = _meta_type(field)
        if id_type is not None:
            return np.dtype(id_type.to_pandas_dtype())
    raise TokenLayoutError(
        f"column {field.name!r} ({t}) is not a token column: tokenloom reads a list of integer "
        f"ids, or raw ids in a binary column whose metadata records {LAYOUT_META_KEY.decode()}; "
        f"add one with `tokenloom tokenize --column {field.name}`"
    )


def layout_field(name: str, id_type: pa.DataType, layout: str, metadata: dict) -> pa.Field:
    """The field of a token column of ids of ``id_type`` stored in ``layout``."""
    if layout == "list":
        return pa.field(name, pa.list_(id_type), metadata=metadata)
    if layout != "bytes":
        raise TokenLayoutError(f"token layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    meta = {**metadata, LAYOUT_META_KEY: f"bytes:{id_type}".encode()}
    return pa.field(name, pa.large_binary(), metadata=meta)


def to_layout(ids: pa.Array, layout: str) -> pa.Array:
    """A list array of ids in ``layout`` (``bytes``: each row's ids as raw little-endian
    bytes, nulls kept)."""
    if layout == "list":
        return ids
    if layout != "bytes":
        raise TokenLayoutError(f"token layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    import pyarrow.compute as pc

    flat = pc.list_flatten(ids).to_numpy(zero_copy_only=False)
    data = flat.astype(flat.dtype.newbyteorder("<"), copy=False)
    lengths = pc.list_value_length(ids).fill_null(0).to_numpy(zero_copy_only=False)
    offs = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lengths.astype(np.int64) * flat.dtype.itemsize, out=offs[1:])
    out = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(ids), [None, pa.py_buffer(offs), pa.py_buffer(data)]
    )
    if ids.null_count:
        out = pc.if_else(ids.is_valid(), out, pa.scalar(None, pa.large_binary()))
    return out


def token_lists(col: Any, field: pa.Field) -> TokenLists:
    """The rows of token column ``col`` (an Arrow array or chunked array of ``field``, either
    layout) as flat ids and offsets; zero-copy where Arrow allows.

    Raises:
        TokenLayoutError: ``field`` is not a token column, or a ``bytes`` row's length is not a
            whole number of ids.
    """
    dtype = token_dtype(field)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    valid = col.is_valid().to_numpy(zero_copy_only=False) if col.null_count else None
    if _is_list(col.type):
        offs = col.offsets.to_numpy().astype(np.int64, copy=False)
        values = col.values.to_numpy(zero_copy_only=False) if len(col.values) else None
        if values is None:
            values = np.empty(0, dtype=dtype)
        return TokenLists(values=values, offsets=offs, valid=valid)
    width = dtype.itemsize
    bufs = col.buffers()
    otype = np.int64 if pa.types.is_large_binary(col.type) else np.int32
    at = col.offset * np.dtype(otype).itemsize  # a sliced array's offsets start later
    offs = np.frombuffer(bufs[1], dtype=otype, count=len(col) + 1, offset=at).astype(np.int64)
    if ((offs - offs[0]) % width).any():
        i = int(np.flatnonzero(np.diff(offs) % width)[0])
        raise TokenLayoutError(
            f"a row of token column {field.name!r} (number {i} of the {len(col)} read) holds "
            f"{int(offs[i + 1] - offs[i])} bytes, not a whole number of {dtype} ids ({width} "
            f"bytes each): the column was not written by `tokenloom tokenize`; write the ids "
            f"into a new column: `tokenloom tokenize --tokenizer SPEC --column "
            f"{field.name}_2 --layout bytes`"
        )
    data = bufs[2]
    values = (
        np.frombuffer(data, dtype=dtype.newbyteorder("<"), count=int(offs[-1]) // width)
        if data is not None and offs[-1] > 0
        else np.empty(0, dtype=dtype)
    )
    return TokenLists(values=values, offsets=offs // width, valid=valid)


def join_token_lists(chunks: list[Any], field: pa.Field) -> TokenLists:
    """:func:`token_lists` of the Arrow arrays ``chunks`` of ``field`` as one, their ids copied
    one chunk at a time into one array allocated once. The list is emptied as the chunks are
    copied, so a chunk nothing else holds is let go right after its copy (``combine_chunks``
    holds every chunk and their copy at once: twice a large take's bytes). One chunk:
    zero-copy, as ``token_lists``."""
    if len(chunks) <= 1:
        return token_lists(chunks.pop() if chunks else pa.array([], field.type), field)
    parts = [token_lists(c, field) for c in chunks]
    chunks.clear()  # the views in ``parts`` hold the buffers now
    n = sum(len(p.offsets) - 1 for p in parts)
    values = np.empty(sum(len(p.used) for p in parts), dtype=token_dtype(field))
    offsets = np.zeros(n + 1, dtype=np.int64)
    valid = None if all(p.valid is None for p in parts) else np.ones(n, dtype=bool)
    at = row = 0
    parts.reverse()
    while parts:
        part = parts.pop()
        k, used = len(part.offsets) - 1, part.used
        values[at : at + len(used)] = used
        offsets[row + 1 : row + k + 1] = part.offsets[1:] - part.offsets[0] + at
        if part.valid is not None:
            assert valid is not None
            valid[row : row + k] = part.valid
        at, row = at + len(used), row + k
        del part, used
    return TokenLists(values=values, offsets=offsets, valid=valid)


def as_token_lists(col: Any, field: pa.Field) -> pa.Array:
    """Token column ``col`` (either layout) as an Arrow list array of ids (nulls kept): what a
    reader that works per row (decode, round-trip, tracing) takes."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if _is_list(col.type):
        return col
    t = token_lists(col, field)
    start = int(t.offsets[0]) if len(t.offsets) else 0
    id_type = pa.from_numpy_dtype(token_dtype(field))
    offs = pa.array((t.offsets - start).astype(np.int32))
    values = pa.array(t.values[start : int(t.offsets[-1])].astype(token_dtype(field)), id_type)
    mask = None if t.valid is None else pa.array(~t.valid)
    return pa.ListArray.from_arrays(offs, values, type=pa.list_(id_type), mask=mask)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)
