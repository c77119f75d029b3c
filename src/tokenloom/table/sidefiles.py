"""Small Arrow tables kept inside a table's directory, beside Lance's own files.

They are single Lance files (so they work on every store Lance does) under ``_tokenloom/``, which
Lance's ``cleanup_old_versions`` leaves alone; a side file counts only once a committed version's
table metadata (:mod:`tokenloom.table.meta`) lists it, so one written by a run that never
committed is just an orphan.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

import pyarrow as pa

from tokenloom.table.core import Table, is_local

__all__ = ["write_side_table", "read_side_table"]


def write_side_table(
    table: Table,
    folder: str,
    data: pa.Table,
    *,
    on_new_file: Callable[[str], None] | None = None,
    staging: str | None = None,
    name: str | None = None,
) -> str:
    """Write ``data`` to a new file under ``_tokenloom/<folder>/``; return its relative path.

    The file is ``<name>.lance`` when ``name`` is given (the caller checks it is free), else a
    fresh random name.

    ``on_new_file`` is called with that path before the file is created (for a run journal);
    with ``staging`` (a local folder) the file is written there and moved into place complete.
    """
    from lance.file import LanceFileWriter

    rel = f"_tokenloom/{folder}/{name or uuid.uuid4().hex}.lance"
    if on_new_file is not None:
        on_new_file(rel)
    final = f"{table.uri.rstrip('/')}/{rel}"
    path = os.path.join(staging, os.path.basename(rel)) if staging else final
    if not staging and is_local(table.uri):
        os.makedirs(os.path.dirname(final), exist_ok=True)
    writer = LanceFileWriter(path, data.schema, storage_options=table.storage_options or None)
    for batch in data.to_batches():
        writer.write_batch(batch)
    writer.close()
    if staging:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.rename(path, final)
    return rel


def read_side_table(table: Table, rel: str) -> pa.Table:
    """Read a side file written by :func:`write_side_table`.

    Raises:
        OSError: when it is missing or unreadable.
    """
    from lance.file import LanceFileReader

    reader = LanceFileReader(
        f"{table.uri.rstrip('/')}/{rel}", storage_options=table.storage_options or None
    )
    return reader.read_all().to_table()
