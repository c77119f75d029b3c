"""Best-fit packing: whole documents per block, chosen best-fit-decreasing in a look-ahead window.

A document of ``n`` tokens takes ``n + 1`` positions (its EOS); one with ``n + 1 <= L`` is never
cut. The plan, deterministic from ``(seed, epoch)`` and the stored counts:

1. Rows are visited in :func:`~tokenloom.loader.plan.shuffle.epoch_permutation` order (empty rows
   contribute nothing, as in :func:`~tokenloom.loader.plan.epoch.plan_epoch`).
2. Each document becomes *pieces* that fit a block (:mod:`~tokenloom.loader.plan.window`): itself
when it
   fits; otherwise, with ``long_docs="split"``, full blocks of ``L`` positions cut as concat would
   cut it plus the tail ``(n + 1) % L`` as one more piece (``window=L, overlap=0``); with
   ``long_docs="window"``, its overlapping windows of at most ``W <= L`` positions.
3. The visiting order is cut into consecutive *windows* of ``fit_window`` documents (all pieces of a
   document in its document's window). Within a window the pieces are sorted by size, largest
   first (ties: visiting order), and each goes into the open block with the **least remaining
   space that fits** (ties: the earliest opened), else into a new block.
4. When a window is done all its blocks are closed. Blocks are emitted window by window, in the
   order they were opened; within a block, pieces lie in visiting order. The rest of each block
   is padding (masked, counted in ``padding_positions``).

Closing every block at the window's end keeps the algorithm simple and the windows independent; it
costs at most a few part-filled blocks per window (see :func:`padding_by_window` and
``docs/recipes.md``).

Planning is compiled (numba, :mod:`~tokenloom.loader.plan._bestfit_jit`, imported on first use):
each window's pieces are sorted by size with a counting sort, and the open blocks are found through
a bitset over the remaining capacities with a min-heap of block ids per capacity, so a piece costs
O(log L), about 0.05 µs. The windows are packed as the pass that computes the concat plan's marks
reads the counts (:data:`~tokenloom.loader.plan.epoch.Visit`), so nothing per piece is built for the
whole epoch; the plan keeps the visiting order (:class:`~tokenloom.loader.plan.window.WindowedPlan`,
shared through the plan store) and the first block of each window. A lookup packs the windows
of the requested blocks again (the same pieces give the same blocks) and keeps them for the next
lookups. :func:`pack_windows_python` is the same planner without numba (a piece of more than
``L / 2`` positions opens a block, so those are placed at once; the rest go through a Python loop,
~0.5 µs a piece); :func:`best_fit_blocks_reference`, the former loop over every piece, is the
reference both are tested against. A selection of fewer than :data:`COMPILED_MIN_DOCS` documents
is planned without numba, so numba (about 49 MiB and 1 s per process) is never loaded for a plan
small enough that numba alone would exceed its 12 bytes a document. The first call on a machine
compiles the loop (seconds) and caches it on disk (numba's ``cache=True``: beside the module, else
the user's cache directory, else in memory for the process).
"""

from __future__ import annotations

import heapq
import threading
from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenloom.loader.plan.compact import count_nonzero
from tokenloom.loader.plan.epoch import (
    MARK_EVERY,
    BlockCounts,
    EpochPlan,
    PlanError,
    _readonly,
    check_selection,
    check_seq_len,
    clip_range,
)
from tokenloom.loader.plan.spans import Spans
from tokenloom.loader.plan.window import (
    VirtualDocs,
    WindowedPlan,
    WindowTable,
    check_blocks,
    check_table,
    check_window,
    empty_spans,
    piece_sizes,
    piece_stretches,
    plan_windowed_epoch,
    window_table,
)

__all__ = [
    "LONG_DOC_POLICIES",
    "BESTFIT_ALGORITHM",
    "BestFitPlan",
    "plan_bestfit",
    "bestfit_spans",
    "best_fit_blocks",
    "best_fit_blocks_reference",
    "pack_pieces",
    "pack_kernel",
    "pack_windows_python",
    "COMPILED_MIN_DOCS",
    "naive_best_fit_blocks",
    "padding_by_window",
]

LONG_DOC_POLICIES = ("split", "window")
"""``split``: full blocks plus a tail; ``window``: overlapping windows (:mod:`.window`)."""

BESTFIT_ALGORITHM = "bfd-window-close-v1"
"""Identity of this planner (part of the plan fingerprint when best-fit is used)."""


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class _Window:
    """The blocks of one fit window, its pieces in block order (about 21 bytes per piece):
    what a lookup reads, kept between lookups."""

    block_ptr: np.ndarray
    """``(nb + 1,)`` block ``k`` is entries ``[block_ptr[k], block_ptr[k + 1])`` below."""
    doc: np.ndarray
    """``(m,)`` int32 document of each piece, counted from the window's first."""
    j: np.ndarray
    """``(m,)`` int32 its piece number within the document."""
    size: np.ndarray
    """``(m,)`` int32 its positions."""
    last: np.ndarray
    """``(m,)`` bool: it is its document's last piece (with the EOS)."""


_CACHE_PIECES = 1 << 20  # pieces of the windows a plan keeps packed between lookups (~21 MB)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class BestFitPlan:
    """One epoch packed best-fit. Same duck-typed surface as the concat plan for the loader.

    Held: the windowed plan's visiting order and window table (:class:`WindowedPlan`, about 4
    bytes per document) and the first block of each fit window (``window_blocks``). The blocks
    of a window are a pure function of its pieces, so a lookup packs again the windows it
    touches (:func:`pack_pieces`, compiled: ~0.05 µs per piece) instead of holding ~66 bytes
    per piece; the windows of the last lookups are kept (up to ``_CACHE_PIECES`` pieces)."""

    seed: int
    epoch: int
    seq_len: int
    fit_window: int
    """Documents considered together by best-fit."""
    long_docs: str
    window: int
    """Piece size limit for long documents (``seq_len`` with ``long_docs="split"``)."""
    overlap: int
    stream: WindowedPlan
    """The documents in visiting order and their pieces (:meth:`WindowedPlan.pieces`)."""
    window_blocks: np.ndarray
    """``(num_windows + 1,)`` uint32 (int64 from ``2**32`` pieces): first block of each fit
    window (documents ``[w * fit_window, (w + 1) * fit_window)``), then ``num_blocks``."""
    empty_rows: int
    num_docs: int
    num_tokens: int
    """Distinct real tokens (EOS and repeated context excluded)."""
    context_tokens: int
    filled_positions: int
    """Tokens, repeated context and EOS positions: ``sum(docs.size)``."""
    num_blocks: int
    padding_positions: int
    """``num_blocks * seq_len - filled_positions``."""
    _cache: list = field(default_factory=lambda: [{}], repr=False)
    """``[{window: _Window}]``: the windows packed for the last lookups (the next steps read
    the same windows: consecutive blocks, or with ``interleave`` the next block of each)."""

    @property
    def padding_fraction(self) -> float:
        """Share of the epoch's positions that are padding."""
        total = self.num_blocks * self.seq_len
        return self.padding_positions / total if total else 0.0

    @property
    def docs(self) -> VirtualDocs:
        """Every piece of the epoch in visiting order. Built on each call (about 66 bytes per
        piece): for references and tests."""
        return self.stream.docs

    def layout(self) -> tuple[VirtualDocs, np.ndarray, np.ndarray]:
        """``(docs, block_ptr, block_pieces)`` of the whole epoch, built on each call (for
        references and tests): block ``b`` holds pieces
        ``block_pieces[block_ptr[b]:block_ptr[b + 1]]`` of ``docs``, in position order."""
        docs = self.docs
        nw = self.window_blocks.shape[0] - 1
        wins = self._pack(np.arange(nw, dtype=np.int64))
        first = np.searchsorted(docs.doc, np.arange(self.num_docs))  # first piece of each doc
        pieces = [
            first[x.doc.astype(np.int64) + w * self.fit_window] + x.j for w, x in wins.items()
        ]
        counts = [np.diff(x.block_ptr) for x in wins.values()]
        ptr = np.zeros(self.num_blocks + 1, dtype=np.int64)
        np.cumsum(np.concatenate([np.zeros(0, np.int64), *counts]), out=ptr[1:])
        return docs, ptr, np.concatenate([np.zeros(0, np.int64), *pieces])

    def windows(self, ws: list[int]) -> dict[int, _Window]:
        """The blocks of fit windows ``ws``: packed again, or kept from the last lookups."""
        known = self._cache[0]
        todo = sorted({w for w in ws if w not in known})
        if not todo:
            return known
        fresh = self._pack(np.asarray(todo, dtype=np.int64))
        kept, wanted = {**known, **fresh}, set(ws)
        total = sum(x.size.shape[0] for x in kept.values())
        for w in list(kept):  # oldest first; the windows asked for stay
            if total <= _CACHE_PIECES:
                break
            if w not in wanted:
                total -= kept.pop(w).size.shape[0]
        self._cache[0] = kept  # replaced whole: a concurrent lookup sees one or the other
        return kept

    def _pack(self, ws: np.ndarray) -> dict[int, _Window]:
        """Each fit window of ``ws`` (ascending) packed, by one compiled call for all."""
        st, F, n = self.stream.stream, self.fit_window, self.num_docs
        lo = ws * F
        cnt = np.minimum(lo + F, n) - lo
        first_doc = np.cumsum(cnt) - cnt
        total = int(cnt.sum())
        docs = np.repeat(lo - first_doc, cnt) + np.arange(total, dtype=np.int64)
        pos = st.order[docs]
        J, sizes = piece_sizes(self.stream.table, pos, st.source_lens.lens[pos])
        first = np.cumsum(J) - J
        win_ptr = np.append(first[first_doc], sizes.shape[0])
        pieces, ptr, per_window = pack_pieces(
            sizes, win_ptr, seq_len=self.seq_len, docs=self.num_docs
        )
        if not np.array_equal(per_window, np.diff(self.window_blocks.astype(np.int64))[ws]):
            raise RuntimeError(  # the plan and its lookup disagree: our bug
                f"best-fit windows {ws[:4].tolist()} packed again into {per_window[:4].tolist()} "
                "blocks, not the plan's; this is a bug in tokenloom, please report it"
            )
        doc = np.repeat(np.arange(total, dtype=np.int64), J)  # document of each piece
        j = np.arange(sizes.shape[0], dtype=np.int64) - first[doc]
        last = (j == J[doc] - 1)[pieces]
        doc = (doc - np.repeat(first_doc, np.diff(win_ptr)))[pieces].astype(np.int32)
        j, sizes = j[pieces].astype(np.int32), sizes[pieces]
        out, b0 = {}, 0
        for i, w in enumerate(ws.tolist()):
            p0, p1 = int(win_ptr[i]), int(win_ptr[i + 1])
            b1 = b0 + int(per_window[i])
            out[w] = _Window(
                block_ptr=ptr[b0 : b1 + 1] - p0,
                doc=doc[p0:p1],
                j=j[p0:p1],
                size=sizes[p0:p1],
                last=last[p0:p1],
            )
            b0 = b1
        return out

    def spans(self, blocks: np.ndarray) -> Spans:
        """:func:`bestfit_spans` of this plan."""
        return bestfit_spans(self, blocks)

    def _before(self, b: int) -> tuple[int, int]:
        """``(filled, eos)`` of blocks ``[0, b)``."""
        if b >= self.num_blocks:
            return self.filled_positions, self.num_docs
        w = int(np.searchsorted(self.window_blocks, b, side="right")) - 1
        d = w * self.fit_window
        filled, eos = _doc_offset(self.stream.stream, d), d
        first = int(self.window_blocks[w])
        if b > first:
            x = self.windows([w])[w]
            upto = int(x.block_ptr[b - first])
            filled += int(x.size[:upto].sum())
            eos += int(x.last[:upto].sum())
        return filled, eos

    def counts(self, lo: int, hi: int) -> BlockCounts:
        """What blocks ``[lo, hi)`` hold (clipped to the epoch). O(pieces of two windows)."""
        lo, hi = clip_range(lo, hi, self.num_blocks)
        f0, e0 = self._before(lo)
        f1, e1 = self._before(hi)
        filled, eos = f1 - f0, e1 - e0
        return BlockCounts(tokens=filled - eos, eos=eos, filled=filled)

    def block_pools(self, blocks: np.ndarray) -> np.ndarray:
        """``(m,)`` pool of each block: 0, or -1 for a padding block (``-1``)."""
        return np.where(np.asarray(blocks) >= 0, 0, -1).astype(np.int64)


def _doc_offset(stream: EpochPlan, d: int) -> int:
    """Stream offset of document ``d`` (``0 <= d <= n``): its mark plus the sizes since."""
    K = MARK_EVERY
    m = d // K
    out = int(stream.marks[m])
    if d > m * K:
        lens = stream.source_lens[stream.order[m * K : d]]
        out += int(np.add(lens, 1, dtype=np.int64).sum())
    return out


def pack_kernel(docs: int | None = None) -> Any:
    """The planner of a selection of ``docs`` documents: the compiled one
    (:func:`tokenloom.loader.plan._bestfit_jit.pack_windows`, numba imported on first use, never by
    ``import tokenloom``), or below :data:`COMPILED_MIN_DOCS` documents
    :func:`pack_windows_python`, which gives the same blocks without loading numba (numba and its
    cached planner add about 49 MiB and 1 s to the process: more than the whole plan of a small
    selection). ``None``: the compiled one."""
    if docs is not None and docs < COMPILED_MIN_DOCS:
        return pack_windows_python
    global _KERNEL
    if _KERNEL is None:
        with _KERNEL_LOCK:
            if _KERNEL is None:
                from tokenloom.loader.plan._bestfit_jit import pack_windows

                _KERNEL = pack_windows
    return _KERNEL


_KERNEL: Any = None
_KERNEL_LOCK = threading.Lock()
COMPILED_MIN_DOCS = 12_000_000
"""Documents from which best-fit plans with the compiled planner. Below, numba's ~49 MiB is too
large a share of 12 bytes a document (measured, ``bench plan --recipe-docs N --recipes best_fit``:
compiled 12.29 B/doc at 10M, 11.82 at 11M, 11.42 at 12M), and :func:`pack_windows_python` keeps
the plan within its 10 s (7.15 s CPU at 11M, 8.22 s at 12M, 7.8-7.9 B/doc)."""


def pack_windows_python(
    sizes: np.ndarray,
    win_ptr: np.ndarray,
    seq_len: int,
    block_pieces: np.ndarray,
    block_count: np.ndarray,
) -> np.ndarray:
    """:func:`tokenloom.loader.plan._bestfit_jit.pack_windows` without numba: the same blocks,
    with the same arguments and result (documented there).

    Per window, the pieces of more than ``L / 2`` positions are placed at once: taken largest
    first, each finds every open block already holding a piece at least as large, so without
    room, and opens the next block. The rest go through one Python loop: the capacities some
    open block has are bytes of a ``bytearray`` (the smallest one that fits: ``find``, a
    ``memchr``), each with a heap of its blocks' ids."""
    L = int(seq_len)
    big = L // 2  # a piece of more than L / 2 positions opens a block
    ptr = np.asarray(win_ptr, dtype=np.int64)
    nw = int(ptr.shape[0]) - 1
    per_window = np.empty(nw, dtype=np.int64)
    listing = block_pieces.shape[0] > 0
    pop, push = heapq.heappop, heapq.heappush
    has = bytearray(L + 2)  # has[c]: some open block has c positions left; has[L + 1]: none fits
    has[L + 1] = 1
    find = has.find
    heaps: list[list[int]] = [[] for _ in range(L + 1)]  # capacity -> heap of block ids
    out_b = 0
    for w in range(nw):
        a, b = int(ptr[w]), int(ptr[w + 1])
        size = np.asarray(sizes[a:b], dtype=np.int64)
        order = np.argsort(-size, kind="stable")  # largest first, ties in visiting order
        desc = size[order]
        nb = int(np.count_nonzero(desc > big))  # blocks 0..nb-1, one large piece each
        if nb:  # each capacity's blocks in opening order (an ascending list is a heap)
            left = L - desc[:nb]  # ascending
            cut = np.flatnonzero(np.diff(left)) + 1
            first, last = np.concatenate(([0], cut)).tolist(), np.append(cut, nb).tolist()
            for c, i, j in zip(left[first].tolist(), first, last, strict=True):
                if c:
                    heaps[c] = list(range(i, j))
                    has[c] = 1
        taken = list(range(nb))  # block of each piece, in ``order``
        put = taken.append
        for x in desc[nb:].tolist():
            r0 = find(1, x)
            if r0 > L:
                blk = nb
                nb += 1
                r = L - x
            else:
                h = heaps[r0]
                blk = pop(h)
                if not h:
                    has[r0] = 0
                r = r0 - x
            if r:
                h = heaps[r]
                if not h:
                    has[r] = 1
                push(h, blk)
            put(blk)
        for c in np.flatnonzero(np.frombuffer(has, np.uint8)[: L + 1]).tolist():  # close all
            heaps[c] = []
            has[c] = 0
        per_window[w] = nb
        if listing and b > a:
            blk_of = np.empty(b - a, dtype=np.int64)
            blk_of[order] = taken
            block_pieces[a:b] = a + np.argsort(blk_of, kind="stable")  # ascending in a block
            block_count[out_b : out_b + nb] = np.bincount(blk_of, minlength=nb)
        out_b += nb
    return per_window


def pack_pieces(
    sizes: np.ndarray, win_ptr: np.ndarray, *, seq_len: int, docs: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Best-fit-decreasing of consecutive windows of pieces (module docstring, 3-4), by the
    planner of :func:`pack_kernel` (``docs``: documents of the selection; default compiled).

    Args:
        sizes: ``(m,)`` positions of each piece, ``1 <= size <= seq_len``, in visiting order.
        win_ptr: ``(nw + 1,)`` ascending: window ``w`` holds pieces ``[win_ptr[w], win_ptr[w+1])``.
        seq_len: ``L``.

    Returns:
        ``(block_pieces, block_ptr, per_window)``: ``(m,)`` int64 piece indices block by block
        (windows in order, each window's blocks in opening order, pieces in visiting order
        within a block), ``(num_blocks + 1,)`` int64 offsets of each block's pieces in it, and
        ``(nw,)`` int64 blocks of each window.
    """
    m = int(sizes.shape[0])
    L = check_seq_len(seq_len)
    if L >= 1 << 31:
        raise PlanError(f"seq_len={L} is beyond the best-fit planner (< 2**31 positions)")
    _check_sizes(np.asarray(sizes), L)
    s = np.asarray(sizes, dtype=np.int32)
    ptr = np.asarray(win_ptr, dtype=np.int64)
    if ptr.ndim != 1 or ptr.shape[0] < 1 or ptr[0] != 0 or ptr[-1] != m or (np.diff(ptr) < 0).any():
        raise PlanError(
            f"win_ptr must ascend from 0 to {m} (the pieces), got {ptr[:8].tolist()}..."
        )
    block_pieces = np.empty(m, dtype=np.int64)
    count = np.empty(m, dtype=np.int64)
    per_window = pack_kernel(docs)(s, ptr, L, block_pieces, count)
    nb = int(per_window.sum())
    block_ptr = np.zeros(nb + 1, dtype=np.int64)
    np.cumsum(count[:nb], out=block_ptr[1:])
    return block_pieces, block_ptr, per_window


def _check_sizes(sizes: np.ndarray, L: int) -> None:
    """Every size in ``[1, L]`` (the compiled loop indexes by size: anything else is refused)."""
    if sizes.size and (int(sizes.min()) < 1 or int(sizes.max()) > L):
        bad = sizes[(sizes < 1) | (sizes > L)][0]
        raise PlanError(f"a piece of {bad} positions does not fit a block of {L} (need 1..{L})")


def best_fit_blocks(
    sizes: np.ndarray, window_of: np.ndarray, *, seq_len: int
) -> tuple[np.ndarray, int]:
    """Assign pieces to blocks best-fit-decreasing within each window (module docstring, 3-4).

    The same blocks as :func:`best_fit_blocks_reference`, planned by :func:`pack_pieces`.

    Args:
        sizes: ``(V,)`` positions of each piece, ``1 <= size <= seq_len``, in visiting order.
        window_of: ``(V,)`` non-decreasing window index of each piece.
        seq_len: ``L``.

    Returns:
        ``(block, num_blocks)``: ``(V,)`` int64 block of each piece (blocks numbered window by
        window in opening order) and the number of blocks.
    """
    V = int(sizes.shape[0])
    if V == 0:
        return np.zeros(0, dtype=np.int64), 0
    w = np.asarray(window_of)
    if w.shape != (V,) or (np.diff(w) < 0).any():
        raise PlanError("window_of must give each piece its window, non-decreasing")
    win_ptr = np.concatenate([[0], np.flatnonzero(np.diff(w)) + 1, [V]])
    pieces, ptr, _ = pack_pieces(np.asarray(sizes), win_ptr, seq_len=seq_len)
    nb = ptr.shape[0] - 1
    block = np.empty(V, dtype=np.int64)
    block[pieces] = np.repeat(np.arange(nb, dtype=np.int64), np.diff(ptr))
    return block, nb


def best_fit_blocks_reference(
    sizes: np.ndarray, window_of: np.ndarray, *, seq_len: int
) -> tuple[np.ndarray, int]:
    """The former planner of :func:`best_fit_blocks`, one Python loop over the pieces (a bisect
    over the distinct remaining capacities, a heap of block ids per capacity; ~1 µs per piece):
    the reference the compiled planner is tested against.

    Args:
        sizes: ``(V,)`` positions of each piece, ``1 <= size <= seq_len``, in visiting order.
        window_of: ``(V,)`` non-decreasing window index of each piece.
        seq_len: ``L``.

    Returns:
        ``(block, num_blocks)``: ``(V,)`` int64 block of each piece (blocks numbered window by
        window in opening order) and the number of blocks.
    """
    V = int(sizes.shape[0])
    if V == 0:
        return np.zeros(0, dtype=np.int64), 0
    w = np.asarray(window_of)
    win_ptr = np.concatenate([[0], np.flatnonzero(np.diff(w)) + 1, [V]])
    pieces, count = np.empty(V, dtype=np.int64), np.empty(V, dtype=np.int64)
    nb = int(_pack_windows_reference(np.asarray(sizes), win_ptr, seq_len, pieces, count).sum())
    block = np.empty(V, dtype=np.int64)
    block[pieces] = np.repeat(np.arange(nb, dtype=np.int64), count[:nb])
    return block, nb


def _pack_windows_reference(
    sizes: np.ndarray,
    win_ptr: np.ndarray,
    seq_len: int,
    block_pieces: np.ndarray,
    block_count: np.ndarray,
) -> np.ndarray:
    """The former :func:`pack_windows_python`, one Python loop over every piece (a bisect over
    the distinct remaining capacities, a heap of block ids per capacity; ~1 µs per piece): the
    reference both planners are tested against (:func:`best_fit_blocks_reference`)."""
    L = int(seq_len)
    ptr = np.asarray(win_ptr, dtype=np.int64)
    nw = int(ptr.shape[0]) - 1
    per_window = np.empty(nw, dtype=np.int64)
    listing = block_pieces.shape[0] > 0
    out_b = 0
    for w in range(nw):
        a, b = int(ptr[w]), int(ptr[w + 1])
        size = np.asarray(sizes[a:b], dtype=np.int64)
        order = np.argsort(-size, kind="stable")  # largest first, ties in visiting order
        rems: list[int] = []  # distinct remaining capacities of open blocks, ascending
        heaps: dict[int, list[int]] = {}  # remaining capacity -> heap of block ids
        taken = [0] * (b - a)  # block of each piece, in ``order``
        nb = 0
        for t, x in enumerate(size[order].tolist()):
            k = bisect_left(rems, x)
            if k == len(rems):
                blk, r = nb, L - x
                nb += 1
            else:
                r0 = rems[k]
                h = heaps[r0]
                blk = heapq.heappop(h)
                if not h:
                    del heaps[r0]
                    del rems[k]
                r = r0 - x
            if r:
                h2 = heaps.get(r)
                if h2 is None:
                    heaps[r] = [blk]
                    insort(rems, r)
                else:
                    heapq.heappush(h2, blk)
            taken[t] = blk
        per_window[w] = nb
        if listing and b > a:
            blk_of = np.empty(b - a, dtype=np.int64)
            blk_of[order] = taken
            block_pieces[a:b] = a + np.argsort(blk_of, kind="stable")  # ascending in a block
            block_count[out_b : out_b + nb] = np.bincount(blk_of, minlength=nb)
        out_b += nb
    return per_window


def naive_best_fit_blocks(
    sizes: Sequence[int], window_of: Sequence[int], *, seq_len: int
) -> list[list[int]]:
    """Slow reference of :func:`best_fit_blocks`: a scan of every open block per piece.

    Returns:
        Per block in emission order, its piece indices in position order.
    """
    blocks: list[list[int]] = []
    for w in sorted(set(window_of)):
        items = sorted((i for i in range(len(sizes)) if window_of[i] == w), key=lambda i: -sizes[i])
        open_: list[list] = []  # [remaining, pieces] in opening order
        for i in items:
            best = None
            for o in open_:
                if o[0] >= sizes[i] and (best is None or o[0] < best[0]):
                    best = o
            if best is None:
                best = [seq_len, []]
                open_.append(best)
            best[0] -= sizes[i]
            best[1].append(i)
        blocks += [sorted(o[1]) for o in open_]
    return blocks


def plan_bestfit(
    row_ids: np.ndarray,
    n_tokens: np.ndarray,
    *,
    seed: int,
    epoch: int,
    seq_len: int,
    fit_window: int,
    long_docs: str = "split",
    window: int | None = None,
    overlap: int = 0,
    cut_points: Mapping[int, np.ndarray] | None = None,
    store: Any = None,
    ordering: Any = None,
    order: np.ndarray | None = None,
) -> BestFitPlan:
    """Plan one epoch with best-fit packing (see the module docstring). O(n log n + V log L).

    Args:
        row_ids: ``(n,)`` strictly ascending table ids of the selected rows.
        n_tokens: ``(n,)`` their token counts (0 = empty row).
        seed: The job's seed.
        epoch: The epoch.
        seq_len: ``L``, positions per block.
        fit_window: Documents of the visiting order considered together, ``>= 1``.
        long_docs: ``"split"`` or ``"window"`` for documents with ``n + 1 > L``
            (with ``"window"``, documents with ``n + 1 > window``).
        window: ``W`` for ``long_docs="window"`` (default ``seq_len``); must be ``<= seq_len``.
        overlap: ``O`` for ``long_docs="window"``, ``0 <= O < W``.
        cut_points: Optional boundary hook of :func:`~tokenloom.loader.plan.window.window_docs`.
        store: Optional :class:`~tokenloom.loader.pipeline.planstore.PlanStore` for the visiting
        order. ordering: Optional curriculum order
        (:func:`~tokenloom.loader.plan.epoch.plan_epoch`): the
            fit windows are cut from it, so a document moves only within its window.
        order: Optional explicit visiting order (see
        :func:`~tokenloom.loader.plan.epoch.plan_epoch`).

    Returns:
        The :class:`BestFitPlan`.

    Raises:
        PlanError: A bad input or option, naming it.
    """
    if isinstance(fit_window, bool) or not isinstance(fit_window, int | np.integer):
        raise PlanError(f"fit_window must be an integer >= 1, got {fit_window!r}")
    if fit_window < 1:
        raise PlanError(f"fit_window must be >= 1 (documents packed together), got {fit_window}")
    if long_docs not in LONG_DOC_POLICIES:
        raise PlanError(f"long_docs must be one of {LONG_DOC_POLICIES}, got {long_docs!r}")
    if long_docs == "split":
        if window is not None or overlap:
            raise PlanError(
                f"window={window!r}, overlap={overlap!r} apply to long_docs='window' only; "
                "pass long_docs='window' or drop them"
            )
        W, ov = int(seq_len), 0
    else:
        W, ov = check_window(seq_len if window is None else window, overlap, seq_len)
    L = check_seq_len(seq_len)
    if L >= 1 << 31:
        raise PlanError(f"seq_len={L} is beyond the best-fit planner (< 2**31 positions)")
    ids, lens = check_selection(row_ids, n_tokens)
    if isinstance(cut_points, WindowTable):  # cut once for the selection (the same every epoch)
        table = check_table(cut_points, int(ids.shape[0]), window=W, overlap=ov)
    else:
        table = window_table(ids, lens, window=W, overlap=ov, cut_points=cut_points)
    F, n = int(fit_window), count_nonzero(lens)
    packer = _Packer(table, fit_window=F, seq_len=L, num_docs=n)
    wp = plan_windowed_epoch(
        ids,
        lens,
        seed=seed,
        epoch=epoch,
        seq_len=L,
        window=W,
        overlap=ov,
        cut_points=table,
        store=store,
        visit=packer,
        ordering=ordering,
        order=order,
    )
    if packer.cursor != n:  # the order was mapped from the plan store: read the counts here
        packer = _Packer(table, fit_window=F, seq_len=L, num_docs=n)
        order = wp.stream.order
        for a in range(0, n, _CHUNK_DOCS):
            at = order[a : a + _CHUNK_DOCS]
            packer(a, at, lens[at])
    window_blocks, done = packer.window_blocks, packer.blocks
    filled = wp.stream_len
    return BestFitPlan(
        seed=wp.seed,
        epoch=wp.epoch,
        seq_len=L,
        fit_window=F,
        long_docs=long_docs,
        window=W,
        overlap=ov,
        stream=wp,
        window_blocks=_readonly(window_blocks),
        empty_rows=wp.empty_rows,
        num_docs=n,
        num_tokens=wp.num_tokens,
        context_tokens=wp.context_tokens,
        filled_positions=filled,
        num_blocks=done,
        padding_positions=done * L - filled,
    )


_NO_OUT = np.zeros(0, dtype=np.int64)
_CHUNK_DOCS = 1 << 16  # documents read per pass when the order comes from the plan store


class _Packer:
    """Best-fit of the visiting order as its chunks go by (a
    :data:`~tokenloom.loader.plan.epoch.Visit`
    of the pass that computes the marks, so the counts are gathered once): each complete fit
    window is packed by the compiled loop and only its number of blocks is kept."""

    def __init__(self, table: WindowTable, *, fit_window: int, seq_len: int, num_docs: int):
        self.table, self.F, self.L, self.n = table, fit_window, seq_len, num_docs
        pieces = num_docs + table.num_windows - int(table.rows.shape[0])
        nw = -(-num_docs // fit_window)
        self.window_blocks = np.zeros(nw + 1, dtype=np.uint32 if pieces < 1 << 32 else np.int64)
        self.cursor = 0  # documents seen
        self.packed = 0  # documents packed (whole windows)
        self.blocks = 0
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []  # (J, sizes) not packed yet
        self.kernel = pack_kernel(num_docs)

    def __call__(self, k: int, positions: np.ndarray, counts: np.ndarray) -> None:
        if k != self.cursor:  # chunks come in order: anything else is our bug
            raise RuntimeError(f"best-fit planner got documents from {k}, expected {self.cursor}")
        self.pending.append(piece_sizes(self.table, positions, counts))
        self.cursor += int(positions.shape[0])
        F = self.F
        end = self.cursor if self.cursor == self.n else self.cursor // F * F
        if end == self.packed:
            return  # a window larger than the chunks: wait for its end
        if len(self.pending) == 1:
            J, sizes = self.pending[0]
        else:
            J = np.concatenate([p[0] for p in self.pending])
            sizes = np.concatenate([p[1] for p in self.pending])
        first = np.cumsum(J) - J
        d = end - self.packed
        m = int(first[d]) if d < J.shape[0] else int(sizes.shape[0])
        win_ptr = np.append(first[:d:F], m)
        _check_sizes(sizes, self.L)  # the table's windows fit (the loop indexes by size)
        per_window = self.kernel(sizes, win_ptr, self.L, _NO_OUT, _NO_OUT)  # counts only
        w0 = self.packed // F
        self.window_blocks[w0 + 1 : w0 + 1 + per_window.shape[0]] = self.blocks + np.cumsum(
            per_window
        )
        self.blocks += int(per_window.sum())
        self.packed = end
        self.pending = [(J[d:], sizes[m:])] if d < J.shape[0] else []


def bestfit_spans(plan: BestFitPlan, blocks: np.ndarray) -> Spans:
    """The stretches (whole pieces) of the requested blocks. O(m + pieces of their windows).

    Args:
        plan: The best-fit plan.
        blocks: ``(m,)`` block indices in ``[0, num_blocks)`` or ``-1`` (padding block).

    Returns:
        :class:`Spans` ordered by block then position, the layout :func:`pack_blocks` takes: each
        block's pieces from position 0, then padding. Window fields are set only with overlap.

    Raises:
        PlanError: A block index is out of range.
    """
    req = check_blocks(blocks, plan.num_blocks)
    real = np.flatnonzero(req >= 0)
    if real.size == 0:
        return empty_spans(req, plan.seq_len, windowed=plan.stream.table.has_context)
    b = req[real]
    w = np.searchsorted(plan.window_blocks, b, side="right") - 1
    wins = plan.windows(np.unique(w).tolist())
    k = b - plan.window_blocks[w].astype(np.int64)  # block within its window
    by_window = np.argsort(w, kind="stable")
    cut = np.flatnonzero(np.diff(w[by_window])) + 1
    groups = [(int(w[g[0]]), g) for g in np.split(by_window, cut)]
    counts = np.empty(b.shape[0], dtype=np.int64)
    for wi, g in groups:
        ptr = wins[wi].block_ptr
        counts[g] = ptr[k[g] + 1] - ptr[k[g]]
    offsets = np.cumsum(counts) - counts
    total = int(counts.sum())
    doc = np.empty(total, dtype=np.int64)
    j = np.empty(total, dtype=np.int64)
    size = np.empty(total, dtype=np.int64)
    F = plan.fit_window
    for wi, g in groups:
        x = wins[wi]
        if g.shape[0] < 8:  # a few blocks of this window (interleave): slices
            for i in g.tolist():
                a0, o, c = int(x.block_ptr[k[i]]), int(offsets[i]), int(counts[i])
                doc[o : o + c] = x.doc[a0 : a0 + c]
                doc[o : o + c] += wi * F
                j[o : o + c] = x.j[a0 : a0 + c]
                size[o : o + c] = x.size[a0 : a0 + c]
            continue
        c = counts[g]  # many blocks of one window (sequential): gathers
        within = np.arange(int(c.sum()), dtype=np.int64) - np.repeat(np.cumsum(c) - c, c)
        src = np.repeat(x.block_ptr[k[g]], c) + within
        dst = np.repeat(offsets[g], c) + within
        doc[dst] = x.doc[src] + wi * F
        j[dst] = x.j[src]
        size[dst] = x.size[src]
    # Only the documents of the requested blocks are expanded into their pieces' fields.
    udocs, at = np.unique(doc, return_inverse=True)
    pieces, _ = plan.stream.pieces(udocs, np.zeros(udocs.shape[0], dtype=np.int64))
    piece = np.searchsorted(pieces.doc, udocs)[at] + j
    ends = np.cumsum(size)
    pos = ends - size - np.repeat(ends[offsets] - size[offsets], counts)  # exclusive, per block
    return piece_stretches(
        pieces,
        req,
        plan.seq_len,
        np.repeat(real, counts),
        pos,
        piece,
        np.zeros(total, dtype=np.int64),
        size,
    )


def padding_by_window(
    n_tokens: np.ndarray,
    *,
    seq_len: int,
    fit_windows: Sequence[int],
    seed: int = 0,
    epoch: int = 0,
) -> dict[int, float]:
    """Padding fraction of best-fit (``long_docs="split"``) for each look-ahead window size.

    Args:
        n_tokens: ``(n,)`` token counts of a corpus (row ids are taken as ``0..n-1``).
        seq_len: ``L``.
        fit_windows: The window sizes to compare.
        seed: Seed of the visiting order.
        epoch: Epoch of the visiting order.

    Returns:
        ``{fit_window: padding_positions / (num_blocks * seq_len)}``.
    """
    lens = np.asarray(n_tokens, dtype=np.int64)
    ids = np.arange(lens.shape[0], dtype=np.int64)
    return {
        int(w): plan_bestfit(
            ids, lens, seed=seed, epoch=epoch, seq_len=seq_len, fit_window=int(w)
        ).padding_fraction
        for w in fit_windows
    }
