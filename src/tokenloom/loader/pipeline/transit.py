"""A packed group in transit: from the I/O thread (or a DataLoader worker) to the training process.

:class:`BuiltGroup` is the group of consecutive steps
:func:`~tokenloom.loader.plan.group.pack_group` packed, with what its steps add to the counters, the
read cost, and the shared-memory slot that holds its arrays when a worker built it
(:class:`~tokenloom.loader.pipeline.buffers.SharedSlots`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenloom.loader.pipeline.buffers import RecycledBuffers, SharedSlots
from tokenloom.loader.plan.group import PackedGroup

if TYPE_CHECKING:
    from tokenloom.loader.plan.view import GroupCounts

__all__ = ["BuiltGroup"]


@dataclass(frozen=True, kw_only=True, eq=False)
class BuiltGroup:
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

    def settle(self, slots: SharedSlots, buffers: RecycledBuffers) -> BuiltGroup:
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
            "masked_tokens": 0 if p.masked_positions is None else int(p.masked_positions[i]),
            "pack_seconds": self.pack_seconds / p.steps,
        }
