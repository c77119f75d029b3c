"""Best-fit packing: whole documents per block, chosen best-fit-decreasing in a look-ahead window.

A document of ``n`` tokens takes ``n + 1`` positions (its EOS); one with ``n + 1 <= L`` is never
cut. The plan, deterministic from ``(seed, epoch)`` and the stored counts:

1. Rows are visited in :func:`~tokenloom.loader.shuffle.epoch_permutation` order (empty rows
   contribute nothing, as in :func:`~tokenloom.loader.plan.plan_epoch`).
2. Each document becomes *pieces* that fit a block (:mod:`~tokenloom.loader.window`): itself when it
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
``docs/recipes.md``). The contents are stored CSR-style (``block_ptr``, ``block_pieces``), so
:func:`bestfit_spans` is O(stretches in the requested blocks). Planning is one Python loop over the
pieces (a bisect over the distinct remaining capacities, a heap of block ids per capacity), about
1-2 µs per piece.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenloom.loader.plan import BlockCounts, PlanError, clip_range, plan_epoch
from tokenloom.loader.spans import Spans
from tokenloom.loader.window import (
    VirtualDocs,
    check_blocks,
    check_window,
    empty_spans,
    piece_stretches,
    window_docs,
)

__all__ = [
    "LONG_DOC_POLICIES",
    "BESTFIT_ALGORITHM",
    "BestFitPlan",
    "plan_bestfit",
    "bestfit_spans",
    "best_fit_blocks",
    "naive_best_fit_blocks",
    "padding_by_window",
]

LONG_DOC_POLICIES = ("split", "window")
"""``split``: full blocks plus a tail; ``window``: overlapping windows (:mod:`.window`)."""

BESTFIT_ALGORITHM = "bfd-window-close-v1"
"""Identity of this planner (part of the plan fingerprint when best-fit is used)."""


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class BestFitPlan:
    """One epoch packed best-fit. Same duck-typed surface as the concat plan for the loader."""

    seed: int
    epoch: int
    seq_len: int
    fit_window: int
    """Documents considered together by best-fit."""
    long_docs: str
    window: int
    """Piece size limit for long documents (``seq_len`` with ``long_docs="split"``)."""
    overlap: int
    docs: VirtualDocs
    """The pieces, in visiting order."""
    block_ptr: np.ndarray
    """``(num_blocks + 1,)`` int64: block ``b`` holds pieces
    ``block_pieces[block_ptr[b]:block_ptr[b + 1]]``."""
    block_pieces: np.ndarray
    """``(V,)`` int64: piece indices, block by block, in position order."""
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

    @property
    def padding_fraction(self) -> float:
        """Share of the epoch's positions that are padding."""
        total = self.num_blocks * self.seq_len
        return self.padding_positions / total if total else 0.0

    def spans(self, blocks: np.ndarray) -> Spans:
        """:func:`bestfit_spans` of this plan."""
        return bestfit_spans(self, blocks)

    def counts(self, lo: int, hi: int) -> BlockCounts:
        """What blocks ``[lo, hi)`` hold (clipped to the epoch). O(pieces in range)."""
        lo, hi = clip_range(lo, hi, self.num_blocks)
        pieces = self.block_pieces[self.block_ptr[lo] : self.block_ptr[hi]]
        d = self.docs
        tokens = int((d.tok_end[pieces] - d.tok_start[pieces]).sum())
        eos = int(d.has_eos[pieces].sum())
        return BlockCounts(tokens=tokens, eos=eos, filled=tokens + eos)

    def block_pools(self, blocks: np.ndarray) -> np.ndarray:
        """``(m,)`` pool of each block: 0, or -1 for a padding block (``-1``)."""
        return np.where(np.asarray(blocks) >= 0, 0, -1).astype(np.int64)


def best_fit_blocks(
    sizes: np.ndarray, window_of: np.ndarray, *, seq_len: int
) -> tuple[np.ndarray, int]:
    """Assign pieces to blocks best-fit-decreasing within each window (module docstring, 3-4).

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
    order = np.lexsort((np.arange(V), -sizes, window_of))  # window, largest first, then order
    s_sorted = sizes[order].tolist()
    bounds = np.flatnonzero(np.diff(window_of[order])) + 1
    cuts = [0, *bounds.tolist(), V]
    L = int(seq_len)
    out = [0] * V
    base = 0
    for w in range(len(cuts) - 1):
        rems: list[int] = []  # distinct remaining capacities of open blocks, ascending
        heaps: dict[int, list[int]] = {}  # remaining capacity -> heap of block ids
        nb = 0
        for x in range(cuts[w], cuts[w + 1]):
            s = s_sorted[x]
            k = bisect_left(rems, s)
            if k == len(rems):
                b, r = nb, L - s
                nb += 1
            else:
                r0 = rems[k]
                h = heaps[r0]
                b = heapq.heappop(h)
                if not h:
                    del heaps[r0]
                    del rems[k]
                r = r0 - s
            if r:
                h2 = heaps.get(r)
                if h2 is None:
                    heaps[r] = [b]
                    insort(rems, r)
                else:
                    heapq.heappush(h2, b)
            out[x] = base + b
        base += nb
    block = np.empty(V, dtype=np.int64)
    block[order] = out
    return block, base


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
) -> BestFitPlan:
    """Plan one epoch with best-fit packing (see the module docstring). O(n log n + V log V).

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
        cut_points: Optional boundary hook of :func:`~tokenloom.loader.window.window_docs`.
        store: Optional :class:`~tokenloom.loader.planstore.PlanStore` for the visiting order.

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
    base = plan_epoch(row_ids, n_tokens, seed=seed, epoch=epoch, seq_len=seq_len, store=store)
    L = base.seq_len
    docs = window_docs(base.row_ids, base.lengths, window=W, overlap=ov, cut_points=cut_points)
    sizes = docs.size
    block, num_blocks = best_fit_blocks(sizes, docs.doc // int(fit_window), seq_len=L)
    block_pieces = np.argsort(block, kind="stable")  # by block, then visiting order
    block_ptr = np.zeros(num_blocks + 1, dtype=np.int64)
    np.cumsum(np.bincount(block, minlength=num_blocks), out=block_ptr[1:])
    filled = int(sizes.sum())
    return BestFitPlan(
        seed=base.seed,
        epoch=base.epoch,
        seq_len=L,
        fit_window=int(fit_window),
        long_docs=long_docs,
        window=W,
        overlap=ov,
        docs=docs,
        block_ptr=block_ptr,
        block_pieces=block_pieces.astype(np.int64, copy=False),
        empty_rows=base.empty_rows,
        num_docs=base.num_docs,
        num_tokens=base.num_tokens,
        context_tokens=docs.context_tokens,
        filled_positions=filled,
        num_blocks=num_blocks,
        padding_positions=num_blocks * L - filled,
    )


def bestfit_spans(plan: BestFitPlan, blocks: np.ndarray) -> Spans:
    """The stretches (whole pieces) of the requested blocks. O(m + S).

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
    b = req[real]
    lo, hi = plan.block_ptr[b], plan.block_ptr[b + 1]
    counts = hi - lo
    total = int(counts.sum())
    if total == 0:
        return empty_spans(req, plan.seq_len, windowed=plan.docs.has_context)
    offsets = np.cumsum(counts) - counts
    within = np.arange(total) - np.repeat(offsets, counts)
    piece = plan.block_pieces[np.repeat(lo, counts) + within]
    size = plan.docs.size[piece]
    ends = np.cumsum(size)
    pos = ends - size - np.repeat(ends[offsets] - size[offsets], counts)  # exclusive, per block
    return piece_stretches(
        plan.docs,
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
