"""The row loader's I/O: resolve the selection once, then read chunks of rows by stable row id.

The plan needs ``(id, _rowid)`` of the rows under the filter — one scan of one small column.
Rows are read with :func:`~tokenloom.loader.pipeline.take.take` (thread-safe, GIL released); a
blob-encoded column (see :mod:`tokenloom.ingest.columns`) is read lazily with ``take_blobs`` and
materialised as ``large_binary`` bytes only for the rows of the chunk, or, for the spec's
``lazy_blobs`` columns, handed on as file objects read by range (:mod:`tokenloom.rows.blobs`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa

from tokenloom.loader.pipeline.take import BLOB_V2, is_blob, take, take_blob_files
from tokenloom.loader.plan.compact import CompactInts, encode
from tokenloom.rows.blobs import LazyBatch, LazyBlob
from tokenloom.rows.transform import RowLoaderError
from tokenloom.table.filters import validate_filter
from tokenloom.table.tokens import as_token_lists, is_bytes_layout

__all__ = [
    "RowSelection",
    "compact_selection",
    "scan_selection",
    "RowReader",
    "is_blob",
    "BLOB_V2",
    "lazy_columns",
    "take_blob_files",
]


def lazy_columns(
    schema: pa.Schema, columns: Sequence[str], lazy: bool | Sequence[str]
) -> tuple[str, ...]:
    """The columns a spec's ``lazy_blobs`` names, checked to be blob columns of the table.

    Raises:
        RowLoaderError: A named column is not blob-encoded, or ``True`` finds no blob column.
    """
    if lazy is False or lazy == ():
        return ()
    if lazy is True:
        found = tuple(c for c in columns if is_blob(schema.field(c)))
        if not found:
            kinds = ", ".join(f"{c} ({schema.field(c).type})" for c in columns)
            raise RowLoaderError(
                f"lazy_blobs=True but none of the columns read is a blob column ({kinds}); "
                "blob columns come from `tokenloom ingest --columns NAME:blob` (or a Parquet "
                "binary column): read one, or drop lazy_blobs"
            )
        return found
    for c in lazy:
        field = schema.field(c)
        if not is_blob(field):
            stored = (
                "large binary without Lance's blob encoding"
                if pa.types.is_large_binary(field.type) or pa.types.is_binary(field.type)
                else str(field.type)
            )
            raise RowLoaderError(
                f"lazy_blobs names column {c!r}, which is not a blob column (stored as "
                f"{stored}); only a blob column (Lance's blob encoding, from `tokenloom ingest "
                f"--columns {c}:blob` or a Parquet binary column) can be read by range: leave "
                f"{c!r} out of lazy_blobs to read it whole"
            )
    return tuple(lazy)


@dataclass(frozen=True, kw_only=True, eq=False)
class RowSelection:
    """The rows a row loader visits, bit-packed (:func:`compact_selection`: about 1-2 bytes per
    row for both columns, read by gathers)."""

    version: int
    row_ids: CompactInts
    """``(n,)`` the ``id`` of each selected row, ascending (int64 values)."""
    rowids: CompactInts
    """``(n,)`` uint64 stable Lance row ids, aligned with ``row_ids`` (stored relative to
    them: their difference is constant over runs of rows written in id order)."""


def compact_selection(version: int, row_ids: np.ndarray, rowids: np.ndarray) -> RowSelection:
    """A :class:`RowSelection` from the scan's plain arrays (``row_ids`` ascending), as the
    plan inputs are held (:func:`~tokenloom.loader.pipeline.inputs.compact_inputs`)."""
    plain = np.asarray(row_ids).astype(np.int64, copy=False)
    ids = encode(plain)
    return RowSelection(
        version=version,
        row_ids=ids,
        rowids=encode(np.asarray(rowids).astype(np.uint64, copy=False), ref=ids, ref_values=plain),
    )


def scan_selection(
    ds: lance.LanceDataset, *, filter: str | None, columns: Sequence[str]
) -> RowSelection:
    """``(id, _rowid)`` of the rows under ``filter``, sorted by id; checks ``columns`` exist.

    Raises:
        RowLoaderError: A column is missing or the filter does not work.
    """
    missing = [c for c in columns if c not in ds.schema.names]
    if missing:
        raise RowLoaderError(
            f"the table has no column {', '.join(map(repr, missing))} (version {ds.version}; "
            f"columns: {', '.join(ds.schema.names)}); typed columns come from "
            f"`tokenloom ingest ... --columns NAME:TYPE`"
        )
    filter = validate_filter(ds, filter)
    try:
        table = ds.scanner(columns=["id"], filter=filter, with_row_id=True).to_table()
    except (ValueError, OSError, RuntimeError) as exc:
        raise RowLoaderError(f"filter {filter!r} does not work on this table: {exc}") from exc
    ids = table.column("id").to_numpy().astype(np.int64, copy=False)
    rowids = table.column("_rowid").to_numpy().astype(np.uint64, copy=False)
    del table
    if ids.size > 1 and bool((ids[1:] < ids[:-1]).any()):  # a scan in id order needs no sort
        order = np.argsort(ids, kind="stable")
        ids, rowids = ids[order], rowids[order]
        del order
    return compact_selection(ds.version, ids, rowids)


class RowReader:
    """Reads the chosen columns of rows by stable row id (one per process; opened lazily)."""

    def __init__(
        self,
        uri: str,
        version: int,
        columns: Sequence[str],
        *,
        storage_options: dict | None = None,
        lazy: Sequence[str] = (),
    ) -> None:
        self.uri = uri
        self.version = version
        self.columns = list(columns)
        self.lazy = tuple(lazy)
        """Blob columns handed on as :class:`~tokenloom.rows.blobs.LazyBlob` file objects."""
        self.storage_options = storage_options
        self._ds: lance.LanceDataset | None = None
        self.rows_read = 0
        self.bytes_read = 0
        self.read_seconds = 0.0

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_ds"] = None  # Lance handles do not cross processes
        return state

    @property
    def dataset(self) -> lance.LanceDataset:
        if self._ds is None:
            self._ds = lance.dataset(
                self.uri, version=self.version, storage_options=self.storage_options
            )
        return self._ds

    def read(self, rowids: np.ndarray, ids: np.ndarray) -> pa.RecordBatch | LazyBatch:
        """The rows ``rowids`` (in that order) as one RecordBatch of the columns, blob columns as
        bytes; ``ids`` (their table ids) are checked against the ``id`` column read with them.

        With :attr:`lazy` columns: a :class:`~tokenloom.rows.blobs.LazyBatch` whose lazy columns
        are file objects (the caller closes it).
        """
        started = time.perf_counter()
        ds = self.dataset
        schema = ds.schema
        rid = [int(r) for r in rowids]
        eager = [c for c in self.columns if c != "id" and c not in self.lazy]
        table = take(ds, rid, ["id", *eager])  # eager blob columns as bytes
        arrays: dict[str, pa.Array] = {
            name: table.column(name).combine_chunks() for name in table.column_names
        }
        got = arrays["id"].to_numpy(zero_copy_only=False)
        if not np.array_equal(got, ids):
            raise RowLoaderError(
                f"rows read back as ids {got[:4].tolist()}... but the plan asked for "
                f"{np.asarray(ids)[:4].tolist()}...; the table changed under a pinned version?"
            )
        lazy: dict[str, list[LazyBlob | None]] = {}
        for c in self.columns:
            if is_bytes_layout(schema.field(c)):  # token ids read as lists, either layout
                arrays[c] = as_token_lists(arrays[c], schema.field(c))
            if c in self.lazy:
                files = take_blob_files(ds, c, rid)
                row_ids = got.tolist()
                lazy[c] = [
                    self._lazy(c, f, r, i) for f, r, i in zip(files, rid, row_ids, strict=True)
                ]
        kept = [c for c in self.columns if c not in lazy]
        batch = pa.record_batch([arrays[c] for c in kept], names=kept)
        self.read_seconds += time.perf_counter() - started
        self.rows_read += len(rid)
        self.bytes_read += batch.nbytes
        return LazyBatch(batch, lazy, self.columns, len(rid)) if self.lazy else batch

    def _lazy(self, column: str, handle: object, rowid: int, row_id: int) -> LazyBlob | None:
        if handle is None:
            return None
        return LazyBlob(
            uri=self.uri,
            version=self.version,
            storage_options=self.storage_options,
            column=column,
            rowid=rowid,
            row_id=row_id,
            size=handle.size(),  # type: ignore[attr-defined]
            handle=handle,
        )
