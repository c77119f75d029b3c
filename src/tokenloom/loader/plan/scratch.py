"""Reused per-thread temporaries for the numpy kernels (packing, gathering rows).

Large temporaries allocated afresh on every call cost page faults (the kernel zero-fills every page
on first touch); a kernel that needs one asks :func:`scratch` for an array it keeps per thread
instead. Plain process memory: nothing is shared with another process.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["scratch"]

_SCRATCH = threading.local()


def scratch(name: str, n: int, dtype: type = np.int64) -> np.ndarray:
    """A reused per-thread array of ``n`` values for temporaries that never leave a function
    (contents undefined). Large temporaries allocated afresh on every call cost page faults."""
    key = (name, np.dtype(dtype).str)
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    buf = bufs.get(key)
    if buf is None or buf.shape[0] < n:
        buf = bufs[key] = np.empty(max(n, 1 << 16), dtype=dtype)
    return buf[:n]
