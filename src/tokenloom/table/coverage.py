"""Which rows each column is computed for, from fragment metadata alone.

A column added by a backfill has a data file in every fragment that existed then; rows appended
later live in fragments without one, and read as null. ``info`` reports the coverage, the loader
refuses to plan over rows a column it uses does not cover, and ``tokenloom refresh`` fills them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["column_coverage", "missing_rows", "uncovered_fragments"]


def _field_ids(ds: Any) -> dict[str, set[int]]:
    """Top-level column name -> the Lance field ids of it and its children."""
    out: dict[str, set[int]] = {}
    for field in ds.lance_schema.fields():
        ids: set[int] = set()
        stack = [field]
        while stack:
            f = stack.pop()
            ids.add(f.id())
            stack.extend(f.children())
        out[field.name()] = ids
    return out


def column_coverage(ds: Any) -> dict[str, int]:
    """Rows (deletions excluded) whose fragment holds a data file of each column.

    Args:
        ds: A ``lance.LanceDataset`` (the version to describe).

    Returns:
        ``{column: rows computed}`` for every top-level column, in schema order. Metadata only:
        no column data is read.
    """
    ids = _field_ids(ds)
    covered = dict.fromkeys(ids, 0)
    for frag in ds.get_fragments():
        present = {f for df in frag.metadata.files for f in df.fields}
        rows = frag.count_rows()
        for name, fids in ids.items():
            if fids & present:
                covered[name] += rows
    return covered


def missing_rows(ds: Any) -> dict[str, int]:
    """``{column: rows not computed}`` for the columns that do not cover every row."""
    total = ds.count_rows()
    return {c: total - n for c, n in column_coverage(ds).items() if n < total}


def uncovered_fragments(ds: Any, columns: list[str]) -> list[Any]:
    """The fragments that hold no data file of some of ``columns`` (their rows read that column
    as null because it was never computed for them, not because a value is null).

    Args:
        ds: A ``lance.LanceDataset``.
        columns: Top-level column names (unknown names are ignored).
    """
    ids = _field_ids(ds)
    wanted = [ids[c] for c in columns if c in ids]
    if not wanted:
        return []
    out = []
    for frag in ds.get_fragments():
        present = {f for df in frag.metadata.files for f in df.fields}
        if any(not (fids & present) for fids in wanted):
            out.append(frag)
    return out
