"""Near-duplicate clustering at corpus scale: band partitions on workers, one verified merge.

Computes the clusters of :func:`~tokenloom.curate.lsh.lsh_clusters` (the same graph: rows
joined when they share a band and their signatures reach the threshold) without holding the
signatures in memory, in three phases:

1. **Keys** (one task per range of rows): read the signatures, drop empty rows, and write each
   band's 8-byte key per row under a work folder.
2. **Buckets** (one task per band): read that band's keys only, sort them, and keep the rows of
   the buckets with two or more rows (the candidates), bucket by bucket.
3. **Merge** (the driver, band after band): a parent array of 8 bytes per row. Inside each
   bucket, rows ``i`` and ``i + step`` are compared for ``step = 1, 2, ...``; a pair already in
   one component is skipped, the others are verified against their signatures (read for those
   rows only) and joined, and a bucket is dropped as soon as all its rows are in one component.
   A bucket of ``m`` near-identical rows costs about ``m`` verifications and ``m`` root checks.

Phases 1 and 2 run on an :class:`~tokenloom.backfill.executors.Executor` (the local process
pool or Ray tasks); their files go through the table's storage (``s3://`` included), so a Ray
node needs no shared disk.

**Large buckets.** Comparing every pair of a bucket of ``m`` rows that do not verify (rows
sharing boilerplate in one band) is ``m^2/2`` work. Buckets of more than ``window + 1`` rows are
compared only within ``window`` positions (each row against the next ``window`` rows of the
bucket, in row order), which is linear; every bucket of at most ``window + 1`` rows is compared
exhaustively, so on such inputs the clusters equal :func:`~tokenloom.curate.lsh.lsh_clusters`'s
exactly (tested). How many buckets and rows were windowed is reported
(:class:`ClusterStats`), never silent.
"""

from __future__ import annotations

import io
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from tokenloom.curate.inputs import CurateError, as_ids
from tokenloom.curate.lsh import (
    DEFAULT_THRESHOLD,
    DEFAULT_WEIGHTS,
    _check_threshold,
    _needed,
    _row_keys,
    optimal_params,
)
from tokenloom.curate.minhash import EMPTY
from tokenloom.table.storage import delete_tree, is_remote, join, read_bytes, write_bytes

__all__ = [
    "DEFAULT_WINDOW",
    "ArraySignatures",
    "NpySignatures",
    "LanceSignatures",
    "ClusterStats",
    "banded_clusters",
]

DEFAULT_WINDOW = 64
"""Buckets of more rows than ``window + 1`` compare each row with the next ``window`` only."""

PART_ROWS = 1 << 17
"""Rows per keys task: its keys are ``bands * 8`` bytes per row (32 MiB at 32 bands)."""

_READ_ROWS = 1 << 15  # signature rows read at once by a keys task: 16 MiB at 128 permutations
_VERIFY_PAIRS = 1 << 15  # candidate pairs verified at once: their rows' signatures are read


class ArraySignatures:
    """Signatures held in memory: a ``(N, P) uint32`` array (small inputs and tests)."""

    def __init__(self, signatures: np.ndarray) -> None:
        self.signatures = signatures

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.signatures.shape)

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` as ``(hi - lo, P) uint32``."""
        return np.asarray(self.signatures[lo:hi])

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The rows at sorted, distinct positions ``rows``."""
        return np.asarray(self.signatures[rows])


class NpySignatures(ArraySignatures):
    """Signatures in a ``.npy`` file of shape ``(N, P) uint32`` (C order), opened per read.

    A range is copied out of a mapping that is dropped at once, rows are read one by one, so the
    pages read do not stay in this process's resident memory (a 10M-row file is 5 GB).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        m = np.load(path, mmap_mode="r")
        if m.ndim != 2 or m.dtype != np.uint32 or not m.flags.c_contiguous:
            raise CurateError(
                f"{path}: signatures must be (N, P) uint32 in C order, not {m.shape} {m.dtype}"
            )
        self._shape = (int(m.shape[0]), int(m.shape[1]))
        self._offset = int(m.offset)  # of the data, after the .npy header
        del m

    @property
    def shape(self) -> tuple[int, int]:
        return self._shape

    def read(self, lo: int, hi: int) -> np.ndarray:
        m = np.load(self.path, mmap_mode="r")
        out = np.array(m[lo:hi])
        del m
        return out

    def take(self, rows: np.ndarray) -> np.ndarray:
        # One read per row, not a mapping: a page fault maps its neighbours too (fault-around,
        # ~50 KB per scattered row), so 64k rows read through a mapping hold ~3 GB resident.
        width = self._shape[1] * 4
        buf = bytearray(width * len(rows))
        view = memoryview(buf)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for i, row in enumerate(np.asarray(rows).tolist()):
                view[i * width : (i + 1) * width] = os.pread(fd, width, self._offset + row * width)
        finally:
            os.close(fd)
        return np.frombuffer(buf, dtype=np.uint32).reshape(len(rows), self._shape[1])


class LanceSignatures:
    """The ``minhash`` (fixed-size list of uint32) column of a Lance table at one version.

    Rows are positions in the table's scan order at that version, as ``Table.dataset.take``
    counts them. Pickles without its open dataset (each worker opens its own).
    """

    def __init__(
        self,
        uri: str,
        version: int,
        *,
        rows: int,
        column: str = "minhash",
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        self.uri, self.version, self.column = uri, version, column
        self.storage_options = dict(storage_options) if storage_options else None
        self._rows = rows
        self._num_perm = int(self._open().schema.field(column).type.list_size)
        if self._num_perm <= 0:
            raise CurateError(f"column {column!r} must be a fixed-size list of uint32")

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_dataset"}

    def _open(self):  # noqa: ANN202 - lance.LanceDataset
        if getattr(self, "_dataset", None) is None:
            import lance

            self._dataset = lance.dataset(
                self.uri, version=self.version, storage_options=self.storage_options
            )
        return self._dataset

    @property
    def shape(self) -> tuple[int, int]:
        return (self._rows, self._num_perm)

    def _flat(self, table, n: int) -> np.ndarray:  # noqa: ANN001 - pyarrow.Table
        import pyarrow.compute as pc

        col = table.column(0)
        if col.null_count:
            raise CurateError(
                f"{col.null_count} rows have no {self.column}; rebuild it: "
                "`tokenloom dedup --near --recompute --table ...`"
            )
        return pc.list_flatten(col).to_numpy().reshape(n, self._num_perm)

    def read(self, lo: int, hi: int) -> np.ndarray:
        return self._flat(
            self._open().to_table(columns=[self.column], offset=lo, limit=hi - lo), hi - lo
        )

    def take(self, rows: np.ndarray) -> np.ndarray:
        return self._flat(self._open().take(rows, columns=[self.column]), len(rows))


@dataclass(kw_only=True)
class ClusterStats:
    """What :func:`banded_clusters` did."""

    rows: int = 0
    empty: int = 0
    """Rows whose signature is all empty (never clustered)."""
    bands: int = 0
    band_rows: int = 0
    buckets: int = 0
    """Buckets of two or more rows, over all bands."""
    bucket_rows: int = 0
    largest_bucket: int = 0
    verified: int = 0
    """Candidate pairs whose signatures were compared."""
    passed: int = 0
    """Verified pairs that reach the threshold (and were joined)."""
    windowed_buckets: int = 0
    """Buckets larger than ``window + 1`` rows, compared within ``window`` positions only."""
    windowed_rows: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _save(uri: str, array: np.ndarray, storage_options: Mapping[str, str] | None) -> None:
    if is_remote(uri):
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        write_bytes(uri, buf.getvalue(), storage_options)
        return
    # Scratch files of one run: no fsync, unlike write_bytes (hundreds of files at 10M rows).
    os.makedirs(os.path.dirname(uri), exist_ok=True)
    np.save(uri, array, allow_pickle=False)


def _load(uri: str, storage_options: Mapping[str, str] | None) -> np.ndarray:
    if is_remote(uri):
        return np.load(io.BytesIO(read_bytes(uri, storage_options)), allow_pickle=False)
    return np.load(uri, allow_pickle=False)


@dataclass(frozen=True)
class _KeysTask:
    source: object
    lo: int
    hi: int
    part: int
    bands: int
    band_rows: int
    workdir: str
    storage_options: Mapping[str, str] | None


def _keys_file(workdir: str, band: int, part: int) -> str:
    return join(workdir, f"keys-b{band:04d}-p{part:05d}.npy")


def _rows_file(workdir: str, part: int) -> str:
    return join(workdir, f"rows-p{part:05d}.npy")


def _buckets_file(workdir: str, band: int) -> str:
    return join(workdir, f"buckets-b{band:04d}.npy")


def _band_keys(task: _KeysTask) -> int:
    """Phase 1 on a worker: per band, the key of each non-empty row of ``lo:hi``; returns the
    number of empty rows."""
    keys: list[list[np.ndarray]] = [[] for _ in range(task.bands)]
    live_rows = []
    w = task.band_rows
    for lo in range(task.lo, task.hi, _READ_ROWS):
        sig = task.source.read(lo, min(task.hi, lo + _READ_ROWS))
        live = np.flatnonzero(np.any(sig != EMPTY, axis=1))
        live_rows.append(lo + live)
        sig = sig[live]
        for band in range(task.bands):
            keys[band].append(_row_keys(sig[:, band * w : (band + 1) * w], band))
    rows = np.concatenate(live_rows) if live_rows else np.zeros(0, np.int64)
    _save(_rows_file(task.workdir, task.part), rows.astype(np.int64), task.storage_options)
    for band in range(task.bands):
        data = np.concatenate(keys[band]) if keys[band] else np.zeros(0, np.uint64)
        _save(_keys_file(task.workdir, band, task.part), data, task.storage_options)
    return (task.hi - task.lo) - rows.size


@dataclass(frozen=True)
class _BucketsTask:
    band: int
    parts: int
    rows: int
    workdir: str
    storage_options: Mapping[str, str] | None


def _band_buckets(task: _BucketsTask) -> tuple[int, int, int]:
    """Phase 2 on a worker: one band's buckets of two or more rows, saved as one array: the
    bucket count ``B``, then ``B`` sizes, then the member rows bucket by bucket (ascending rows
    inside a bucket). Returns ``(buckets, rows in them, largest)``.

    Each key keeps its high bits and takes the row number as its low bits, so one in-place sort
    of 8 bytes per row groups the bucket and orders its rows (an argsort is twice as slow and
    twice the memory). Keys equal in their high bits only form one bucket; that costs a few
    comparisons, never a wrong join, since a verified pair must also agree on the band itself.
    """
    so = task.storage_options
    bits = max(1, int(task.rows - 1).bit_length())  # row number bits
    low = np.uint64((1 << bits) - 1)
    packed = np.concatenate(
        [_load(_keys_file(task.workdir, task.band, p), so) for p in range(task.parts)]
    )
    packed &= ~low
    packed |= np.concatenate(
        [_load(_rows_file(task.workdir, p), so) for p in range(task.parts)]
    ).astype(np.uint64)
    packed.sort()
    keys = packed >> np.uint64(bits)
    start = np.ones(keys.size, dtype=bool)
    start[1:] = keys[1:] != keys[:-1]
    del keys
    bounds = np.append(np.flatnonzero(start), start.size)
    del start
    sizes = np.diff(bounds)
    multi = sizes >= 2
    members = (packed[np.repeat(multi, sizes)] & low).astype(np.int64)
    del packed
    sizes = sizes[multi]
    out = np.concatenate([[sizes.size], sizes, members]).astype(np.int64)
    _save(_buckets_file(task.workdir, task.band), out, so)
    return int(sizes.size), int(members.size), int(sizes.max(initial=0))


def banded_clusters(
    ids: np.ndarray,
    source: ArraySignatures | LanceSignatures,
    *,
    workdir: str,
    executor=None,  # noqa: ANN001 - tokenloom.backfill.executors.Executor
    threshold: float = DEFAULT_THRESHOLD,
    params: tuple[int, int] | None = None,
    weights: tuple[float, float] = DEFAULT_WEIGHTS,
    window: int = DEFAULT_WINDOW,
    part_rows: int = PART_ROWS,
    storage_options: Mapping[str, str] | None = None,
    progress=None,  # noqa: ANN001 - a bar with update(n), or None
) -> tuple[np.ndarray, np.ndarray, ClusterStats]:
    """Cluster near-duplicate rows (the module docstring says how, and when it equals
    :func:`~tokenloom.curate.lsh.lsh_clusters`).

    Args:
        ids: ``(N,) int64`` unique row ids, row ``i`` of ``source`` is ``ids[i]``.
        source: The signatures, read by row ranges and by rows.
        workdir: A folder (or object-store prefix) for the partitions; deleted at the end.
        executor: Runs the key and bucket tasks; ``None`` runs them in this process.
        threshold: Estimated Jaccard similarity a joined pair must reach, in (0, 1].
        params: ``(bands, rows)`` to override :func:`~tokenloom.curate.lsh.optimal_params`.
        weights: For :func:`~tokenloom.curate.lsh.optimal_params`.
        window: Buckets of more than ``window + 1`` rows compare rows ``window`` apart at most.
        part_rows: Rows per keys task.
        storage_options: For an object-store ``workdir``.
        progress: Advanced by the rows of each finished band.

    Returns:
        ``(cluster, is_near_dup, stats)``: the smallest id of each row's cluster (its own id
        when alone), true for every member but that smallest id, and :class:`ClusterStats`.

    Raises:
        CurateError: A bad threshold, params or window, a repeated id, a length mismatch.
    """
    from tokenloom.backfill.executors import InlineExecutor

    _check_threshold(threshold)
    n, p = source.shape
    ids = as_ids(ids, n=n)
    bands, band_rows = (
        params if params is not None else optimal_params(threshold, p, weights=weights)
    )
    if bands < 1 or band_rows < 1 or bands * band_rows > p:
        raise CurateError(f"params (bands={bands}, rows={band_rows}) need 1 <= bands * rows <= {p}")
    if not (isinstance(window, int) and window >= 1):
        raise CurateError(f"window must be an integer >= 1, not {window!r}")
    if not (isinstance(part_rows, int) and part_rows >= 1):
        raise CurateError(f"part_rows must be an integer >= 1, not {part_rows!r}")
    runner = executor if executor is not None else InlineExecutor()
    so = dict(storage_options) if storage_options else None
    stats = ClusterStats(rows=n, bands=bands, band_rows=band_rows)
    need = _needed(threshold, p)
    parent = np.arange(n, dtype=np.int64)  # rows; parent[x] <= x, roots are their smallest row
    try:
        t0 = time.perf_counter()
        spans = [(lo, min(n, lo + part_rows)) for lo in range(0, n, part_rows)] or [(0, 0)]
        tasks = [
            _KeysTask(source, lo, hi, i, bands, band_rows, workdir, so)
            for i, (lo, hi) in enumerate(spans)
        ]
        stats.empty = sum(runner.map(_band_keys, tasks))
        t1 = time.perf_counter()
        stats.seconds["keys"] = round(t1 - t0, 3)
        for b, m, big in runner.map(
            _band_buckets, [_BucketsTask(band, len(spans), n, workdir, so) for band in range(bands)]
        ):
            stats.buckets += b
            stats.bucket_rows += m
            stats.largest_bucket = max(stats.largest_bucket, big)
        t2 = time.perf_counter()
        stats.seconds["buckets"] = round(t2 - t1, 3)
        for band in range(bands):
            packed = _load(_buckets_file(workdir, band), so)
            count = int(packed[0])
            sizes, members = packed[1 : 1 + count], packed[1 + count :]
            cols = slice(band * band_rows, (band + 1) * band_rows)
            _merge_band(parent, source, sizes, members, cols, need, window, stats)
            if progress is not None:
                progress.update(n * (band + 1) // bands - n * band // bands)
        stats.seconds["merge"] = round(time.perf_counter() - t2, 3)
    finally:
        if is_remote(workdir):
            delete_tree(workdir, so)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    parent = _find(parent, np.arange(n))  # now parent[x] is the smallest row of x's component
    # The cluster id is the component's smallest *id*.
    smallest = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(smallest, parent, ids)
    cluster = smallest[parent]
    return cluster, cluster != ids, stats


def _merge_band(
    parent: np.ndarray,
    source,  # noqa: ANN001
    sizes: np.ndarray,
    members: np.ndarray,
    cols: slice,
    need: int,
    window: int,
    stats: ClusterStats,
) -> None:
    """Phase 3 for one band: join the verified pairs of each bucket (module docstring)."""
    if not sizes.size:
        return
    starts = np.cumsum(sizes) - sizes  # (B,)
    bucket = np.repeat(np.arange(sizes.size), sizes)  # (M,) bucket of each member position
    end = (starts + sizes)[bucket]  # (M,) end (exclusive) of each position's bucket
    exhaustive = sizes <= window + 1  # (B,)
    stats.windowed_buckets += int((~exhaustive).sum())
    stats.windowed_rows += int(sizes[~exhaustive].sum())
    active = np.ones(sizes.size, dtype=bool)  # (B,) buckets with pairs left to look at
    act = np.arange(members.size)  # (A,) member positions of the active buckets
    pos = act[act + 1 < end]  # positions with a later partner in their bucket
    step = 1
    while pos.size:
        pos = pos[pos + step < end[pos]]
        if step > window:
            pos = pos[exhaustive[bucket[pos]]]
        for lo in range(0, pos.size, _VERIFY_PAIRS):
            chunk = pos[lo : lo + _VERIFY_PAIRS]
            u, v = members[chunk], members[chunk + step]
            apart = _find(parent, u) != _find(parent, v)
            if apart.any():
                _verify_and_join(parent, source, u[apart], v[apart], cols, need, stats)
        # Drop the buckets whose rows are all in one component now, and those without pairs
        # left (the next steps only look at farther pairs); only active buckets are checked.
        left = np.zeros(sizes.size, dtype=bool)
        left[bucket[pos]] = True
        active &= left
        act = act[active[bucket[act]]]
        if act.size:
            roots, b = _find(parent, members[act]), bucket[act]
            first = np.flatnonzero(np.concatenate(([True], b[1:] != b[:-1])))
            same = np.minimum.reduceat(roots, first) == np.maximum.reduceat(roots, first)
            active[b[first[same]]] = False
        pos = pos[active[bucket[pos]]]
        act = act[active[bucket[act]]]
        step += 1


def _verify_and_join(
    parent: np.ndarray,
    source,  # noqa: ANN001
    u: np.ndarray,
    v: np.ndarray,
    cols: slice,
    need: int,
    stats: ClusterStats,
) -> None:
    rows = np.unique(np.concatenate([u, v]))
    sig = source.take(rows)  # only the rows of these pairs
    a, b = sig[np.searchsorted(rows, u)], sig[np.searchsorted(rows, v)]
    same = a == b
    ok = same[:, cols].all(axis=1) & (same.sum(axis=1) >= need)
    stats.verified += int(u.size)
    if ok.any():
        _union_local(parent, u[ok], v[ok])
        stats.passed += int(ok.sum())


def _find(parent: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The roots of ``x``, compressing the paths of ``x`` only: the cost is that of ``x``, not of
    the whole parent array (``lsh._union`` compresses every row after each merge, which at 10M
    rows costs more than the merge itself)."""
    r = parent[x]
    while True:
        up = parent[r]
        if np.array_equal(up, r):
            break
        r = up
    parent[x] = r
    return r


def _union_local(parent: np.ndarray, u: np.ndarray, v: np.ndarray) -> None:
    """Merge the components of each edge ``(u[i], v[i])``: hook the larger root under the
    smaller (so ``parent[x] <= x`` and a root is its component's smallest row), until no edge
    spans two components."""
    while u.size:
        ru, rv = _find(parent, u), _find(parent, v)
        open_ = ru != rv
        if not open_.any():
            return
        u, v, ru, rv = u[open_], v[open_], ru[open_], rv[open_]
        np.minimum.at(parent, np.maximum(ru, rv), np.minimum(ru, rv))
