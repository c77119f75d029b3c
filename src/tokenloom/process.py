"""Process hygiene: a child process never outlives the process that started it.

Backfill workers (spawned pools) and training ranks (started by ``torchrun``, in sessions of their
own, so killing the launcher's process group does not reach them) call :func:`die_with_parent`
before any work: when the parent dies, even by ``kill -9``, the kernel ends them too.
"""

from __future__ import annotations

import os
import sys

__all__ = ["die_with_parent", "env_topology"]

_PR_SET_PDEATHSIG = 1


def _set_parent_death_signal() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; ``False`` where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):  # pragma: no cover - no libc prctl
        return False


def _watch_parent(parent: int, interval: float = 0.5) -> None:  # pragma: no cover - non-Linux
    import threading
    import time

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="tokenloom-parent-watch", daemon=True).start()


def die_with_parent(parent: int) -> None:
    """Pool initializer: end this worker when the driver ``parent`` dies, even by ``kill -9``.

    Runs in each worker before it takes any unit. On Linux the kernel sends SIGKILL when the
    parent dies (``PR_SET_PDEATHSIG``); elsewhere a daemon thread polls the parent id. Either
    way, a driver that died *before* this ran (while the worker was still starting: the spawn
    start-up imports modules for a second or more) is seen here at once, as a changed parent
    id, and the worker exits instead of waiting forever on a queue nobody will write to.

    Args:
        parent: The driver's pid, taken in the driver.
    """
    if not _set_parent_death_signal():
        _watch_parent(parent)
    if os.getppid() != parent:  # checked after arming: no window where a death goes unseen
        os._exit(1)


def env_topology(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: the arguments, else torchrun's ``RANK``/``WORLD_SIZE``, else
    ``(0, 1)``. (Checking that the rank is inside the world is the caller's, with its error.)"""

    def env(name: str, default: int) -> int:
        value = os.environ.get(name)
        return int(value) if value not in (None, "") else default

    return (
        env("RANK", 0) if rank is None else int(rank),
        env("WORLD_SIZE", 1) if world_size is None else int(world_size),
    )
