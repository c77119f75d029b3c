"""Long documents as *virtual documents*: overlapping windows, and the concat plan over them.

**Windows** (``long_docs="window"``, ``window=W``, ``overlap=ov``, ``0 <= O < W``). A document of
``n`` tokens occupies ``n + 1`` positions (its EOS included). When ``n + 1 <= W`` it stays whole.
Otherwise it is cut into windows of at most ``W`` positions with stride ``W - O``: window ``j``
covers positions ``[j * (W - O), min(j * (W - O) + W, n + 1))``, so every window but the last has
exactly ``W`` positions and only the last holds the EOS. Window ``j >= 1`` starts with the last
``O`` tokens of window ``j - 1``: **context only**, present in ``input_ids``, never a target
(:mod:`~tokenloom.loader.plan.pack` gives ``-100`` to the positions whose target is context). With
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
:func:`~tokenloom.loader.plan.shuffle.epoch_permutation` order, expands each into its windows in
place, and lays the virtual documents end to end in blocks of ``L`` like
:func:`~tokenloom.loader.plan.epoch.plan_epoch` (blocks may cut a window; its later stretch keeps
the context range). :func:`windowed_spans` answers block → stretches by binary search.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenloom.loader.plan.epoch import (
    MARK_EVERY,
    BlockCounts,
    EpochPlan,
    PlanError,
    Visit,
    _readonly,
    clip_range,
    pass_chunk,
    plan_epoch,
    stream_counts,
)
from tokenloom.loader.plan.shuffle import order_dtype
from tokenloom.loader.plan.spans import Spans

__all__ = [
    "VirtualDocs",
    "CutPoints",
    "WindowTable",
    "window_table",
    "naive_windowed_layout",
    "WindowedPlan",
    "check_window",
    "check_table",
    "check_blocks",
    "window_docs",
    "naive_window_docs",
    "naive_structured_ends",
    "END_KINDS",
    "plan_windowed_epoch",
    "windowed_spans",
    "piece_stretches",
    "piece_sizes",
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


class CutPoints(Mapping):
    """Cut points of some rows, CSR: ``row id -> sorted token offsets`` without a Python object
    per row (what :func:`~tokenloom.loader.pipeline.read.read_cut_points` returns; any mapping works
    too).

    Args:
        rows: ``(m,)`` strictly ascending row ids.
        ptr: ``(m + 1,)`` offsets: row ``rows[i]``'s offsets are ``values[ptr[i]:ptr[i + 1]]``.
        values: The offsets, sorted within each row.
    """

    def __init__(
        self, rows: np.ndarray, ptr: np.ndarray, values: np.ndarray, ranks: np.ndarray | None = None
    ) -> None:
        self.rows = np.asarray(rows, dtype=np.int64)
        self.ptr = np.asarray(ptr, dtype=np.int64)
        self.values = np.asarray(values)
        self.ranks = None if ranks is None else np.asarray(ranks, dtype=np.int8)
        """Optional kind of each offset (:mod:`~tokenloom.tokenize.structure`: 0 line,
        1 paragraph, 2 section), parallel to ``values``: a *ranked* column."""
        if self.ptr.shape != (self.rows.shape[0] + 1,):
            raise PlanError(f"cut points: ptr must hold {self.rows.shape[0] + 1} offsets")
        if self.ranks is not None and self.ranks.shape != self.values.shape:
            raise PlanError("cut points: ranks must be parallel to the offsets")

    @classmethod
    def from_mapping(cls, cuts: Mapping[int, Any], row_ids: np.ndarray | None = None) -> CutPoints:
        """The CSR form of a mapping (only the rows of ``row_ids`` when given)."""
        if isinstance(cuts, CutPoints):
            return cuts
        keys = sorted(int(k) for k in cuts) if row_ids is None else np.unique(row_ids).tolist()
        arrays = [np.sort(np.asarray(cuts.get(k, ()), dtype=np.int64)) for k in keys]
        ptr = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum([a.shape[0] for a in arrays], out=ptr[1:])
        values = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        return cls(np.asarray(keys, dtype=np.int64), ptr, values)

    def segments(self, row_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(lo, hi)``: each row's offsets are ``values[lo:hi]`` (empty when it has none)."""
        ids = np.asarray(row_ids, dtype=np.int64)
        k = np.searchsorted(self.rows, ids)
        kk = np.minimum(k, max(self.rows.shape[0] - 1, 0))
        found = (k < self.rows.shape[0]) & (self.rows[kk] == ids) if self.rows.size else k < 0
        return np.where(found, self.ptr[kk], 0), np.where(found, self.ptr[kk + found], 0)

    def __getitem__(self, row_id: int) -> np.ndarray:
        k = int(np.searchsorted(self.rows, int(row_id)))
        if k == self.rows.shape[0] or int(self.rows[k]) != int(row_id):
            raise KeyError(row_id)
        return self.values[int(self.ptr[k]) : int(self.ptr[k + 1])]

    def __iter__(self) -> Any:
        return iter(self.rows.tolist())

    def __len__(self) -> int:
        return int(self.rows.shape[0])


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class WindowTable:
    """The windows of a selection's long rows (``n + 1 > W``), the same every epoch.

    Row ``rows[i]`` (a position in the selection) has windows ending at positions
    ``ends[ptr[i]:ptr[i + 1]]`` (the last is ``n + 1``); window ``j`` starts at 0 or at the
    previous end minus ``overlap``. Short rows are one piece. About 12 bytes per long row plus
    4-8 per window: a few percent of the per-piece arrays of :class:`VirtualDocs`. Plain cuts
    (no cut column, ``overlap == 0``: best-fit's ``long_docs="split"``) are a function of a
    row's length, so their ``ptr`` and ``ends`` are not stored (``None``): about 4.5 bytes per
    long row. Read a row's windows with :meth:`windows_of`.
    """

    window: int
    overlap: int
    rows: np.ndarray
    """``(M,)`` ascending selection positions of the long rows."""
    ptr: np.ndarray | None
    """``(M + 1,)`` int64 offsets into ``ends`` (``None`` for plain cuts)."""
    ends: np.ndarray | None
    """``(T,)`` end position of each window (int32 when every row is shorter than ``2**31``;
    ``None`` for plain cuts)."""
    num_windows: int
    """``T``: windows of the long rows."""
    bits: np.ndarray
    """``(ceil(N / 8),)`` uint8: bit ``p`` is set when selection position ``p`` is a long row
    (a lookup searches ``rows`` for those only)."""
    kinds: np.ndarray | None = None
    """``(T,)`` int8 optional: what each window ends at (:data:`END_KINDS`: ``-1`` the hard
    limit, ``0`` line, ``1`` paragraph, ``2`` section, ``3`` the document's end); ``None`` when
    no cut column was given (every window but a row's last ends at the hard limit)."""

    @property
    def context_tokens(self) -> int:
        """Tokens repeated as context: ``overlap`` per window after a row's first."""
        return self.overlap * int(self.num_windows - self.rows.shape[0])

    def windows_of(self, k: np.ndarray | None, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(J, ends)`` of long rows ``rows[k]`` of ``n`` tokens: ``(m,)`` int64 windows of each
        and ``(sum(J),)`` int64 end positions of their windows, row after row (``k`` is not
        read for plain cuts, whose ends follow from ``n``: it may be ``None`` then)."""
        if self.ends is None:
            return _even_windows(np.asarray(n, dtype=np.int64) + 1, self.window, self.overlap)
        assert k is not None and self.ptr is not None
        k = np.asarray(k, dtype=np.int64)
        J = self.ptr[k + 1] - self.ptr[k]
        first = np.cumsum(J) - J
        at = np.repeat(self.ptr[k] - first, J) + np.arange(int(J.sum()), dtype=np.int64)
        return J, self.ends[at].astype(np.int64)

    @property
    def has_context(self) -> bool:
        """Whether any piece carries context or ends a window with a deferred target."""
        return self.overlap > 0 and self.rows.shape[0] > 0

    def find(self, positions: np.ndarray) -> np.ndarray:
        """``(m,)`` index into ``rows`` of each selection position, ``-1`` for a short row."""
        p = np.asarray(positions, dtype=np.int64)
        out = np.full(p.shape, -1, dtype=np.int64)
        if self.rows.shape[0] == 0:
            return out
        hit = np.flatnonzero((self.bits[p >> 3] >> (p & 7).astype(np.uint8)) & 1)
        out[hit] = np.searchsorted(self.rows, p[hit])
        return out

    def extra(self, positions: np.ndarray) -> np.ndarray:
        """``(m,)`` int64 positions each row's windows add (repeated context), 0 when short."""
        if self.ptr is None:  # plain cuts repeat nothing
            return np.zeros(np.shape(positions), dtype=np.int64)
        k = self.find(positions)
        long = k >= 0
        kk = np.where(long, k, 0)
        up = np.minimum(kk + 1, self.rows.shape[0])
        return np.where(long, (self.ptr[up] - self.ptr[kk] - 1) * self.overlap, 0)


_SCAN = 1 << 16  # counts decoded per pass when looking for the long rows (small temporaries)


def _segment_upper(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per row, the first index in ``[lo, hi)`` with ``values[i] > x`` (``hi`` if none): a
    binary search over every row at once (``values`` sorted within each segment)."""
    lo, hi = lo.copy(), hi.copy()
    last = max(values.shape[0] - 1, 0)
    while True:
        todo = lo < hi
        if not todo.any():
            return lo
        mid = (lo + hi) >> 1
        go = values[np.minimum(mid, last)] <= x if values.size else np.zeros_like(todo)
        lo = np.where(todo & go, mid + 1, lo)
        hi = np.where(todo & ~go, mid, hi)


def window_table(
    row_ids: Any,
    lengths: Any,
    *,
    window: int,
    overlap: int,
    cut_points: Mapping[int, np.ndarray] | Callable[[np.ndarray], Mapping] | None = None,
    units: bool = False,
) -> WindowTable:
    """The :class:`WindowTable` of a selection: the windows :func:`window_docs` cuts, computed
    for the long rows only, vectorised over rows (a batch of rows at a time, one pass per
    window index), so the temporaries stay a few megabytes.

    Args:
        row_ids: ``(N,)`` table ids of the selection (plain or compact).
        lengths: ``(N,)`` their token counts (plain or compact).
        window: ``W``.
        overlap: ``O``.
        cut_points: Optional ``row id -> sorted offsets`` (a :class:`CutPoints` is used in
            place), or a function reading those of the rows at some selection positions (called
            once per batch of long rows: the cut points are never all held at once).
        units: ``long_docs="units"``: end a window at the latest *section* boundary that leaves
            it a new token, so a unit that fits is never cut; else as a window (needs ranked cut
            points, see :func:`_snapped_windows`).
    """
    W, ov = check_window(window, overlap)
    if units and cut_points is None:
        raise PlanError("long_docs='units' needs a ranked cut column (cut_column=cut_structure)")
    N = int(np.shape(lengths)[0])
    if isinstance(lengths, np.ndarray):
        blocks = ((lo, lengths[lo : lo + _SCAN]) for lo in range(0, N, _SCAN))
    else:
        blocks = lengths.blocks(_SCAN)
    # Held as the table's rows (4 bytes each below 2**32 rows): no int64 copy to free later, whose
    # hole in the heap would stay resident while the epoch is planned.
    rows_dtype = order_dtype(N)
    plain = cut_points is None and ov == 0  # windows are a function of the length: not stored
    parts, windows = [], 0
    for lo, v in blocks:
        at = np.flatnonzero(v >= W)  # n + 1 > W
        parts.append((lo + at).astype(rows_dtype))
        if plain and at.size:
            windows += int((-(-(v[at].astype(np.int64) + 1) // W)).sum())
    long = np.concatenate(parts) if parts else np.zeros(0, dtype=rows_dtype)
    del parts
    M = long.shape[0]
    bits = np.zeros(-(-N // 8), dtype=np.uint8)
    np.bitwise_or.at(bits, long >> 3, (1 << (long & 7)).astype(np.uint8))
    if plain:
        return WindowTable(
            window=W, overlap=ov, rows=long, ptr=None, ends=None, num_windows=windows, bits=bits
        )
    cuts: Any = cut_points
    if cut_points is not None and M and not (isinstance(cuts, CutPoints) or callable(cuts)):
        cuts = CutPoints.from_mapping(cut_points, np.asarray(row_ids[long], dtype=np.int64))
    ptr = np.zeros(M + 1, dtype=np.int64)  # windows per row, then summed in place
    chunks: list[np.ndarray] = []
    kinds: list[np.ndarray] = []
    for a in range(0, M, _ROWS):
        at = long[a : a + _ROWS]
        P = np.asarray(lengths[at], dtype=np.int64) + 1
        if cuts is None:
            J, ends = _even_windows(P, W, ov)
        else:
            ids = np.asarray(row_ids[at], dtype=np.int64)
            mine = CutPoints.from_mapping(cuts(at), ids) if callable(cuts) else cuts
            J, ends, kind = _snapped_windows(P, ids, mine, W, ov, units=units)
            kinds.append(kind)
        ptr[a + 1 : a + 1 + at.shape[0]] = J
        chunks.append(ends.astype(np.int32 if int(P.max()) < 1 << 31 else np.int64))
    np.cumsum(ptr, out=ptr)
    dtype = np.int64 if any(c.dtype == np.int64 for c in chunks) else np.int32
    ends = np.concatenate(chunks).astype(dtype, copy=False) if chunks else np.zeros(0, np.int32)
    kind = None
    if cuts is not None:
        kind = np.concatenate(kinds) if kinds else np.zeros(0, dtype=np.int8)
    return WindowTable(
        window=W,
        overlap=ov,
        rows=long,
        ptr=ptr,
        ends=ends,
        num_windows=int(ends.shape[0]),
        bits=bits,
        kinds=kind,
    )


_ROWS = 1 << 13  # long rows cut per batch in window_table (their cut points read at once)


def _even_windows(P: np.ndarray, W: int, ov: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows per row and their ends, rows of ``P > W`` positions cut every ``W - O``."""
    stride = W - ov
    J = 1 + -(-(P - W) // stride)
    first = np.cumsum(J) - J
    j = np.arange(int(J.sum()), dtype=np.int64) - np.repeat(first, J)
    return J, np.minimum(j * stride + W, np.repeat(P, J))


def _snapped_windows(
    P: np.ndarray, ids: np.ndarray, cuts: CutPoints, W: int, ov: int, *, units: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Windows per row, their ends and what each ends at (:data:`END_KINDS`); one pass per
    window index, every row at once.

    Unranked cut points (``cuts.ranks is None``): a window ends at the latest cut point within
    its last eighth, else at ``W`` (:func:`window_docs`). Ranked: at the *strongest* cut point
    within its last quarter (the latest of that rank), else at ``W``. With ``units`` (ranked
    only), first at the latest section boundary anywhere in the window that leaves it a new token.
    """
    M = P.shape[0]
    seg_lo, seg_hi = cuts.segments(ids)
    if cuts.ranks is None:
        if units:
            raise PlanError(
                "long_docs='units' needs a ranked cut column (offsets with a kind each); add one "
                "with `tokenloom tokenize --table TABLE --tokenizer SPEC --structure`"
            )
        levels = [(0, cuts.values, seg_lo, seg_hi)]
        slack = max(1, W // 8)
    else:
        levels = []
        # only this batch's stretch of the offsets (rows ascend: their segments lie in it)
        has = seg_hi > seg_lo  # a row without cut points has the segment (0, 0)
        a = int(seg_lo[has].min()) if has.any() else 0
        b = int(seg_hi[has].max()) if has.any() else 0
        ranks, values = cuts.ranks[a:b], cuts.values[a:b]
        lo_b, hi_b = np.where(has, seg_lo - a, 0), np.where(has, seg_hi - a, 0)
        for r in (SECTION_RANK, 1, 0):  # strongest first: offsets of rank >= r, CSR per row
            keep = ranks >= r
            cm = np.zeros(keep.shape[0] + 1, dtype=np.int64)
            np.cumsum(keep, out=cm[1:])
            levels.append((r, values[keep], cm[lo_b], cm[hi_b]))
        slack = max(1, W // 4)
    s = np.zeros(M, dtype=np.int64)
    active = np.arange(M, dtype=np.int64)
    who, got, kinds = [], [], []  # per pass: the rows cut, where and at what their window ends
    while active.size:
        p, sa = P[active], s[active]
        done = p - sa <= W
        who.append(active[done])
        got.append(p[done])
        kinds.append(np.full(int(done.sum()), END_OF_DOC, dtype=np.int8))
        active, sa = active[~done], sa[~done]
        if not active.size:
            break
        limit = sa + W
        end = limit.copy()
        kind = np.full(active.shape[0], -1, dtype=np.int8)
        floor = np.maximum(sa + ov, limit - slack)
        tries = [(levels[0], sa + ov)] if units else []
        for (r, values, lo, hi_all), fl in tries + [(lv, floor) for lv in levels]:
            lo_a = lo[active]
            hi = _segment_upper(values, lo_a, hi_all[active], limit)
            has = hi > lo_a
            c = values[np.maximum(hi - 1, 0)].astype(np.int64) if values.size else limit
            ok = has & (c > fl) & (kind < 0)
            end[ok] = c[ok]
            kind[ok] = r
        who.append(active)
        got.append(end)
        kinds.append(kind)
        s[active] = end - ov
    row = np.concatenate(who)
    order = np.argsort(row, kind="stable")  # row by row, passes in order
    return np.bincount(row, minlength=M), np.concatenate(got)[order], np.concatenate(kinds)[order]


def naive_structured_ends(
    n: int, offsets: list[int], ranks: list[int] | None, *, window: int, overlap: int, units: bool
) -> list[tuple[int, int]]:
    """Slow reference of one row's windows in :func:`window_table` with cut points:
    ``(end position, kind)`` per window, one loop per window and per candidate."""
    W, ov, P = window, overlap, n + 1
    ranked = ranks is not None
    rk = list(ranks) if ranked else [0] * len(offsets)
    slack = max(1, W // 4) if ranked else max(1, W // 8)
    out, s = [], 0
    while P - s > W:
        best = None
        if units:
            sec = [c for c, r in zip(offsets, rk, strict=True) if r == 2 and s + ov < c <= s + W]
            best = (max(sec), 2) if sec else None
        if best is None:
            floor = max(s + ov, s + W - slack)
            inside = [(r, c) for c, r in zip(offsets, rk, strict=True) if floor < c <= s + W]
            best = (max(inside)[1], max(inside)[0]) if inside else (s + W, -1)
        out.append(best)
        s = best[0] - ov
    out.append((P, END_OF_DOC))
    return out


SECTION_RANK = 2
"""The rank of a section boundary (a unit's edge under ``long_docs="units"``)."""
END_OF_DOC = 3
"""The kind of a row's last window: it ends with the document."""
END_KINDS = {-1: "none", 0: "line", 1: "paragraph", 2: "section", END_OF_DOC: "end"}
"""What a window ends at, by :attr:`WindowTable.kinds` value."""


def _windowed_marks(order: np.ndarray, table: WindowTable, marks: np.ndarray) -> np.ndarray:
    """The concat plan's ``marks`` with each long row's repeated context added: a pass over the
    order testing the table's bitmap, without decoding the counts again (equal to
    :func:`~tokenloom.loader.plan.epoch.stream_marks` of the windowed sizes)."""
    K = MARK_EVERY
    add = np.zeros(marks.shape[0], dtype=np.int64)
    step = pass_chunk(order.shape[0])
    for a in range(0, order.shape[0], step):
        p = order[a : a + step].astype(np.int64)
        hit = np.flatnonzero((table.bits[p >> 3] >> (p & 7).astype(np.uint8)) & 1)
        if hit.size:
            np.add.at(add, (a + hit) // K + 1, table.extra(p[hit]))
    return marks + np.cumsum(add)


class _WindowedLens:
    """Token counts of the selection as the windowed stream sees them: each long row's own
    tokens plus its repeated context (read by gathers, like the counts; nothing per row held)."""

    def __init__(self, lens: Any, table: WindowTable) -> None:
        self.lens, self.table = lens, table
        self.shape = (int(np.shape(lens)[0]),)
        self.dtype = np.dtype(np.int64)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx: Any) -> np.ndarray:
        positions = np.asarray(idx)
        base = np.asarray(self.lens[positions], dtype=np.int64)
        if not self.table.has_context:
            return base
        return base + self.table.extra(positions)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class WindowedPlan:
    """One epoch of windows laid end to end in blocks (concat packing, ``long_docs="window"``).

    Held: the concat plan's visiting order (:class:`~tokenloom.loader.plan.epoch.EpochPlan`, 4 bytes
    per row) with stream offsets every :data:`~tokenloom.loader.plan.epoch.MARK_EVERY` rows counted
    in windowed positions, and the epoch-independent :class:`WindowTable` of the long rows; a
    lookup expands the rows around the requested blocks into their windows."""

    seed: int
    epoch: int
    seq_len: int
    window: int
    overlap: int
    stream: EpochPlan
    """The visiting order; its row sizes include each long row's repeated context."""
    table: WindowTable
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

    @property
    def docs(self) -> VirtualDocs:
        """Every piece of the epoch, in stream order. Built on each call (about 66 bytes per
        piece): for references and tests; lookups expand only the rows they need."""
        st = self.stream
        sizes = np.add(st.source_lens[st.order], 1, dtype=np.int64)
        return self.pieces(np.arange(st.num_docs, dtype=np.int64), np.cumsum(sizes) - sizes)[0]

    def counts(self, lo: int, hi: int) -> BlockCounts:
        """What blocks ``[lo, hi)`` hold (clipped to the epoch). O(log n)."""
        lo, hi = clip_range(lo, hi, self.num_blocks)
        L = self.seq_len
        a, b = min(lo * L, self.stream_len), min(hi * L, self.stream_len)
        tokens, eos = stream_counts(self.stream, a, b)
        return BlockCounts(tokens=tokens, eos=eos, filled=tokens + eos)

    def block_pools(self, blocks: np.ndarray) -> np.ndarray:
        """``(m,)`` pool of each block: 0, or -1 for a padding block (``-1``)."""
        return np.where(np.asarray(blocks) >= 0, 0, -1).astype(np.int64)

    def _bounds(self, docs: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(ids, n, J, local, j, start, end)`` of the pieces of documents ``docs``: per document
        its table id, tokens and pieces; per piece its document (index into ``docs``), window
        number and positions ``[start, end)`` in the row."""
        st = self.stream
        pos = st.order[docs].astype(np.int64)
        n = np.asarray(st.source_lens.lens[pos], dtype=np.int64)
        t = self.table
        k = t.find(pos)
        long = k >= 0
        if not long.any():  # whole documents only: one piece each
            one = np.ones(docs.shape[0], dtype=np.int64)
            local = np.arange(docs.shape[0], dtype=np.int64)
            return pos, n, one, local, local * 0, local * 0, n + 1
        J = np.ones(docs.shape[0], dtype=np.int64)
        J[long], long_ends = t.windows_of(k[long], n[long])
        first_piece = np.cumsum(J) - J
        total = int(J.sum())
        local = np.repeat(np.arange(docs.shape[0], dtype=np.int64), J)
        j = np.arange(total, dtype=np.int64) - first_piece[local]
        lp = long[local]
        end = n[local] + 1
        end[lp] = long_ends
        start = np.zeros(total, dtype=np.int64)
        later = np.flatnonzero(lp & (j > 0))  # a window after its row's first
        start[later] = end[later - 1] - self.overlap
        return pos, n, J, local, j, start, end

    def pieces(self, docs: np.ndarray, starts: np.ndarray) -> tuple[VirtualDocs, np.ndarray]:
        """The pieces of documents ``docs`` (visiting indices, ascending) whose windowed stream
        offsets are ``starts``: ``(pieces, piece_starts)``, in stream order."""
        pos, n, J, local, j, start, end = self._bounds(docs)
        ids = self.stream.source_ids[pos]
        first_piece = np.cumsum(J) - J
        size = end - start
        csum = np.cumsum(size)
        offset = csum - size - (csum - size)[first_piece][local]
        piece_starts = np.asarray(starts, dtype=np.int64)[local] + offset
        v = _pieces(local, ids, n, start, end, j == 0, end == n[local] + 1, self.overlap)
        v = VirtualDocs(
            doc=np.asarray(docs, dtype=np.int64)[local],
            row_id=v.row_id,
            doc_len=v.doc_len,
            tok_start=v.tok_start,
            tok_end=v.tok_end,
            has_eos=v.has_eos,
            ctx_end=v.ctx_end,
            ends_window=v.ends_window,
            size=v.size,
            has_context=self.table.has_context,
            context_tokens=v.context_tokens,
        )
        return v, piece_starts


def piece_sizes(
    table: WindowTable, positions: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(J, size)``: pieces of each document (int64) and positions of each piece (int32), in
    stream order, for documents at selection ``positions`` with ``counts`` tokens: the sizes
    :meth:`WindowedPlan.pieces` gives, without its other fields (best-fit's planner reads them
    for every document, a chunk at a time)."""
    n = np.asarray(counts)
    at = np.flatnonzero(n >= table.window)  # n + 1 > W: the table's rows, cut into windows
    J = np.ones(n.shape[0], dtype=np.int64)
    if not at.size:  # a piece has at most W <= L < 2**31 positions
        return J, np.add(n, 1, dtype=np.int32)
    k = None if table.ends is None else np.searchsorted(table.rows, np.asarray(positions)[at])
    Jl, ends = table.windows_of(k, n[at])
    J[at] = Jl
    first = np.cumsum(J) - J
    sizes = np.add(n, 1, dtype=np.int32)
    sizes = np.repeat(sizes, J)  # a long document's pieces are overwritten below
    fl = np.cumsum(Jl) - Jl  # first window of each long row in ``ends``
    starts = np.empty_like(ends)
    starts[1:] = ends[:-1] - table.overlap
    starts[fl] = 0
    dst = np.repeat(first[at] - fl, Jl) + np.arange(ends.shape[0], dtype=np.int64)
    sizes[dst] = ends - starts
    return J, sizes


def check_table(table: WindowTable, rows: int, *, window: int, overlap: int) -> WindowTable:
    """``table`` when it was cut for a selection of ``rows`` rows with these window options.

    Raises:
        PlanError: naming the mismatch and the fix.
    """
    if table.bits.shape[0] != -(-rows // 8):
        raise PlanError(
            f"the window table was cut for another selection (bitmap of "
            f"{table.bits.shape[0]} bytes, {rows} rows); cut it again "
            "with window_table(row_ids, n_tokens, ...)"
        )
    if (table.window, table.overlap) != (window, overlap):
        raise PlanError(
            f"the window table was cut for window={table.window}, overlap={table.overlap}, "
            f"not window={window}, overlap={overlap}"
        )
    return table


def plan_windowed_epoch(
    row_ids: np.ndarray,
    n_tokens: np.ndarray,
    *,
    seed: int,
    epoch: int,
    seq_len: int,
    window: int,
    overlap: int,
    cut_points: Mapping[int, np.ndarray] | WindowTable | None = None,
    store: Any = None,
    visit: Visit | None = None,
    ordering: Any = None,
    order: np.ndarray | None = None,
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
        cut_points: Optional boundary hook (see :func:`window_docs`), or the selection's
            :class:`WindowTable` already computed (it is the same every epoch).
        store: Optional :class:`~tokenloom.loader.pipeline.planstore.PlanStore` for the visiting
        order. visit: Optional hook of :func:`~tokenloom.loader.plan.epoch.plan_epoch` (the rows'
        own counts). ordering: Optional curriculum order
        (:func:`~tokenloom.loader.plan.epoch.plan_epoch`). order: Optional explicit visiting order
        (see :func:`~tokenloom.loader.plan.epoch.plan_epoch`).

    Returns:
        The :class:`WindowedPlan`. With ``W = L, O = 0`` its stream equals
        :func:`~tokenloom.loader.plan.epoch.plan_epoch`'s.
    """
    W, ov = check_window(window, overlap, seq_len)
    base = plan_epoch(
        row_ids,
        n_tokens,
        seed=seed,
        epoch=epoch,
        seq_len=seq_len,
        store=store,
        visit=visit,
        ordering=ordering,
        order=order,
    )
    if isinstance(cut_points, WindowTable):
        table = check_table(cut_points, int(base.source_ids.shape[0]), window=W, overlap=ov)
    else:
        table = window_table(
            base.source_ids, base.source_lens, window=W, overlap=ov, cut_points=cut_points
        )
    lens = _WindowedLens(base.source_lens, table)
    marks = (
        _readonly(_windowed_marks(base.order, table, base.marks))
        if table.has_context
        else base.marks
    )
    stream_len = int(marks[-1])
    L = base.seq_len
    num_blocks = -(-stream_len // L)
    stream = dataclasses.replace(
        base,
        marks=marks,
        source_lens=lens,
        num_tokens=stream_len - base.num_docs,
        stream_len=stream_len,
        num_blocks=num_blocks,
        padding_positions=num_blocks * L - stream_len,
    )
    return WindowedPlan(
        seed=base.seed,
        epoch=base.epoch,
        seq_len=L,
        window=W,
        overlap=ov,
        stream=stream,
        table=table,
        empty_rows=base.empty_rows,
        num_docs=base.num_docs,
        num_tokens=base.num_tokens,
        context_tokens=table.context_tokens,
        stream_len=stream_len,
        num_blocks=num_blocks,
        padding_positions=num_blocks * L - stream_len,
    )


def naive_windowed_layout(
    row_ids: np.ndarray,
    n_tokens: np.ndarray,
    *,
    seed: int,
    epoch: int,
    window: int,
    overlap: int,
    cut_points: Mapping[int, np.ndarray] | None = None,
) -> tuple[VirtualDocs, np.ndarray]:
    """The former layout of :class:`WindowedPlan` (every piece of the epoch as arrays, ~66 bytes
    per piece): ``(pieces in stream order, (V + 1,) stream offsets)``. A reference for tests."""
    base = plan_epoch(row_ids, n_tokens, seed=seed, epoch=epoch, seq_len=1)
    docs = window_docs(
        base.row_ids, base.lengths, window=window, overlap=overlap, cut_points=cut_points
    )
    starts = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum(docs.size, out=starts[1:])
    return docs, starts


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
    """The stretches of the requested blocks of a :class:`WindowedPlan`. O(m log n + S).

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
    L = plan.seq_len
    real = np.flatnonzero(req >= 0)
    if real.size == 0:
        return empty_spans(req, L, windowed=plan.table.has_context)
    lo = req[real] * L
    hi = np.minimum(lo + L, plan.stream_len)
    docs, dstarts, _ = plan.stream.covering(lo, hi)
    pieces, starts = plan.pieces(docs, dstarts)
    ends = starts + pieces.size
    first = np.searchsorted(starts, lo, side="right") - 1
    last = np.searchsorted(starts, hi, side="left") - 1
    counts = last - first + 1
    total = int(counts.sum())
    offsets = np.cumsum(counts) - counts
    which = np.repeat(np.arange(real.shape[0]), counts)
    piece = np.repeat(first, counts) + (np.arange(total) - np.repeat(offsets, counts))
    blk_lo = lo[which]
    p_start, p_end = starts[piece], ends[piece]
    s0 = np.maximum(p_start, blk_lo)
    s1 = np.minimum(p_end, hi[which])
    return piece_stretches(
        pieces, req, L, real[which], s0 - blk_lo, piece, s0 - p_start, s1 - p_start
    )
