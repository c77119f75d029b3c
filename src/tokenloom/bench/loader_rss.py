"""Process memory for the benchmarks: peak memory of a process tree (a loader's process plus its
DataLoader workers), sampled in a background thread, and the per-process figures ``bench plan``
adds up (anonymous memory, files' allocated blocks, a trimmed heap).

Two sums over the tree are kept: **RSS**, what ``ps``/psutil report (pages shared between the
processes, such as torch's libraries mapped by every spawned worker, count once per process), and
**PSS** (each shared page divided among the processes sharing it, so the sum is the tree's real
footprint). Linux ``/proc`` is read directly; elsewhere psutil is used when installed (RSS only).
The descendant set is refreshed every ``refresh_s`` (a ``/proc`` scan), RSS every ``interval_s``
(``statm``: a counter read), PSS as often as ``pss_share`` of one core allows: ``smaps_rollup``
walks every page of the process (measured on a loader's tree with two DataLoader workers,
~1 GB: 34 ms of CPU a read, 55 ms of wall, against 0.2 ms for the RSS of the three processes),
so reading it every ``interval_s`` took a quarter of a core from the loader being measured (on 2
cores, 10% less throughput for a loader with workers), and a read takes the process's memory
map lock its own threads then wait for. The sampler also keeps a time series
(every ``series_s``) of the tree's CPU utilisation (user + system time of its live processes over
the wall, in % of one core) beside its RSS and PSS: :class:`UsagePoint`.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

__all__ = [
    "TreeMemory",
    "UsagePoint",
    "tree_cpu_seconds",
    "tree_cpu_total",
    "TreeSampler",
    "tree_pids",
    "tree_memory",
    "anon_bytes",
    "trim_heap",
    "allocated_bytes",
]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = os.path.isdir("/proc/self")


@dataclass(frozen=True, kw_only=True)
class TreeMemory:
    """One sample (bytes) of a process tree."""

    processes: int
    rss: int
    pss: int | None
    """``None`` where PSS is not available (no ``/proc/<pid>/smaps_rollup``)."""


@dataclass(frozen=True)
class UsagePoint:
    """One point of a tree's usage series."""

    t: float
    """Seconds since the sampler started."""
    cpu_pct: float
    """CPU time of the tree's processes since the previous point over the wall between the two,
    in % of one core (200 = two cores busy)."""
    rss_mb: float
    pss_mb: float | None


def _cpu_ticks(pid: int) -> int | None:
    """User + system clock ticks of one process (``/proc/<pid>/stat`` fields 14 and 15)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def tree_cpu_seconds(pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system) each live process of ``pids`` used so far."""
    out: dict[int, float] = {}
    for pid in pids:
        if _PROC:
            ticks = _cpu_ticks(pid)
            if ticks is not None:
                out[pid] = ticks / _TICK
            continue
        try:
            import psutil

            times = psutil.Process(pid).cpu_times()
            out[pid] = times.user + times.system
        except Exception:  # noqa: BLE001 - psutil missing, or the process exited
            continue
    return out


def tree_cpu_total() -> float:
    """CPU seconds (user + system) this process and its descendants have used so far: its own
    and its waited-for children's (``os.times``), plus its live descendants' (``/proc``). A
    child's time moves from the second sum to the first when it is waited for, so the total
    stays continuous across a worker that ends (a DataLoader's workers at an epoch's end)."""
    me = os.getpid()
    t = os.times()
    live = tree_cpu_seconds([p for p in tree_pids(me) if p != me])
    return t.user + t.system + t.children_user + t.children_system + sum(live.values())


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def tree_pids(root: int) -> list[int]:
    """``root`` and all its live descendants."""
    if not _PROC:
        try:
            import psutil
        except ImportError:
            return [root]
        try:
            proc = psutil.Process(root)
            return [root, *(c.pid for c in proc.children(recursive=True))]
        except psutil.Error:
            return []
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            parent = _ppid(int(name))
            if parent is not None:
                children.setdefault(parent, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _rss_pss(pid: int, with_pss: bool) -> tuple[int, int | None]:
    if not _PROC:
        import psutil

        return psutil.Process(pid).memory_info().rss, None
    with open(f"/proc/{pid}/statm", "rb") as f:
        rss = int(f.read().split()[1]) * _PAGE
    if not with_pss:
        return rss, None
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return rss, int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, None


def tree_memory(pids: list[int], *, with_pss: bool = True) -> TreeMemory:
    """Sum RSS (and PSS) over ``pids``; processes that exited meanwhile are skipped."""
    rss, pss, alive, pss_ok = 0, 0, 0, with_pss
    for pid in pids:
        try:
            r, p = _rss_pss(pid, with_pss)
        except (OSError, ValueError, ImportError):
            continue
        except Exception:  # noqa: BLE001 - psutil.NoSuchProcess and friends
            continue
        alive += 1
        rss += r
        if p is None:
            pss_ok = False
        else:
            pss += p
    return TreeMemory(processes=alive, rss=rss, pss=pss if pss_ok and alive else None)


class TreeSampler:
    """Samples a process tree's memory until stopped; keeps the peaks.

    Args:
        root: The tree's root process id.
        interval_s: Seconds between memory samples (RSS).
        refresh_s: Seconds between rescans of the descendants.
        series_s: Seconds between the points of :attr:`series` (CPU %, RSS, PSS).
        pss_share: Share of one core the PSS reads may take: after a read that cost ``c``
            seconds of the sampler's CPU the next waits ``c / pss_share`` (at least
            ``interval_s``), so :attr:`peak_pss` is the peak of those reads and a series
            point's PSS the latest one.
    """

    def __init__(
        self,
        root: int,
        *,
        interval_s: float = 0.1,
        refresh_s: float = 0.5,
        series_s: float = 0.5,
        pss_share: float = 0.02,
    ) -> None:
        self.root = root
        self.interval_s = interval_s
        self.refresh_s = refresh_s
        self.series_s = series_s
        self.pss_share = pss_share
        self.samples = 0
        """Memory samples taken (RSS)."""
        self.pss_reads = 0
        """Samples that read PSS too."""
        self.pss_cpu_s = 0.0
        """The sampler's CPU seconds in its PSS reads."""
        self._pss: int | None = None  # the latest PSS read
        self.series: list[UsagePoint] = []
        """The usage time series (the first point after ``series_s``)."""
        self.peak_rss = 0
        self.peak_pss: int | None = None
        self.peak_processes = 0
        self.last = TreeMemory(processes=0, rss=0, pss=None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokenloom-rss", daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def pids(self) -> list[int]:
        """The tree's current processes (a fresh scan)."""
        return tree_pids(self.root)

    def _point(self, now: float, pids: list[int], sample: TreeMemory) -> None:
        """Add a series point: the tree's CPU since the last point (a process born since then
        counts its CPU from its start; one that exited meanwhile is lost)."""
        cpu = tree_cpu_seconds(pids)
        prev_t, prev_cpu = self._cpu_mark
        used = sum(v - prev_cpu.get(pid, 0.0) for pid, v in cpu.items())
        self._cpu_mark = (now, cpu)
        self.series.append(
            UsagePoint(
                t=round(now - self._started, 3),
                cpu_pct=round(100.0 * max(used, 0.0) / max(now - prev_t, 1e-6), 1),
                rss_mb=round(sample.rss / 2**20, 1),
                pss_mb=None if self._pss is None else round(self._pss / 2**20, 1),
            )
        )

    def _run(self) -> None:
        pids: list[int] = []
        rescanned = pss_due = 0.0
        self._started = time.monotonic()
        self._cpu_mark: tuple[float, dict[int, float]] = (self._started, {})
        while True:
            now = time.monotonic()
            if now - rescanned >= self.refresh_s:
                pids, rescanned = tree_pids(self.root), now
            if not self._cpu_mark[1] and pids:
                self._cpu_mark = (now, tree_cpu_seconds(pids))
            with_pss = now >= pss_due and bool(pids)
            spent = time.thread_time()
            sample = tree_memory(pids, with_pss=with_pss)
            self.samples += 1
            if with_pss:
                spent = time.thread_time() - spent
                self.pss_reads += 1
                self.pss_cpu_s += spent
                pss_due = now + max(spent / self.pss_share, self.interval_s)
                if sample.pss is not None:
                    self._pss = sample.pss
                    self.peak_pss = max(self.peak_pss or 0, sample.pss)
            if now - self._cpu_mark[0] >= self.series_s:
                self._point(now, pids, sample)
            self.last = sample
            self.peak_rss = max(self.peak_rss, sample.rss)
            self.peak_processes = max(self.peak_processes, sample.processes)
            if self._stop.wait(self.interval_s):
                return


def trim_heap() -> None:
    """Give the heap's free pages (glibc's, and Arrow's pool's) back to the system, so that a
    process's growth of anonymous memory counts what it allocates, not pages freed earlier that
    it reuses."""
    from tokenloom.process import release_memory

    release_memory()


def anon_bytes(pid: int | str = "self") -> int:
    """A process's anonymous memory (private heap and copied-on-write pages), or -1."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Anonymous:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def allocated_bytes(root: str) -> int:
    """Bytes the files under ``root`` take (allocated blocks: a file being written through a mapping
    counts the pages written so far)."""
    total = 0
    for base, _, names in os.walk(root):
        for n in names:
            try:
                total += os.stat(os.path.join(base, n)).st_blocks * 512
            except OSError:  # renamed or removed meanwhile
                pass
    return total
