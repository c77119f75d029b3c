"""Exact duplicates: rows whose text hashes are equal, keeping the smallest ``id`` of each group.

This is the *global* step of exact deduplication: a backfill computes ``text_hashes`` per batch,
then one call here over the whole ``(id, hash)`` projection decides every row. It is a sort, not
a hash table, so it runs at numpy speed with no Python work per row: about 24 bytes of input per
row (8 id + 16 hash) plus O(N) ``int64`` scratch for the sort order; 10^7 rows take seconds.

Output convention: ``dup_of`` names, for *every* row, the id of the row kept for its text -- a
kept row points to itself. So ``dup_of`` is a cluster label (``GROUP BY dup_of`` gives the copies
of a text) and ``is_dup`` is exactly ``dup_of != id``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from tokenloom.curate.inputs import CurateError, as_ids
from tokenloom.curate.normalize import DIGEST_SIZE, hashes_to_numpy

__all__ = ["exact_duplicates", "exact_duplicates_naive", "as_hash_matrix"]


HashColumn = np.ndarray | pa.Array | pa.ChunkedArray | Sequence[bytes]
"""Text hashes in any form :func:`as_hash_matrix` accepts."""


def as_hash_matrix(hashes: HashColumn) -> np.ndarray:
    """Return text hashes as a contiguous ``(N, 16) uint8`` array.

    Args:
        hashes: ``(N, 16) uint8``; ``(N,)`` of dtype ``S16``/``V16``; a list of 16-byte
            ``bytes``; or the ``fixed_size_binary(16)`` column :func:`text_hashes` returns.

    Raises:
        CurateError: Any other shape, width or dtype, or null hashes.
    """
    if isinstance(hashes, (pa.Array, pa.ChunkedArray)):
        return np.ascontiguousarray(hashes_to_numpy(hashes))
    if not isinstance(hashes, np.ndarray):
        hashes = list(hashes)
        if any(not isinstance(h, bytes) or len(h) != DIGEST_SIZE for h in hashes):
            raise CurateError(f"every hash must be {DIGEST_SIZE} bytes (from `text_hashes`)")
        hashes = np.frombuffer(b"".join(hashes), dtype=np.uint8).reshape(-1, DIGEST_SIZE)
    arr = hashes
    if arr.ndim == 1 and arr.dtype.itemsize == DIGEST_SIZE and arr.dtype.kind in "SV":
        arr = np.ascontiguousarray(arr).view(np.uint8).reshape(-1, DIGEST_SIZE)
    if arr.ndim != 2 or arr.shape[1] != DIGEST_SIZE or arr.dtype != np.uint8:
        raise CurateError(
            f"hashes must be (N, {DIGEST_SIZE}) uint8 (or the fixed_size_binary column of "
            f"`text_hashes`), not shape {arr.shape} {arr.dtype}"
        )
    return np.ascontiguousarray(arr)


def exact_duplicates(ids: np.ndarray, hashes: HashColumn) -> tuple[np.ndarray, np.ndarray]:
    """Flag every row whose hash appeared on a row with a smaller id.

    Args:
        ids: ``(N,) int64`` unique row ids, in any order.
        hashes: ``(N, 16) uint8`` text hashes aligned with ``ids`` (anything
            :func:`as_hash_matrix` accepts).

    Returns:
        ``(is_dup, dup_of)``: ``(N,) bool`` -- true unless the row has the smallest id among the
        rows sharing its hash; and ``(N,) int64`` -- that smallest id, for every row (a kept row
        gives its own id). Both aligned with the input order.

    Raises:
        CurateError: Misshapen inputs, a length mismatch or a repeated id.
    """
    h = as_hash_matrix(hashes)
    ids = as_ids(ids, n=h.shape[0], check_unique=False)  # checked below, from the sort
    n = ids.shape[0]
    if n == 0:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64)
    order, hi, lo = _order_by_hash_then_id(ids, h)  # (N,) positions sorted by (hash, id)
    new_group = np.empty(n, dtype=bool)  # (N,) true where a run of equal hashes starts
    new_group[0] = True
    np.not_equal(hi[1:], hi[:-1], out=new_group[1:])
    new_group[1:] |= lo[1:] != lo[:-1]
    del hi, lo
    first = np.flatnonzero(new_group)  # (G,) sorted positions of each group's kept row
    group_of = np.cumsum(new_group) - 1  # (N,) group index of each sorted position
    dup_of = np.empty(n, dtype=np.int64)
    dup_of[order] = ids[order[first]][group_of]
    return dup_of != ids, dup_of


def _order_by_hash_then_id(
    ids: np.ndarray, h: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions sorted by (128-bit hash, id), and the two halves of the sorted hashes.

    The hash order is that of two native-endian ``uint64`` keys: any consistent order groups
    equal hashes, which is all that is needed. Also checks that ids are unique.

    A three-key ``lexsort`` costs about three stable sorts. Instead: sort by id (skipped when the
    ids already ascend, as a table scan's do), then stably by the hash's first 64 bits; rows that
    share those 64 bits but differ in the last 64 (odds ~N^2/2^65: essentially never) are
    re-sorted by the full key in place.
    """
    if ids.size > 1 and not np.all(ids[1:] > ids[:-1]):
        by_id = np.argsort(ids)
        s = ids[by_id]
        repeated = s[1:][s[1:] == s[:-1]]
        if repeated.size:
            raise CurateError(
                f"ids must be unique, but id {int(repeated[0])} appears more than once; "
                f"pass the table's `id` column"
            )
        del s
    else:
        by_id = np.arange(ids.size)
    words = h.view(np.uint64)  # (N, 2), no copy
    order = by_id[np.argsort(words[by_id, 0], kind="stable")]  # (N,) by (first 64 bits, id)
    hi, lo = words[order, 0], words[order, 1]
    same_hi = hi[1:] == hi[:-1]
    clash = same_hi & (lo[1:] != lo[:-1])  # (N-1,) equal prefix, different hash
    if clash.any():
        run = np.cumsum(np.concatenate(([True], ~same_hi)))  # (N,) run label of equal prefixes
        bad = np.isin(run, run[1:][clash])  # (N,) positions inside a run with a clash
        pos = np.flatnonzero(bad)
        sub = order[pos]
        order[pos] = sub[np.lexsort((ids[sub], words[sub, 1], words[sub, 0]))]
        hi, lo = words[order, 0], words[order, 1]
    return order, hi, lo


def exact_duplicates_naive(ids: Sequence[int], hashes: Sequence[bytes]) -> tuple[list, list]:
    """Reference for :func:`exact_duplicates`: a dict over rows in id order.

    Args:
        ids: ``N`` unique ids.
        hashes: ``N`` hashes, each ``bytes`` (or anything hashable).

    Returns:
        ``(is_dup, dup_of)`` as two lists aligned with the input order.
    """
    kept: dict[bytes, int] = {}
    for i in sorted(range(len(ids)), key=lambda k: ids[k]):
        kept.setdefault(hashes[i], ids[i])
    dup_of = [kept[hashes[i]] for i in range(len(ids))]
    return [d != i for d, i in zip(dup_of, ids, strict=True)], dup_of
