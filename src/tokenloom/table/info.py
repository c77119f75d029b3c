"""What ``tokenloom info`` reports: rows, versions, columns with their bytes on disk, sources.

Column bytes are read from each data file's own footer (the byte ranges of every page buffer of
every column), so they add up, with the per-file overhead (column metadata, footers, alignment),
to exactly the bytes of the data files on disk.
"""

from __future__ import annotations

import dataclasses
import posixpath
from dataclasses import asdict, dataclass

from tokenloom.table.core import Table, VersionInfo

__all__ = ["ColumnInfo", "TableInfo", "table_info", "column_bytes"]


@dataclass(frozen=True, kw_only=True)
class ColumnInfo:
    """One column of the table."""

    name: str
    """Column name."""
    type: str
    """Arrow type, as text."""
    bytes: int
    """Bytes of this column's page buffers in the data files of this version."""
    files: int
    """How many data files hold (part of) this column."""
    rows_computed: int
    """Rows this column is computed for (rows appended after a backfill are not, until
    ``tokenloom refresh``)."""


@dataclass(frozen=True, kw_only=True)
class TableInfo:
    """A summary of one table version."""

    uri: str
    version: int
    rows: int
    fragments: int
    data_files: int
    data_file_bytes: int
    """Total size of this version's data files."""
    overhead_bytes: int
    """``data_file_bytes`` minus the column bytes: footers, column metadata, alignment."""
    deleted_rows: int
    columns: list[ColumnInfo]
    versions: list[VersionInfo]
    rows_per_source: dict[str, int]
    pins: list[dict] = dataclasses.field(default_factory=list)
    """Every Lance tag: ``tag``, the ``version`` it keeps and the ``run`` directory holding it
    (``None``: a tag no tokenloom run made); see :mod:`tokenloom.table.tags`."""

    def to_json(self) -> dict:
        """A JSON-ready dict (timestamps as ISO-8601 text)."""
        out = asdict(self)
        for v in out["versions"]:
            v["timestamp"] = v["timestamp"].isoformat()
            v["properties"] = dict(v["properties"])
        return out


def _data_file_uri(table: Table, path: str) -> str:
    return posixpath.join(table.uri, "data", path)


def column_bytes(table: Table) -> tuple[dict[int, int], dict[int, int], int, int]:
    """Bytes per Lance field id, files per field id, total data-file bytes, data-file count.

    Reads only the footer of each data file (no column data).
    """
    from lance.file import LanceFileReader

    per_field: dict[int, int] = {}
    files_per_field: dict[int, int] = {}
    total = 0
    n_files = 0
    opts = table.storage_options or None
    for frag in table.dataset.get_fragments():
        for data_file in frag.metadata.files:
            n_files += 1
            meta = LanceFileReader(
                _data_file_uri(table, data_file.path), storage_options=opts
            ).metadata()
            size = data_file.file_size_bytes
            if size is None or size <= 0:
                size = _file_size(table, data_file.path)
            total += size
            for field_id, column in zip(data_file.fields, meta.columns, strict=False):
                nbytes = sum(buf.size for page in column.pages for buf in page.buffers)
                nbytes += sum(buf.size for buf in column.column_buffers)
                per_field[field_id] = per_field.get(field_id, 0) + nbytes
                files_per_field[field_id] = files_per_field.get(field_id, 0) + 1
    return per_field, files_per_field, total, n_files


def _file_size(table: Table, path: str) -> int:
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(table.uri)
    return int(fs.get_file_info(posixpath.join(root, "data", path)).size)


def _field_ids(table: Table) -> dict[str, list[int]]:
    """Top-level column name -> the Lance field ids of it and its children."""
    out: dict[str, list[int]] = {}
    for field in table.dataset.lance_schema.fields():
        ids: list[int] = []
        stack = [field]
        while stack:
            f = stack.pop()
            ids.append(f.id())
            stack.extend(f.children())
        out[field.name()] = ids
    return out


def table_info(table: Table) -> TableInfo:
    """Gather the summary ``tokenloom info`` prints."""
    from tokenloom.table.coverage import column_coverage
    from tokenloom.table.tags import table_pins

    per_field, files_per_field, total, n_files = column_bytes(table)
    coverage = column_coverage(table.dataset)
    ids = _field_ids(table)
    schema = table.schema()
    columns = []
    for name in schema.names:
        fids = ids.get(name, [])
        columns.append(
            ColumnInfo(
                name=name,
                type=str(schema.field(name).type),
                bytes=sum(per_field.get(i, 0) for i in fids),
                files=max((files_per_field.get(i, 0) for i in fids), default=0),
                rows_computed=coverage.get(name, 0),
            )
        )
    col_total = sum(per_field.values())
    stats = table.dataset.stats.dataset_stats()
    return TableInfo(
        uri=table.uri,
        version=table.version,
        rows=table.count_rows(),
        fragments=len(table.dataset.get_fragments()),
        data_files=n_files,
        data_file_bytes=total,
        overhead_bytes=total - col_total,
        deleted_rows=int(stats.get("num_deleted_rows", 0)),
        columns=columns,
        versions=table.versions(),
        rows_per_source=table.rows_per_source(),
        pins=[p.to_json() for p in table_pins(table)],
    )
