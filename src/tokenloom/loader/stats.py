"""Loader profiling: counters that add up correctly across DataLoader workers.

Each batch carries the *increments* its worker made since its previous batch; the consumer sums
them, so totals are exact whatever the number of workers. The consumer adds its own wait time
(stall): the seconds it spent blocked in ``next()`` per step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

__all__ = ["LoaderStats"]


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
    bytes_read: int = 0
    read_seconds: float = 0.0
    pack_seconds: float = 0.0
    wait_seconds: float = 0.0
    """Time the consumer spent waiting for batches (the data stall)."""
    read_pipelines: int = 0
    """Read pipelines started (one per iteration of each process); the four fields below add
    up over them, :meth:`read_ahead_summary` gives the means."""
    io_threads: int = 0
    read_ahead: int = 0
    probe_wall_seconds: float = 0.0
    """Wall time of the groups timed to size the pipelines
    (:mod:`~tokenloom.loader.readahead`)."""
    probe_cpu_seconds: float = 0.0

    def add(self, other: LoaderStats | dict) -> None:
        """Add another set of counters (or its dict form) into this one."""
        items = other.items() if isinstance(other, dict) else asdict(other).items()
        for key, value in items:
            if key != "rows_planned":
                setattr(self, key, getattr(self, key) + value)

    def delta(self, since: LoaderStats) -> dict:
        """The increments since a snapshot, as a dict (what a batch carries)."""
        return {
            f.name: getattr(self, f.name) - getattr(since, f.name)
            for f in fields(self)
            if f.name != "rows_planned"
        }

    def record_sizing(self, sizing: Any) -> None:
        """Count one read pipeline sized as ``sizing`` (a
        :class:`~tokenloom.loader.readahead.ReadAhead`)."""
        self.read_pipelines += 1
        self.io_threads += sizing.io_threads
        self.read_ahead += sizing.read_ahead
        self.probe_wall_seconds += sizing.wall_s
        self.probe_cpu_seconds += sizing.cpu_s

    def read_ahead_summary(self) -> str:
        """Mean threads, depth and probe times per read pipeline ("" before the first)."""
        n = self.read_pipelines
        if not n:
            return ""
        return (
            f"{self.io_threads / n:g} threads, {self.read_ahead / n:g} groups ahead "
            f"(probe {self.probe_wall_seconds / n * 1e3:.1f} ms wall, "
            f"{self.probe_cpu_seconds / n * 1e3:.1f} ms CPU)"
        )

    def copy(self) -> LoaderStats:
        return replace(self)

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self, elapsed: float | None = None) -> str:
        """One line for a training log."""
        per_step = self.wait_seconds / max(self.steps, 1)
        line = (
            f"loader: {self.steps} steps, {self.tokens / 1e6:.2f}M tok, "
            f"read {self.rows_read} rows/{self.bytes_read / 1e6:.1f} MB "
            f"in {self.read_seconds:.2f}s, "
            f"pack {self.pack_seconds:.2f}s, stall {per_step * 1e3:.1f} ms/step"
        )
        if elapsed:
            line += f" ({100 * self.wait_seconds / elapsed:.1f}% of wall)"
        if self.padding:
            line += f", pad {self.padding}"
        if self.read_pipelines:
            line += f"; read-ahead {self.read_ahead_summary()}"
        return line
