"""The table layer: create/open a tokenloom table, its schema, versions and on-disk summary.

This package is the only writer to Lance; every other layer goes through :class:`Table`.
"""

from tokenloom.table.core import NEXT_ID_KEY, Table, VersionInfo, normalize_uri
from tokenloom.table.info import ColumnInfo, TableInfo, table_info
from tokenloom.table.schema import BASE_SCHEMA, OP_KEY

__all__ = [
    "BASE_SCHEMA",
    "NEXT_ID_KEY",
    "OP_KEY",
    "ColumnInfo",
    "Table",
    "TableInfo",
    "VersionInfo",
    "normalize_uri",
    "table_info",
]
