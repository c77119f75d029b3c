"""Ingest throughput next to pyarrow's own JSON reader on the same files.

pyarrow's multithreaded C++ JSON reader is the floor of what "reading JSONL" costs; tokenloom's
ingest does more (per-record validation with rejections, fingerprints, ids, a Lance write and
commit), so the ratio says what that safety costs. Runs alternate to share the machine's noise.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field

__all__ = ["IngestBench", "run_ingest_bench"]


@dataclass(kw_only=True)
class IngestBench:
    """Measured figures of one benchmark run."""

    files: int
    megabytes: float
    rows: int
    pyarrow_seconds: list[float] = field(default_factory=list)
    tokenloom_seconds: list[float] = field(default_factory=list)

    @property
    def pyarrow_mb_s(self) -> float:
        return self.megabytes / statistics.median(self.pyarrow_seconds)

    @property
    def tokenloom_mb_s(self) -> float:
        return self.megabytes / statistics.median(self.tokenloom_seconds)

    @property
    def ratio(self) -> float:
        """tokenloom throughput / pyarrow throughput (1.0 = as fast as the raw reader)."""
        return self.tokenloom_mb_s / self.pyarrow_mb_s

    def to_json(self) -> dict:
        return {
            "files": self.files,
            "megabytes": round(self.megabytes, 3),
            "rows": self.rows,
            "pyarrow_mb_s": round(self.pyarrow_mb_s, 2),
            "tokenloom_mb_s": round(self.tokenloom_mb_s, 2),
            "ratio": round(self.ratio, 3),
            "pyarrow_seconds": self.pyarrow_seconds,
            "tokenloom_seconds": self.tokenloom_seconds,
        }


def _pyarrow_read(paths: list[str]) -> int:
    import pyarrow.json as pj

    rows = 0
    opts = pj.ReadOptions(block_size=16 << 20)
    for path in paths:
        rows += pj.read_json(path, read_options=opts).num_rows
    return rows


def run_ingest_bench(paths: list[str], *, repeats: int = 3) -> IngestBench:
    """Time pyarrow's JSON reader and ``tokenloom.ingest`` on the same JSONL files.

    Args:
        paths: Clean JSONL files (pyarrow's reader fails on any bad line).
        repeats: Alternating runs of each; medians are compared.
    """
    from tokenloom.ingest import ingest

    size = sum(os.path.getsize(p) for p in paths)
    bench = IngestBench(files=len(paths), megabytes=size / 1e6, rows=0)
    scratch = tempfile.mkdtemp(prefix="tokenloom-bench-")
    try:
        for i in range(repeats):
            t0 = time.perf_counter()
            bench.rows = _pyarrow_read(paths)
            bench.pyarrow_seconds.append(time.perf_counter() - t0)
            table = os.path.join(scratch, f"t{i}.lance")
            t0 = time.perf_counter()
            result = ingest(paths, table, progress=False)
            bench.tokenloom_seconds.append(time.perf_counter() - t0)
            if result.rows_written != bench.rows:
                raise AssertionError(
                    f"tokenloom wrote {result.rows_written} rows, pyarrow read {bench.rows}"
                )
            shutil.rmtree(table, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return bench
