"""``PackedStream``: the epoch plan materialised as packed numpy batches (no torch).

The pure plan (:mod:`~tokenloom.loader.plan`) says which token of which row lands where; this
module reads those tokens (:mod:`~tokenloom.loader.read`), packs them
(:mod:`~tokenloom.loader.group`) and hands out batches. Steps are built in *groups* of consecutive
steps: one ``take`` for all their rows, one vectorised gather, one pack into a reused buffer
(:mod:`~tokenloom.loader.buffers`), so per-step Python stays small next to reading. DataLoader
worker ``w`` of ``W`` (:mod:`~tokenloom.loader.workers`) builds groups ``w, w+W, ...`` of this
rank's steps into shared-memory slots and sends one message per group; the training process
takes the workers' messages round-robin, so the stream is the same for any number of workers.
The state is ``(epoch, step)`` plus a fingerprint of the plan's inputs. Torch's face of it,
``PackedDataset`` and ``DataLoader``, is :mod:`~tokenloom.loader.dataloader`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tokenloom.loader.buffers import RecycledBuffers, SharedSlots, shm_available
from tokenloom.loader.gauge import PipelineGauge
from tokenloom.loader.group import PackedGroup
from tokenloom.loader.planner import Planner
from tokenloom.loader.read import LoaderError, TokenReader
from tokenloom.loader.readahead import (
    READ_AHEAD_BYTES,
    TAKE_ROWS,
    ReadAhead,
    available_cores,
    log,
    rows_per_take,
    size_read_ahead,
    timed,
)
from tokenloom.loader.spec import LoaderSpec
from tokenloom.loader.state import LoaderState
from tokenloom.loader.stats import LoaderStats
from tokenloom.loader.view import EpochView, GroupCounts, StepCounts
from tokenloom.process import env_topology
from tokenloom.table.storage import is_remote

__all__ = ["PackedStream"]

_META = "_loader"  # per-batch worker metadata, removed by DataLoader
# A worker's groups in transit: its queue (prefetch_factor, 2 by default), the one in the pipe
# and the one the training process is settling. More only makes a worker wait for a slot.
_SLOTS_IN_TRANSIT = 4
# Slots the training process lends to batches at a time (the group being handed out and the one
# before it, which a training loop may still hold a batch of); past that it copies groups out,
# so keeping batches never stalls a worker. A slot is a group of ~1,000 rows: tens of MB.
_SLOTS_LENT = 2
_GROUP_BYTES = 8 << 20  # packed output of one local group at most (4 int64 fields)
_AHEAD_STEPS = 64  # local read-ahead: 4 groups ahead, fewer big ones covering these steps
_SLOT_WAIT_S = 5.0  # then a group is sent by value instead (slow, never stuck)


class PackedStream:
    """Packed blocks of a token column, streamed from the table as a
    :class:`~tokenloom.loader.spec.LoaderSpec` says (numpy; torch's face of it is
    :class:`~tokenloom.loader.dataloader.PackedDataset`, whose arguments these are). A
    DataLoader worker runs a detached copy (:meth:`detached`) and imports no torch.

    ``PackedDataset(spec, rank=r, world_size=w)`` is the form every tokenloom command uses. The
    keyword form ``PackedDataset("corpus.lance", seq_len=2048, global_batch=16, ...)`` takes the
    spec's fields flat (recipe fields included) and builds the spec.

    Args:
        spec: The :class:`LoaderSpec`, or a table URI / :class:`tokenloom.table.Table` for the
            keyword form.
        token_column: Keyword form only: the spec's ``token_column``.
        rank: This rank (default: ``$RANK`` or 0).
        world_size: Number of ranks (default: ``$WORLD_SIZE`` or 1); it must divide the global
            batch, and each rank packs ``global_batch / world_size`` blocks per step.
        epoch: The epoch to start in.
        storage_options: Object-store options for Lance.
        allow_data_change: Accept a checkpoint whose table version/filter/tokenizer differ.
        io_threads: Threads reading and packing ahead (not part of the stream; default:
            sized from the first read group's measured wall and CPU time, see
            :mod:`~tokenloom.loader.readahead`; at least 2, in-process and in each DataLoader
            worker).
        read_ahead: Read groups in flight (default: sized with ``io_threads``).
        read_group: Steps per group: per ``take``, per pack and per worker message (default:
            sized to ~256 rows per take).
        **options: Keyword form only: the other :class:`LoaderSpec` fields.
    """

    def __init__(
        self,
        spec: LoaderSpec | Any,
        token_column: str | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        epoch: int = 0,
        storage_options: dict | None = None,
        allow_data_change: bool = False,
        io_threads: int | None = None,
        read_ahead: int | None = None,
        read_group: int | None = None,
        **options: Any,
    ) -> None:
        from tokenloom.table import Table

        super().__init__()
        handle = None
        if not isinstance(spec, LoaderSpec):
            if "batch_size" in options:
                raise LoaderError(
                    "PackedDataset takes global_batch= (blocks per global step over all ranks); "
                    "batch_size= is gone because it meant different things in different places"
                )
            if token_column is not None:
                options["token_column"] = token_column
            if isinstance(spec, Table):
                handle = spec
                options.setdefault("version", handle.version)
            uri = handle.uri if handle is not None else spec
            spec = LoaderSpec.from_options(table=uri, **options)
        elif token_column is not None or options:
            raise LoaderError(
                "pass either a LoaderSpec or keyword options, not both "
                f"(got {', '.join(sorted(options)) or 'token_column'}); use spec.replace(...)"
            )
        self.rank, self.world_size = env_topology(rank, world_size)
        if not 0 <= self.rank < self.world_size:
            raise LoaderError(f"rank {self.rank} is outside world_size {self.world_size}")
        self.blocks_per_rank = spec.per_rank(self.world_size)
        """Blocks this rank packs per step (``global_batch / world_size``)."""
        self.planner = Planner(spec, storage_options=storage_options, table=handle)
        self.spec = self.planner.spec
        """The spec, with the table version pinned."""
        self.allow_data_change = allow_data_change
        if (
            (io_threads is not None and io_threads < 1)
            or (read_ahead is not None and read_ahead < 1)
            or (read_group is not None and read_group < 1)
        ):
            raise LoaderError(
                f"io_threads, read_ahead and read_group must be >= 1 "
                f"({io_threads}, {read_ahead}, {read_group})"
            )
        self.io_threads = io_threads
        """Threads reading and packing ahead (``take`` and the packer release the GIL);
        ``None``: sized from a measured read group on an object store; locally 2, in the
        training process and in each DataLoader worker."""
        self.read_ahead = read_ahead
        """Read groups in flight (at least ``io_threads``); ``None``: sized with them."""
        self.sizing: ReadAhead | None = None
        """How the last iteration sized its reads (in this process)."""
        self.read_group = read_group
        """Steps per ``take``; ``None``: sized to about 256 rows per take from the plan."""
        self._buffers = RecycledBuffers()
        """Output buffers of packed groups, reused once no batch of theirs is referenced."""
        self.reader = TokenReader(
            self.uri, self.version, self.spec.token_column, storage_options=storage_options
        )
        self.stats = LoaderStats(rows_planned=len(self.inputs.row_ids))
        self.gauge = PipelineGauge()
        """Queue occupancy of this process's read pipeline (written into :attr:`stats`)."""
        self.last_counts: StepCounts | None = None
        """Per-pool counts of the batch built last (the DataLoader adds them up)."""
        self._epoch = int(epoch)
        self._step = 0

    # -- what the spec resolved to --------------------------------------------------------------

    @property
    def uri(self) -> str:
        return self.planner.uri

    @property
    def version(self) -> int:
        """The pinned table version."""
        return self.planner.version

    @property
    def inputs(self) -> Any:
        """The plan's inputs (:class:`~tokenloom.loader.read.PlanInputs`)."""
        return self.planner.inputs

    @property
    def eos_id(self) -> int:
        return self.planner.eos_id

    @property
    def pad_id(self) -> int:
        return self.planner.pad_id

    @property
    def global_batch(self) -> int:
        """Blocks per global step (``blocks_per_rank * world_size``)."""
        return self.spec.global_batch

    @property
    def seq_len(self) -> int:
        return self.spec.seq_len

    # -- the plan -----------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def step(self) -> int:
        """Global steps of this epoch delivered so far."""
        return self._step

    def plan(self, epoch: int | None = None) -> Any:
        """The epoch's plan (a :class:`~tokenloom.loader.view.BlockPlan`)."""
        return self.planner.plan(self._epoch if epoch is None else epoch)

    def view(self, epoch: int | None = None) -> EpochView:
        """The epoch cut into global steps (:class:`~tokenloom.loader.view.EpochView`)."""
        return self.planner.view(self._epoch if epoch is None else epoch)

    def epoch_info(self, epoch: int | None = None) -> dict:
        """Exact sizes of an epoch from stored counts: steps, blocks, tokens, padding, dropped."""
        return self.planner.epoch_info(self._epoch if epoch is None else epoch)

    def __len__(self) -> int:
        """Steps in the current epoch (the same on every rank)."""
        return self.view().steps

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch`` (from its start, unless the cursor is already in it)."""
        if epoch != self._epoch:
            self._epoch = int(epoch)
            self._step = 0

    # -- state --------------------------------------------------------------------------------

    def plan_inputs(self) -> dict:
        """The named inputs the stream depends on (world size and workers are not among them)."""
        return self.planner.plan_inputs()

    def state_dict(self) -> dict:
        """The exact cursor of batches delivered so far, with the plan's fingerprint."""
        return LoaderState.create(
            epoch=self._epoch, step=self._step, inputs=self.plan_inputs()
        ).to_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue the global stream a state was taken at (on any world size / workers).

        Raises:
            ResumeMismatchError: naming what changed and the override.
        """
        saved = LoaderState.from_dict(state)
        saved.check(self.plan_inputs(), allow_data_change=self.allow_data_change)
        self._epoch, self._step = saved.epoch, saved.step

    # -- iteration ----------------------------------------------------------------------------

    def _group_steps(self, view: EpochView) -> int:
        """Steps whose rows are read in one ``take``: about
        :func:`~tokenloom.loader.readahead.rows_per_take` rows per call (small takes pay a
        fixed cost each, on an object store one GET per row; very large ones lose locality);
        locally also at most :data:`_GROUP_BYTES` of packed output (a worker's ring holds a few
        groups: their size is most of a worker's memory)."""
        if self.read_group is not None:
            return self.read_group
        remote = is_remote(self.uri)
        # ~ rows + block cuts per step; on an object store distinct rows (what a GET fetches)
        stretches = len(self.inputs.row_ids) + (0 if remote else view.plan.num_blocks)
        per_step = max(stretches / max(view.steps, 1) / self.world_size, 1.0)
        width = self.reader.dataset.schema.field(self.spec.token_column).type.value_type
        take = rows_per_take(
            int(self.inputs.n_tokens.sum()) * max(width.bit_width // 8, 1), remote=remote
        )
        steps = take // per_step
        if not remote:
            steps = min(steps, _GROUP_BYTES // (4 * self.blocks_per_rank * self.seq_len * 8))
        return int(min(max(steps, 1), 64 * take // TAKE_ROWS))

    def _build_group(
        self, view: EpochView, epoch: int, steps: range, slots: SharedSlots | None
    ) -> _Group:
        """Several consecutive steps read with ONE take of all their rows and packed with one
        call (in an I/O thread: ``take`` and the numpy packer release the GIL for most of their
        time); the consumer hands them out step by step. ``slots``: in a DataLoader worker, pack
        into a shared-memory slot that the training process lends to the batches."""
        layout = view.group(
            np.arange(steps.start, steps.stop), rank=self.rank, world_size=self.world_size
        )
        spans = layout.spans
        rowids = self.inputs.rowids[np.searchsorted(self.inputs.row_ids, spans.row_id)]
        tokens, offsets, read = self.reader.read_ranges(
            rowids, layout.starts, layout.stops, spans.doc_len
        )
        self.gauge.fetched()
        started = time.perf_counter()
        shape = (4, len(layout.blocks), self.seq_len)
        slot = None
        if slots is not None:
            slot, out = slots.acquire(shape, timeout_s=_SLOT_WAIT_S)
        if slot is None:
            out = self._buffers.take(shape)
        packed = view.pack_group(layout, tokens, offsets, out=out)
        counts = view.count_group(layout, packed, len(self.spec.pool_names))
        if slot is not None:
            packed = replace(packed, arrays=None)  # the training process reads the slot
        return _Group(
            epoch=epoch,
            first=steps.start,
            packed=packed,
            counts=counts,
            pools=layout.pools if self.spec.mixture else None,
            read=read,
            pack_seconds=time.perf_counter() - started,
            seq_len=self.seq_len,
            slot=slot,
        )

    def detached(self) -> PackedStream:
        """This stream as a plain :class:`PackedStream` (what a worker is sent: unpickling it
        imports no torch). Shares this object's state."""
        out = PackedStream.__new__(PackedStream)
        out.__dict__.update(self.__dict__)
        return out

    def batches(self) -> Iterator[dict[str, Any]]:
        """The rest of the current epoch in this process: one dict of numpy arrays per step
        (the cursor moves as each is handed out)."""
        return self._iterate(None)

    def groups(self, worker: int, workers: int) -> Iterator[_Group]:
        """DataLoader worker ``worker`` of ``workers``: its groups of steps of the rest of the
        current epoch (groups ``worker, worker + workers, ...``), packed into a shared-memory
        ring where the platform has one, for the training process to hand out step by step."""
        return self._iterate((worker, workers))

    def _iterate(self, worker: tuple[int, int] | None) -> Iterator[Any]:
        info = worker
        wid, workers = worker if worker is not None else (0, 1)
        epoch, first = self._epoch, self._step
        view = self.view(epoch)
        total = view.steps
        size = self._group_steps(view)
        # worker w builds groups w, w + W, ...: the DataLoader's round-robin keeps the order
        starts = range(first + wid * size, total, workers * size)
        groups = [range(lo, min(lo + size, total)) for lo in starts]
        snapshot = self.stats.copy()  # a worker sends what it adds from here (sizing included)
        probed = self._size_reads(view, epoch, groups, workers if info is not None else 0)
        assert self.sizing is not None
        threads, depth = self.sizing.io_threads, self.sizing.read_ahead
        skip = 1 if probed is not None else 0
        gauge = self.gauge
        # the group being handed out stays in the packed queue while its successor is submitted
        gauge.start(capacity=(depth + 1) * size)
        with ThreadPoolExecutor(threads, thread_name_prefix="tokenloom-read") as pool:
            slots = None
            if info is not None and groups and shm_available():
                size_values = 4 * len(groups[0]) * self.blocks_per_rank * self.seq_len
                slots = SharedSlots(
                    depth + _SLOTS_IN_TRANSIT + _SLOTS_LENT, size_values, lendable=_SLOTS_LENT
                )
            build = self._build_group

            def submit(g: range) -> Any:
                return gauge.submit(pool, build, view, epoch, g, slots, steps=len(g))

            ahead = deque(submit(g) for g in groups[skip : skip + depth])
            next_group = skip + len(ahead)
            expected = first_sent = groups[0].start if groups else total
            while ahead or probed is not None:
                tracked = probed is None  # the probe group was built outside the gauge
                if probed is not None:
                    group, probed = probed, None
                else:
                    group = gauge.take(ahead.popleft())
                    if next_group < len(groups):
                        ahead.append(submit(groups[next_group]))
                        next_group += 1
                assert group.first == expected  # groups are consumed in order
                expected += workers * size
                if info is not None:
                    # one message per group (the slots' memory crosses with the first one);
                    # the DataLoader splits it into steps and adds the worker's counters once
                    gauge.handed_out(self.stats, steps=group.steps if tracked else 0)
                    extra, snapshot = self.stats.delta(snapshot), self.stats.copy()
                    ring = slots if group.first == first_sent else None
                    yield replace(group, worker=wid, slots=ring, extra=extra, sent=time.monotonic())
                    continue
                for i in range(group.steps):
                    self.stats.add(group.step_stats(i))
                    gauge.handed_out(self.stats, steps=1 if tracked else 0)
                    self.last_counts = group.counts.step(i)
                    self._step = group.first + i + 1
                    if self._step >= total:
                        self._epoch, self._step = epoch + 1, 0
                    yield group.batch(i)

    def _size_reads(
        self, view: EpochView, epoch: int, groups: list[range], workers: int
    ) -> _Group | None:
        """Size the read pipeline (:attr:`sizing`): explicit values as given; on an object
        store the others from the first group, built here and timed (the group is returned,
        not built again; later epochs in this process reuse it); locally 2 threads in-process
        and in each worker (a worker's second thread overlaps one group's take with the next
        group's pack: measured +7% tok/s with 2 workers on 2 cores), 4 groups ahead, or fewer
        big ones covering :data:`_AHEAD_STEPS` steps (one per thread at least)."""
        cores = available_cores(max(workers, 1))
        floor = 2
        explicit = self.io_threads is not None and self.read_ahead is not None
        if explicit or not groups or not is_remote(self.uri):
            size = len(groups[0]) if groups else 1
            ahead = max(self.io_threads or floor, min(4, -(-_AHEAD_STEPS // size)))
            self.sizing = size_read_ahead(
                0.0, 0.0, cores=cores, io_threads=self.io_threads or floor,
                read_ahead=self.read_ahead or ahead,
            )  # fmt: skip
            self.stats.record_sizing(self.sizing)
            return None
        if self.sizing is not None and self.sizing.measured:  # a later epoch: measured already
            self.stats.record_sizing(self.sizing)
            return None
        self.reader.dataset  # noqa: B018 - opened before the clock starts
        built, wall, cpu = timed(self._build_group, view, epoch, groups[0], None)
        step_bytes = 4 * self.blocks_per_rank * self.seq_len * 8  # ids, labels, positions, docs
        self.sizing = size_read_ahead(
            wall, cpu, cores=cores, io_threads=self.io_threads, read_ahead=self.read_ahead,
            min_threads=floor, max_ahead=READ_AHEAD_BYTES // (len(groups[0]) * step_bytes),
        )  # fmt: skip
        self.stats.record_sizing(self.sizing)
        log.info("%s (%s)", self.sizing.describe(), self.uri)
        return built


@dataclass(frozen=True, kw_only=True, eq=False)
class _Group:
    """Consecutive steps as an I/O thread built them, with what they add to the counters."""

    epoch: int
    first: int
    """Global step of the group's first batch."""
    packed: PackedGroup
    counts: GroupCounts
    """Per-pool counts of each step."""
    pools: np.ndarray | None
    """``(k * B,)`` mixture pool of each block, with a mixture."""
    read: tuple[int, int, float]
    """Rows, bytes and seconds the group's ``take`` cost."""
    pack_seconds: float
    seq_len: int
    slot: int | None = None
    """The shared-memory slot holding the packed arrays (``packed.arrays`` is then ``None``)."""
    worker: int = 0
    """The DataLoader worker that built the group."""
    slots: SharedSlots | None = None
    """The worker's slots, sent with its first group."""
    extra: dict | None = None
    """The worker's other counters since its last message (pipeline gauges, read-ahead sizing:
    :meth:`LoaderStats.delta`), added once by the consumer."""
    sent: float = 0.0
    """``time.monotonic()`` when the worker handed the group out (the in-transit gauge)."""

    def settle(self, slots: SharedSlots, buffers: RecycledBuffers) -> _Group:
        """In the training process: the group with its arrays in its slot, lent to the batches
        (:meth:`SharedSlots.lend`: freed for the worker once no batch of it is referenced), or
        copied out into a recycled buffer and the slot freed at once when the training loop
        already holds all the slots it may (so the worker never waits on batches it keeps)."""
        if self.slot is None:
            return self
        p = self.packed
        shape = (4, p.steps * p.blocks_per_step, self.seq_len)
        arrays = slots.lend(self.slot, shape)
        if arrays is None:
            arrays = buffers.take(shape)
            np.copyto(arrays, slots.view(self.slot, shape))
            slots.release(self.slot)
        return replace(self, packed=replace(p, arrays=arrays), slot=None, slots=None)

    @property
    def steps(self) -> int:
        return self.packed.steps

    def batch(self, i: int) -> dict[str, Any]:
        """Step ``first + i`` as a dict of numpy arrays (views into the group's arrays)."""
        p = self.packed.step(i)
        batch: dict[str, Any] = {
            "input_ids": p.input_ids,
            "labels": p.labels,
            "position_ids": p.position_ids,
            "doc_ids": p.doc_ids,
            "cu_seqlens": p.cu_seqlens,
            "max_seqlen": p.max_seqlen,
            "continues": p.continues,
            "spans": p.spans,
        }
        if p.context is not None:
            batch["context"] = p.context  # (n, 2) context-only range of each stretch
        if self.pools is not None:
            B = self.packed.blocks_per_step
            batch["block_pool"] = self.pools[i * B : (i + 1) * B]  # (B,) pool of each block
        return batch

    def step_stats(self, i: int) -> dict[str, float]:
        """What delivering step ``first + i`` adds to :class:`LoaderStats` (the group's read
        counts with its first step)."""
        p = self.packed
        rows, nbytes, seconds = self.read if i == 0 else (0, 0, 0.0)
        return {
            "steps": 1,
            "rows_read": rows,
            "bytes_read": nbytes,
            "read_seconds": seconds,
            "rows_packed": int(p.stretch_bounds[i + 1] - p.stretch_bounds[i]),
            "tokens": int(p.real_tokens[i]),
            "eos": int(p.eos_positions[i]),
            "padding": int(p.padding_positions[i]),
            "loss_positions": int(p.loss_positions[i]),
            "pack_seconds": self.pack_seconds / p.steps,
        }
