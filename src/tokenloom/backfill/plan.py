"""The work plan of a backfill: which rows of which fragments each work unit computes.

Units are ranges of ``id`` inside one fragment, so a unit's rows are found again with a filter
whatever happened to other fragments, and a fragment larger than ``unit_rows`` is split so that N
workers have N things to do. Each unit carries a key derived from the *data* it reads (fragment
id, physical rows, deletions, the files holding its input columns): a result is reused exactly as
long as that data is unchanged, across table versions made by appends or other backfills.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow.compute as pc

__all__ = ["Unit", "plan_units", "fragment_key", "fragments_missing"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Unit:
    """One work unit: the rows of fragment ``fragment_id`` with ``lo <= id <= hi``."""

    fragment_id: int
    lo: int
    hi: int
    rows: int
    """Visible rows in the range when planned."""
    key: str
    """Hash of the fragment's identity; part of the result file name."""
    offset: int = -1
    """Position of the unit's first row among the fragment's visible rows when the fragment's
    ids ascend (then the unit is read by offset/limit, the cheapest read); -1 otherwise."""

    @property
    def name(self) -> str:
        """The unit's stable name (its result file's stem)."""
        return f"f{self.fragment_id}-{self.lo}-{self.hi}-{self.key}"


def fragment_key(fragment: lance.LanceFragment, field_ids: Sequence[int]) -> str:
    """Identity of the data a unit of this fragment reads (changes when that data changes)."""
    meta = fragment.metadata
    wanted = set(field_ids)
    files = sorted(f.path for f in meta.files if wanted.intersection(f.fields))
    deletion = meta.deletion_file
    parts = [
        str(meta.id),
        str(meta.physical_rows),
        repr((deletion.num_deleted_rows, deletion.id) if deletion is not None else None),
        *files,
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def _leaf_field_ids(ds: lance.LanceDataset, columns: Sequence[str]) -> list[int]:
    ids: list[int] = []
    wanted = set(columns)
    for field in ds.lance_schema.fields():
        if field.name() not in wanted:
            continue
        stack = [field]
        while stack:
            f = stack.pop()
            ids.append(f.id())
            stack.extend(f.children())
    return ids


def fragments_missing(ds: lance.LanceDataset, columns: Sequence[str]) -> list[lance.LanceFragment]:
    """Fragments with no data file for ``columns`` (all of them when the columns are new)."""
    if not all(c in ds.schema.names for c in columns):
        return list(ds.get_fragments())
    ids = set(_leaf_field_ids(ds, columns))
    return [
        f
        for f in ds.get_fragments()
        if not any(ids.intersection(df.fields) for df in f.metadata.files)
    ]


def plan_units(
    ds: lance.LanceDataset,
    fragments: Sequence[lance.LanceFragment],
    inputs: Sequence[str],
    *,
    unit_rows: int,
    min_units: int = 1,
) -> list[Unit]:
    """Split ``fragments`` into units of at most ``unit_rows`` rows (smaller when there would be
    fewer than ``min_units`` units), in fragment then id order.

    Reads only the ``id`` column.
    """
    total = sum(f.count_rows() for f in fragments)
    if total == 0:
        return []
    size = max(1, min(unit_rows, math.ceil(total / max(1, min_units))))
    field_ids = _leaf_field_ids(ds, ["id", *inputs])
    units: list[Unit] = []
    for frag in fragments:
        ids = frag.to_table(columns=["id"]).column("id")
        if len(ids) == 0:
            continue
        key = fragment_key(frag, field_ids)
        raw = pc.cast(ids, "int64").to_numpy()
        ascending = bool(np.all(np.diff(raw) > 0))
        sorted_ids = raw if ascending else np.sort(raw)
        for start in range(0, len(sorted_ids), size):
            chunk = sorted_ids[start : start + size]
            units.append(
                Unit(
                    fragment_id=frag.fragment_id,
                    lo=int(chunk[0]),
                    hi=int(chunk[-1]),
                    rows=len(chunk),
                    key=key,
                    offset=start if ascending else -1,
                )
            )
    return units
