"""The row loader: rows (not token streams) of any columns, on the same plan machinery.

A :class:`RowSpec` names the rows (SQL filter, pinned version), the columns, the global batch
and the seed; :class:`RowPlan` is the pure epoch plan (a fresh global shuffle per epoch, ranks
and workers independent, refill of skipped rows); :class:`RowDataset` reads chunks, runs a
transform on Arrow RecordBatches in a thread pool and yields ``arrow``/``numpy``/``torch``/
``python`` batches with an exact, elastic resume state; :class:`RowMapDataset` is the
map-style variant; with ``lazy_blobs`` blob columns reach the transform as :class:`LazyBlob`
file objects read by range. Importing this package imports neither Lance nor torch.
"""

from __future__ import annotations

from tokenloom.rows.plan import MAX_REFILLS, REFILL_ALGORITHM, RowPlan, naive_slots
from tokenloom.rows.spec import RowSpec
from tokenloom.rows.transform import FORMATS, ON_ERROR, RowLoaderError, RowTransformError, SkipRow

_LAZY = {
    "RowDataset": "iterable",
    "RowMapDataset": "dataset",
    "RowLoader": "loader",
    "RowReader": "read",
    "LazyBlob": "blobs",
    "LazyBatch": "blobs",
}


def __getattr__(name: str):  # noqa: ANN202 - Lance/torch only when these are asked for
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"tokenloom.rows.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'tokenloom.rows' has no attribute {name!r}")


__all__ = [
    "FORMATS",
    "LazyBatch",
    "LazyBlob",
    "MAX_REFILLS",
    "ON_ERROR",
    "REFILL_ALGORITHM",
    "RowDataset",
    "RowLoader",
    "RowMapDataset",
    "RowPlan",
    "RowReader",
    "RowSpec",
    "RowLoaderError",
    "RowTransformError",
    "SkipRow",
    "naive_slots",
]
