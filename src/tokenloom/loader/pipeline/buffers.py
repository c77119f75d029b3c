"""Reused output buffers: packed groups are written into memory that is already mapped.

A group of steps is packed into one ``(4, k * B, L)`` int64 buffer (``input_ids``, ``labels``,
``position_ids``, ``doc_ids``). Fresh buffers of megabytes cost more than the packing itself: the
kernel zero-fills every page on first touch, and with several processes on a loaded machine that
system time was the largest item after ``take``. So buffers are recycled
(:class:`RecycledBuffers`, one process): a buffer is handed out again once nothing references it
any more: every batch tensor is a view of its group's buffer, so the buffer's reference count
says whether the consumer still holds a batch of it. A consumer that keeps batches simply makes
the pool allocate more (as plain allocation would). A DataLoader worker packs into shared-memory
slots instead (:mod:`~tokenloom.loader.pipeline.transit`), copied out into these buffers when
they cannot be lent.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["RecycledBuffers"]


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
