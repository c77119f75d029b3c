"""Long documents as *virtual documents*: overlapping windows, and the concat plan over them.

**Windows** (``long_docs="window"``, ``window=W``, ``overlap=ov``, ``0 <= O < W``). A document of
``n`` tokens occupies ``n + 1`` positions (its EOS included). When ``n + 1 <= W`` it stays whole.
Otherwise it is cut into windows of at most ``W`` positions with stride ``W - O``: window ``j``
covers positions ``[j * (W - O), min(j * (W - O) + W, n + 1))``, so every window but the last has
exactly ``W`` positions and only the last holds the EOS. Window ``j >= 1`` starts with the last
``O`` tokens of window ``j - 1``: **context only**, present in ``input_ids``, never a target
(:mod:`~tokenloom.loader.pack` gives ``-100`` to the positions whose target is context). With
``O >= 1`` a window's last label is also ``-100``, since the next window trains that target (the
first new token) with its context; with ``O = 0`` windows are plain cuts and that label is the
usual lookahead. So every token is *new* in exactly one window, and every target ``1..n`` (EOS
included) is trained exactly once per epoch. ``W = L, O = 0`` is the "split" policy that best-fit
packing uses for documents longer than a block.

**Boundaries.** The planner sees only token counts, never text, so by default windows are cut at
fixed offsets. :func:`window_docs` takes an optional ``cut_points`` hook (a window then ends at
the latest boundary within its last eighth, else at ``W``): per row id, sorted
token offsets where a cut is welcome (sentence or paragraph ends, e.g. from a stored column). A
window then ends at the largest such offset that leaves it at least one new token, else at the
hard limit. The offsets must be plan inputs (a stored column of the pinned table version), or the
plan stops being a pure function of stored data.

**Concat over windows.** :func:`plan_windowed_epoch` visits rows in the usual
:func:`~tokenloom.loader.shuffle.epoch_permutation` order, expands each into its windows in place,
and lays the virtual documents end to end in blocks of ``L`` like
:func:`~tokenloom.loader.plan.plan_epoch` (blocks may cut a window; its later stretch keeps the
context range). :func:`windowed_spans` answers block → stretches by binary search.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenloom.loader.plan import BlockCounts, PlanError, clip_range, plan_epoch
from tokenloom.loader.spans import Spans

__all__ = [
    "VirtualDocs",
    "WindowedPlan",
    "check_window",
    "check_blocks",
    "window_docs",
    "naive_window_docs",
    "plan_windowed_epoch",
    "windowed_spans",
    "piece_stretches",
    "empty_spans",
]


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class VirtualDocs:
    """Pieces of documents (whole documents or windows) in visiting order. Arrays: ``(V,)``."""

    doc: np.ndarray
    """int64: index of the real document in the epoch's visiting order."""
    row_id: np.ndarray
    """int64: table ``id`` of the row."""
    doc_len: np.ndarray
    """int64: tokens of the whole row (its ``n_tokens``)."""
    tok_start: np.ndarray
    """int64: first token of the piece."""
    tok_end: np.ndarray
    """int64: one past its last token (EOS excluded)."""
    has_eos: np.ndarray
    """bool: the piece ends with the row's EOS (only the last piece of a row)."""
    ctx_end: np.ndarray
    """int64: tokens ``[tok_start, ctx_end)`` are context only (``ctx_end == tok_start``: none)."""
    ends_window: np.ndarray
    """bool: a later window of the row trains the target after this piece (``O >= 1``)."""
    size: np.ndarray
    """int64: positions of each piece, ``tok_end - tok_start + has_eos``."""
    has_context: bool
    """Whether any piece carries context tokens or ends a window with a deferred target."""
    context_tokens: int
    """Tokens delivered a second time, as context."""

    def __len__(self) -> int:
        return int(self.doc.shape[0])


def check_window(window: int, overlap: int, seq_len: int | None = None) -> tuple[int, int]:
    """Validate ``0 <= overlap < window (<= seq_len)``; return them as ints.

    Raises:
        PlanError: naming the bad value and the rule.
    """
    for name, value in (("window", window), ("overlap", overlap)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise PlanError(f"{name} must be an integer, got {value!r}")
    if not 0 <= overlap < window:
        raise PlanError(
            f"need 0 <= overlap < window, got window={window}, overlap={overlap}; "
            "each window must bring at least one new token"
        )
    if seq_len is not None and window > seq_len:
        raise PlanError(
            f"window={window} is longer than the block (seq_len={seq_len}); pass window <= seq_len"
        )
    return int(window), int(overlap)


def _pieces(
    doc: np.ndarray,
    ids: np.ndarray,
    lens: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    overlap: int,
) -> VirtualDocs:
    """Pieces from position ranges ``[start, end)`` of documents ``doc`` (vectorised)."""
    n = lens[doc]
    ctx = np.where(first, 0, overlap)
    ends = ~last & (overlap > 0)
    return VirtualDocs(
        doc=doc,
        row_id=ids[doc],
        doc_len=n,
        tok_start=start,
        tok_end=np.minimum(end, n),
        has_eos=end == n + 1,
        ctx_end=start + ctx,
        ends_window=ends,
        size=end - start,
        has_context=bool(ctx.any() or ends.any()),
        context_tokens=int(ctx.sum()),
    )


def window_docs(
    row_ids: np.ndarray,
    lengths: np.ndarray,
    *,
    window: int,
    overlap: int,
    cut_points: Mapping[int, np.ndarray] | None = None,
) -> VirtualDocs:
    """Expand documents (in visiting order) into windows. O(V) vectorised without ``cut_points``.

    Args:
        row_ids: ``(n,)`` table ids, in visiting order.
        lengths: ``(n,)`` tokens of each document (``>= 1``).
        window: ``W``, most positions per window (the EOS counts as one position).
        overlap: ``O``, context tokens repeated at the start of each window after the first.
        cut_points: Optional ``row id -> sorted token offsets`` where a window may end; used only
            for rows longer than ``W`` positions (see the module docstring).

    Returns:
        The :class:`VirtualDocs`, documents in order, each one's windows in order.
    """
    W, ov = check_window(window, overlap)
    ids = np.asarray(row_ids, dtype=np.int64)
    lens = np.asarray(lengths, dtype=np.int64)
    P = lens + 1  # (n,) positions of each document
    stride = W - ov
    if cut_points is None:
        J = np.where(P <= W, 1, 1 + -(-(P - W) // stride))  # (n,) windows per document
        doc = np.repeat(np.arange(ids.shape[0], dtype=np.int64), J)
        j = np.arange(doc.shape[0], dtype=np.int64) - np.repeat(np.cumsum(J) - J, J)
        start = j * stride
        end = np.minimum(start + W, P[doc])
        return _pieces(doc, ids, lens, start, end, j == 0, j == J[doc] - 1, ov)
    # Snapping: a loop over the long documents only; short ones stay whole.
    docs, starts, ends = [], [], []
    long_mask = P > W
    for k in np.flatnonzero(long_mask).tolist():
        cuts = np.asarray(cut_points.get(int(ids[k]), ()), dtype=np.int64)
        s, p = 0, int(P[k])
        while p - s > W:
            # A cut c ends the window's tokens at c: it must leave a new token (c > s + O).
            hi = np.searchsorted(cuts, s + W, side="right")
            # the latest boundary in the last eighth of the window (a small slack), else cut at W
            floor = max(s + ov, s + W - max(1, W // 8))
            c = int(cuts[hi - 1]) if hi and cuts[hi - 1] > floor else s + W
            docs.append(k)
            starts.append(s)
            ends.append(c)
            s = c - ov
        docs.append(k)
        starts.append(s)
        ends.append(p)
    short = np.flatnonzero(~long_mask)
    doc = np.concatenate([short, np.asarray(docs, dtype=np.int64)])
    start = np.concatenate([np.zeros(short.shape[0], np.int64), np.asarray(starts, np.int64)])
    end = np.concatenate([P[short], np.asarray(ends, dtype=np.int64)])
    order = np.lexsort((start, doc))
    doc, start, end = doc[order], start[order], end[order]
    first = start == 0
    last = end == P[doc]
    return _pieces(doc, ids, lens, start, end, first, last, ov)


def naive_window_docs(
    row_ids: list[int],
    lengths: list[int],
    *,
    window: int,
    overlap: int,
    cut_points: Mapping[int, np.ndarray] | None = None,
) -> list[tuple[int, int, int, int, bool, int, bool]]:
    """Slow reference of :func:`window_docs`: one loop per document.

    Returns:
        ``(doc, row_id, tok_start, tok_end, has_eos, ctx_end, ends_window)`` per piece.
    """
    out = []
    for k, (rid, n) in enumerate(zip(row_ids, lengths, strict=True)):
        cuts = [int(c) for c in (cut_points or {}).get(rid, ())]
        s, last = 0, False
        while not last:
            if n + 1 - s <= window:
                e = n + 1
            else:
                floor = max(s + overlap, s + window - max(1, window // 8))
                ok = [c for c in cuts if floor < c <= s + window]
                e = max(ok) if ok else s + window
            last = e == n + 1
            ctx = s + overlap if s > 0 else 0
            out.append((k, rid, s, min(e, n), last, ctx, not last and overlap > 0))
            s = e - overlap
    return out


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class WindowedPlan:
    """One epoch of windows laid end to end in blocks (concat packing, ``long_docs="window"``)."""

    seed: int
    epoch: int
    seq_len: int
    window: int
    overlap: int
    docs: VirtualDocs
    """The pieces in stream order."""
    starts: np.ndarray
    """``(V + 1,)`` int64: stream offset of each piece; ``starts[V] == stream_len``."""
    empty_rows: int
    num_docs: int
    """Real (non-empty) documents."""
    num_tokens: int
    """Distinct real tokens of the epoch (EOS and repeated context excluded)."""
    context_tokens: int
    """Tokens repeated as context (input without loss)."""
    stream_len: int
    """Positions of the stream: ``num_tokens + context_tokens + num_docs``."""
    num_blocks: int
    padding_positions: int
    """Padding at the end of the last block."""

    def spans(self, blocks: np.ndarray) -> Spans:
        """:func:`windowed_spans` of this plan."""
        return windowed_spans(self, blocks)

    def counts(self, lo: int, hi: int) -> BlockCounts:
        """What blocks ``[lo, hi)`` hold (clipped to the epoch). O(log V)."""
        lo, hi = clip_range(lo, hi, self.num_blocks)
        L = self.seq_len
        a, b = min(lo * L, self.stream_len), min(hi * L, self.stream_len)
        eos_at = self.starts[1:][self.docs.has_eos] - 1  # ascending stream positions of the EOS
        eos = int(np.searchsorted(eos_at, b) - np.searchsorted(eos_at, a))
        return BlockCounts(tokens=b - a - eos, eos=eos, filled=b - a)

    def block_pools(self, blocks: np.ndarray) -> np.ndarray:
        """``(m,)`` pool of each block: 0, or -1 for a padding block (``-1``)."""
        return np.where(np.asarray(blocks) >= 0, 0, -1).astype(np.int64)


def plan_windowed_epoch(
    row_ids: np.ndarray,
    n_tokens: np.ndarray,
    *,
    seed: int,
    epoch: int,
    seq_len: int,
    window: int,
    overlap: int,
    cut_points: Mapping[int, np.ndarray] | None = None,
    store: Any = None,
) -> WindowedPlan:
    """Concat packing of windows: rows in epoch order, each expanded into windows in place.

    Args:
        row_ids: ``(n,)`` strictly ascending table ids of the selected rows.
        n_tokens: ``(n,)`` their token counts (0 = empty row, contributes nothing).
        seed: The job's seed.
        epoch: The epoch.
        seq_len: ``L``, positions per block.
        window: ``W <= L``.
        overlap: ``O < W``.
        cut_points: Optional boundary hook (see :func:`window_docs`).
        store: Optional :class:`~tokenloom.loader.planstore.PlanStore` for the visiting order.

    Returns:
        The :class:`WindowedPlan`. With ``W = L, O = 0`` its stream equals
        :func:`~tokenloom.loader.plan.plan_epoch`'s.
    """
    W, ov = check_window(window, overlap, seq_len)
    base = plan_epoch(row_ids, n_tokens, seed=seed, epoch=epoch, seq_len=seq_len, store=store)
    docs = window_docs(base.row_ids, base.lengths, window=W, overlap=ov, cut_points=cut_points)
    starts = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum(docs.size, out=starts[1:])
    stream_len = int(starts[-1])
    num_blocks = -(-stream_len // base.seq_len)
    ctx = docs.context_tokens
    return WindowedPlan(
        seed=base.seed,
        epoch=base.epoch,
        seq_len=base.seq_len,
        window=W,
        overlap=ov,
        docs=docs,
        starts=starts,
        empty_rows=base.empty_rows,
        num_docs=base.num_docs,
        num_tokens=base.num_tokens,
        context_tokens=ctx,
        stream_len=stream_len,
        num_blocks=num_blocks,
        padding_positions=num_blocks * base.seq_len - stream_len,
    )


def check_blocks(blocks: np.ndarray, num_blocks: int) -> np.ndarray:
    """``blocks`` as a 1-D int64 array of indices in ``[-1, num_blocks)``.

    Raises:
        PlanError: not 1-D integers, or an index outside the range.
    """
    req = np.asarray(blocks)
    if req.ndim != 1 or (req.size and not np.issubdtype(req.dtype, np.integer)):
        raise PlanError(f"blocks must be a 1-D integer array, got {req.dtype} {req.shape}")
    req = req.astype(np.int64, copy=False)
    if req.size and (int(req.min()) < -1 or int(req.max()) >= num_blocks):
        bad = req[(req < -1) | (req >= num_blocks)][0]
        raise PlanError(f"block {bad} is outside the epoch's blocks [0, {num_blocks}) or -1")
    return req


def piece_stretches(
    docs: VirtualDocs,
    req: np.ndarray,
    seq_len: int,
    block: np.ndarray,
    pos: np.ndarray,
    piece: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
) -> Spans:
    """:class:`Spans` of stretches given as positions ``[a, b)`` of pieces ``piece``.

    ``block`` indexes ``req`` and ``pos`` is the stretch's position in the block; the window fields
    are set only when the pieces carry context (so split-only plans pack exactly like concat).
    """
    size = docs.size[piece]
    t0 = docs.tok_start[piece]
    full_end = b == size
    ctx = docs.has_context
    return Spans(
        seq_len=seq_len,
        blocks=req,
        block=block.astype(np.int64, copy=False),
        pos=pos,
        doc=docs.doc[piece],
        row_id=docs.row_id[piece],
        doc_len=docs.doc_len[piece],
        tok_start=t0 + a,
        tok_end=np.minimum(t0 + b, docs.tok_end[piece]),
        has_eos=docs.has_eos[piece] & full_end,
        ctx_end=docs.ctx_end[piece] if ctx else None,
        ends_window=(docs.ends_window[piece] & full_end) if ctx else None,
    )


def empty_spans(req: np.ndarray, seq_len: int, *, windowed: bool) -> Spans:
    """Spans with no stretch (every requested block is padding)."""
    z = np.zeros(0, dtype=np.int64)
    return Spans(
        seq_len=seq_len,
        blocks=req,
        block=z,
        pos=z,
        doc=z,
        row_id=z,
        doc_len=z,
        tok_start=z,
        tok_end=z,
        has_eos=np.zeros(0, dtype=bool),
        ctx_end=z if windowed else None,
        ends_window=np.zeros(0, dtype=bool) if windowed else None,
    )


def windowed_spans(plan: WindowedPlan, blocks: np.ndarray) -> Spans:
    """The stretches of the requested blocks of a :class:`WindowedPlan`. O(m log V + S).

    Args:
        plan: The plan.
        blocks: ``(m,)`` block indices in ``[0, num_blocks)`` or ``-1`` (padding block).

    Returns:
        :class:`Spans` ordered by block then position, with ``ctx_end``/``ends_window`` set when
        the plan has context (``overlap > 0``).

    Raises:
        PlanError: A block index is out of range.
    """
    req = check_blocks(blocks, plan.num_blocks)
    L, starts = plan.seq_len, plan.starts
    real = np.flatnonzero(req >= 0)
    lo = req[real] * L
    hi = np.minimum(lo + L, plan.stream_len)
    first = np.searchsorted(starts, lo, side="right") - 1
    last = np.searchsorted(starts, hi, side="left") - 1
    counts = last - first + 1
    total = int(counts.sum())
    offsets = np.cumsum(counts) - counts
    which = np.repeat(np.arange(real.shape[0]), counts)
    piece = np.repeat(first, counts) + (np.arange(total) - np.repeat(offsets, counts))
    blk_lo = lo[which]
    p_start, p_end = starts[piece], starts[piece + 1]
    s0 = np.maximum(p_start, blk_lo)
    s1 = np.minimum(p_end, hi[which])
    return piece_stretches(
        plan.docs, req, L, real[which], s0 - blk_lo, piece, s0 - p_start, s1 - p_start
    )
