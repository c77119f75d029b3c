"""Rows by stable row id: the one wrapper around Lance's take.

Every reader of rows by id (the token reader, loss masks, the row loader, verify, eval tasks)
calls :func:`take`: Lance's private take by row id is thread-safe and releases the GIL, so
callers run several at once from threads. An empty id list returns an empty table of the
columns (nothing is read); a column the table lacks is refused up front, named; blob-encoded
columns (:mod:`tokenloom.ingest.columns`) are read with ``take_blobs`` and
returned as ``large_binary`` bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from tokenloom.errors import TableError

__all__ = ["TakeError", "take", "take_blob_files", "is_blob", "BLOB_V2"]


class TakeError(TableError):
    """Rows cannot be taken as asked (a column the table does not have)."""


BLOB_V2 = "lance.blob.v2"
"""Arrow extension name of Lance's newer blob columns (``lance.blob.BlobType``, 2.2 files)."""


def is_blob(field: pa.Field) -> bool:
    """Whether a column is stored with Lance's blob encoding (the ``lance-encoding:blob`` field
    metadata tokenloom's ingest writes, or a ``lance.blob.v2`` column of an adopted table)."""
    if getattr(field.type, "extension_name", None) == BLOB_V2:
        return True
    return (field.metadata or {}).get(b"lance-encoding:blob") == b"true"


def take_blob_files(dataset: Any, column: str, rowids: Sequence[int]) -> list:
    """Lance's file objects (``BlobFile``, ``None`` for a null) of blob ``column`` for rows by
    stable row id, in that order: the one place blob values are taken (nothing is fetched yet
    but their positions)."""
    rid = [int(r) for r in rowids]
    return dataset.take_blobs(column, ids=rid) if rid else []


def take(dataset: Any, rowids: Sequence[int] | np.ndarray, columns: Sequence[str]) -> pa.Table:
    """The ``columns`` of the rows with stable row ids ``rowids``, in that order.

    Args:
        dataset: A ``lance.LanceDataset`` (at the pinned version).
        rowids: Stable row ids (``_rowid``), any integer sequence or array; may be empty.
        columns: Column names, in the order of the result's columns.

    Returns:
        A ``pa.Table`` with one row per id; blob columns as ``large_binary`` bytes.

    Raises:
        TakeError: A column is not in the table (named, with the table's columns).
    """
    schema = dataset.schema
    columns = list(columns)
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise TakeError(
            f"the table has no column {', '.join(map(repr, missing))} (version "
            f"{dataset.version}; columns: {', '.join(schema.names)}); check the column name, "
            "or compute it first (`tokenloom tokenize` / `tokenloom backfill`)"
        )
    ids = rowids.tolist() if isinstance(rowids, np.ndarray) else [int(r) for r in rowids]
    blobs = [c for c in columns if is_blob(schema.field(c))]
    plain = [c for c in columns if c not in blobs]
    if not ids:
        fields = [
            pa.field(c, pa.large_binary()) if c in blobs else schema.field(c) for c in columns
        ]
        return pa.schema(fields).empty_table()
    table = dataset._take_rows(ids, columns=plain) if plain else None
    if not blobs:
        return table
    arrays = {c: table.column(c) for c in plain} if table is not None else {}
    for c in blobs:
        files = take_blob_files(dataset, c, ids)
        arrays[c] = pa.array(
            [f.readall() if f is not None else None for f in files], type=pa.large_binary()
        )
    return pa.table({c: arrays[c] for c in columns})
