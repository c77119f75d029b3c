"""The per-epoch visiting order: one uniform permutation per ``(seed, epoch)``.

Every process of a job (every rank, every DataLoader worker, a resumed run next week) must compute
the *identical* order from two integers, without talking to the others. The order is drawn from

    np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))

but not through ``Generator.permutation``: NumPy guarantees that a *bit generator's* raw stream is
stable across releases, not that ``Generator`` methods keep drawing the same values (NEP 19 allows
them to change for bug fixes and speed). So the permutation is the stable ``argsort`` of ``n`` raw
64-bit PCG64 outputs: a function of the raw stream alone, hence the same on every NumPy version.
Ties between two 64-bit keys (probability about ``n**2 / 2**65``, ~3e-8 for a million rows) are
broken by position, so the result stays deterministic even then.

**How it is computed** (:func:`stable_argsort_u64`; :func:`naive_epoch_permutation` is the
reference). A stable ``argsort`` of 64-bit keys is a comparison sort moving 16 bytes per item; a
plain ``np.sort`` of ``uint64`` is a SIMD sort in place and several times faster. So each key
keeps its high ``64 - b`` bits and its position goes into the low ``b = bit_length(n - 1)`` bits;
the packed values are distinct, and sorting them orders by (high bits, position). Only items whose
high bits tie (about ``n**2 / 2**(65 - b)`` pairs: a few hundred for 17.5M rows) may be out of
true order; their full keys are drawn again from the stream and those runs re-sorted by (key,
position). The result equals ``argsort(keys, kind="stable")`` exactly. Above 4096 rows the packed
values are dealt into buckets by their top bits (counted in a first pass over the stream) and
sorted a group of consecutive buckets at a time: 16 groups below 4M rows, 8 from 4M (where the
passes cost more than the memory), each read in one more pass over the stream; from 4M rows a
group's buckets are sorted on up to 8 threads (``np.sort`` releases the GIL). Buckets and groups
are in order end to end, so the result is the same; the sort holds one group (about 0.5 byte per
row, 1 from 4M) besides its result, which it writes where the caller says (the plan store's file),
and each pass reads the stream in 64 chunks (1024 to 256k keys), so no temporary is a fixed size
that would outweigh a small result. Cost: the stream is drawn 10 to 18 times, about 0.2 s per
million rows on one core; 4 bytes per row for the result (a single sort of 8 bytes per row would
be several times faster below 4M rows but doubles the node's peak there).

:data:`PERMUTATION_ALGORITHM` names this recipe; it belongs in the loader's fingerprint so that a
future change of recipe is refused on resume instead of silently reading other rows.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = [
    "PERMUTATION_ALGORITHM",
    "chunk_size",
    "epoch_rng",
    "epoch_order",
    "epoch_permutation",
    "naive_epoch_permutation",
    "stable_argsort_u64",
]

PERMUTATION_ALGORITHM = "pcg64-seedseq[seed,epoch]-rawsort-v1"
"""Identity of the recipe of :func:`epoch_permutation` (part of the plan fingerprint)."""

_CHUNK = 1 << 18  # most keys drawn / packed / unpacked per pass (bounds the temporaries)
_MIN_CHUNK = 1 << 10  # fewest keys per pass (below, the passes cost more than they hold)
_CHUNKS = 64  # passes over the stream cut it into this many chunks, within the two bounds
_PARALLEL_MIN = 1 << 22  # keys from which the sort runs on several threads
_SORT_GROUPS = 16  # groups sorted one after another below _PARALLEL_MIN keys (0.5 B/key)
_LARGE_SORT_GROUPS = 8  # from _PARALLEL_MIN keys (1 B/key: 8 fewer passes over the stream)
_MIN_GROUP = 1 << 12  # keys up to which the packed values are sorted in one piece


def _check_seed(name: str, value: object) -> int:
    # bool is an int subclass; ``seed=True`` is almost certainly a mistake.
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _check_n(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    return int(n)


def epoch_rng(*, seed: int, epoch: int) -> np.random.Generator:
    """The random generator of one ``(seed, epoch)``, identical in every process.

    Args:
        seed: The job's seed, a non-negative integer.
        epoch: The epoch number, a non-negative integer.

    Returns:
        ``np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))``.

    Raises:
        ValueError: ``seed`` or ``epoch`` is not a non-negative integer.
    """
    seq = np.random.SeedSequence([_check_seed("seed", seed), _check_seed("epoch", epoch)])
    return np.random.Generator(np.random.PCG64(seq))


def order_dtype(n: int) -> type[np.unsignedinteger] | type[np.signedinteger]:
    """Narrowest dtype holding positions ``0..n-1``: ``uint32`` below ``2**32``, else ``int64``."""
    return np.uint32 if n <= 1 << 32 else np.int64


def chunk_size(n: int, *, least: int, most: int, multiple: int = 1) -> int:
    """Items per chunk of a pass over ``n`` items: a sixty-fourth of them (:data:`_CHUNKS`) in
    whole multiples of ``multiple``, within ``[least, most]`` (multiples of ``multiple``). A chunk's
    temporaries are a few bytes per item of the chunk: a fixed chunk would outweigh a small
    plan, a sixty-fourth stays a small share of it at every size."""
    units = -(-n // (_CHUNKS * multiple))
    return multiple * min(max(units, least // multiple), most // multiple)


def _chunk(n: int) -> int:
    """Keys per chunk of a pass over ``n`` keys (:func:`chunk_size`)."""
    return chunk_size(n, least=_MIN_CHUNK, most=_CHUNK)


def _sort_threads(n: int) -> int:
    """Threads for the packed sort: up to 8 cores from 4M keys (``np.sort`` frees the GIL)."""
    if n < _PARALLEL_MIN:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))


def _pack(keys: np.ndarray, lo: int, shift: np.uint64, out: np.ndarray) -> None:
    """``out = (keys >> shift << shift) | positions`` for keys at positions ``lo, lo + 1, ...``."""
    np.right_shift(keys, shift, out=out)
    np.left_shift(out, shift, out=out)
    out |= np.arange(lo, lo + keys.shape[0], dtype=np.uint64)


def _mapped_u64(n: int) -> np.ndarray:
    """``np.empty(n, uint64)`` in its own anonymous mapping: given back to the system as soon
    as it is freed, instead of staying in the heap beside the next group's buffer."""
    if n == 0:
        return np.empty(0, dtype=np.uint64)
    return np.frombuffer(mmap.mmap(-1, n * 8), dtype=np.uint64)


def _groups(counts: np.ndarray, cap: int) -> list[tuple[int, int]]:
    """Runs ``[b0, b1)`` of consecutive buckets holding at most ``cap`` values together (or
    one bucket, however large)."""
    out, b0, held = [], 0, 0
    for b, c in enumerate(counts.tolist()):
        if held and held + c > cap:
            out.append((b0, b))
            b0, held = b, 0
        held += c
    out.append((b0, counts.shape[0]))
    return out


def _sorted_groups(
    n: int,
    chunks: Callable[[], Iterator[np.ndarray]],
    shift: np.uint64,
    threads: int,
    max_sorting: int,
) -> Iterator[tuple[int, np.ndarray]]:
    """``(offset, values)``: the packed values in ascending order, as consecutive groups that
    start at ``offset`` of the whole. With several threads or fewer than ``n`` values sorted at
    once, the values are dealt into buckets by their top bits (counted in a first pass over the
    stream); a group is a run of consecutive buckets read in one more pass, so its buckets,
    sorted apart in parallel, are in order end to end and the groups too."""
    if threads <= 1 and max_sorting >= n:
        packed = np.empty(n, dtype=np.uint64)  # (n,) high key bits | position
        lo = 0
        for keys in chunks():
            _pack(keys, lo, shift, packed[lo : lo + keys.shape[0]])
            lo += keys.shape[0]
        if lo != n:
            raise ValueError(f"chunks yielded {lo} keys, expected {n}")
        packed.sort()
        yield 0, packed
        return
    groups_wanted = -(-n // max(max_sorting, 1))
    bits = min(max((2 * threads - 1).bit_length(), (4 * groups_wanted - 1).bit_length()), 16)
    top = np.uint64(64 - bits)
    counts = np.zeros(1 << bits, dtype=np.int64)
    for keys in chunks():
        counts += np.bincount((keys >> top).astype(np.uint16), minlength=1 << bits)
    if int(counts.sum()) != n:
        raise ValueError(f"chunks yielded {int(counts.sum())} keys, expected {n}")
    offset = 0
    for b0, b1 in _groups(counts, max_sorting):
        size = int(counts[b0:b1].sum())
        packed = _mapped_u64(size)  # this group's values, bucket after bucket
        bounds = np.zeros(b1 - b0 + 1, dtype=np.int64)
        np.cumsum(counts[b0:b1], out=bounds[1:])
        cursor = bounds[:-1].copy()
        whole = b0 == 0 and b1 == 1 << bits
        first, last = np.uint64(b0 << int(top)), np.uint64(((b1 << int(top)) - 1) % (1 << 64))
        lo = 0
        for keys in chunks():
            if whole:
                part = np.empty(keys.shape[0], dtype=np.uint64)
                _pack(keys, lo, shift, part)
                bucket = (keys >> top).astype(np.int64)
            else:  # keys whose top bits are those of buckets [b0, b1)
                at = np.flatnonzero((keys >= first) & (keys <= last))
                mine = keys[at]
                part = (mine >> shift) << shift
                part |= (at + lo).astype(np.uint64)
                bucket = (mine >> top).astype(np.int64)
            bucket -= b0
            lo += keys.shape[0]
            if b1 - b0 == 1:
                packed[cursor[0] : cursor[0] + part.shape[0]] = part
                cursor[0] += part.shape[0]
                continue
            by_bucket = part[np.argsort(bucket, kind="stable")]  # a radix sort of small ints
            edges = np.zeros(b1 - b0 + 1, dtype=np.int64)
            np.cumsum(np.bincount(bucket, minlength=b1 - b0), out=edges[1:])
            for b in np.flatnonzero(edges[1:] > edges[:-1]).tolist():
                m = int(edges[b + 1] - edges[b])
                packed[cursor[b] : cursor[b] + m] = by_bucket[edges[b] : edges[b + 1]]
                cursor[b] += m
        spans = list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))
        if threads > 1 and len(spans) > 1:
            with ThreadPoolExecutor(threads, thread_name_prefix="tokenloom-sort") as pool:
                list(pool.map(lambda ab, buf=packed: buf[ab[0] : ab[1]].sort(), spans))
        else:
            for a, b in spans:
                packed[a:b].sort()
        yield offset, packed
        offset += size
        del packed


def stable_argsort_u64(
    n: int,
    chunks: Callable[[], Iterator[np.ndarray]],
    *,
    threads: int | None = None,
    max_sorting: int | None = None,
    out: np.ndarray | None = None,
    exact: bool = False,
) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of ``n`` uint64 keys, by a packed in-place sort.

    Args:
        n: Number of keys.
        chunks: Yields the keys in order as consecutive ``uint64`` arrays (``n`` in all), the
            same on every call; called once per group of values sorted at once, plus up to
            twice (bucket counts, tie repair).
        threads: Threads sorting (default: up to 8 cores from 4M keys, else 1). The result does
            not depend on it.
        max_sorting: Most packed values (8 bytes each) held at once (default: a sixteenth,
            at least 4096, below 4M keys, an eighth from 4M: 0.5 or 1 byte per key, for a pass
            over the stream per group). The result does not depend on it.
        out: Optional ``(n,)`` array of :func:`order_dtype` ``(n)`` to write the result into
            (e.g. a file mapped for writing), instead of a new one.
        exact: The caller's keys have their low ``bit_length(n - 1)`` bits zero, so the packed
            values hold them whole and equal high bits are equal keys: no tie to repair (a key
            with few distinct values would otherwise send most items through the repair).

    Returns:
        ``(n,)`` :func:`order_dtype` positions ordered by ``(key, position)`` (``out`` if given).
    """
    dtype = order_dtype(n)
    if out is None:
        out = np.empty(n, dtype=dtype)
    elif out.shape != (n,) or out.dtype != dtype:
        raise ValueError(f"out must be ({n},) {np.dtype(dtype)}, got {out.shape} {out.dtype}")
    b = max(1, (n - 1).bit_length())
    shift, mask = np.uint64(b), np.uint64((1 << b) - 1)
    if max_sorting is None:
        groups = _SORT_GROUPS if n < _PARALLEL_MIN else _LARGE_SORT_GROUPS
        max_sorting = max(-(-n // groups), _MIN_GROUP)
    threads = _sort_threads(n) if threads is None else threads
    step = _chunk(n)
    diff = np.empty(step, dtype=np.uint64)  # one chunk's neighbours' XOR
    ties: list[np.ndarray] = []  # slots whose high bits equal a neighbour's
    for at, packed in _sorted_groups(n, chunks, shift, threads, max(int(max_sorting), 1)):
        m = packed.shape[0]
        for a in range(0, max(m - 1, 0), step):
            z = min(a + step, m - 1)
            if exact:
                break
            d = diff[: z - a]
            np.bitwise_xor(packed[a + 1 : z + 1], packed[a:z], out=d)
            np.right_shift(d, shift, out=d)
            same = d == 0
            if same.any():
                slot = np.flatnonzero(same) + (at + a)
                ties.append(np.union1d(slot, slot + 1))
        for a in range(0, m, step):
            part = packed[a : a + step]
            np.bitwise_and(part, mask, out=part)  # the positions, in place
            out[at + a : at + a + part.shape[0]] = part
        del packed
    if ties:
        slots = np.unique(np.concatenate(ties))  # contiguous runs, high bits ascending
        pos = out[slots].astype(np.int64)
        want = np.sort(pos)
        full = np.empty(want.shape[0], dtype=np.uint64)  # full key of each of ``want``
        lo = 0
        for keys in chunks():
            hi = lo + keys.shape[0]
            i, j = np.searchsorted(want, [lo, hi])
            full[i:j] = keys[want[i:j] - lo]
            lo = hi
        key = full[np.searchsorted(want, pos)]
        out[slots] = pos[np.lexsort((pos, key))]  # by key, ties by position
    return out


def _raw_chunks(n: int, seed: int, epoch: int) -> Callable[[], Iterator[np.ndarray]]:
    def gen() -> Iterator[np.ndarray]:
        raw = epoch_rng(seed=seed, epoch=epoch).bit_generator
        step = _chunk(n)
        for a in range(0, n, step):
            yield raw.random_raw(min(step, n - a))  # the stable raw stream, in order

    return gen


def epoch_order(n: int, *, seed: int, epoch: int, out: np.ndarray | None = None) -> np.ndarray:
    """:func:`epoch_permutation` in its narrowest dtype (``uint32`` below ``2**32`` items),
    written into ``out`` when given (see :func:`stable_argsort_u64`).

    Raises:
        ValueError: ``n`` is negative or ``seed``/``epoch`` are not non-negative integers.
    """
    n = _check_n(n)
    seed, epoch = _check_seed("seed", seed), _check_seed("epoch", epoch)
    return stable_argsort_u64(n, _raw_chunks(n, seed, epoch), out=out)


def epoch_permutation(n: int, *, seed: int, epoch: int) -> np.ndarray:
    """A uniform random permutation of ``range(n)`` for one ``(seed, epoch)``.

    Args:
        n: Number of items (rows) to permute, ``n >= 0``.
        seed: The job's seed, a non-negative integer.
        epoch: The epoch number, a non-negative integer.

    Returns:
        ``perm``: shape ``(n,)``, int64, each of ``0..n-1`` exactly once; ``perm[i]`` is the
        input position visited ``i``-th. Same arguments give the same array in every process and
        on every NumPy version (see the module docstring); another seed or epoch gives an
        independent one.

    Raises:
        ValueError: ``n`` is negative or ``seed``/``epoch`` are not non-negative integers.
    """
    return epoch_order(n, seed=seed, epoch=epoch).astype(np.int64, copy=False)


def naive_epoch_permutation(n: int, *, seed: int, epoch: int) -> np.ndarray:
    """Slow reference of :func:`epoch_permutation`: the stable argsort of the raw stream."""
    keys = epoch_rng(seed=seed, epoch=epoch).bit_generator.random_raw(_check_n(n))
    return np.argsort(keys, kind="stable").astype(np.int64, copy=False)
