"""The block schedule of a token-quota mixture: which pool supplies global block ``k``.

Shares become integer weights ``w_p`` (:func:`share_weights`, ``W = sum(w)``). Block ``k`` goes to
the pool with the largest deficit ``w_p * (k + 1) - W * c_p(k)`` (ties: the lowest index). That
greedy never lets a pool get a whole block ahead of its quota, so after ``W`` blocks every pool has
exactly ``w_p`` and the schedule repeats: one period is precomputed (:func:`deficit_schedule`) and
any block's source or any pool's count is O(P) without iterating from 0. Pure integer math, with
a slow exact-fraction reference (:func:`naive_deficit_sources`) and the share-deviation measure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from tokenloom.loader.plan import PlanError

__all__ = [
    "Schedule",
    "share_weights",
    "deficit_schedule",
    "naive_deficit_sources",
    "window_share_deviation",
]


def share_weights(shares: Sequence[float], *, resolution: int = 10_000) -> np.ndarray:
    """Integer weights of the shares, divided by their gcd.

    Integer shares are used as they are; otherwise ``round(share / sum * resolution)``.

    Raises:
        PlanError: A share rounds to 0 at this resolution (name it, and the fix).
    """
    if all(isinstance(s, int | np.integer) and not isinstance(s, bool) for s in shares):
        w = np.asarray(shares, dtype=np.int64)
    else:
        total = float(sum(float(s) for s in shares))
        w = np.asarray([round(float(s) / total * resolution) for s in shares], dtype=np.int64)
    if w.size == 0:
        raise PlanError("a mixture needs at least one pool")
    if int(w.min()) < 1:
        i = int(np.argmin(w))
        raise PlanError(
            f"share {shares[i]!r} of pool {i} rounds to 0 at resolution {resolution}; "
            "raise the resolution or the share"
        )
    return w // math.gcd(*w.tolist())


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Schedule:
    """One period of the largest-deficit schedule; everything else follows by periodicity."""

    weights: np.ndarray
    """``(P,)`` int64 integer weights ``w_p``."""
    period: int
    """``W = sum(weights)``."""
    pool_at: np.ndarray
    """``(W,)`` int64: the pool of each block of the period."""
    rank_at: np.ndarray
    """``(W,)`` int64: how many blocks of that pool precede it in the period."""
    offsets: tuple[np.ndarray, ...]
    """Per pool, ``(w_p,)`` ascending offsets of its blocks in the period."""

    def source(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(pool, pool_block)`` of global blocks ``k`` (int64 arrays). O(1) each."""
        k = np.asarray(k, dtype=np.int64)
        r = k % self.period
        p = self.pool_at[r]
        return p, (k // self.period) * self.weights[p] + self.rank_at[r]

    def taken(self, k: int) -> np.ndarray:
        """``(P,)`` blocks taken from each pool by global blocks ``[0, k)``. O(P log W)."""
        q, r = divmod(int(k), self.period)
        return q * self.weights + np.array([np.searchsorted(o, r) for o in self.offsets])

    def position(self, pool: int, j: int) -> int:
        """Global index of pool ``pool``'s ``j``-th block (0-based)."""
        q, r = divmod(int(j), int(self.weights[pool]))
        return q * self.period + int(self.offsets[pool][r])


def deficit_schedule(weights: np.ndarray) -> Schedule:
    """Precompute one period of the largest-deficit schedule. O(W * P).

    Args:
        weights: ``(P,)`` positive integer weights.

    Returns:
        The :class:`Schedule`.
    """
    w = [int(x) for x in np.asarray(weights, dtype=np.int64)]
    W, P = sum(w), len(w)
    c = [0] * P
    pool_at = np.empty(W, dtype=np.int64)
    rank_at = np.empty(W, dtype=np.int64)
    for k in range(W):
        best, best_d = 0, None
        for p in range(P):
            d = w[p] * (k + 1) - W * c[p]
            if best_d is None or d > best_d:
                best, best_d = p, d
        pool_at[k], rank_at[k] = best, c[best]
        c[best] += 1
    # Upper quota makes every pool end the period with exactly its weight: the greedy restarts.
    assert c == w, (c, w)
    offsets = tuple(np.flatnonzero(pool_at == p).astype(np.int64) for p in range(P))
    return Schedule(
        weights=np.asarray(w, dtype=np.int64),
        period=W,
        pool_at=pool_at,
        rank_at=rank_at,
        offsets=offsets,
    )


def naive_deficit_sources(weights: Sequence[int], num_blocks: int) -> list[tuple[int, int]]:
    """Slow reference: run the largest-deficit rule from block 0 with exact fractions, no period.

    Returns:
        ``(pool, pool_block)`` of each global block ``0..num_blocks-1``.
    """
    total = sum(weights)
    shares = [Fraction(w, total) for w in weights]
    taken = [0] * len(weights)
    out = []
    for k in range(num_blocks):
        deficits = [s * (k + 1) - c for s, c in zip(shares, taken, strict=True)]
        p = deficits.index(max(deficits))
        out.append((p, taken[p]))
        taken[p] += 1
    return out


def window_share_deviation(
    pool_of_block: np.ndarray,
    shares: Sequence[float],
    *,
    window: int = 100,
    weight: np.ndarray | None = None,
) -> float:
    """Worst ``|share of pool p in the window - target share p|`` over all windows of blocks.

    Args:
        pool_of_block: ``(N,)`` pool of each global block.
        shares: Target shares (normalised here).
        window: Consecutive blocks per window.
        weight: ``(N,)`` optional weight of each block (e.g. its real tokens) to measure token
            shares; ``None`` measures block shares.

    Returns:
        The worst absolute deviation (0 when ``N < window``).
    """
    pool_of_block = np.asarray(pool_of_block, dtype=np.int64)
    N = pool_of_block.shape[0]
    if N < window:
        return 0.0
    s = np.asarray(shares, dtype=np.float64)
    s = s / s.sum()
    wt = np.ones(N) if weight is None else np.asarray(weight, dtype=np.float64)
    tot = np.concatenate([[0.0], np.cumsum(wt)])
    denom = tot[window:] - tot[:-window]
    worst = 0.0
    for p in range(s.shape[0]):
        c = np.concatenate([[0.0], np.cumsum(np.where(pool_of_block == p, wt, 0.0))])
        got = (c[window:] - c[:-window]) / np.maximum(denom, 1e-300)
        worst = max(worst, float(np.abs(got - s[p]).max()))
    return worst
