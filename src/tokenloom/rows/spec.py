"""``RowSpec``: which stream of rows a row loader delivers, defined once, validated once.

Like :class:`~tokenloom.loader.plan.spec.LoaderSpec` for packed tokens, a spec names the table and
version, the rows (SQL filter), the columns read, the global batch, the seed and ``drop_last``.
It does not name the topology (rank, world size, workers) nor the cursor: the global stream does
not depend on them. Pure: imports neither Lance nor torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenloom.loader.plan.epoch import PlanError
from tokenloom.loader.plan.shuffle import PERMUTATION_ALGORITHM
from tokenloom.loader.plan.stream.spec import StreamSpec
from tokenloom.rows.plan import REFILL_ALGORITHM

__all__ = ["RowSpec"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RowSpec(StreamSpec):
    """Which rows a :class:`~tokenloom.rows.RowDataset` delivers, in which order.

    ``table``, ``version``, ``filter``, ``global_batch`` (rows per global step over all
    ranks), ``seed`` and ``drop_last`` (leave out the last incomplete step instead of
    completing it with refill rows) are the common part
    (:class:`~tokenloom.loader.plan.stream.spec.StreamSpec`).
    """

    columns: tuple[str, ...]
    """Columns read and handed to the transform (blob columns arrive as bytes, unless lazy)."""
    lazy_blobs: bool | tuple[str, ...] = False
    """Blob columns handed to the transform as file objects read by range instead of bytes
    (:mod:`tokenloom.rows.blobs`): ``True`` for every blob column among ``columns``, or the
    names of some. Needs a transform; the stream of rows does not change."""

    def __post_init__(self) -> None:
        StreamSpec.__post_init__(self)  # table, version, filter, global_batch, seed, drop_last
        cols = self.columns
        if isinstance(cols, str):
            cols = tuple(c.strip() for c in cols.split(",") if c.strip())
        if not isinstance(cols, Sequence) or not cols or not all(isinstance(c, str) for c in cols):
            raise PlanError(f"columns must name at least one column, got {self.columns!r}")
        if len(set(cols)) != len(cols):
            raise PlanError(f"columns repeat a name: {list(cols)}")
        object.__setattr__(self, "columns", tuple(cols))
        object.__setattr__(self, "lazy_blobs", self._lazy_blobs(self.lazy_blobs))

    def _lazy_blobs(self, lazy: Any) -> bool | tuple[str, ...]:
        """``lazy_blobs`` as ``True``/``False`` or a tuple of names among ``columns``."""
        if isinstance(lazy, bool):
            return lazy
        names = lazy
        if isinstance(names, str):
            names = [c.strip() for c in names.split(",") if c.strip()]
        if not isinstance(names, Sequence) or not all(isinstance(c, str) for c in names):
            raise PlanError(f"lazy_blobs must be True, False or blob column names, got {lazy!r}")
        missing = [c for c in names if c not in self.columns]
        if missing:
            raise PlanError(
                f"lazy_blobs names {', '.join(map(repr, missing))}, not among the columns read "
                f"{list(self.columns)}; add it to columns, or name one of those"
            )
        return tuple(dict.fromkeys(names)) or False

    @property
    def unit(self) -> str:
        """A global step's items are rows (``per_rank``: rows each rank gets per step)."""
        return "rows"

    def replace(self, **changes: Any) -> RowSpec:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    def fingerprint_inputs(self) -> dict[str, Any]:
        """The spec's named inputs of the stream (the dataset adds the version and transform)."""
        return {
            "kind": "rows",
            **self.stream_inputs(),
            "columns": list(self.columns),
            "permutation": PERMUTATION_ALGORITHM,
            "refill": REFILL_ALGORITHM,
        }
