"""Check 6, pool shares per step: a mixture holds its shares within every global step.

For a loader with a mixture, each checked step's batch names the pool of every row
(``block_pool``, ``-1`` for a padding block). With ``m`` real blocks in the step and pool ``p``'s
target share ``x_p`` (the shares normalised), a **full** step (``m == G``) must give pool ``p``
``floor(G x_p)`` or ``ceil(G x_p)`` blocks (a share resolution of ``1e-4`` is allowed for), and a
partial last step within 4 blocks of ``m x_p``. A run whose steps each draw from one pool (while
its shares hold only over the epoch) fails here, with the first step and pool that is off.
Without a mixture the check passes and says so.
"""

from __future__ import annotations

import math
import time

import numpy as np

from tokenloom.verify.report import CheckResult
from tokenloom.verify.sample import Sample

__all__ = ["PARTIAL_STEP_SLACK", "check_pool_shares", "step_share_error"]

PARTIAL_STEP_SLACK = 4.0
"""Largest ``|blocks - m x_p|`` allowed in a step of ``m < G`` real blocks (measured worst 3.2)."""


def step_share_error(
    pools: np.ndarray, shares: np.ndarray, global_batch: int, names: list[str]
) -> str | None:
    """Why one step's pools do not hold the shares (``None`` when they do).

    Args:
        pools: ``(B,)`` pool of each batch row, ``-1`` for a padding block.
        shares: ``(P,)`` target shares, summing to 1.
        global_batch: ``G``.
        names: The pools' names, for the message.
    """
    real = pools[pools >= 0]
    m = int(real.size)
    counts = np.bincount(real, minlength=len(shares))
    for p, (got, x) in enumerate(zip(counts.tolist(), shares.tolist(), strict=True)):
        want = m * x
        if m == global_batch:
            tol = global_batch * 1e-4 + 1e-9
            lo, hi = math.floor(want - tol), math.ceil(want + tol)
            if not lo <= got <= hi:
                return (
                    f"pool {names[p]!r} has {got} of the step's {m} blocks, its share "
                    f"{x:.4f} asks for {lo}" + ("" if lo == hi else f" or {hi}")
                )
        elif abs(got - want) > PARTIAL_STEP_SLACK:
            return (
                f"pool {names[p]!r} has {got} of the last step's {m} blocks, its share "
                f"{x:.4f} asks for about {want:.1f}"
            )
    return None


def check_pool_shares(sample: Sample) -> CheckResult:
    """Check 6 (see the module docstring)."""
    started = time.perf_counter()
    spec = sample.spec
    if not spec.mixture:
        return CheckResult(
            name="pool_shares",
            passed=True,
            detail="no mixture: one pool",
            seconds=time.perf_counter() - started,
        )
    names = [p.name for p in spec.mixture]
    shares = np.array([p.share for p in spec.mixture], dtype=np.float64)
    shares = shares / shares.sum()
    G = spec.global_batch
    worst = 0.0
    for batch in sample.batches:
        pools = np.asarray(batch.arrays["block_pool"], dtype=np.int64).reshape(-1)
        why = step_share_error(pools, shares, G, names)
        if why is not None:
            return CheckResult(
                name="pool_shares",
                passed=False,
                detail=f"step {batch.step}: {why}",
                seconds=time.perf_counter() - started,
            )
        real = pools[pools >= 0]
        if real.size:
            got = np.bincount(real, minlength=len(shares)) / real.size
            worst = max(worst, float(np.abs(got - shares).max()))
    return CheckResult(
        name="pool_shares",
        passed=True,
        detail=(
            f"{len(sample.batches)} steps of {G} blocks each hold every pool's share "
            f"(floor or ceil of {G} x share; worst step deviation {100 * worst:.1f} points)"
        ),
        seconds=time.perf_counter() - started,
    )
