"""``RowSpec``: which stream of rows a row loader delivers, defined once, validated once.

Like :class:`~tokenloom.loader.spec.LoaderSpec` for packed tokens, a spec names the table and
version, the rows (SQL filter), the columns read, the global batch, the seed and ``drop_last``.
It does not name the topology (rank, world size, workers) nor the cursor: the global stream does
not depend on them. Pure: imports neither Lance nor torch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenloom.loader.plan import PlanError
from tokenloom.loader.shuffle import PERMUTATION_ALGORITHM
from tokenloom.loader.spec import absolute_uri
from tokenloom.rows.plan import REFILL_ALGORITHM

__all__ = ["RowSpec"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RowSpec:
    """Which rows a :class:`~tokenloom.rows.RowDataset` delivers, in which order."""

    table: str
    """The table: a local path (stored absolute) or an object-store URI Lance accepts."""
    columns: tuple[str, ...]
    """Columns read and handed to the transform (blob columns arrive as bytes, unless lazy)."""
    version: int | None = None
    """Table version; ``None``: the latest when the dataset is built (then pinned)."""
    filter: str | None = None
    """SQL selecting the rows (``None``: all)."""
    global_batch: int = 8
    """Rows per global step ``G`` over all ranks (each of ``W`` ranks gets ``G / W``)."""
    seed: int = 0
    """Shuffle seed; every epoch is a fresh permutation of ``(seed, epoch)``."""
    drop_last: bool = False
    """Leave out the epoch's last incomplete step instead of completing it with refill rows."""
    lazy_blobs: bool | tuple[str, ...] = False
    """Blob columns handed to the transform as file objects read by range instead of bytes
    (:mod:`tokenloom.rows.blobs`): ``True`` for every blob column among ``columns``, or the
    names of some. Needs a transform; the stream of rows does not change."""

    def __post_init__(self) -> None:
        if not isinstance(self.table, str | os.PathLike) or not os.fspath(self.table):
            raise PlanError(f"table must be a path or URI, got {self.table!r}")
        object.__setattr__(self, "table", absolute_uri(self.table))
        cols = self.columns
        if isinstance(cols, str):
            cols = tuple(c.strip() for c in cols.split(",") if c.strip())
        if not isinstance(cols, Sequence) or not cols or not all(isinstance(c, str) for c in cols):
            raise PlanError(f"columns must name at least one column, got {self.columns!r}")
        if len(set(cols)) != len(cols):
            raise PlanError(f"columns repeat a name: {list(cols)}")
        object.__setattr__(self, "columns", tuple(cols))
        for name, low in (("global_batch", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise PlanError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.version is not None and (
            isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0
        ):
            raise PlanError(f"version must be an integer >= 0, got {self.version!r}")
        if self.filter is not None and (
            not isinstance(self.filter, str) or not self.filter.strip()
        ):
            raise PlanError(f"filter must be SQL text or None, got {self.filter!r}")
        if not isinstance(self.drop_last, bool):
            raise PlanError(f"drop_last must be True or False, got {self.drop_last!r}")
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

    def per_rank(self, world_size: int) -> int:
        """Rows each of ``world_size`` ranks gets per step.

        Raises:
            PlanError: ``G`` is not a multiple of ``world_size``.
        """
        if self.global_batch % world_size:
            raise PlanError(
                f"global batch {self.global_batch} rows does not split evenly over {world_size} "
                f"ranks; pick a global batch that is a multiple of {world_size}"
            )
        return self.global_batch // world_size

    def replace(self, **changes: Any) -> RowSpec:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    def fingerprint_inputs(self) -> dict[str, Any]:
        """The spec's named inputs of the stream (the dataset adds the version and transform)."""
        return {
            "kind": "rows",
            "filter": self.filter,
            "columns": list(self.columns),
            "global_batch": self.global_batch,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "permutation": PERMUTATION_ALGORITHM,
            "refill": REFILL_ALGORITHM,
        }
