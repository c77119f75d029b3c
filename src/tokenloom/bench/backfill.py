"""The backfill engine's overhead: ``add_column`` with N workers vs the same UDF over the same
rows in one in-process loop (read the inputs, call the UDF per batch, nothing written).

The engine additionally plans, spawns workers, checkpoints every unit, assembles one data file
per fragment and commits; with a cheap UDF that is all overhead, so the ratio is its upper bound.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

__all__ = ["BackfillBench", "run_backfill_bench"]


@dataclass(kw_only=True)
class BackfillBench:
    """Measured figures of one run."""

    rows: int
    workers: int
    loop_seconds: list[float] = field(default_factory=list)
    engine_seconds: list[float] = field(default_factory=list)

    @property
    def loop_rows_s(self) -> float:
        return self.rows / statistics.median(self.loop_seconds)

    @property
    def engine_rows_s(self) -> float:
        return self.rows / statistics.median(self.engine_seconds)

    @property
    def ratio(self) -> float:
        """Engine time / loop time (1.0 = no overhead; below 1 = parallelism wins)."""
        return statistics.median(self.engine_seconds) / statistics.median(self.loop_seconds)

    def to_json(self) -> dict:
        return {
            "rows": self.rows,
            "workers": self.workers,
            "loop_rows_s": round(self.loop_rows_s),
            "engine_rows_s": round(self.engine_rows_s),
            "engine_over_loop_time": round(self.ratio, 3),
            "loop_seconds": self.loop_seconds,
            "engine_seconds": self.engine_seconds,
        }


def _loop(uri: str, udf) -> int:  # noqa: ANN001
    import lance

    ds = lance.dataset(uri)
    rows = 0
    for batch in ds.to_batches(columns=list(udf.inputs), batch_size=udf.batch_size):
        rows += len(udf(batch).column(0))
    return rows


def run_backfill_bench(uri: str, udf, *, workers: int, repeats: int = 3) -> BackfillBench:  # noqa: ANN001
    """Alternate the in-process loop and ``add_column`` (each into a fresh column name)."""
    import lance

    from tokenloom.backfill import add_column

    bench = BackfillBench(rows=lance.dataset(uri).count_rows(), workers=workers)
    for i in range(repeats):
        t0 = time.perf_counter()
        _loop(uri, udf)
        bench.loop_seconds.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        add_column(uri, f"{udf.columns[0]}_bench{i}", udf, workers=workers, progress=False)
        bench.engine_seconds.append(time.perf_counter() - t0)
    return bench
