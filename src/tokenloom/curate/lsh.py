"""Near-duplicate clusters from MinHash signatures: banded LSH, verified pairs, components.

This is the *global* step of near-deduplication: signatures are computed per batch, then one call
over all ``(id, signature)`` rows decides every row. The clustering it computes is exactly this
graph's connected components (:func:`lsh_clusters_naive` computes it pair by pair):

* nodes are the rows; rows whose signature is all :data:`~tokenloom.curate.minhash.EMPTY` (no
  shingles) are isolated;
* rows ``i, j`` are joined when they agree on every position of at least one *band* (``bands``
  disjoint runs of ``rows`` positions: band ``k`` is positions ``[k*rows, (k+1)*rows)``) **and**
  their signatures agree in at least ``ceil(threshold * num_perm)`` positions, i.e. the
  estimated Jaccard similarity reaches the threshold. Banding finds candidates without comparing
  all pairs; verification removes the candidates below the threshold, so precision does not
  depend on how loose the bands are.

``rows`` is chosen among powers of two (and ``bands = num_perm // rows``) to minimise the
weighted false positive and false negative probability at the threshold, the objective of
``datasketch``, with misses weighted four times more (:data:`DEFAULT_WEIGHTS`). Restricting
``rows`` to powers of two makes band layouts *nest*: a band of 8 positions contains two bands of
4, so two rows that share a band at a higher threshold share one at every lower threshold too
(the chosen ``rows`` never decrease as the threshold rises; tested). With verification that is
what makes clustering monotone: a higher threshold never merges clusters, it only splits them.

Cost: one stable sort per band over the distinct signatures, then the candidate pairs of each
bucket, consecutive pairs first; pairs already in one component are skipped before they are
verified, so a bucket of m near-identical rows costs about m verifications, not m^2/2.
"""

from __future__ import annotations

import math

import numpy as np

from tokenloom.curate.inputs import CurateError, as_ids
from tokenloom.curate.minhash import EMPTY
from tokenloom.curate.shingle import fmix64

__all__ = [
    "DEFAULT_THRESHOLD",
    "DEFAULT_WEIGHTS",
    "optimal_params",
    "lsh_clusters",
    "lsh_clusters_naive",
    "connected_components",
]

DEFAULT_THRESHOLD = 0.5
"""Estimated Jaccard a pair of rows must reach; the reason for 0.5 with the default shingling is
in ``docs/curation.md``."""

DEFAULT_WEIGHTS = (0.2, 0.8)
"""``(false_positive_weight, false_negative_weight)`` of the parameter choice. ``datasketch``
weighs both 0.5; candidates are verified here, so a false positive costs one signature
comparison while a false negative loses a duplicate for good: misses weigh four times more."""

_VERIFY_CHUNK = 1 << 16  # candidate pairs gathered at once: 2 x (chunk, num_perm) uint32


def _integrals(threshold: float, bands: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """False positive and false negative areas of the LSH S-curve ``1 - (1 - s**r)**b``.

    The curve is a polynomial of degree ``r * b``, so Gauss-Legendre quadrature with
    ``(max degree) // 2 + 1`` nodes integrates it exactly, up to rounding.
    """
    nodes, weights = np.polynomial.legendre.leggauss(int((bands * rows).max()) // 2 + 1)

    def area(lo: float, hi: float, false_negative: bool) -> np.ndarray:
        s = (hi - lo) / 2 * nodes + (hi + lo) / 2  # (Q,)
        miss = (1.0 - s[None, :] ** rows[:, None]) ** bands[:, None]  # (K, Q) P(no shared band)
        curve = miss if false_negative else 1.0 - miss
        return (hi - lo) / 2 * (curve @ weights)  # (K,)

    return area(0.0, threshold, False), area(threshold, 1.0, True)


def optimal_params(
    threshold: float,
    num_perm: int,
    *,
    weights: tuple[float, float] = (0.2, 0.8),
    nested: bool = True,
) -> tuple[int, int]:
    """Choose ``(bands, rows)`` minimising weighted false positive + false negative area.

    Args:
        threshold: Jaccard similarity threshold in (0, 1].
        num_perm: Signature length.
        weights: ``(false_positive_weight, false_negative_weight)``, as in ``datasketch``
            (whose default is ``(0.5, 0.5)``; see :data:`DEFAULT_WEIGHTS`).
        nested: Search only ``rows`` = 1, 2, 4, ... with ``bands = num_perm // rows`` (what
            :func:`lsh_clusters` uses, see the module docstring). ``False`` searches every
            ``bands * rows <= num_perm`` in ``datasketch``'s order and gives its answer.

    Returns:
        ``(bands, rows)``.
    """
    _check_threshold(threshold)
    if nested:
        rows = 2 ** np.arange(int(math.log2(num_perm)) + 1)
        bands = num_perm // rows
    else:
        pairs = [(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)]
        bands, rows = (np.array(x) for x in zip(*pairs, strict=True))
    fp, fn = _integrals(threshold, bands, rows)
    best = int(np.argmin(fp * weights[0] + fn * weights[1]))  # first minimum: datasketch's tie
    return int(bands[best]), int(rows[best])


def _check_threshold(threshold: float) -> None:
    if not (isinstance(threshold, (int, float)) and 0.0 < threshold <= 1.0):
        raise CurateError(f"threshold must be a Jaccard similarity in (0, 1], not {threshold!r}")


def _needed(threshold: float, num_perm: int) -> int:
    """Equal positions a verified pair needs: estimated Jaccard >= threshold."""
    return math.ceil(threshold * num_perm - 1e-9)


def connected_components(n: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Label each of ``n`` nodes with the smallest node index of its component.

    The same union-find that :func:`lsh_clusters` runs incrementally (components so far decide
    which candidates are verified). On a finished edge list ``scipy.sparse.csgraph`` is as fast
    or faster (``tokenloom bench components``, figures in ``docs/curation.md``) but cannot be
    updated chunk by chunk, which that pruning needs.

    Args:
        n: Number of nodes.
        u: ``(E,)`` edge endpoints.
        v: ``(E,)`` edge endpoints.

    Returns:
        ``(n,) int64``.
    """
    parent = np.arange(n, dtype=np.int64)
    _union(parent, np.asarray(u, dtype=np.int64), np.asarray(v, dtype=np.int64))
    return parent


def _union(parent: np.ndarray, u: np.ndarray, v: np.ndarray) -> None:
    """Merge the components of each edge, in place, vectorised (hook and compress).

    Invariant on entry and exit: ``parent[x]`` is the root of ``x`` and ``parent[x] <= x``, so a
    root is its component's smallest index. Each round hooks the larger root of every unmerged
    edge under the smaller one, then compresses paths; rounds repeat until no edge spans two
    components.
    """
    while u.size:
        ru, rv = parent[u], parent[v]
        open_ = ru != rv
        u, v, ru, rv = u[open_], v[open_], ru[open_], rv[open_]
        if not u.size:
            return
        np.minimum.at(parent, np.maximum(ru, rv), np.minimum(ru, rv))
        while True:
            grand = parent[parent]
            if np.array_equal(grand, parent):
                break
            parent[:] = grand


def _row_keys(block: np.ndarray, salt: int) -> np.ndarray:
    """``(R,) uint64`` hash of each row of a ``(R, w) uint32`` block (equal rows, equal keys)."""
    acc = np.full(block.shape[0], salt, dtype=np.uint64)
    for j in range(block.shape[1]):
        acc = fmix64(acc ^ block[:, j].astype(np.uint64))
    return acc


def _runs(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort ``keys``; return the order, and for each sorted position in a run of >= 2 equal
    keys: its position and the end (exclusive) of its run."""
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    start = np.concatenate(([True], k[1:] != k[:-1]))  # (R,)
    bounds = np.append(np.flatnonzero(start), k.size)  # (G + 1,)
    end = np.repeat(bounds[1:], np.diff(bounds))  # (R,) end of each position's run
    pos = np.flatnonzero(end - np.arange(k.size) > 1)  # has a later partner in its run
    return order, pos, end


def lsh_clusters(
    ids: np.ndarray,
    signatures: np.ndarray,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    num_perm: int | None = None,
    params: tuple[int, int] | None = None,
    weights: tuple[float, float] = DEFAULT_WEIGHTS,
) -> tuple[np.ndarray, np.ndarray]:
    """Cluster near-duplicate rows (see the module docstring for the exact rule).

    Args:
        ids: ``(N,) int64`` unique row ids, any order.
        signatures: ``(N, P) uint32`` from :func:`~tokenloom.curate.minhash_signatures`.
        threshold: Estimated Jaccard similarity a joined pair must reach, in (0, 1].
        num_perm: Expected ``P``, checked when given (signatures from another config fail).
        params: ``(bands, rows)`` to override :func:`optimal_params`; ``bands * rows <= P``.
            Monotonicity in ``threshold`` holds only for the nested defaults.
        weights: ``(false_positive_weight, false_negative_weight)`` for :func:`optimal_params`.

    Returns:
        ``(cluster, is_near_dup)``: ``(N,) int64`` the smallest id of each row's cluster (its own
        id when alone), and ``(N,) bool``, true for every member except that smallest id.

    Raises:
        CurateError: Misshapen inputs, a bad threshold or params, a repeated id.
    """
    _check_threshold(threshold)
    sig = np.asarray(signatures)
    if sig.ndim != 2 or sig.dtype != np.uint32:
        raise CurateError(f"signatures must be (N, P) uint32, not {sig.shape} {sig.dtype}")
    n, p = sig.shape
    if num_perm is not None and p != num_perm:
        raise CurateError(f"signatures have {p} permutations but num_perm={num_perm} was expected")
    ids = as_ids(ids, n=n)
    bands, rows = params if params is not None else optimal_params(threshold, p, weights=weights)
    if bands < 1 or rows < 1 or bands * rows > p:
        raise CurateError(f"params (bands={bands}, rows={rows}) need 1 <= bands * rows <= {p}")
    # Union-find runs over ranks in id order, so a component's root is its smallest id;
    # signatures are read in place, never copied or reordered.
    by_id = np.argsort(ids)  # (N,) rows in id order
    rank = np.empty(n, dtype=np.int64)
    rank[by_id] = np.arange(n)  # (N,) each row's position in id order
    parent = np.arange(n, dtype=np.int64)  # over ranks
    live = np.concatenate(
        [
            lo + np.flatnonzero(np.any(sig[lo : lo + _VERIFY_CHUNK] != EMPTY, axis=1))
            for lo in range(0, n, _VERIFY_CHUNK)
        ]
        or [np.zeros(0, dtype=np.int64)]
    )  # (L,) rows with shingles
    reps = _collapse_identical(sig, live, rank, parent)  # (R,) one row per distinct signature
    need = _needed(threshold, p)
    for band in range(bands):
        cols = slice(band * rows, (band + 1) * rows)
        order, pos, end = _runs(_row_keys(sig[reps, cols], band))
        step = 1
        while pos.size:  # pairs (i, i + step) inside each run, for step = 1, 2, ...
            pos = pos[pos + step < end[pos]]
            for lo in range(0, pos.size, _VERIFY_CHUNK):
                chunk = pos[lo : lo + _VERIFY_CHUNK]
                u, v = reps[order[chunk]], reps[order[chunk + step]]  # rows
                apart = parent[rank[u]] != parent[rank[v]]  # not yet in one component
                u, v = u[apart], v[apart]
                same = sig[u] == sig[v]  # (E, P)
                ok = same[:, cols].all(axis=1) & (same.sum(axis=1) >= need)
                _union(parent, rank[u[ok]], rank[v[ok]])
            step += 1
    cluster = ids[by_id][parent[rank]]
    return cluster, cluster != ids


def _collapse_identical(
    sig: np.ndarray, live: np.ndarray, rank: np.ndarray, parent: np.ndarray
) -> np.ndarray:
    """Union rows with identical signatures; return one representative row per signature.

    Identical rows share every band and agree everywhere, so they are joined whatever the
    threshold, and a member is joined to exactly the rows its representative is joined to.
    Rows whose full-signature keys collide without being equal stay representatives.
    """
    keys = np.concatenate(
        [
            _row_keys(sig[live[lo : lo + _VERIFY_CHUNK]], 0xC0FFEE)
            for lo in range(0, live.size, _VERIFY_CHUNK)
        ]
        or [np.zeros(0, dtype=np.uint64)]
    )
    order, _, end = _runs(keys)
    run_start = np.concatenate(([True], end[1:] != end[:-1]))[: end.size]  # (L,)
    members = live[order]  # (L,) rows in key order
    heads = members[np.flatnonzero(run_start)[np.cumsum(run_start) - 1]]  # (L,) run's first row
    equal = np.zeros(members.size, dtype=bool)  # (L,) identical to its run's first row
    for lo in range(0, members.size, _VERIFY_CHUNK):
        m, h = members[lo : lo + _VERIFY_CHUNK], heads[lo : lo + _VERIFY_CHUNK]
        equal[lo : lo + m.size] = np.all(sig[m] == sig[h], axis=1)
    _union(parent, rank[members[equal]], rank[heads[equal]])
    return members[run_start | ~equal]


def lsh_clusters_naive(
    ids: np.ndarray,
    signatures: np.ndarray,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    params: tuple[int, int] | None = None,
    weights: tuple[float, float] = DEFAULT_WEIGHTS,
) -> tuple[np.ndarray, np.ndarray]:
    """Reference for :func:`lsh_clusters`: every pair checked in Python, dict union-find."""
    sig = np.asarray(signatures)
    n, p = sig.shape
    bands, rows = params if params is not None else optimal_params(threshold, p, weights=weights)
    need = _needed(threshold, p)
    root = {int(i): int(i) for i in ids}

    def find(x: int) -> int:
        while root[x] != x:
            x = root[x]
        return x

    empty = [bool(np.all(s == EMPTY)) for s in sig]
    for i in range(n):
        for j in range(i + 1, n):
            if empty[i] or empty[j]:
                continue
            same = sig[i] == sig[j]
            banded = any(same[k * rows : (k + 1) * rows].all() for k in range(bands))
            if banded and int(same.sum()) >= need:
                a, b = find(int(ids[i])), find(int(ids[j]))
                root[max(a, b)] = min(a, b)
    cluster = np.array([find(int(i)) for i in ids], dtype=np.int64)
    return cluster, cluster != np.asarray(ids)
