"""``DataLoader``: a torch DataLoader over a :class:`~tokenloom.loader.dataset.PackedDataset`.

Spawned workers (Lance is not fork-safe), ``batch_size=None`` (the dataset yields whole
batches), a ``state_dict()`` that is the exact cursor of batches *delivered to the consumer*, and
:attr:`DataLoader.stats` adding up the workers' counters and the consumer's wait (stall) time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from tokenloom.loader.buffers import SharedSlots
from tokenloom.loader.dataset import PackedDataset, _Group, as_tensors
from tokenloom.loader.ledger import LedgerCounter
from tokenloom.loader.read import LoaderError
from tokenloom.loader.stats import LoaderStats

__all__ = ["DataLoader"]


def _keep(group: Any) -> Any:
    """collate_fn of the workers: a group of steps as built (one message per group)."""
    return group


class DataLoader(torch.utils.data.DataLoader):
    """A torch DataLoader over a :class:`PackedDataset` (``batch_size=None``, spawn workers)
    whose ``state_dict()`` is the exact cursor of batches delivered to the consumer and whose
    :attr:`stats` add up the workers' counters and the consumer's wait time."""

    def __init__(self, dataset: PackedDataset, num_workers: int = 0, **kwargs: Any) -> None:
        if kwargs.get("persistent_workers"):
            raise LoaderError(
                "persistent_workers=True would replay the epoch the workers were started in "
                "(their copy of the dataset never hears of set_epoch); leave it off — workers "
                "restart each epoch, and the plan is rebuilt from stored counts in milliseconds"
            )
        if num_workers > 0:
            kwargs.setdefault("multiprocessing_context", "spawn")  # Lance is not fork-safe
            kwargs.setdefault("collate_fn", _keep)  # workers send groups; tensors made here
        if kwargs.get("batch_size") is not None:
            raise LoaderError(
                f"DataLoader(batch_size={kwargs['batch_size']}) would be ignored: a "
                "PackedDataset yields whole batches of global_batch / world_size blocks; set "
                "global_batch in the LoaderSpec instead"
            )
        kwargs.pop("batch_size", None)
        if kwargs.get("shuffle") or kwargs.get("sampler") is not None:
            raise LoaderError(
                "shuffle/sampler do not apply: the PackedDataset shuffles the whole selection "
                "every epoch from its seed (LoaderSpec.seed)"
            )
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)
        self.stats = LoaderStats(rows_planned=dataset.stats.rows_planned)
        self.ledger = LedgerCounter(dataset.spec.pool_names, dataset.planner.universes())
        """Per-pool counts of the batches delivered (the ledger's numbers, at run time)."""

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        ds: PackedDataset = self.dataset  # type: ignore[assignment]
        if self.num_workers == 0:
            yield from self._in_process(ds)
            return
        total = len(ds)
        it = super().__iter__()
        slots: dict[int, SharedSlots] = {}  # each worker's shared-memory slots
        while True:
            started = time.perf_counter()
            try:
                group: _Group = next(it)
            except StopIteration:
                return
            if group.slots is not None:
                slots[group.worker] = group.slots
            if group.slot is not None:
                group = group.settle(slots[group.worker], ds._buffers)
            self.stats.wait_seconds += time.perf_counter() - started
            for i in range(group.steps):
                self.stats.add(group.step_stats(i))
                self.ledger.add(group.counts.step(i))
                ds._epoch, ds._step = group.epoch, group.first + i + 1
                if ds._step >= total:
                    ds._epoch, ds._step = group.epoch + 1, 0
                yield as_tensors(group.batch(i))

    def _in_process(self, ds: PackedDataset) -> Iterator[dict[str, Any]]:
        snapshot = ds.stats.copy()
        it = iter(ds)
        while True:
            started = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.stats.wait_seconds += time.perf_counter() - started
            self.stats.add(ds.stats.delta(snapshot))
            self.ledger.add(ds.last_counts)
            snapshot = ds.stats.copy()
            yield batch

    def state_dict(self) -> dict:
        """The cursor of batches delivered to the consumer."""
        return self.dataset.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
