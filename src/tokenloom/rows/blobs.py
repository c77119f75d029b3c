"""Blob columns handed to a transform as file objects read by range (``lazy_blobs``).

A blob column (Lance's blob encoding: ``tokenloom ingest --columns NAME:blob``, or any Parquet
binary column) stores each value out of line, so one value can be read in part. With
``RowSpec(lazy_blobs=...)`` the transform gets a :class:`LazyBatch` instead of a RecordBatch: its
lazy columns are lists of :class:`LazyBlob` (``None`` for a null value), seekable, readable file
objects that fetch only the byte ranges read (plus a bounded read-ahead for small sequential
reads), so a transform can decode a few frames of a 50 MB video without fetching the rest.

A :class:`LazyBlob` is valid within the transform call: the loader closes it when the call
returns, and a transform must return what it read (bytes, arrays), not the file object. It
pickles as its address (table, version, column, stable row id, position): unpickled in another
process it opens the table there and reads from the same place.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa

from tokenloom.rows.transform import RowLoaderError

__all__ = ["READ_AHEAD", "LazyBlob", "LazyBatch", "returned_blob"]

READ_AHEAD = 512 << 10
"""Bytes fetched at least per range read of a lazy blob (Lance's own default read-ahead): a
decoder reading a few KiB at a time costs one fetch per 512 KiB, not one per read. A read of
at least this size fetches exactly the bytes asked for."""


@lru_cache(maxsize=8)
def _dataset(uri: str, version: int, options: tuple[tuple[str, str], ...]) -> Any:
    """A table opened in this process, for blobs unpickled here (Lance handles do not pickle)."""
    import lance

    return lance.dataset(uri, version=version, storage_options=dict(options) or None)


class LazyBlob(io.RawIOBase):
    """One blob value as a read-only, seekable file object that reads by range.

    ``read(n)``, ``readinto(b)``, ``seek(offset, whence)``, ``tell()``, ``size()``,
    ``readall()``, ``close()`` as :class:`io.RawIOBase` (wrap it in :class:`io.BufferedReader`
    for ``readline``); :meth:`read_range` reads ``[offset, offset + length)`` without moving the
    position. :attr:`bytes_fetched` counts the bytes this object fetched from storage.
    """

    def __init__(
        self,
        *,
        uri: str,
        version: int,
        storage_options: dict | None,
        column: str,
        rowid: int,
        row_id: int,
        size: int,
        handle: Any = None,
        position: int = 0,
    ) -> None:
        super().__init__()
        self.uri = uri
        self.version = version
        self.storage_options = storage_options
        self.column = column
        """The blob column."""
        self.rowid = rowid
        """The row's stable Lance row id (its address in the table)."""
        self.row_id = row_id
        """The row's table ``id``."""
        self._size = size
        self._handle = handle  # Lance's BlobFile, opened again lazily after unpickling
        self._pos = position
        self._buf = b""
        self._buf_at = 0
        self.bytes_fetched = 0
        """Bytes read from storage through this object (read-ahead included)."""

    # -- pickling: the blob's address, never the Lance handle -----------------------------------

    def __reduce__(self) -> tuple:
        if self.closed:
            raise ValueError(self._closed_message())
        state = {
            "uri": self.uri,
            "version": self.version,
            "storage_options": self.storage_options,
            "column": self.column,
            "rowid": self.rowid,
            "row_id": self.row_id,
            "size": self._size,
            "position": self._pos,
        }
        return (_unpickle, (state,))

    def copy(self) -> LazyBlob:
        """A new file object on the same blob, at position 0 (sharing the open handle)."""
        self._check_open()
        return LazyBlob(
            uri=self.uri,
            version=self.version,
            storage_options=self.storage_options,
            column=self.column,
            rowid=self.rowid,
            row_id=self.row_id,
            size=self._size,
            handle=self._handle,
        )

    def _open(self) -> Any:
        if self._handle is None:
            from tokenloom.rows.read import take_blob_files

            options = tuple(sorted((self.storage_options or {}).items()))
            ds = _dataset(self.uri, self.version, options)
            (self._handle,) = take_blob_files(ds, self.column, [self.rowid])
            if self._handle is None:  # the address named a value; a null has no file object
                raise RowLoaderError(
                    f"blob {self.column!r} of row id {self.row_id} reads as null in {self.uri} "
                    f"version {self.version}; the table changed under a pinned version?"
                )
        return self._handle

    # -- io.RawIOBase ---------------------------------------------------------------------------

    def _closed_message(self) -> str:
        return (
            f"blob {self.column!r} of row id {self.row_id} is closed: a lazy blob is valid "
            "within the transform call; read what you need there and return bytes or arrays"
        )

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(self._closed_message())

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        """The blob's length in bytes."""
        return self._size

    def __len__(self) -> int:
        return self._size

    def tell(self) -> int:
        self._check_open()
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._check_open()
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}.get(whence)
        if base is None:
            raise ValueError(f"whence must be 0, 1 or 2 (io.SEEK_SET/CUR/END), got {whence!r}")
        position = base + int(offset)
        if position < 0:
            raise ValueError(f"negative seek position {position} in blob of {self._size} bytes")
        self._pos = position
        return position

    def read_range(self, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` (clipped to the blob), fetched exactly; the
        position does not move."""
        self._check_open()
        if offset < 0 or length < 0:
            raise ValueError(f"offset and length must be >= 0, got {offset}, {length}")
        length = max(0, min(length, self._size - offset))
        if length == 0:
            return b""
        data = self._open().read_range(offset, length)
        self.bytes_fetched += len(data)
        return data

    def _read(self, n: int) -> bytes:
        n = max(0, min(n, self._size - self._pos))
        if n == 0:
            return b""
        start = self._pos - self._buf_at
        if 0 <= start and start + n <= len(self._buf):  # served by the read-ahead
            data = self._buf[start : start + n]
        elif n >= READ_AHEAD:
            data = self.read_range(self._pos, n)
        else:
            self._buf = self.read_range(self._pos, READ_AHEAD)
            self._buf_at = self._pos
            data = self._buf[:n]
        self._pos += len(data)
        return data

    def read(self, size: int | None = -1) -> bytes:
        self._check_open()
        return self._read(self._size - self._pos if size is None or size < 0 else size)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        self._check_open()
        view = memoryview(buffer).cast("B")
        data = self._read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._buf = b""
        self._handle = None  # shared with copies: never closed here, dropped
        super().close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"at {self._pos}"
        return f"<LazyBlob {self.column!r} row id {self.row_id}: {self._size} bytes, {state}>"


def _unpickle(state: dict) -> LazyBlob:
    return LazyBlob(**state)


class LazyBatch:
    """What a transform gets under ``lazy_blobs``: a RecordBatch's reading surface whose lazy
    blob columns are lists of :class:`LazyBlob` (``None`` for a null value).

    ``batch.column("video")`` (or ``batch["video"]``) is the list of file objects; other columns
    are Arrow arrays as in a RecordBatch; :attr:`arrow` is a RecordBatch of the other columns.
    The loader closes every file object when the transform returns.
    """

    def __init__(
        self,
        arrow: pa.RecordBatch,
        blobs: dict[str, list[LazyBlob | None]],
        names: Sequence[str],
        num_rows: int,
    ) -> None:
        self._rows = num_rows  # the Arrow part may have no column (every column lazy)
        self.arrow = arrow
        """The columns that are not lazy, as a RecordBatch."""
        self.blobs = blobs
        """Lazy column name -> one file object (or ``None``) per row."""
        self.column_names = list(names)
        """The columns, in the spec's order."""
        self._made: list[LazyBlob] = [b for col in blobs.values() for b in col if b is not None]
        self._lock = threading.Lock()

    @property
    def num_rows(self) -> int:
        return self._rows

    def __len__(self) -> int:
        return self.num_rows

    def column(self, key: str | int) -> pa.Array | list[LazyBlob | None]:
        """A column by name or position: a list of file objects for a lazy column."""
        name = self.column_names[key] if isinstance(key, int) else key
        if name in self.blobs:
            return self.blobs[name]
        if name not in self.arrow.schema.names:
            raise KeyError(f"no column {name!r}; the columns are {self.column_names}")
        return self.arrow.column(name)

    __getitem__ = column

    def slice(self, offset: int = 0, length: int | None = None) -> LazyBatch:
        """Rows ``[offset, offset + length)`` with fresh file objects at position 0 (closed with
        this batch)."""
        offset = min(max(0, offset), self._rows)
        stop = self._rows if length is None else min(self._rows, offset + max(0, length))
        blobs = {
            name: [b.copy() if b is not None else None for b in files[offset:stop]]
            for name, files in self.blobs.items()
        }
        part = LazyBatch(
            self.arrow.slice(offset, stop - offset), blobs, self.column_names, stop - offset
        )
        with self._lock:
            self._made.extend(part._made)
        return part

    def to_pydict(self) -> dict[str, list]:
        """Column name -> Python values (file objects for lazy columns)."""
        plain = self.arrow.to_pydict()
        return {
            name: list(self.blobs[name]) if name in self.blobs else plain[name]
            for name in self.column_names
        }

    def to_pylist(self) -> list[dict[str, Any]]:
        """One dict per row (file objects for lazy columns)."""
        cols = self.to_pydict()
        return [{k: v[i] for k, v in cols.items()} for i in range(self.num_rows)]

    def close(self) -> None:
        """Close every file object handed out by this batch and its slices."""
        with self._lock:
            made, self._made = self._made, []
        for blob in made:
            blob.close()

    def __enter__(self) -> LazyBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<LazyBatch {self.num_rows} rows, lazy {list(self.blobs)} of {self.column_names}>"


_OBJECT = np.dtype(object)


def returned_blob(output: Any) -> str | None:
    """The lazy column whose file object a transform's dict output carries, or ``None``."""
    if not isinstance(output, dict):
        return None
    for name, values in output.items():
        if isinstance(values, list | tuple) or getattr(values, "dtype", None) is _OBJECT:
            for v in values:
                if isinstance(v, LazyBlob):
                    return f"{name!r} (a file object of blob column {v.column!r})"
    return None
