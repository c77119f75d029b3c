"""The held-out split as a SQL filter on the row id: stable for the life of the table.

A row is held out when ``id % M < K`` with ``K / M = percent / 100``; for 1%, ``id % 100 = 0``.
The ``id`` column is assigned densely at ingest and never reused or rewritten (see
:mod:`tokenloom.table.schema`), so:

* **stable**: a row's side never changes -- not when columns are added, not at a later table
  version, not when more rows are ingested (new rows get new ids and split at the same rate);
* **exact**: over any run of ``M`` consecutive ids exactly ``K`` are held out, so every source
  ingested as a contiguous block is held out at the requested rate (systematic sampling);
* **nested**: the 1% held-out set is inside the 2% one, so growing the evaluation set never
  moves a row from evaluation into training;
* **complementary**: :func:`train_filter` is the exact negation, and together they cover every
  row: no row is in both, none is lost.

It is a plain SQL expression, so Lance evaluates it as a pushed-down scan filter, and it can be
combined with curation filters: ``f"({train_filter()}) AND quality = 1.0"``.
"""

from __future__ import annotations

import re
from decimal import Decimal

import numpy as np

from tokenloom.curate.inputs import CurateError

__all__ = ["heldout_filter", "train_filter", "heldout_mask"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_DECIMALS = 2  # percent in steps of 0.01, i.e. modulus at most 10_000


def _modulus(percent: float | int) -> tuple[int, int]:
    """``(M, K)`` with ``K / M == percent / 100``, the smallest power-of-ten ``M >= 100``."""
    if isinstance(percent, bool) or not isinstance(percent, (int, float)):
        raise CurateError(f"percent must be a number in (0, 100), not {percent!r}")
    exact = Decimal(str(percent))
    if not exact.is_finite() or not 0 < exact < 100:
        raise CurateError(f"percent must be in (0, 100), not {percent!r}")
    decimals = max(0, -exact.normalize().as_tuple().exponent)
    if decimals > _MAX_DECIMALS:
        raise CurateError(
            f"percent {percent!r} has more than {_MAX_DECIMALS} decimals; round it, e.g. "
            f"{round(float(percent), _MAX_DECIMALS)}"
        )
    scale = 10**decimals
    return 100 * scale, int(exact * scale)


def _check_column(column: str) -> str:
    if not isinstance(column, str) or not _IDENTIFIER.fullmatch(column):
        raise CurateError(f"column must be a plain column name like 'id', not {column!r}")
    return column


def heldout_filter(percent: float = 1, *, column: str = "id") -> str:
    """The SQL filter selecting the held-out rows.

    Args:
        percent: Share of rows held out, in (0, 100), in steps of 0.01.
        column: The integer row-id column (non-negative values).

    Returns:
        E.g. ``"id % 100 = 0"`` for 1%, ``"id % 1000 < 5"`` for 0.5%.

    Raises:
        CurateError: ``percent`` out of range or too fine; ``column`` not a plain identifier.
    """
    m, k = _modulus(percent)
    col = _check_column(column)
    return f"{col} % {m} = 0" if k == 1 else f"{col} % {m} < {k}"


def train_filter(percent: float = 1, *, column: str = "id") -> str:
    """The SQL filter selecting every row :func:`heldout_filter` does not (same arguments)."""
    m, k = _modulus(percent)
    col = _check_column(column)
    return f"{col} % {m} != 0" if k == 1 else f"{col} % {m} >= {k}"


def heldout_mask(ids: np.ndarray, percent: float = 1) -> np.ndarray:
    """``(N,) bool``: which of ``(N,)`` integer ids :func:`heldout_filter` selects.

    Uses SQL's truncated remainder (``np.fmod``), so it agrees with the filter for every id.
    """
    m, k = _modulus(percent)
    return np.fmod(np.asarray(ids, dtype=np.int64), m) < k
