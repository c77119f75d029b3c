"""``worker_init_fn``s for the worker tests; this module imports no torch (a worker that runs
one imports it)."""

from __future__ import annotations

import os
import signal


def fail_in_worker_1(worker: int) -> None:
    if worker == 1:
        raise ValueError("bad shard settings in worker 1")


def kill_worker_1(worker: int) -> None:
    """Worker 1 is killed (SIGKILL: no cleanup of its own) before it sends anything."""
    if worker == 1:
        os.kill(os.getpid(), signal.SIGKILL)
