"""The compiled knapsack packer (numba): the blocks of :func:`tokenloom.vision.packing.pack_compact`
with ``policy="knapsack"`` in one pass over the epoch's order. Imported on the first knapsack
plan, never by ``import tokenloom``.

Each block takes, from the next ``window`` waiting samples, the subset with the most tokens that
fits the budget and the image cap, the oldest waiting sample always in; ties go to the fewest
images, then to the subset the dynamic programme reaches first. That is what the reference
(:func:`tokenloom.vision.packing._knapsack` driven by ``pack_compact(..., compiled=False)``)
computes, state for state, with the states held as bit sets (64 token counts a word) instead
of one boolean each.
"""

from __future__ import annotations

import numpy as np

from tokenloom.loader.plan._jit import jit

ONE = np.uint64(1)
ALL = np.uint64(0xFFFFFFFFFFFFFFFF)


@jit
def _shift_into(src: np.ndarray, n: int, words: int, last: np.uint64, out: np.ndarray) -> None:
    """``out = (src << n)`` over ``words`` 64-bit words, bits past the last word's ``last`` mask
    dropped."""
    q = n // 64
    r = np.uint64(n % 64)
    for w in range(words - 1, -1, -1):
        v = np.uint64(0)
        if w - q >= 0:
            v = src[w - q] << r
            if r > 0 and w - q - 1 >= 0:
                v |= src[w - q - 1] >> (np.uint64(64) - r)
        out[w] = v
    out[words - 1] &= last


@jit
def knapsack_blocks(
    order: np.ndarray,
    lengths: np.ndarray,
    images: np.ndarray,
    budget: int,
    cap: int,
    window: int,
    members: np.ndarray,
    starts: np.ndarray,
) -> int:
    """Pack ``order`` (indices of fitting samples, in the epoch's order) into blocks: writes
    each block's members into ``members`` (block after block) and block ``b``'s end into
    ``starts[b + 1]`` (``starts[0]`` is left as given: 0); returns the number of blocks.

    The states are bit sets: ``reach[k]`` has bit ``c`` when some subset of the items seen
    uses ``c`` tokens and ``k`` images; an item shifts row ``k - k_j`` by its length into row
    ``k``, and ``took[j, k]`` keeps the bits it newly set, as the reference's table does."""
    total = len(order)
    words_max = (budget + 64) // 64
    win = np.empty(window, np.int64)  # waiting samples, oldest first
    wl = np.empty(window, np.int64)
    wk = np.empty(window, np.int64)
    pick = np.empty(window, np.bool_)
    reach = np.zeros((cap + 1, words_max), np.uint64)
    took = np.zeros((window, cap + 1, words_max), np.uint64)
    shifted = np.zeros(words_max, np.uint64)
    nwin = nxt = at = blocks = 0
    while nxt < total or nwin > 0:
        while nwin < window and nxt < total:
            win[nwin] = order[nxt]
            nwin += 1
            nxt += 1
        sum_l = sum_k = 0
        for j in range(nwin):
            wl[j] = lengths[win[j]]
            wk[j] = images[win[j]]
            sum_l += wl[j]
            sum_k += wk[j]
            pick[j] = False
        if sum_l <= budget and sum_k <= cap:
            for j in range(nwin):
                pick[j] = True
        else:
            cap_left = cap - wk[0]
            budget_left = budget - wl[0]
            words = (budget_left + 64) // 64
            top = budget_left % 64
            last = ALL if top == 63 else (ONE << np.uint64(top + 1)) - ONE
            for k in range(cap_left + 1):
                for w in range(words):
                    reach[k, w] = 0
            reach[0, 0] = ONE
            for j in range(1, nwin):
                n, k_j = wl[j], wk[j]
                for k in range(cap_left + 1):
                    for w in range(words):
                        took[j, k, w] = 0
                if n > budget_left or k_j > cap_left:
                    continue
                for k in range(cap_left, k_j - 1, -1):  # descending: row k - k_j is the old one
                    _shift_into(reach[k - k_j], n, words, last, shifted)
                    for w in range(words):
                        new = shifted[w] & ~reach[k, w]
                        took[j, k, w] = new
                        reach[k, w] |= new
            best_k = best_c = -1
            for k in range(cap_left + 1):  # most tokens; ties: fewest images
                for w in range(words - 1, -1, -1):
                    v = reach[k, w]
                    if v != 0:
                        b = 63
                        while (v >> np.uint64(b)) & ONE == 0:
                            b -= 1
                        c = w * 64 + b
                        if c > best_c:
                            best_k, best_c = k, c
                        break
            pick[0] = True
            k, c = best_k, best_c
            for j in range(nwin - 1, 0, -1):  # walk back: the item that first reached (k, c)
                if (took[j, k, c // 64] >> np.uint64(c % 64)) & ONE:
                    pick[j] = True
                    k -= wk[j]
                    c -= wl[j]
        for j in range(nwin):
            if pick[j]:
                members[at] = win[j]
                at += 1
        blocks += 1
        starts[blocks] = at
        keep = 0
        for j in range(nwin):
            if not pick[j]:
                win[keep] = win[j]
                keep += 1
        nwin = keep
    return blocks
