"""File locks beside a table that say who holds them, wait with a deadline, and leave nothing.

A :class:`FileLock` is an ``flock`` on a small file holding its holder (pid, host, since, what),
so the kernel releases it when the holder dies, even by ``kill -9``: a stale lock never blocks.
Waiting prints the holder once and gives up after ``timeout`` seconds with an error naming it.
The file is removed on release; a killed holder leaves it behind, and the next holder (or
``tokenloom gc``) reuses or removes it. Local file systems only (``flock``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from tokenloom.errors import TokenloomError

__all__ = ["FileLock", "LockTimeoutError", "describe_holder", "is_held", "read_holder"]


class LockTimeoutError(TokenloomError):
    """A lock stayed held by another process for longer than the caller would wait."""


def read_holder(path: str) -> dict[str, Any]:
    """What the lock file at ``path`` says about its holder ({} when unknown)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def describe_holder(holder: dict[str, Any]) -> str:
    """``pid 123 on host h since 2024-01-01T10:00:00Z (5 s ago) for backfill x``."""
    if not holder:
        return "another process (it records no pid)"
    out = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    since = holder.get("since")
    if since:
        age = time.time() - float(holder.get("since_unix", time.time()))
        out += f" since {since} ({age:,.0f} s ago)"
    if holder.get("what"):
        out += f" for {holder['what']}"
    return out


def is_held(path: str) -> bool:
    """Whether a live process holds the lock at ``path`` (``False`` when no file is there)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases the probe's lock
    return False


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class FileLock:
    """An exclusive lock on ``path``; use as ``with FileLock(p, what=...).acquire(timeout):``.

    Args:
        path: The lock file (its directory is created).
        what: What the holder does, shown to whoever waits (e.g. ``"backfill n_tokens"``).
        keep_file: Leave the file on release, for a lock file shared with code that does not
            re-check the file after locking (then removing it could let two holders in).
    """

    def __init__(self, path: str, *, what: str, keep_file: bool = False) -> None:
        self.path = path
        self.what = what
        self.keep_file = keep_file
        self._fd: int | None = None

    def acquire(
        self,
        timeout: float | None = None,
        *,
        on_wait: Callable[[str], None] | None = _stderr,
        poll: float = 0.1,
    ) -> FileLock:
        """Take the lock, waiting at most ``timeout`` seconds (``None``: forever; 0: no wait).

        Raises:
            LockTimeoutError: naming the holder (pid, host, since) and the lock file.
        """
        import fcntl

        deadline = None if timeout is None else time.monotonic() + timeout
        told = False
        while True:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = describe_holder(read_holder(self.path))
                if deadline is not None and time.monotonic() >= deadline:
                    raise LockTimeoutError(
                        f"{self.what} is locked by {holder} (lock file {self.path}); gave up "
                        f"after {timeout:g} s. Wait for it to finish or pass a longer "
                        "--lock-timeout; a dead holder releases the lock by itself"
                    ) from None
                if not told and on_wait is not None:
                    limit = "" if timeout is None else f" (at most {timeout:g} s)"
                    on_wait(f"waiting for {self.what}: locked by {holder}{limit}")
                    told = True
                time.sleep(poll)
                continue
            # The file may have been removed (released) between open and flock: retry on the
            # new one, or two processes would each hold a lock on a different file.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            self._fd = fd
            self._write_holder()
            return self

    def _write_holder(self) -> None:
        assert self._fd is not None
        now = time.time()
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
            "since_unix": now,
            "what": self.what,
        }
        data = json.dumps(holder).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file and release the lock (nothing is left behind)."""
        if self._fd is None:
            return
        if self.keep_file:
            os.ftruncate(self._fd, 0)  # no stale holder shown while another process holds it
        else:
            try:
                os.unlink(self.path)  # still holding it: nobody can take this inode meanwhile
            except FileNotFoundError:
                pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> FileLock:
        if self._fd is None:
            self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
