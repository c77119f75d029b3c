"""Reused output buffers: packed groups are written into memory that is already mapped.

A group of steps is packed into one ``(4, k * B, L)`` int64 buffer (``input_ids``, ``labels``,
``position_ids``, ``doc_ids``). Fresh buffers of megabytes cost more than the packing itself: the
kernel zero-fills every page on first touch, and with several processes on a loaded machine that
system time was the largest item after ``take``. So buffers are recycled:

* :class:`RecycledBuffers` (one process): a buffer is handed out again once nothing references it
  any more: every batch tensor is a view of its group's buffer, so the buffer's reference count
  says whether the consumer still holds a batch of it. A consumer that keeps batches simply makes
  the pool allocate more (as plain allocation would).
* :class:`SharedSlots` (a DataLoader worker and the training process): a fixed ring of slots in
  one piece of anonymous shared memory, with one flag byte per slot. The worker packs into a
  free slot and sends the slot number (the memory itself crosses once, as one file
  descriptor). The training process *lends* the slot to the batches
  (:meth:`SharedSlots.lend`: the batch tensors are views of the shared memory, no copy) and the
  slot goes back to the worker when the last view of it is gone. At most ``lendable`` slots are
  lent at a time; past that the training process copies the slot into a recycled buffer and
  frees it at once, so a training loop that keeps batches costs a copy, never a stuck worker.
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time
from typing import Any

import numpy as np

__all__ = ["RecycledBuffers", "SharedSlots", "shm_available"]


class RecycledBuffers:
    """``int64`` buffers reused once unreferenced (thread-safe).

    Args:
        keep: Buffers kept for reuse at most (more may be handed out; they are not kept).
    """

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._pool: list[np.ndarray] = []
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"keep": self.keep}  # buffers stay in their process

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def take(self, shape: tuple[int, ...]) -> np.ndarray:
        """A C-contiguous int64 array of ``shape`` that nothing else references."""
        with self._lock:
            for buf in self._pool:
                # the pool, the loop variable and getrefcount's argument: nobody else
                if buf.shape == shape and sys.getrefcount(buf) == 3:
                    return buf
            buf = np.empty(shape, dtype=np.int64)
            if len(self._pool) < self.keep:
                self._pool.append(buf)
            else:  # forget an unreferenced buffer of another shape, if any
                for i, old in enumerate(self._pool):
                    if old.shape != shape and sys.getrefcount(old) == 3:
                        self._pool[i] = buf
                        break
            return buf


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

    Created in the worker as anonymous shared memory (``memfd_create``: no name, no file; no
    torch either, a worker imports numpy and Lance only). Pickled into the training process
    with the first group: its descriptor crosses once (``multiprocessing.reduction.DupFd``)
    and the training process maps the same memory. The kernel frees it when the last mapping
    and descriptor are gone, so nothing is left behind however the processes end (``kill -9``
    included). After that only slot numbers cross.

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
