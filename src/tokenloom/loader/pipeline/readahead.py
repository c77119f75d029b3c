"""How many reads the loader keeps in flight, sized from one measured read.

A read unit (on an object store a fetch span, :mod:`~tokenloom.loader.pipeline.fetch`) costs
``cpu_s`` of CPU and takes ``wall_s`` end to end; the difference is time spent waiting (object-store
latency, the disk). With ``n`` units in flight the loader reads at most ``n / wall_s`` units per
second, and the cores cap it at ``cores / cpu_s``. Little's law gives the depth that reaches the
cap:

    in_flight = wall_s * wanted_rate = wall_s * cores / cpu_s

On a page-cached local table ``wall_s ~ cpu_s`` and this is about one thread per core, the
fixed default the loader keeps locally (on a busy machine, waiting for a core would look like
I/O): 2 threads building read groups (one ``take`` each, then packing), 4 groups ahead. On an
object store the first fetch span is timed and the depth grows with its waiting share, within
a memory budget of raw token bytes (:data:`FETCH_AHEAD_BYTES`). Explicit ``io_threads`` /
``read_ahead`` always win; the measured figures are kept in :class:`ReadAhead` and the loader's
stats.

How many rows one ``take`` asks for matters as much on an object store: Lance merges reads
closer than about 64 KiB into one ranged GET (measured against a local S3 server: rows 26 KiB
apart cost one GET per 64 rows, rows 100 KiB apart one GET each), and a shuffled take of
``n`` rows from a column of ``B`` bytes leaves ``B / n`` bytes between neighbours (and fetches
the bytes between neighbours it merges). :func:`rows_per_fetch` therefore reads spans of at
least :data:`FETCH_BYTES` of tokens and a quarter of the epoch's rows (:data:`FETCH_FRACTION`),
up to :data:`MAX_FETCH_BYTES`: raw token lists held once, not the packed blocks made of them.

A token column larger than ``FETCH_FRACTION * MAX_FETCH_BYTES`` cannot be read that way within
memory: a span then holds a small share of the epoch and the merged GETs fetch mostly bytes no
span uses (24.9x the bytes used at 3.2 GB of tokens). Such a table is read **per row**
(:func:`per_row_reads`): spans of :data:`ROW_FETCH_BYTES` of tokens, the dataset opened with a
merge window of :data:`ROW_BLOCK_SIZE` (a GET per row, the bytes it holds), many spans and takes
in flight. What it holds is then set by these constants, not by the table's size.

A token column that fits :data:`FETCH_AHEAD_BYTES` (in each process reading it) is **held**
(:func:`resident_reads`): its whole selection is fetched once in row order and serves every
epoch. Spans of a quarter of the epoch fetch about four times the bytes they use (the whole
file between their rows; measured 2.0-2.3x with spans of half of a 20k-row epoch); a held table
fetches each byte once. While its fetch runs, the first read group is taken on its own (a
lead, :mod:`~tokenloom.loader.pipeline.fetch`), so that the first batch does not wait for the
whole table.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ReadAhead",
    "per_row_reads",
    "resident_reads",
    "size_read_ahead",
    "available_cores",
    "timed",
    "rows_per_take",
    "rows_per_fetch",
]

log = logging.getLogger("tokenloom.loader")

TAKE_ROWS = 1024
"""Rows per take on a local table (one warm thread, 400k rows: 80 rows 47M tok/s, 256 ~53M,
1,024 ~59M; bigger groups also spread the per-group Python over more steps)."""
COALESCE_BYTES = 64 << 10
"""Reads of one object closer than this become one GET (Lance's object-store block size)."""
MAX_REMOTE_TAKE_ROWS = 4096
"""The most rows per take on an object store (a read group's batches stay in memory)."""
READ_AHEAD_BYTES = 512 << 20
"""Budget of the batches read groups in flight may hold (measured depths are capped by it)."""
FETCH_BYTES = 16 << 20
"""Token bytes one fetch span reads at least on an object store
(:mod:`~tokenloom.loader.pipeline.fetch`): the rows of a span share GETs, the denser the fewer
(measured at 20 ms per request on a local S3 server, 20k rows of 1.6 KB: takes of 2,048 random rows
~32k rows/s and 4x the bytes used fetched, 8,192 rows ~158k rows/s and 1.7x)."""
FETCH_FRACTION = 4
"""A fetch span reads at least ``1 / FETCH_FRACTION`` of the epoch's rows (within
:data:`MAX_FETCH_BYTES`). Once its rows lie closer than the merge window, a span's GETs cover the
whole file between them, so the bytes fetched per byte used are about the epoch's rows over the
span's (measured on 100k rows of 1.6 KB at 20 ms: spans of 10% of the rows fetched 9x the bytes
used, 2.3M tok/s; 25%: 19.8M; 50%: 25.3M; the local table 20.5M)."""
MAX_FETCH_BYTES = 64 << 20
"""Token bytes one fetch span reads at most (past ``FETCH_FRACTION * MAX_FETCH_BYTES`` of
tokens, spans hold a smaller share of the epoch and fetch more bytes than they use)."""
ROW_FETCH_BYTES = 1 << 20
"""Token bytes one fetch span reads at least when a table is read per row
(:func:`per_row_reads`; a span is whole read groups, so usually one group of ~1,000 rows): its
rows lie far apart, so a span only batches requests; spans in flight are what keeps many GETs
outstanding (sized by the same Little's-law probe, within :data:`ROWS_IN_FLIGHT`)."""
ROWS_IN_FLIGHT = 2048
"""Rows (about one GET each) that per-row reads keep requested at once at most: at 20 ms per
request that is ~100k rows/s, above what a local table delivers here. More only queues requests
at the server: on a local S3 server doing ~300 GETs/s under load, 33 spans of 5,000 rows in
flight (~4,500 requests held by the proxy) delivered no batch within 5 minutes."""
ROW_BLOCK_SIZE = 1024
"""Lance's merge window (its ``block_size``) for per-row reads: ranges of one file closer than
this share a GET. Measured through 20 ms on a local S3 server, 200k rows of ~1.6 KB, random
takes of 256 rows: a ``list<uint16>`` column fetched 4.4x (4 KiB) to 5x (64 KiB) the bytes used
(its pages are cut in ~2 KiB chunks, read whole); raw token bytes (``large_binary``) 1.1-1.3x
at 512 B-1 KiB and 1.3-1.4x at 4 KiB."""
FETCH_AHEAD_BYTES = 256 << 20
"""Budget of the token bytes fetch spans in flight may hold (measured depths are capped by it)."""
MAX_THREADS = 32
"""Upper bound of measured threads (each holds one group's rows; beyond this the store, not
the depth, is the limit)."""


@dataclass(frozen=True, kw_only=True)
class ReadAhead:
    """The read pipeline's depth and what it was sized from."""

    io_threads: int
    """Threads building read groups concurrently."""
    read_ahead: int
    """Read groups submitted ahead of the consumer (``>= io_threads``)."""
    wall_s: float
    """Wall time of the probe group (read + pack); 0 when nothing was measured."""
    cpu_s: float
    """Process CPU time spent on the probe group."""
    cores: int
    """Cores this pipeline may use."""
    measured: bool
    """False when both values were given explicitly (no probe)."""
    span_rows: int = 0
    """On an object store: rows of the probe's fetch span (:mod:`~tokenloom.loader.pipeline.fetch`;
    ``read_ahead`` counts such spans and ``io_threads`` the takes they are cut into); locally,
    rows of the first span when groups are taken several at once (one take per span); 0 when
    reads are one take per read group."""
    pack_cpu_s: float = 0.0
    """On an object store: CPU the probe span's groups cost to pack, estimated from its first
    group (the depth counts it with :attr:`cpu_s`: a span in flight must cover its packing)."""

    @property
    def waiting_s(self) -> float:
        """The probe's time not spent on a CPU (latency, I/O)."""
        return max(self.wall_s - self.cpu_s, 0.0)

    def describe(self) -> str:
        """One log line."""
        if not self.measured:
            return f"read-ahead: {self.io_threads} threads, {self.read_ahead} groups (explicit)"
        if self.span_rows:
            return (
                f"read-ahead: {self.read_ahead} fetch spans of ~{self.span_rows} rows in flight, "
                f"{self.io_threads} concurrent takes, sized from the first span's fetch: "
                f"{self.wall_s * 1e3:.1f} ms wall / {self.cpu_s * 1e3:.1f} ms CPU, packing it "
                f"~{self.pack_cpu_s * 1e3:.0f} ms CPU, on {self.cores} cores"
            )
        return (
            f"read-ahead: {self.io_threads} threads, {self.read_ahead} groups in flight, sized "
            f"from a probe group of {self.wall_s * 1e3:.1f} ms wall / {self.cpu_s * 1e3:.1f} ms "
            f"CPU ({self.waiting_s * 1e3:.1f} ms waiting) on {self.cores} cores"
        )


def size_read_ahead(
    wall_s: float,
    cpu_s: float,
    *,
    cores: int,
    io_threads: int | None = None,
    read_ahead: int | None = None,
    min_threads: int = 1,
    min_ahead: int = 4,
    max_threads: int = MAX_THREADS,
    max_ahead: int | None = None,
) -> ReadAhead:
    """Threads and groups in flight so that reading keeps ``cores`` busy (Little's law).

    Args:
        wall_s: Wall time of one measured read group.
        cpu_s: Process CPU time of that group (all threads).
        cores: Cores available to this pipeline.
        io_threads: An explicit thread count (kept as given).
        read_ahead: An explicit depth (kept as given, raised to ``io_threads``).
        min_threads: The floor of a measured thread count (the fixed default it replaces).
        min_ahead: The floor of a measured depth.
        max_threads: The cap of a measured thread count.
        max_ahead: The cap of measured values (a memory budget in groups; at least 1).

    Returns:
        A :class:`ReadAhead`: ``io_threads = clamp(ceil(cores * wall_s / cpu_s))`` unless given,
        and ``read_ahead = max(io_threads + 2, min_ahead)`` unless given (every thread busy, plus
        the group being consumed and one finished ahead of it).
    """
    if cores < 1 or min_threads < 1 or max_threads < min_threads:
        raise ValueError(f"bad bounds: cores={cores}, threads in [{min_threads}, {max_threads}]")
    wall_s, cpu_s = max(float(wall_s), 0.0), max(float(cpu_s), 0.0)
    threads = io_threads
    if threads is None:
        # A probe that used (almost) no CPU says nothing about the CPU bound: take the cap.
        ratio = wall_s / cpu_s if cpu_s > 1e-6 else math.inf
        wanted = cores * ratio
        threads = max_threads if math.isinf(wanted) else math.ceil(wanted - 1e-9)
        threads = min(max(threads, min_threads), max_threads)
        if max_ahead is not None:
            threads = max(min(threads, max_ahead), 1)
    depth = read_ahead
    if depth is None:
        depth = max(threads + 2, min_ahead)
        if max_ahead is not None:
            depth = max(min(depth, max_ahead), 1)
    return ReadAhead(
        io_threads=int(threads),
        read_ahead=int(max(depth, threads)),
        wall_s=wall_s,
        cpu_s=cpu_s,
        cores=int(cores),
        measured=io_threads is None or read_ahead is None,
    )


def available_cores(workers: int = 1) -> int:
    """This process's share of the CPUs it may run on, among ``workers`` loader processes."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(n // max(workers, 1), 1)


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float, float]:
    """``fn(*args)`` with its wall time and the process's CPU time (every thread) meanwhile."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def rows_per_take(column_bytes: float, *, remote: bool, cap: bool = True) -> int:
    """Rows one ``take`` should ask for.

    Args:
        column_bytes: Size of the token data the epoch reads (selected tokens x bytes each).
        remote: The table is on an object store.

    Returns:
        :data:`TAKE_ROWS` locally; on an object store ``4 * column_bytes / COALESCE_BYTES`` (an
        average gap of a quarter of the merge window, so that most gaps fall inside it), within
        ``[TAKE_ROWS, MAX_REMOTE_TAKE_ROWS]`` (``cap=False``: at least ``TAKE_ROWS``).
    """
    if not remote:
        return TAKE_ROWS
    wanted = max(4.0 * max(float(column_bytes), 0.0) / COALESCE_BYTES, TAKE_ROWS)
    return int(min(wanted, MAX_REMOTE_TAKE_ROWS) if cap else wanted)


def per_row_reads(column_bytes: float) -> bool:
    """Whether an object-store table is read per row: spans of at most
    :data:`MAX_FETCH_BYTES` would hold less than ``1 / FETCH_FRACTION`` of its tokens."""
    return float(column_bytes) > FETCH_FRACTION * MAX_FETCH_BYTES


def resident_reads(column_bytes: float, *, processes: int = 1) -> bool:
    """Whether an object-store table is held whole once fetched (one fetch of its selection,
    in row order, serving every epoch): its token bytes, once in each of ``processes`` readers
    (DataLoader workers), fit :data:`FETCH_AHEAD_BYTES`."""
    return float(column_bytes) * max(int(processes), 1) <= FETCH_AHEAD_BYTES


def rows_per_fetch(column_bytes: float, rows: int) -> int:
    """Rows one fetch span should read on an object store.

    Args:
        column_bytes: Size of the token data the epoch reads (selected tokens x bytes each).
        rows: Rows the epoch reads.

    Returns:
        The most of: enough rows to hold :data:`FETCH_BYTES` of tokens, ``rows /
        FETCH_FRACTION``, and :func:`rows_per_take`'s count (neighbours within the merge window);
        but no more than :data:`MAX_FETCH_BYTES` of tokens, nor than ``rows``. A table read per
        row (:func:`per_row_reads`): :data:`ROW_FETCH_BYTES` of tokens, whatever its size.
    """
    rows = max(int(rows), 1)
    mean = max(float(column_bytes), 1.0) / rows  # bytes per row
    if per_row_reads(column_bytes):
        return int(max(min(ROW_FETCH_BYTES / mean, rows), 1))
    wanted = max(
        FETCH_BYTES / mean,
        rows / FETCH_FRACTION,
        rows_per_take(column_bytes, remote=True, cap=False),
    )
    return int(max(min(wanted, MAX_FETCH_BYTES / mean, rows), 1))
