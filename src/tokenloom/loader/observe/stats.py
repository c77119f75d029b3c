"""Loader profiling: counters that add up correctly across DataLoader workers.

Each batch carries the *increments* its worker made since its previous batch; the consumer sums
them, so totals are exact whatever the number of workers. The consumer adds its own clock: the
seconds it spent blocked in ``next()`` (the stall) and its wall time, and the batches' time in
transit from the workers. Queue occupancies (:mod:`~tokenloom.loader.observe.gauge`) travel as areas
in step-seconds, which add up too; maxima merge by ``max``. :meth:`LoaderStats.summary` ends with a
plain-words verdict of the bottleneck (:func:`~tokenloom.loader.observe.bottleneck.bottleneck`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["LoaderStats", "STAGES"]

STAGES = ("planned", "read", "packed", "transit")
"""The pipeline's queues, in order (see :mod:`tokenloom.loader.observe.gauge`)."""

_NOT_SUMMED = frozenset({"rows_planned"})
_MAXIMA = frozenset({"planned_max", "read_max", "packed_max", "transit_max", "capacity"})


@dataclass(kw_only=True)
class LoaderStats:
    """Counters of one loader (or one worker's increments)."""

    steps: int = 0
    """Batches delivered."""
    rows_planned: int = 0
    """Rows selected by the filter (the epoch's documents)."""
    rows_read: int = 0
    """Token lists fetched from the table (a long document cached across blocks counts once)."""
    rows_packed: int = 0
    """Document stretches packed into blocks."""
    tokens: int = 0
    """Real document tokens delivered (EOS and padding excluded)."""
    eos: int = 0
    padding: int = 0
    loss_positions: int = 0
    masked_tokens: int = 0
    """Labels a loss-mask column set to ``-100`` (not in :attr:`loss_positions`)."""
    bytes_read: int = 0
    read_seconds: float = 0.0
    """I/O-thread time spent fetching rows (``take``)."""
    pack_seconds: float = 0.0
    """I/O-thread time spent packing fetched rows into blocks."""
    wait_seconds: float = 0.0
    """Time the consumer spent waiting for batches after each pass's first (the data stall)."""
    wall_seconds: float = 0.0
    """The consumer's time iterating, from each pass's first batch to its last."""
    transfer_seconds: float = 0.0
    """The part of the stall after the awaited batch had left its worker (moving it across)."""
    startup_seconds: float = 0.0
    """Time the consumer waited for each pass's first batch (workers spawned, plan built)."""
    pipelines: int = 0
    """Read pipelines run (one per DataLoader worker per epoch, or one per in-process pass)."""
    pipeline_seconds: float = 0.0
    """Their lifetimes, summed: the clock of the queue areas below."""
    planned_area: float = 0.0
    """Step-seconds of steps submitted for reading, rows not fetched yet."""
    read_area: float = 0.0
    """Step-seconds of steps fetched, being packed."""
    packed_area: float = 0.0
    """Step-seconds of batches built, not yet handed out."""
    transit_area: float = 0.0
    """Step-seconds of batches handed out by a worker, not yet received by the consumer."""
    planned_max: int = 0
    read_max: int = 0
    packed_max: int = 0
    """Largest length of each queue in one pipeline."""
    transit_max: int = 0
    """Largest number of batches in transit to the consumer, all workers together."""
    capacity: int = 0
    """Steps a pipeline submits ahead at most (read-ahead groups x steps per group)."""
    starved_seconds: float = 0.0
    """Pipeline time blocked on the oldest group: packed queue empty, reads in flight."""
    full_seconds: float = 0.0
    """Pipeline time with every submitted group built, waiting to be handed out (the I/O
    threads idle until the consumer takes more)."""
    io_threads: int = 0
    """I/O threads of the read pipelines, summed over them (:attr:`pipelines`)."""
    read_ahead: int = 0
    """Read groups in flight of the read pipelines, summed over them."""
    probe_wall_seconds: float = 0.0
    """Wall time of the groups timed to size the pipelines
    (:mod:`~tokenloom.loader.pipeline.readahead`)."""
    probe_cpu_seconds: float = 0.0
    span_rows: int = 0
    """Rows of each pipeline's first fetch span on an object store, summed over them (0: one
    take per read group; then :attr:`read_ahead` counts read groups, else fetch spans)."""
    spans_carried: int = 0
    """Fetch spans a pipeline found fetched already when it started: read ahead across the epoch
    boundary by the pass before it, in the same process (the training process, or a persistent
    DataLoader worker)."""

    def add(self, other: LoaderStats | dict) -> None:
        """Add another set of counters (or its dict form) into this one."""
        mine = self.__dict__  # per batch: plain dict work, no dataclass machinery
        for key, value in (other if isinstance(other, dict) else other.__dict__).items():
            if key in _MAXIMA:
                if value > mine[key]:
                    mine[key] = value
            elif key not in _NOT_SUMMED:
                mine[key] += value

    def add_counts(self, counts: dict) -> None:
        """Add counters that are all sums (a step's: :meth:`BuiltGroup.step_stats`), without
        the checks of :meth:`add` for maxima and fixed figures."""
        mine = self.__dict__
        for key, value in counts.items():
            mine[key] += value

    def delta(self, since: LoaderStats) -> dict:
        """The increments since a snapshot, as a dict (what a batch carries); maxima as is."""
        now, then = self.__dict__, since.__dict__
        return {k: now[k] if k in _MAXIMA else now[k] - then[k] for k in _CARRIED}

    def record_sizing(self, sizing: Any) -> None:
        """Add the sizing of one read pipeline (a
        :class:`~tokenloom.loader.pipeline.readahead.ReadAhead`; the pipeline itself is counted by
        the gauge, :attr:`pipelines`)."""
        self.io_threads += sizing.io_threads
        self.read_ahead += sizing.read_ahead
        self.probe_wall_seconds += sizing.wall_s
        self.probe_cpu_seconds += sizing.cpu_s
        self.span_rows += getattr(sizing, "span_rows", 0)

    def read_ahead_summary(self) -> str:
        """Mean threads, depth and probe times per read pipeline ("" before the first)."""
        n = self.pipelines
        if not n:
            return ""
        if self.span_rows:
            return (
                f"{_count(self.read_ahead / n, 'fetch span')} of ~{self.span_rows / n:.0f} rows "
                f"ahead, {_count(self.io_threads / n, 'concurrent take')} "
                f"(probe {self.probe_wall_seconds / n * 1e3:.1f} ms wall, "
                f"{self.probe_cpu_seconds / n * 1e3:.1f} ms CPU)"
            )
        return (
            f"{_count(self.io_threads / n, 'thread')}, "
            f"{_count(self.read_ahead / n, 'group')} ahead "
            f"(probe {self.probe_wall_seconds / n * 1e3:.1f} ms wall, "
            f"{self.probe_cpu_seconds / n * 1e3:.1f} ms CPU)"
        )

    def copy(self) -> LoaderStats:
        snapshot = object.__new__(LoaderStats)
        snapshot.__dict__.update(self.__dict__)
        return snapshot

    def occupancy(self, elapsed: float | None = None) -> dict[str, tuple[float, int]]:
        """``stage -> (mean, max)`` steps in each queue: per pipeline for the worker-side
        queues, all workers together for ``transit`` (over ``elapsed`` or the consumer's wall).
        """
        per = max(self.pipeline_seconds, 1e-12)
        wall = max(elapsed or self.wall_seconds, 1e-12)
        return {
            "planned": (self.planned_area / per, self.planned_max),
            "read": (self.read_area / per, self.read_max),
            "packed": (self.packed_area / per, self.packed_max),
            "transit": (self.transit_area / wall, self.transit_max),
        }

    def to_json(self) -> dict:
        from tokenloom.loader.observe.bottleneck import bottleneck

        verdict = bottleneck(self)
        return {**asdict(self), "bottleneck": verdict.stage, "verdict": verdict.text}

    def summary(self, elapsed: float | None = None) -> str:
        """One line for a training log: totals, per-step times, queues and the verdict."""
        from tokenloom.loader.observe.bottleneck import bottleneck

        n = max(self.steps, 1)
        wall = elapsed or self.wall_seconds
        line = (
            f"loader: {self.steps} steps, {self.tokens / 1e6:.2f}M tok, "
            f"read {self.rows_read} rows/{self.bytes_read / 1e6:.1f} MB; per step "
            f"fetch {1e3 * self.read_seconds / n:.2f} ms, pack {1e3 * self.pack_seconds / n:.2f} "
            f"ms, stall {1e3 * self.wait_seconds / n:.2f} ms"
        )
        if wall:
            line += f" ({100 * self.wait_seconds / wall:.1f}% of wall)"
        if self.startup_seconds:
            line += f", start-up {self.startup_seconds:.2f}s"
        if self.padding:
            line += f", pad {self.padding}"
        if self.pipelines:
            occ = self.occupancy(elapsed)
            queues = ", ".join(
                f"{s} {m:.1f}/{top}" for s, (m, top) in occ.items() if s in STAGES[:3]
            )
            line += f"; queue mean/max per pipeline (submits <= {self.capacity} ahead): {queues}"
            if self.transit_max:
                mean, top = occ["transit"]
                line += f"; in transit {mean:.1f}/{top}"
        if self.pipelines and self.io_threads:
            line += f"; read-ahead {self.read_ahead_summary()}"
        return f"{line}; {bottleneck(self, elapsed).text}"


_CARRIED = tuple(f.name for f in fields(LoaderStats) if f.name not in _NOT_SUMMED)


def _count(value: float, noun: str) -> str:
    """``value`` (a mean, so perhaps not whole) and ``noun``, plural unless it is exactly 1."""
    return f"{value:g} {noun}" if value == 1 else f"{value:g} {noun}s"
