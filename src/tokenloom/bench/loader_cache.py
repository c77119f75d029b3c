"""Page-cache state of a loader's input before it is measured: warm (every file read once) or
cold (its pages dropped), and how much of it was really resident when the case started.

Cold uses ``os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` after an ``fsync`` (dirty pages
cannot be dropped); it needs no root, but the kernel may keep pages (another process mapping
them, a filesystem that ignores the hint), so the resident share is measured after the drop
with ``mincore(2)`` (through ctypes on Linux) and reported beside the result, instead of being
assumed. Only the benchmark's own files are touched. On a virtual machine the host may still
cache the disk: "cold" here means out of this kernel's page cache.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["CACHE_MODES", "CacheState", "files_under", "resident_fraction", "prepare_cache"]

CACHE_MODES = ("warm", "cold")


@dataclass(frozen=True, kw_only=True)
class CacheState:
    """What :func:`prepare_cache` did and saw."""

    mode: str
    """``warm`` or ``cold``."""
    resident: float | None
    """Share of the input's pages in the page cache afterwards (``None``: cannot be measured
    on this platform)."""
    note: str = ""
    """Why a cold run is not cold (dropping unsupported or pages kept), else empty."""


def files_under(path: str) -> Iterator[str]:
    """Every regular file of a file or directory tree, in a stable order."""
    if os.path.isfile(path):
        yield path
        return
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            if os.path.isfile(full) and not os.path.islink(full):
                yield full


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not hasattr(os, "posix_fadvise") or name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def _resident_pages(libc: ctypes.CDLL, path: str) -> tuple[int, int]:
    """``(resident, total)`` pages of one file, from ``mincore`` over a read-only mapping."""
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    if size == 0:
        return 0, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), f"mmap of {path}")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path}")
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in bytes(vec)), pages


def resident_fraction(paths: list[str]) -> float | None:
    """Share of the pages of every file under ``paths`` now in the page cache (``None`` where
    ``mincore`` is not available)."""
    libc = _libc()
    if libc is None:
        return None
    try:
        counts = [_resident_pages(libc, f) for p in paths for f in files_under(p)]
    except (OSError, AttributeError):
        return None
    total = sum(t for _r, t in counts)
    return sum(r for r, _t in counts) / total if total else 0.0


def _drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _read(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def prepare_cache(paths: list[str], mode: str) -> CacheState:
    """Read every file under ``paths`` (``warm``) or drop their pages (``cold``), then measure
    how much of them is resident."""
    if mode not in CACHE_MODES:
        raise ValueError(f"cache mode must be one of {CACHE_MODES}, got {mode!r}")
    files = [f for p in paths for f in files_under(p)]
    note = ""
    if mode == "warm":
        for f in files:
            _read(f)
    elif not hasattr(os, "posix_fadvise"):
        note = "posix_fadvise is not available on this platform: the run is not cold"
    else:
        for f in files:
            _drop(f)
    resident = resident_fraction(paths)
    if mode == "cold" and not note:
        if resident is None:
            note = "dropped with posix_fadvise; residency cannot be measured here"
        elif resident > 0.05:
            note = f"{resident:.0%} of the input stayed cached after posix_fadvise"
    return CacheState(mode=mode, resident=resident, note=note)
