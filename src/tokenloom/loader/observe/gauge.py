"""Queue gauges of the loader's pipeline: how many steps sit in each stage, integrated over time.

A read pipeline (one per DataLoader worker, or one in the training process) moves every step
through three queues, then hands it out::

    planned ──take──▶ read ──pack──▶ packed ──yield──▶ in transit ──▶ consumer

* **planned**: steps submitted to the I/O threads whose rows are not fetched yet;
* **read**: steps whose rows are fetched and are being packed;
* **packed**: batches built, waiting to be handed out;
* **in transit**: batches a DataLoader worker handed out that the consumer has not received yet
  (measured in the consumer's process by :class:`TransitGauge`; always empty without workers).

:class:`PipelineGauge` integrates each queue's length over time (an *area* in step-seconds, so the
mean occupancy is ``area / seconds``, Little's law), keeps each maximum, and times two conditions:
*starved* (the pipeline blocked on its oldest group: the packed queue was empty while reads were
in flight) and *full* (every group submitted is built and waits to be handed out: the I/O threads
have nothing to do until the consumer takes more). Areas and times add up over workers, so they
travel as increments like every other counter of
:class:`~tokenloom.loader.observe.stats.LoaderStats`. Events are per group or per step, never per
row: a ``perf_counter`` and one uncontended lock each.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from tokenloom.loader.observe.stats import LoaderStats

__all__ = ["PipelineGauge", "TransitGauge"]


class PipelineGauge:
    """Occupancy of one process's read pipeline, accumulated over its epochs.

    The dataset calls :meth:`start` once per iteration, :meth:`submit` instead of
    ``pool.submit`` for each read group, :meth:`fetched` inside the group once its rows are in,
    :meth:`take` instead of ``future.result()``, and :meth:`handed_out` for each step it yields.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()  # which group the current I/O thread runs
        self._counts = [0, 0, 0]  # planned, read, packed (steps)
        self._last: float | None = None
        self.pipelines = 0
        self.seconds = 0.0
        self.areas = [0.0, 0.0, 0.0]
        self.maxima = [0, 0, 0]
        self.capacity = 0
        self.starved = 0.0
        self.full = 0.0

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_lock"], state["_local"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._local = threading.local()

    # -- events --------------------------------------------------------------------------------

    def start(self, capacity: int) -> None:
        """A pipeline starts, submitting at most ``capacity`` steps ahead."""
        with self._lock:
            self._counts = [0, 0, 0]
            self._last = time.perf_counter()
            self.pipelines += 1
            self.capacity = max(self.capacity, int(capacity))

    def submit(self, pool: Executor, fn: Callable[..., Any], *args: Any, steps: int) -> Future:
        """``pool.submit(fn, *args)`` for a group of ``steps`` steps, tracked through the queues."""
        with self._lock:
            self._advance()
            self._counts[0] += steps
            self._peak()

        def run() -> Any:
            self._local.group = [steps, False]  # [steps, fetched]
            try:
                out = fn(*args)
            finally:
                group, self._local.group = self._local.group, None
            with self._lock:
                self._advance()
                self._counts[1 if group[1] else 0] -= steps
                self._counts[2] += steps
                self._peak()
            return out

        return pool.submit(run)

    def fetched(self) -> None:
        """Inside a submitted group: its rows are fetched, packing starts (no-op elsewhere)."""
        group = getattr(self._local, "group", None)
        if group is None or group[1]:
            return
        group[1] = True
        with self._lock:
            self._advance()
            self._counts[0] -= group[0]
            self._counts[1] += group[0]
            self._peak()

    def take(self, future: Future) -> Any:
        """``future.result()``, timing how long the pipeline starved waiting for it."""
        started = time.perf_counter()
        out = future.result()
        waited = time.perf_counter() - started
        with self._lock:
            self.starved += waited
        return out

    def handed_out(self, stats: LoaderStats, steps: int = 1) -> None:
        """``steps`` packed steps leave the pipeline (0: steps built outside it); the totals so
        far are written into ``stats``."""
        with self._lock:
            self._advance()
            self._counts[2] -= steps
            stats.pipelines = self.pipelines
            stats.pipeline_seconds = self.seconds
            stats.planned_area, stats.read_area, stats.packed_area = self.areas
            stats.planned_max, stats.read_max, stats.packed_max = self.maxima
            stats.capacity = self.capacity
            stats.starved_seconds = self.starved
            stats.full_seconds = self.full

    # -- integration ---------------------------------------------------------------------------

    def _advance(self) -> None:
        """Integrate the queue lengths since the last event (under the lock)."""
        now = time.perf_counter()
        if self._last is None:
            self._last = now
            return
        dt = now - self._last
        self._last = now
        self.seconds += dt
        planned, read, packed = self._counts
        self.areas[0] += planned * dt
        self.areas[1] += read * dt
        self.areas[2] += packed * dt
        if planned == 0 and read == 0 and packed > 0:
            self.full += dt

    def _peak(self) -> None:
        self.maxima = [max(m, c) for m, c in zip(self.maxima, self._counts, strict=True)]


class TransitGauge:
    """Batches handed out by DataLoader workers and not yet received by the consumer.

    Each batch carries the ``time.monotonic()`` at which its worker yielded it (a system-wide
    clock, comparable across processes). The summed transit time over the consumer's wall time is
    the mean occupancy; the maximum is exact at receipts, the moments just before the queue
    shrinks (batch ``k`` received at ``r_k`` shared the queue with every later batch sent before
    ``r_k``; batches arrive in step order and at most ``window`` are outstanding). The part of
    each stall after the batch was sent is the transfer's, the part before it the worker's.
    A pass's first batch is start-up: its times are not counted, and transit starts there.
    """

    def __init__(self, window: int) -> None:
        self._recent: deque[list[float]] = deque(maxlen=max(int(window), 1))
        self._floor = 0.0

    def arrive(
        self, sent: float, asked: float, received: float, *, first: bool, stats: LoaderStats
    ) -> None:
        """A batch stamped ``sent`` was asked for at ``asked`` and received at ``received``
        (``time.monotonic()`` all); adds to ``stats.transit_*`` and ``transfer_seconds``."""
        if first:
            self._recent.clear()
            self._floor = received
        else:
            stats.transfer_seconds += max(received - max(sent, asked), 0.0)
            stats.transit_area += max(received - max(sent, self._floor), 0.0)
        top = stats.transit_max
        for entry in self._recent:
            if entry[0] >= sent:
                entry[1] += 1
                top = max(top, int(entry[1]))
        self._recent.append([received, 1])
        stats.transit_max = max(top, 1)
