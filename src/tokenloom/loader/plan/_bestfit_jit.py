"""The compiled inner loop of best-fit packing (numba). Imported only when a best-fit plan is
built or read (:func:`tokenloom.loader.plan.bestfit.pack_kernel`), never by ``import tokenloom``.

Per window, pieces are taken largest first (ties in visiting order: a counting sort by size, or
a stable sort in a window of fewer than ``L / 8`` pieces) and each goes to the open block with
the least remaining space that fits, ties to the earliest opened block:

* the remaining capacities ``1..L`` that some open block has are bits of a hierarchical bitset
  (32 bits per word, one level above another until a level is one word): the smallest capacity
  ``>= size`` is found in O(log32 L) word operations;
* the open blocks of one capacity form a min-heap of block ids (a pairing heap whose nodes are
  the block ids themselves: ``child``/``sibling`` links, no allocation): a block enters a class
  when its remaining space changes, so the class is not in opening order and a queue would not
  do; the heap pops the smallest id, as the reference's ``heapq`` does.

Everything is reset per window by undoing what the window set (never O(L) per window), so a
fit window of one document costs O(1) beside its pieces.
"""

from __future__ import annotations

import numpy as np

from tokenloom.loader.plan._jit import jit


@jit
def _ctz32(x: int) -> int:
    """Trailing zeros of ``0 < x < 2**32``."""
    n = 0
    if x & 0xFFFF == 0:
        n += 16
        x >>= 16
    if x & 0xFF == 0:
        n += 8
        x >>= 8
    if x & 0xF == 0:
        n += 4
        x >>= 4
    if x & 0x3 == 0:
        n += 2
        x >>= 2
    if x & 0x1 == 0:
        n += 1
    return n


@jit
def _bits_set(bits: np.ndarray, offs: np.ndarray, nlev: int, c: int) -> None:
    for lev in range(nlev):
        w = c >> 5
        i = offs[lev] + w
        was = bits[i]
        bits[i] = was | (1 << (c & 31))
        if was != 0:
            return
        c = w


@jit
def _bits_clear(bits: np.ndarray, offs: np.ndarray, nlev: int, c: int) -> None:
    for lev in range(nlev):
        w = c >> 5
        i = offs[lev] + w
        v = bits[i] & ~(1 << (c & 31))
        bits[i] = v
        if v != 0:
            return
        c = w


@jit
def _bits_next(bits: np.ndarray, offs: np.ndarray, nlev: int, c: int) -> int:
    """The smallest set bit ``>= c`` of level 0, or -1."""
    lev = 0
    while True:
        if lev == nlev:
            return -1
        w = c >> 5
        if w >= offs[lev + 1] - offs[lev]:
            return -1
        m = bits[offs[lev] + w] & ((0xFFFFFFFF << (c & 31)) & 0xFFFFFFFF)
        if m != 0:
            c = (w << 5) + _ctz32(m)
            break
        c = w + 1
        lev += 1
    while lev > 0:
        lev -= 1
        c = (c << 5) + _ctz32(bits[offs[lev] + c])
    return c


@jit
def _meld(a: int, b: int, child: np.ndarray, sib: np.ndarray) -> int:
    """Pairing-heap meld of two roots (``-1``: empty); the smaller id stays the root."""
    if a < 0:
        return b
    if b < 0:
        return a
    if b < a:
        a, b = b, a
    sib[b] = child[a]
    child[a] = b
    return a


@jit
def _merge_pairs(first: int, child: np.ndarray, sib: np.ndarray) -> int:
    """The two-pass merge of a popped root's children (list linked by ``sib``)."""
    acc = -1  # melded pairs, linked through sib in reverse order
    a = first
    while a >= 0:
        b = sib[a]
        if b < 0:
            sib[a] = acc
            acc = a
            break
        nxt = sib[b]
        sib[a] = -1
        sib[b] = -1
        m = _meld(a, b, child, sib)
        sib[m] = acc
        acc = m
        a = nxt
    res = -1
    while acc >= 0:
        nxt = sib[acc]
        sib[acc] = -1
        res = _meld(res, acc, child, sib)
        acc = nxt
    return res


@jit
def _sort_desc(sizes: np.ndarray, a: int, m: int, order: np.ndarray, tmp: np.ndarray) -> None:
    """``order[:m]``: ``0..m-1`` by ``sizes[a + x]`` descending, ties ascending (a bottom-up
    merge sort: stable, and quick to compile)."""
    for x in range(m):
        order[x] = x
    width = 1
    src, dst = order, tmp
    swapped = False
    while width < m:
        lo = 0
        while lo < m:
            mid = min(lo + width, m)
            hi = min(lo + 2 * width, m)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if sizes[a + src[j]] > sizes[a + src[i]]:  # strictly larger: ties keep order
                    dst[k] = src[j]
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
                k += 1
            while i < mid:
                dst[k] = src[i]
                i += 1
                k += 1
            while j < hi:
                dst[k] = src[j]
                j += 1
                k += 1
            lo = hi
        src, dst = dst, src
        swapped = not swapped
        width *= 2
    if swapped:  # the sorted run is in tmp
        order[:m] = tmp[:m]


@jit
def pack_windows(
    sizes: np.ndarray,
    win_ptr: np.ndarray,
    seq_len: int,
    block_pieces: np.ndarray,
    block_count: np.ndarray,
) -> np.ndarray:
    """Best-fit-decreasing of every window (module docstring).

    Args:
        sizes: ``(m,)`` positions of each piece, ``1 <= size <= seq_len``, in visiting order.
        win_ptr: ``(nw + 1,)`` window ``w`` holds pieces ``[win_ptr[w], win_ptr[w + 1])``.
        seq_len: ``L``.
        block_pieces: ``(m,)`` out: piece indices, block by block (windows in order, blocks in
            opening order), ascending within a block.
        block_count: ``(m,)`` out: pieces of each block (the first ``sum(result)`` entries).
            Both empty: only the blocks per window are counted.

    Returns:
        ``(nw,)`` int64 blocks of each window.
    """
    nw = win_ptr.shape[0] - 1
    nbits = seq_len + 1
    offs = np.zeros(16, np.int64)
    nlev = 0
    n = nbits
    while True:
        w = (n + 31) >> 5
        offs[nlev + 1] = offs[nlev] + w
        nlev += 1
        if w == 1:
            break
        n = w
    bits = np.zeros(offs[nlev], np.int64)
    root = np.full(nbits, -1, np.int64)
    most = 0
    for w in range(nw):
        most = max(most, win_ptr[w + 1] - win_ptr[w])
    child = np.empty(most, np.int64)
    sib = np.empty(most, np.int64)
    rem = np.empty(most, np.int64)
    cnt = np.empty(most, np.int64)
    start = np.empty(most, np.int64)
    blk_of = np.empty(most, np.int64)
    order = np.empty(most, np.int64)
    tmp = np.empty(most, np.int64)
    hist = np.zeros(nbits, np.int64)
    per_window = np.empty(nw, np.int64)
    out_b = 0
    for w in range(nw):
        a = win_ptr[w]
        m = win_ptr[w + 1] - a
        if 8 * m >= seq_len:  # counting sort by size, O(m + L): largest first, ties in order
            for x in range(m):
                hist[sizes[a + x]] += 1
            run = 0
            for s in range(seq_len, 0, -1):
                c = hist[s]
                hist[s] = run
                run += c
            for x in range(m):
                s = sizes[a + x]
                order[hist[s]] = x
                hist[s] += 1
            hist[:] = 0  # every size's start was written: O(L), as the pass above
        else:  # a small window: a merge sort, O(m log m), never O(L)
            _sort_desc(sizes, a, m, order, tmp)
        nb = 0
        for t in range(m):
            x = order[t]
            s = np.int64(sizes[a + x])
            r0 = _bits_next(bits, offs, nlev, s)
            if r0 < 0:
                blk = nb
                nb += 1
                cnt[blk] = 0
                r = seq_len - s
            else:
                blk = root[r0]
                rest = _merge_pairs(child[blk], child, sib)
                root[r0] = rest
                if rest < 0:
                    _bits_clear(bits, offs, nlev, r0)
                r = r0 - s
            if r > 0:
                if root[r] < 0:
                    _bits_set(bits, offs, nlev, r)
                child[blk] = -1
                sib[blk] = -1
                root[r] = _meld(root[r], blk, child, sib)
            rem[blk] = r
            blk_of[x] = blk
            cnt[blk] += 1
        for k in range(nb):  # close the window's blocks: undo what it set
            r = rem[k]
            if r > 0 and root[r] >= 0:
                root[r] = -1
                _bits_clear(bits, offs, nlev, r)
        per_window[w] = nb
        if block_pieces.shape[0] == 0:  # the number of blocks only (planning)
            continue
        run = a
        for k in range(nb):
            block_count[out_b + k] = cnt[k]
            start[k] = run
            run += cnt[k]
        for x in range(m):  # pieces by block, in visiting order within a block
            k = blk_of[x]
            block_pieces[start[k]] = a + x
            start[k] += 1
        out_b += nb
    return per_window
