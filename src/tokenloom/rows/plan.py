"""The row loader's epoch plan: which row fills which slot of which global step (pure numpy).

A selection of ``n`` rows is visited in a fresh permutation per ``(seed, epoch)``
(:func:`~tokenloom.loader.plan.shuffle.epoch_permutation`). Global step ``s`` holds the ``G`` global
positions ``s*G .. s*G+G-1``; rank ``r`` of ``W`` takes the contiguous ``G / W`` of them, so the
global batch depends on ``G`` only, never on the world size or the DataLoader workers.

Every slot is always filled, so every rank runs the same number of steps whatever happens to a
row (no DDP hang). A slot's row is its position's row in the permutation; when that row is left
out (its transform failed under ``on_error="skip"``) or the position is past the end of the
epoch (the last, incomplete step, when ``drop_last`` is off), the slot takes the next of its
**refill candidates**: position ``p``'s ``k``-th candidate is ``alt[(p * MAX_REFILLS + k) % n]``
in a second permutation ``alt`` of ``(seed, epoch)``. A slot's chain depends on its position
alone, so ranks agree without talking, and a resumed run on another world size refills the same
way. :data:`REFILL_ALGORITHM` names this recipe for the fingerprint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenloom.loader.plan.epoch import PlanError
from tokenloom.loader.plan.shuffle import epoch_order, epoch_permutation
from tokenloom.loader.plan.stream.topology import Topology

__all__ = ["REFILL_ALGORITHM", "MAX_REFILLS", "RowPlan", "refill_permutation", "naive_slots"]

REFILL_ALGORITHM = "alt-pcg64[seed,epoch,1]-chain16-v1"
"""Identity of the refill recipe (part of the fingerprint)."""

MAX_REFILLS = 16
"""Candidates a slot tries before the loader gives up (16 failures in a row is not bad luck)."""


def refill_permutation(n: int, *, seed: int, epoch: int) -> np.ndarray:
    """``(n,)`` int64: the second permutation refill candidates are drawn from.

    Drawn like :func:`~tokenloom.loader.plan.shuffle.epoch_permutation` from ``(seed, epoch)`` but
    on an independent stream (the seed shifted past any epoch's), so it is unrelated to the order.
    """
    return epoch_permutation(n, seed=_refill_seed(seed), epoch=epoch)


def _refill_seed(seed: int) -> int:
    # ``seed * 2**20 + 2**40`` cannot collide with a real (seed, epoch) pair for seeds < 2**20.
    return seed + (1 << 40)


@dataclass(frozen=True, kw_only=True, eq=False)
class RowPlan:
    """One epoch of a row selection cut into global steps (see the module docstring).

    Positions index the selection (``0..n-1``, ascending ``id``), not table ids.
    """

    n: int
    """Rows in the selection."""
    seed: int
    epoch: int
    global_batch: int
    """Slots per global step ``G``."""
    drop_last: bool
    """Leave out the last incomplete step instead of completing it with refill rows."""
    order: np.ndarray
    """``(n,)`` the selection position visited at each global position (uint32 below
    ``2**32`` rows: :func:`~tokenloom.loader.plan.shuffle.epoch_order`)."""
    alt: np.ndarray
    """``(n,)`` the refill permutation (:func:`refill_permutation`'s values, as narrow)."""

    @classmethod
    def build(cls, n: int, *, seed: int, epoch: int, global_batch: int, drop_last: bool) -> RowPlan:
        """The plan of one epoch (``O(n log n)``: two permutations, 4 bytes per row each below
        ``2**32`` rows, built by the grouped sort of :mod:`~tokenloom.loader.plan.shuffle`).

        Raises:
            PlanError: ``global_batch < 1``.
        """
        if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
            raise PlanError(f"global_batch must be an integer >= 1, got {global_batch!r}")
        return cls(
            n=int(n),
            seed=seed,
            epoch=epoch,
            global_batch=global_batch,
            drop_last=drop_last,
            order=epoch_order(n, seed=seed, epoch=epoch),
            alt=epoch_order(n, seed=_refill_seed(seed), epoch=epoch),
        )

    @property
    def steps(self) -> int:
        """Global steps in the epoch: ``n // G`` with ``drop_last``, else ``ceil(n / G)``."""
        g = self.global_batch
        return self.n // g if self.drop_last else -(-self.n // g)

    def positions(self, step: int, *, rank: int = 0, world_size: int = 1) -> np.ndarray:
        """``(G / W,)`` global positions rank ``rank`` fills at ``step``.

        Raises:
            PlanError: A bad topology or a step outside the epoch.
        """
        topology = Topology(rank, world_size)
        b = topology.per_rank(self.global_batch, unit="rows")
        if not 0 <= step < self.steps:
            raise PlanError(
                f"step {step} is outside the epoch: it has {self.steps} global steps of "
                f"{self.global_batch} rows ({self.n} rows, drop_last={self.drop_last})"
            )
        return topology.first(step, self.global_batch) + np.arange(b, dtype=np.int64)

    def first_rows(self, positions: np.ndarray) -> np.ndarray:
        """Selection position of each global position's own row (``-1`` past the epoch's end)."""
        p = np.asarray(positions, dtype=np.int64)
        out = np.full(p.shape, -1, dtype=np.int64)
        inside = p < self.n
        out[inside] = self.order[p[inside]]
        return out

    def candidate(self, position: int, k: int) -> int:
        """Selection position of global position ``position``'s ``k``-th refill candidate.

        Raises:
            PlanError: ``k >= MAX_REFILLS`` or an empty selection.
        """
        if self.n == 0:
            raise PlanError("the selection is empty: no row can refill a slot")
        if not 0 <= k < MAX_REFILLS:
            raise PlanError(f"refill candidate {k} of position {position}: at most {MAX_REFILLS}")
        return int(self.alt[(int(position) * MAX_REFILLS + k) % self.n])


def naive_slots(
    plan: RowPlan, step: int, *, rank: int, world_size: int, bad: set[int]
) -> list[int]:
    """Reference: the selection position delivered in each of a rank's slots, one by one.

    ``bad`` holds selection positions whose transform fails. The loader must deliver exactly
    this (it is faster because it reads and transforms whole chunks at once).
    """
    out = []
    for p in plan.positions(step, rank=rank, world_size=world_size).tolist():
        row = int(plan.order[p]) if p < plan.n else -1
        k = 0
        while row < 0 or row in bad:
            row = plan.candidate(p, k)
            k += 1
        out.append(row)
    return out
