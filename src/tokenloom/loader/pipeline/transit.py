"""Shared-memory transit: what a DataLoader worker builds, crossing to the training process.

Every tokenloom loader with workers (token, rows, image+text) runs them on
:class:`~tokenloom.loader.pipeline.workers.WorkerPool` and sends what they build through this
module, the one owner of the shared memory between the processes:

* :class:`SharedSlots`: a worker's ring of slots in one piece of anonymous shared memory
  (``memfd_create``), one flag byte a slot. Its descriptor crosses once, with the first message
  that carries it (the pool then tells the worker it was taken); after that only slot numbers
  cross. The kernel frees the memory when the last mapping and descriptor are gone, so nothing is
  left behind however the processes end (``kill -9`` included), and a worker that dies holding
  its descriptor is reported as dead by the pool.
* :class:`WorkerRing`: a worker's side. It makes the ring (where the platform has anonymous shared
  memory: Linux), hands out free slots, waiting up to ``wait_s`` for the training process to free
  one (then a message goes by value: slower, never stuck), and puts the ring on the first message
  that needs it.
* :class:`Rings`: the training process's side. It maps each worker's ring as it arrives and
  settles every message: the slot is *lent* to the batches (their arrays are views of the shared
  memory, no copy; the slot goes back to the worker once no view of it is left), or, when
  ``lendable`` slots are already lent, copied out and freed at once.

Two kinds of messages cross, both :class:`InTransit`:

* :class:`BuiltGroup` (the token loader): consecutive packed steps, their ``(4, k * B, L)``
  ``int64`` arrays packed straight into a slot (:meth:`WorkerRing.acquire`).
* :class:`StepMessage` (rows, image+text): one step as a dict of arrays of any shapes and dtypes.
  :meth:`WorkerRing.put` writes its numeric arrays into one slot (one ring made at the first step,
  sized from it), each at an offset aligned to 64 bytes; only their names, dtypes, shapes and
  offsets travel on the pipe, with whatever is not a numeric array (strings, Python objects, Arrow
  batches) pickled by value. A step that does not fit its slot is sent by value.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from tokenloom.loader.pipeline.buffers import RecycledBuffers
from tokenloom.loader.plan.group import PackedGroup

if TYPE_CHECKING:
    from tokenloom.loader.plan.view import GroupCounts

__all__ = [
    "BuiltGroup",
    "InTransit",
    "Rings",
    "SharedSlots",
    "StepMessage",
    "WorkerRing",
    "shm_available",
]

_ALIGN = 64  # every array of a step starts at a cache line
# A step ring: queued (prefetch) + in the pipe + being settled + lent + being built
_STEP_SLOTS = 8
_STEP_LENT = 2  # slots the training process lends to batches at a time (then it copies)
_STEP_WAIT_S = 1.0  # how long a worker waits for a free slot before it sends a step by value
_HEADROOM = 1.5  # a step slot holds this many times the first step's arrays (later steps vary)


class _Lease:
    """The owner of a lent slot's array: numpy views keep their base alive, and the base of
    every view of the lent array is this object, so it is collected (and the slot freed) only
    once the last view, or tensor over a view, is gone."""

    __slots__ = ("__array_interface__", "_memory", "_slots", "_slot")

    def __init__(self, memory: np.ndarray, slots: SharedSlots, slot: int) -> None:
        self.__array_interface__ = memory.__array_interface__
        self._memory = memory  # keeps the shared mapping alive as long as any view
        self._slots, self._slot = slots, slot

    def __del__(self) -> None:
        self._slots._returned(self._slot)


def shm_available() -> bool:
    """Whether rings of shared slots can be made here (anonymous shared memory: Linux)."""
    return hasattr(os, "memfd_create")


class SharedSlots:
    """A worker's ring of ``slots`` shared-memory slots of ``slot_size`` int64 each.

    Created in the worker (by its :class:`WorkerRing`) as anonymous shared memory
    (``memfd_create``: no name, no file; no torch either, a worker imports numpy and Lance only).
    Pickled into the training process with the first message that carries it: its descriptor
    crosses once (``multiprocessing.reduction.DupFd``) and the training process maps the same
    memory. The kernel frees it when the last mapping and descriptor are gone, so nothing is left
    behind however the processes end (``kill -9`` included). After that only slot numbers cross.

    Args:
        slots: Slots in the ring.
        slot_size: int64 values per slot.
        lendable: Slots the training process may lend to batches at a time (the rest of the
            ring is for groups being built and in transit).
    """

    def __init__(self, slots: int, slot_size: int, lendable: int = 0) -> None:
        self.shape = (int(slots), int(slot_size))
        self.lendable = lendable
        self._fd = os.memfd_create("tokenloom-slots", os.MFD_CLOEXEC)
        self._own_fd = True  # closed with this object (a persistent worker makes a ring a pass)
        os.ftruncate(self._fd, self._nbytes)
        self._mapping = mmap.mmap(self._fd, self._nbytes)
        self._local()

    @property
    def _nbytes(self) -> int:
        slots, size = self.shape
        return slots * (size * 8 + 1)

    def _local(self) -> None:
        slots, size = self.shape
        whole = np.frombuffer(self._mapping, dtype=np.uint8)
        self._data_np = whole[: slots * size * 8].view(np.int64).reshape(slots, size)
        self._flags_np = whole[slots * size * 8 :]
        self._lent = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        from multiprocessing.reduction import DupFd

        return {"fd": DupFd(self._fd), "shape": self.shape, "lendable": self.lendable}

    def __setstate__(self, state: dict) -> None:
        self.shape, self.lendable = tuple(state["shape"]), state["lendable"]
        self._fd = state["fd"].detach()
        self._own_fd = False
        try:
            self._mapping = mmap.mmap(self._fd, self._nbytes)
        finally:
            os.close(self._fd)  # the mapping keeps the memory
        self._local()

    def __del__(self) -> None:
        # the memory stays while a mapping of it does (the other process's included)
        if getattr(self, "_own_fd", False):
            self._own_fd = False
            try:
                os.close(self._fd)
            except OSError:
                pass

    @property
    def slots(self) -> int:
        return int(self._flags_np.shape[0])

    def acquire(
        self, shape: tuple[int, ...], *, timeout_s: float, poll_s: float = 0.0005
    ) -> tuple[int | None, np.ndarray | None]:
        """A free slot (waiting up to ``timeout_s`` for the training process to release one)
        as an array of ``shape``; it stays busy until :meth:`release`. ``(None, None)`` when
        none came free in time."""
        n = int(np.prod(shape))
        if n > self._data_np.shape[1]:
            return None, None
        flags = self._flags_np
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:  # the worker's pack threads acquire at once: one slot each
                free = np.flatnonzero(flags == 0)
                if len(free):
                    j = int(free[0])
                    flags[j] = 1
                    return j, self._data_np[j, :n].reshape(shape)
            if time.monotonic() > deadline:
                return None, None
            time.sleep(poll_s)

    def view(self, slot: int, shape: tuple[int, ...]) -> np.ndarray:
        """Slot ``slot`` as an array of ``shape`` (the training process's side)."""
        return self._data_np[slot, : int(np.prod(shape))].reshape(shape)

    def lend(self, slot: int, shape: tuple[int, ...]) -> Any:
        """Slot ``slot`` as an array of ``shape`` (the training process's side, no copy) that
        frees the slot once neither it nor any view of it is referenced; ``None`` when
        :attr:`lendable` slots are already lent (then copy the slot out and :meth:`release`
        it)."""
        with self._lock:
            if self._lent >= self.lendable:
                return None
            self._lent += 1
        return np.asarray(_Lease(self.view(slot, shape), self, slot))

    def settle(
        self, slot: int, shape: tuple[int, ...], buffers: RecycledBuffers | None = None
    ) -> np.ndarray:
        """Slot ``slot`` as an ``int64`` array of ``shape`` in the training process: lent
        (:meth:`lend`, no copy), or, when :attr:`lendable` slots are already lent, copied out
        (into a recycled buffer with ``buffers``) and the slot freed at once, so a training loop
        that keeps batches costs a copy, never a stuck worker."""
        arrays = self.lend(slot, shape)
        if arrays is None:
            arrays = buffers.take(shape) if buffers is not None else np.empty(shape, np.int64)
            np.copyto(arrays, self.view(slot, shape))
            self.release(slot)
        return arrays  # type: ignore[no-any-return]

    def _returned(self, slot: int) -> None:
        with self._lock:
            self._lent -= 1
        self._flags_np[slot] = 0

    @property
    def lent(self) -> int:
        """Slots lent to batches now."""
        return self._lent

    def release(self, slot: int) -> None:
        self._flags_np[slot] = 0


class WorkerRing:
    """A worker's side of the transit: its ring of ``slots`` slots, ``lendable`` of them lent to
    batches at a time, made by :meth:`open` (or at the first step :meth:`put` moves), and
    nothing where the platform has no anonymous shared memory (every message by value).

    Args:
        slots: Slots in the ring.
        lendable: Slots the training process may lend to batches at a time.
        wait_s: How long :meth:`acquire` waits for a free slot before the message goes by value.
    """

    def __init__(
        self, slots: int = _STEP_SLOTS, *, lendable: int = _STEP_LENT, wait_s: float = _STEP_WAIT_S
    ) -> None:
        self.slots, self.lendable, self.wait_s = int(slots), int(lendable), float(wait_s)
        self.ring: SharedSlots | None = None
        self.usable = shm_available()
        self._sent = False

    def open(self, slot_size: int) -> None:
        """Make the ring, with slots of ``slot_size`` int64 values (once; nothing where there is
        no shared memory)."""
        if self.usable and self.ring is None:
            self.ring = SharedSlots(self.slots, slot_size, lendable=self.lendable)

    def acquire(self, shape: tuple[int, ...]) -> tuple[int | None, np.ndarray | None]:
        """A free slot as an int64 array of ``shape`` (:meth:`SharedSlots.acquire`);
        ``(None, None)`` without a ring, for an array larger than a slot, or when none came
        free within ``wait_s``: the message then goes by value."""
        if self.ring is None:
            return None, None
        return self.ring.acquire(shape, timeout_s=self.wait_s)

    def descriptor(self) -> SharedSlots | None:
        """The ring, to put on the next message, the first time it is asked for once it exists
        (its descriptor crosses once); ``None`` after that and without a ring."""
        if self.ring is None or self._sent:
            return None
        self._sent = True
        return self.ring

    def put(self, message: StepMessage) -> StepMessage:
        """``message`` with its numeric arrays moved into a slot (when one fits and is free;
        the ring is made at the first step that has any, sized from it)."""
        batch = message.batch
        if not self.usable or not isinstance(batch, dict):
            return message
        arrays = {k: v for k, v in batch.items() if _shared(v)}
        if not arrays:
            return message
        layout, offset = [], 0
        for name, value in arrays.items():
            layout.append((name, value.dtype.str, value.shape, offset))
            offset += _aligned(value.nbytes)
        self.open(-(-int(offset * _HEADROOM + (64 << 10)) // 8))
        slot, memory = self.acquire((max(-(-offset // 8), 1),))
        if slot is None or memory is None:
            return message  # too big for a slot, or none free: by value
        raw = memory.view(np.uint8)
        for (_, _, _, at), value in zip(layout, arrays.values(), strict=True):
            raw[at : at + value.nbytes] = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
        rest = {k: v for k, v in batch.items() if k not in arrays}
        return replace(
            message, batch=rest, slot=slot, slots=self.descriptor(), layout=tuple(layout),
            keys=tuple(batch), nbytes=max(offset, 8),
        )  # fmt: skip


M = TypeVar("M", bound="InTransit")


class Rings:
    """The training process's side of the transit: each worker's ring, mapped when it arrives
    with that worker's first message that carries it, and the messages settled from it.

    Args:
        buffers: Where a slot that cannot be lent is copied out to (recycled buffers of the
            stream); fresh memory without.
    """

    def __init__(self, buffers: RecycledBuffers | None = None) -> None:
        self.buffers = buffers
        self._rings: dict[int, SharedSlots] = {}

    def settle(self, message: M) -> M:
        """``message`` with its arrays here: views of its lent slot, or copied out and the slot
        freed at once when the training loop already holds all the slots it may
        (:meth:`SharedSlots.settle`). A message sent by value is returned as it is."""
        if message.slots is not None:
            self._rings[message.worker] = message.slots
        if message.slot is None:
            return message
        return message._settled(self._rings[message.worker], self.buffers)  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True, eq=False)
class InTransit:
    """What every message from a worker carries for the transit."""

    worker: int = 0
    """The DataLoader worker that built it."""
    slots: SharedSlots | None = None
    """The worker's ring, with the first message that carries it (its descriptor crosses once)."""
    slot: int | None = None
    """The slot of the ring holding the message's arrays (``None``: all of it by value)."""

    def _settled(self, ring: SharedSlots, buffers: RecycledBuffers | None) -> InTransit:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True, eq=False)
class BuiltGroup(InTransit):
    """Consecutive steps as an I/O thread built them, with what they add to the counters (with
    :attr:`slot`, ``packed.arrays`` is ``None``: the arrays are in the slot)."""

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
    extra: dict | None = None
    """The worker's other counters since its last message (pipeline gauges, read-ahead sizing:
    :meth:`LoaderStats.delta`), added once by the consumer."""
    sent: float = 0.0
    """``time.monotonic()`` when the worker handed the group out (the in-transit gauge)."""

    def _settled(self, ring: SharedSlots, buffers: RecycledBuffers | None) -> BuiltGroup:
        """The group with its arrays out of its slot (``packed.arrays`` was ``None``)."""
        assert self.slot is not None
        p = self.packed
        shape = (4, p.steps * p.blocks_per_step, self.seq_len)
        arrays = ring.settle(self.slot, shape, buffers)
        return replace(self, packed=replace(p, arrays=arrays), slot=None, slots=None)

    @property
    def steps(self) -> int:
        return self.packed.steps

    def batch(self, i: int) -> dict[str, Any]:
        """Step ``first + i`` as a dict of numpy arrays (views into the group's arrays): the
        fields of :meth:`PackedGroup.step`, sliced here directly (once per step: no
        :class:`PackedArrays` and its counters built and dropped)."""
        p = self.packed
        B = p.blocks_per_step
        rows = slice(i * B, (i + 1) * B)
        a, b = p.stretch_bounds[i : i + 2].tolist()
        c, d = p.segment_bounds[i : i + 2].tolist()
        arrays = p.arrays
        batch: dict[str, Any] = {
            "input_ids": arrays[0, rows],
            "labels": arrays[1, rows],
            "position_ids": arrays[2, rows],
            "doc_ids": arrays[3, rows],
            "cu_seqlens": p.cu_seqlens[c : d + 1] - np.int32(i * B * arrays.shape[2]),
            "max_seqlen": int(p.max_seqlen[i]),
            "continues": p.continues[rows],
            "spans": p.spans[a:b],
        }
        if p.context is not None:
            batch["context"] = p.context[a:b]  # (n, 2) context-only range of each stretch
        if self.pools is not None:
            batch["block_pool"] = self.pools[rows]  # (B,) pool of each block
        return batch

    def step_stats(self, i: int) -> dict[str, float]:
        """What delivering step ``first + i`` adds to :class:`LoaderStats` (the group's read
        counts with its first step): sums only (:meth:`LoaderStats.add_counts`)."""
        return self._step_stats[i]

    @cached_property
    def _step_stats(self) -> list[dict[str, float]]:
        """:meth:`step_stats` of every step, built at once from the group's per-step arrays."""
        p = self.packed
        k = p.steps
        rows, nbytes, seconds = self.read
        masked = [0] * k if p.masked_positions is None else p.masked_positions.tolist()
        out = [
            {
                "steps": 1,
                "rows_read": 0,
                "bytes_read": 0,
                "read_seconds": 0.0,
                "rows_packed": packed,
                "tokens": tokens,
                "eos": eos,
                "padding": padding,
                "loss_positions": loss,
                "masked_tokens": mask,
                "pack_seconds": self.pack_seconds / k,
            }
            for packed, tokens, eos, padding, loss, mask in zip(
                np.diff(p.stretch_bounds).tolist(),
                p.real_tokens.tolist(),
                p.eos_positions.tolist(),
                p.padding_positions.tolist(),
                p.loss_positions.tolist(),
                masked,
                strict=True,
            )
        ]
        if out:
            out[0].update(rows_read=rows, bytes_read=nbytes, read_seconds=seconds)
        return out


def _shared(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "biufc" and value.ndim > 0


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass(frozen=True, kw_only=True, eq=False)
class StepMessage(InTransit):
    """One built step of a worker (``first``: its global step in ``epoch``)."""

    epoch: int
    first: int
    batch: Any
    """The step by value, or with :attr:`slot` the entries that are not in the slot."""
    extra: dict = field(default_factory=dict)
    """Loader counters of this step (added up in the training process)."""
    layout: tuple = ()
    """``(name, dtype, shape, offset)`` of each array in the slot."""
    keys: tuple = ()
    """The batch's keys in order (arrays in the slot and the rest)."""
    nbytes: int = 0

    @property
    def steps(self) -> int:
        return 1

    def _settled(self, ring: SharedSlots, buffers: RecycledBuffers | None) -> StepMessage:
        """The message with the whole batch here: its arrays views of the slot."""
        assert self.slot is not None
        raw = ring.settle(self.slot, (-(-self.nbytes // 8),), buffers).view(np.uint8)
        out = dict(self.batch)
        for name, dtype, shape, offset in self.layout:
            dt = np.dtype(dtype)
            size = int(np.prod(shape)) * dt.itemsize
            out[name] = raw[offset : offset + size].view(dt).reshape(shape)
        batch = {k: out[k] for k in self.keys}
        return replace(self, batch=batch, slot=None, slots=None, layout=(), nbytes=0)
