"""Which step checkpoints a run keeps (``--keep-every``, ``--keep-last``, ``--keep-best``).

Every checkpoint is a ``RUN/step-N`` directory (:mod:`tokenloom.train.layout`); after a new one is
written, the others are deleted unless a rule keeps them. Pure: no torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["best_step", "steps_to_keep"]


def best_step(val: Iterable[Sequence[float]]) -> int | None:
    """The step of the lowest validation loss among ``(step, loss)`` pairs taken after training
    began (step 0, before any update, holds no checkpoint); the earliest on a tie."""
    best: tuple[float, int] | None = None
    for step, loss in val:
        if step <= 0 or not math.isfinite(loss):
            continue
        if best is None or (loss, step) < best:
            best = (float(loss), int(step))
    return best[1] if best else None


def steps_to_keep(
    steps: Iterable[int],
    *,
    latest: int,
    keep_every: int | None = None,
    keep_last: int = 1,
    best: int | None = None,
) -> set[int]:
    """The steps among ``steps`` (the checkpoints on disk) that survive once ``latest`` is written.

    Args:
        steps: Steps of the checkpoint directories on disk (``latest`` among them).
        latest: The checkpoint just written (the run's latest: always kept). Steps after it are
            left by a save killed before its record switched and are never kept.
        keep_every: Keep every step that is a multiple of this (immutable ``step-N``).
        keep_last: Keep this many most recent checkpoints (``latest`` included).
        best: Keep this step (the lowest validation loss so far), if on disk.
    """
    alive = sorted(s for s in set(steps) if s <= latest)
    keep = {latest, *alive[-keep_last:]} if keep_last > 0 else {latest}
    if keep_every:
        keep |= {s for s in alive if s % keep_every == 0}
    if best is not None and best in alive:
        keep.add(best)
    return keep
