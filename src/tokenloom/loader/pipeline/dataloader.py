"""Torch's face of the loader: ``PackedDataset`` and ``DataLoader``.

:class:`PackedDataset` is the :class:`~tokenloom.loader.pipeline.dataset.PackedStream` as a torch
``IterableDataset`` (batches as tensors, zero-copy over the packed arrays). :class:`DataLoader`
is a torch ``DataLoader`` over it with ``batch_size=None`` (the dataset yields whole batches), a
``state_dict()`` that is the exact cursor of batches *delivered to the consumer*, and
:attr:`DataLoader.stats` adding up the workers' counters and the consumer's wait (stall) time.
Its workers are tokenloom's own (:class:`~tokenloom.loader.pipeline.workers.WorkerPool`): spawned
(or ``forkserver``) processes that import no torch, each sending groups of steps through a
shared-memory ring; torch's ``prefetch_factor``, ``timeout``, ``worker_init_fn``,
``multiprocessing_context`` (``fork`` refused: Lance is not fork-safe) and ``pin_memory`` keep
their meaning.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from tokenloom.loader.observe.gauge import TransitGauge
from tokenloom.loader.observe.ledger import LedgerCounter
from tokenloom.loader.observe.stats import LoaderStats
from tokenloom.loader.pipeline import prebuilt
from tokenloom.loader.pipeline.dataset import PackedStream
from tokenloom.loader.pipeline.read import LoaderError
from tokenloom.loader.pipeline.transit import BuiltGroup, Rings
from tokenloom.loader.pipeline.workers import KeptPool, WorkerPool, multiprocessing_context

__all__ = ["DataLoader", "PackedDataset", "as_tensors"]


def as_tensors(batch: dict[str, Any], *, pin: bool = False) -> dict[str, Any]:
    """The batch's numpy arrays as torch tensors (zero-copy; pinned copies with ``pin``)."""
    out = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
    return _pinned(out) if pin else out


def _pinned(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class TensorSteps:
    """A read group's steps as dicts of torch tensors: :meth:`BuiltGroup.batch` field by field
    (views of the same memory), each field turned into a tensor once per group and cut into its
    steps in one call (``unbind``, ``split``), so a step is a dict of tensors already made and
    no torch call at all. Converting each step's seven arrays (``as_tensors``) was the largest
    part of handing a batch out in-process: a torch call lets go of the interpreter lock, and
    the read threads that take it meanwhile keep it for up to a switch interval."""

    __slots__ = ("group", "_blocks", "_cu", "_max", "_continues", "_spans", "_context", "_pools")

    def __init__(self, group: BuiltGroup) -> None:
        self.group = group
        p = group.packed
        S, B = p.steps, p.blocks_per_step
        arrays = torch.as_tensor(p.arrays)  # (4, S * B, L), zero-copy
        L = arrays.shape[2]
        fields = arrays.reshape(4, S, B, L).unbind(0)
        self._blocks = tuple(f.unbind(0) for f in fields)  # per field, a (B, L) view a step
        seg, cu = p.segment_bounds, p.cu_seqlens
        n = np.diff(seg) + 1  # step i: cu_seqlens[seg[i] : seg[i + 1] + 1], from its own start
        at = np.cumsum(n) - n
        take = np.repeat(seg[:-1] - at, n) + np.arange(int(n.sum()))
        flat = np.repeat(np.arange(S, dtype=np.int64) * (B * L), n)
        cut = n.tolist()
        self._cu = torch.from_numpy(cu[take] - flat.astype(cu.dtype)).split(cut)
        self._max = p.max_seqlen.tolist()
        self._continues = torch.from_numpy(p.continues).split(B)
        sb = p.stretch_bounds
        stretches = np.diff(sb).tolist()
        self._spans = torch.from_numpy(p.spans[sb[0] : sb[-1]]).split(stretches)
        self._context = (
            None
            if p.context is None
            else torch.from_numpy(p.context[sb[0] : sb[-1]]).split(stretches)
        )
        self._pools = None if group.pools is None else torch.from_numpy(group.pools).split(B)

    def batch(self, i: int) -> dict[str, Any]:
        """Step ``i`` of the group: the keys, order and values of :meth:`BuiltGroup.batch`."""
        input_ids, labels, position_ids, doc_ids = self._blocks
        batch: dict[str, Any] = {
            "input_ids": input_ids[i],
            "labels": labels[i],
            "position_ids": position_ids[i],
            "doc_ids": doc_ids[i],
            "cu_seqlens": self._cu[i],
            "max_seqlen": self._max[i],
            "continues": self._continues[i],
            "spans": self._spans[i],
        }
        if self._context is not None:
            batch["context"] = self._context[i]
        if self._pools is not None:
            batch["block_pool"] = self._pools[i]
        return batch


def tensor_steps(
    steps: Iterator[tuple[BuiltGroup, int]],
) -> Iterator[tuple[BuiltGroup, int, dict[str, Any]]]:
    """``(group, i, batch)`` for each step handed out as ``(group, i)``: the batch as tensors,
    through one :class:`TensorSteps` per group, let go after the group's last step (its buffer
    is reused once its batches are dropped). A group of fewer than :data:`_TENSOR_STEPS_MIN`
    steps (``read_group=1``, say) is converted step by step instead: cutting it costs more torch
    calls than its steps' own seven."""
    tensors = None
    for group, i in steps:
        if group.steps < _TENSOR_STEPS_MIN:
            yield group, i, as_tensors(group.batch(i))
            continue
        if tensors is None or tensors.group is not group:
            tensors = TensorSteps(group)
        batch = tensors.batch(i)
        if i + 1 == group.steps:
            tensors = None
        yield group, i, batch


_TENSOR_STEPS_MIN = 4


class PackedDataset(PackedStream, IterableDataset):
    __doc__ = PackedStream.__doc__

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Batches (dicts of tensors) of the rest of the current epoch, in this process."""
        if get_worker_info() is not None:
            raise LoaderError(
                "a PackedDataset inside a torch DataLoader worker would interleave its groups "
                "of steps out of order; use tokenloom.loader.DataLoader(dataset, num_workers=N), "
                "whose workers keep the stream exact"
            )
        for _, _, batch in tensor_steps(self.handed_steps()):
            yield batch


class DataLoader(torch.utils.data.DataLoader):
    """A torch DataLoader over a :class:`PackedDataset` (``batch_size=None``, spawn workers)
    whose ``state_dict()`` is the exact cursor of batches delivered to the consumer and whose
    :attr:`stats` add up the workers' counters and the consumer's wait time.

    The one front for both streams: given a :class:`~tokenloom.rows.RowDataset` it returns a
    :class:`~tokenloom.rows.RowLoader` (the same contract: whole batches, exact cursor, spawned
    workers that need no ``__main__`` guard).
    """

    def __new__(cls, dataset: Any, *args: Any, **kwargs: Any) -> Any:
        rows = sys.modules.get("tokenloom.rows.iterable")  # loaded if a RowDataset exists
        if cls is DataLoader and rows is not None and isinstance(dataset, rows.RowDataset):
            from tokenloom.rows.loader import RowLoader

            return RowLoader(dataset, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, dataset: PackedDataset, num_workers: int = 0, **kwargs: Any) -> None:
        if not isinstance(dataset, PackedDataset):
            raise TypeError(
                f"tokenloom.loader.DataLoader takes a PackedDataset or a RowDataset, not a "
                f"{type(dataset).__name__}; a RowMapDataset (map-style) goes to "
                "torch.utils.data.DataLoader(ds, batch_size=B, shuffle=True)"
            )
        if num_workers > 0:  # spawn by default, forkserver too; fork refused (Lance)
            kwargs["multiprocessing_context"] = multiprocessing_context(
                kwargs.get("multiprocessing_context")
            )
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
        self._stats = LoaderStats(rows_planned=dataset.stats.rows_planned)
        self._unfolded: LoaderStats | None = None
        """In-process: the dataset's counters when they were last added into :attr:`stats`
        (what it has counted since is added when :attr:`stats` is read, not per batch)."""
        self._transit = TransitGauge(2 * num_workers * (self.prefetch_factor or 2))
        self.ledger = LedgerCounter(dataset.spec.pool_names, dataset.planner.run_universes())
        """Per-pool counts of the batches delivered (the ledger's numbers, at run time)."""
        self._kept = KeptPool()
        """With ``persistent_workers``: the workers kept between passes, and what they were
        started for (a re-pinned version or other read settings start new ones)."""

    @property
    def stats(self) -> LoaderStats:
        """The counters of the batches delivered so far (the workers' and this process's)."""
        if self._unfolded is not None:  # in-process: the dataset's counts since the last read
            ds: PackedDataset = self.dataset  # type: ignore[assignment]
            self._stats.add(ds.stats.delta(self._unfolded))
            self._unfolded = ds.stats.copy()
        return self._stats

    @stats.setter
    def stats(self, value: LoaderStats) -> None:
        self._stats, self._unfolded = value, None

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        ds: PackedDataset = self.dataset  # type: ignore[assignment]
        if self.num_workers == 0:
            yield from self._in_process(ds)
            return
        total = len(ds)
        pool = self._workers(ds)
        self.worker_pool = pool
        """The workers of the current (or last) pass."""
        pin = self._pin()
        it = pool.run((ds.epoch, ds.step)) if pool.persistent else iter(pool)
        last: float | None = None
        rings = Rings(ds._buffers)  # each worker's shared-memory ring
        while True:
            asked = time.monotonic()
            try:
                group: BuiltGroup = next(it)
            except StopIteration:
                return
            group = rings.settle(group)
            first, last = last is None, self._clock(asked, last)
            self._transit.arrive(group.sent, asked, last, first=first, stats=self.stats)
            if group.extra:
                self.stats.add(group.extra)
            for _, i, batch in tensor_steps((group, i) for i in range(group.steps)):
                self.stats.add_counts(group.step_stats(i))
                self.ledger.add_step(group.counts, i)
                ds.delivered(group.epoch, group.first + i, total)
                pool.check()  # a dead worker is noticed here, not when its queue runs dry
                yield _pinned(batch) if pin else batch
            group = batch = None  # the group's slot goes back once its batches are dropped

    def _workers(self, ds: PackedDataset) -> WorkerPool:
        """This pass's workers: new ones, or with ``persistent_workers`` the ones kept from the
        last pass when it ran to its end and the dataset still reads what they were started
        with (each pass tells them its cursor: ``set_epoch`` and ``load_state_dict`` reach
        them, and their object-store fetches carry over into the next epoch)."""
        key = (ds.planner, ds.rank, ds.world_size, ds.io_threads, ds.read_ahead, ds.read_group)

        def start(persistent: bool) -> WorkerPool:
            prebuilt.ensure()  # the workers' packer, built here: they only load it
            return WorkerPool.of_loader(self, ds.detached(), persistent=persistent)

        return self._kept.get(key, start, persistent=bool(self.persistent_workers))

    def close(self) -> None:
        """Stop the workers kept between passes (``persistent_workers``); the next pass
        starts new ones. Without persistent workers there is nothing to stop between passes."""
        self._kept.close()

    def _pin(self) -> bool:
        return bool(self.pin_memory) and torch.cuda.is_available()

    def _in_process(self, ds: PackedDataset) -> Iterator[dict[str, Any]]:
        # The dataset's counters are added into ``stats`` when it is read (the sum of per-batch
        # increments is the increment since the pass began): no per-batch copy of them.
        self.stats  # noqa: B018 - anything pending from a pass before is added first
        self._unfolded = ds.stats.copy()
        it = tensor_steps(ds.handed_steps())
        pin = self._pin()
        last: float | None = None
        try:
            while True:
                asked = time.monotonic()
                try:
                    group, i, batch = next(it)
                except StopIteration:
                    return
                last = self._clock(asked, last)
                self.ledger.add_step(group.counts, i)
                del group
                yield _pinned(batch) if pin else batch
        finally:
            self.stats  # noqa: B018 - the pass's counts added, then nothing is pending
            self._unfolded = None

    def _clock(self, asked: float, last: float | None) -> float:
        """A batch arrived: the wait since ``asked`` is stall and the time since the previous
        arrival is wall time, except for a pass's first batch (``last`` is ``None``), whose
        wait is start-up (workers spawned, plan built). Returns now (``time.monotonic()``, the
        clock the workers stamp batches with)."""
        now = time.monotonic()
        stats = self._stats  # this process's own clock: nothing of the dataset's to add
        if last is None:
            stats.startup_seconds += now - asked
        else:
            stats.wait_seconds += now - asked
            stats.wall_seconds += now - last
        return now

    def state_dict(self) -> dict:
        """The cursor of batches delivered to the consumer."""
        return self.dataset.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
