"""A built step crossing from a worker to the training process: its arrays in a shared-memory
slot, the rest by value.

A loader whose steps are dicts of arrays of any shapes and dtypes (rows, images) runs on
:class:`~tokenloom.loader.pipeline.workers.WorkerPool` by yielding :class:`StepMessage` objects from
its ``groups(worker, workers, keep=...)``. The worker writes the numeric arrays of a step into one
slot of its ring (:class:`~tokenloom.loader.pipeline.buffers.SharedSlots`, sized from its first
step, one memcpy), each at an offset aligned to 64 bytes; only their names, dtypes, shapes and
offsets travel on the pipe, with whatever is not a numeric array (strings, Python objects, Arrow
batches) pickled by value. The training process lends the slot to the batch (the arrays are
views of the shared memory; the slot goes back to the worker once no view of it is left), or
copies it out when it already lends ``lendable`` slots. A step that does not fit its slot, or
finds none free within :data:`SLOT_WAIT_S`, is sent by value: slower, never stuck.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tokenloom.loader.pipeline.buffers import SharedSlots, shm_available

__all__ = ["StepMessage", "StepRing", "SLOT_WAIT_S"]

SLOT_WAIT_S = 1.0
"""How long a worker waits for a free slot before it sends a step by value."""
_ALIGN = 64  # every array starts at a cache line
_RING_SLOTS = 8  # queued (prefetch) + in the pipe + being settled + lent + being built
_LENT = 2  # slots the training process lends to batches at a time (then it copies)
_HEADROOM = 1.5  # a slot holds this many times the first step's arrays (later steps vary)


def _shared(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "biufc" and value.ndim > 0


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass
class StepMessage:
    """One built step of a worker (``first``: its global step in ``epoch``)."""

    epoch: int
    first: int
    batch: Any
    """The step by value, or with :attr:`slot` the entries that are not in the slot."""
    extra: dict = field(default_factory=dict)
    """Loader counters of this step (added up in the training process)."""
    worker: int = 0
    slots: SharedSlots | None = None
    """The worker's ring, with the first message that uses it (its descriptor crosses once)."""
    slot: int | None = None
    layout: tuple = ()
    """``(name, dtype, shape, offset)`` of each array in the slot."""
    keys: tuple = ()
    """The batch's keys in order (arrays in the slot and the rest)."""
    nbytes: int = 0

    @property
    def steps(self) -> int:
        return 1

    def settle(self, slots: SharedSlots | None) -> Any:
        """In the training process: the batch, its arrays views of the lent slot (or copied
        out, the slot freed at once, when the training loop holds all it may)."""
        if self.slot is None:
            return self.batch
        assert slots is not None  # the ring crossed with this worker's first slotted step
        n = -(-self.nbytes // 8)
        flat = slots.lend(self.slot, (n,))
        if flat is None:
            flat = slots.view(self.slot, (n,)).copy()
            slots.release(self.slot)
        raw = flat.view(np.uint8)
        out = dict(self.batch)
        for name, dtype, shape, offset in self.layout:
            dt = np.dtype(dtype)
            size = int(np.prod(shape)) * dt.itemsize
            out[name] = raw[offset : offset + size].view(dt).reshape(shape)
        return {k: out[k] for k in self.keys}


class StepRing:
    """A worker's side: puts each step's arrays into a ring made at the first step that has
    any (``None`` where the platform has no anonymous shared memory)."""

    def __init__(self) -> None:
        self.ring: SharedSlots | None = None
        self._sent = False
        self._usable = shm_available()

    def put(self, message: StepMessage) -> StepMessage:
        """``message`` with its numeric arrays moved into a slot (when one fits and is free)."""
        batch = message.batch
        if not self._usable or not isinstance(batch, dict):
            return message
        arrays = {k: v for k, v in batch.items() if _shared(v)}
        if not arrays:
            return message
        layout, offset = [], 0
        for name, value in arrays.items():
            layout.append((name, value.dtype.str, value.shape, offset))
            offset += _aligned(value.nbytes)
        if self.ring is None:
            size = -(-int(offset * _HEADROOM + (64 << 10)) // 8)
            self.ring = SharedSlots(_RING_SLOTS, size, lendable=_LENT)
        slot, memory = self.ring.acquire((max(-(-offset // 8), 1),), timeout_s=SLOT_WAIT_S)
        if slot is None or memory is None:
            return message  # too big for a slot, or none free: by value
        raw = memory.view(np.uint8)
        for (_, _, _, at), value in zip(layout, arrays.values(), strict=True):
            raw[at : at + value.nbytes] = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
        rest = {k: v for k, v in batch.items() if k not in arrays}
        ring = None if self._sent else self.ring
        self._sent = True
        return replace(
            message, batch=rest, slot=slot, slots=ring, layout=tuple(layout),
            keys=tuple(batch), nbytes=max(offset, 8),
        )  # fmt: skip
