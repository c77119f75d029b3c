"""Transforms for the row-worker tests, importable by spawned workers (no torch here)."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa


def slow_k(batch: pa.RecordBatch) -> dict:
    """``k`` doubled and a 2-D float block per row, after a pause (so steps queue up)."""
    time.sleep(0.3)
    k = batch.column("k").to_numpy()
    return {"k2": k * 2, "grid": np.outer(k, np.arange(3, dtype=np.float32)), "flag": k % 2 == 0}
