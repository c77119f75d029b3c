"""Who reads a stream: rank ``r`` of ``W`` ranks, and worker ``w`` of ``N`` per rank.

The global stream never depends on the topology (★3): global step ``s`` holds the ``G`` items
``s*G .. s*G+G-1``; rank ``r`` takes the contiguous ``G / W`` of them (so ``G`` must be a
multiple of ``W``: :func:`split_global_batch`, the one place that rule is checked), and worker
``w`` of ``N`` builds the rank's groups of steps ``w, w + N, ...`` (:func:`worker_groups`),
which the loader takes round-robin, so the order is the same for any ``N``. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenloom.loader.plan.epoch import PlanError

__all__ = ["Topology", "check_rank", "split_global_batch", "worker_groups"]


def split_global_batch(global_batch: int, world_size: int, *, unit: str = "items") -> int:
    """``G / W``: the items each of ``world_size`` ranks takes of a global step of
    ``global_batch`` (``unit`` names them in the error).

    Raises:
        PlanError: ``world_size < 1``, or ``G`` is not a multiple of ``W`` (naming the nearest
            global batches that are).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise PlanError(f"world_size must be >= 1, got {world_size!r}")
    if global_batch % world_size:
        low = global_batch - global_batch % world_size
        high = low + world_size
        near = f"{low} or {high}" if low else f"{high}"
        raise PlanError(
            f"global batch {global_batch} {unit} does not split evenly over {world_size} ranks "
            f"(each rank takes global_batch / world_size); pick a global batch that is a "
            f"multiple of the world size, e.g. {near} (--global-batch-size / global_batch=)"
        )
    return global_batch // world_size


def check_rank(rank: int, world_size: int) -> None:
    """Refuse a rank outside ``0 .. world_size - 1``.

    Raises:
        PlanError: Naming the rank, the world size and where they come from.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise PlanError(f"world_size must be >= 1, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise PlanError(
            f"rank must be in [0, {world_size}), got {rank}: rank {rank} is outside world_size "
            f"{world_size} (pass rank=/world_size=, or let torchrun set $RANK and $WORLD_SIZE)"
        )


@dataclass(frozen=True, slots=True)
class Topology:
    """Rank ``rank`` of ``world_size`` (checked: :func:`check_rank`)."""

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        check_rank(self.rank, self.world_size)

    @classmethod
    def of(cls, rank: int | None = None, world_size: int | None = None) -> Topology:
        """The arguments, else torchrun's ``$RANK``/``$WORLD_SIZE``, else ``(0, 1)``."""
        from tokenloom.process import env_topology

        return cls(*env_topology(rank, world_size))

    def per_rank(self, global_batch: int, *, unit: str = "items") -> int:
        """This topology's share of a global step (:func:`split_global_batch`)."""
        return split_global_batch(global_batch, self.world_size, unit=unit)

    def first(self, step: int, global_batch: int) -> int:
        """Global position of this rank's first item of global step ``step``."""
        return step * global_batch + self.rank * self.per_rank(global_batch)


def worker_groups(first: int, total: int, size: int, worker: int, workers: int) -> list[range]:
    """Groups of ``size`` steps from step ``first`` to ``total`` that worker ``worker`` of
    ``workers`` builds: groups ``worker, worker + workers, ...`` (a loader takes its workers'
    groups round-robin, so the stream is the same for any number of workers)."""
    if size < 1 or workers < 1 or not 0 <= worker < workers:
        raise PlanError(f"worker {worker} of {workers}, groups of {size} steps: out of range")
    starts = range(first + worker * size, total, workers * size)
    return [range(lo, min(lo + size, total)) for lo in starts]
