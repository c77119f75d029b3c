"""Process hygiene: a child process never outlives the process that started it, and a spawned
loader worker does not run the user's script again.

Backfill workers (spawned pools) and training ranks (started by ``torchrun``, in sessions of their
own, so killing the launcher's process group does not reach them) call :func:`die_with_parent`
before any work: when the parent dies, even by ``kill -9``, the kernel ends them too.

Loader workers (the packed loader's and the row loader's) are spawned (Lance is not fork-safe);
:func:`main_not_rerun` keeps multiprocessing from running the parent's ``__main__`` in each of
them, so a script needs no ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "defined_in_main",
    "die_with_parent",
    "env_topology",
    "main_not_rerun",
    "release_arrow_memory",
    "release_memory",
]

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


_START_LOCK = threading.Lock()


def defined_in_main(*objects: Any) -> bool:
    """Whether any of ``objects`` (functions, classes, callable instances) was defined in the
    script being run: a spawned worker can only unpickle it by running the script again."""
    for obj in objects:
        if obj is None:
            continue
        module = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", None)
        if module in ("__main__", "__mp_main__"):
            return True
    return False


@contextmanager
def main_not_rerun(skip: bool = True) -> Iterator[None]:
    """While processes are started under it: leave the parent's ``__main__`` out of what a
    spawned child prepares, so multiprocessing does not run the script again in every child
    (which, without a ``__main__`` guard, would start workers from the workers).

    Wrap only the starting of workers whose targets and arguments need nothing from
    ``__main__`` (see :func:`defined_in_main`); ``skip=False`` leaves spawning as it is.
    """
    if not skip:
        yield
        return
    import multiprocessing.spawn

    with _START_LOCK:
        original = multiprocessing.spawn.get_preparation_data

        def prepare(name: str) -> dict:
            data = original(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        multiprocessing.spawn.get_preparation_data = prepare
        try:
            yield
        finally:
            multiprocessing.spawn.get_preparation_data = original


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


def release_arrow_memory() -> None:
    """Give the pages Arrow's allocator keeps after a large scan back to the system.

    Arrow's pool (mimalloc or jemalloc) keeps freed pages for reuse: a process that scanned a
    column of every row would otherwise hold that scan's peak (tens of bytes a row) for the rest
    of its life, and the next stage's peak would stack on it.
    """
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def release_memory() -> None:
    """Give freed memory back to the system after a step over every row: Arrow's pool
    (:func:`release_arrow_memory`) and the C heap (glibc's ``malloc_trim``; numpy's arrays of a
    few MiB come from the heap, whose freed pages glibc otherwise keeps)."""
    release_arrow_memory()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass
