"""The windowed plan holds the visiting order and the long rows' windows only; every lookup equals
the former layout's (every piece of the epoch as arrays), cut points included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.loader.plan.compact import encode
from tokenloom.loader.plan.epoch import PlanError
from tokenloom.loader.plan.window import (
    CutPoints,
    naive_windowed_layout,
    piece_stretches,
    plan_windowed_epoch,
    window_docs,
    window_table,
)

FIELDS = ("block", "pos", "doc", "row_id", "doc_len", "tok_start", "tok_end", "has_eos")


def former_spans(docs, starts, seq_len: int, stream_len: int, blocks: np.ndarray):
    """The former ``windowed_spans``: binary search over every piece's stream offset."""
    req = np.asarray(blocks, dtype=np.int64)
    real = np.flatnonzero(req >= 0)
    lo = req[real] * seq_len
    hi = np.minimum(lo + seq_len, stream_len)
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
        docs, req, seq_len, real[which], s0 - blk_lo, piece, s0 - p_start, s1 - p_start
    )


@st.composite
def selections(draw: st.DrawFn):
    n = draw(st.integers(0, 40))
    lens = draw(st.lists(st.integers(0, 120), min_size=n, max_size=n))
    ids = np.cumsum(draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))).astype(np.int64)
    L = draw(st.integers(2, 40))
    W = draw(st.integers(1, L))
    ov = draw(st.integers(0, W - 1))
    cuts = None
    if draw(st.booleans()):
        cuts = {
            int(r): np.sort(np.array(draw(st.lists(st.integers(0, 130), max_size=12)), np.int64))
            for r in ids.tolist()
            if draw(st.booleans())
        }
    return ids, np.array(lens, dtype=np.int64), L, W, ov, cuts


@settings(derandomize=True, max_examples=80, deadline=None)
@given(
    sel=selections(),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 2),
    csr=st.booleans(),
    compact=st.booleans(),
    data=st.data(),
)
def test_windowed_plan_equals_the_former_layout(sel, seed, epoch, csr, compact, data) -> None:
    ids, lens, L, W, ov, cuts = sel
    hook = CutPoints.from_mapping(cuts) if csr and cuts is not None else cuts
    counts = encode(lens) if compact else lens  # plain and compact selections alike
    plan = plan_windowed_epoch(
        ids, counts, seed=seed, epoch=epoch, seq_len=L, window=W, overlap=ov,
        cut_points=hook,
    )  # fmt: skip
    docs, starts = naive_windowed_layout(
        ids, lens, seed=seed, epoch=epoch, window=W, overlap=ov, cut_points=cuts
    )
    stream_len = int(starts[-1])
    assert plan.stream_len == stream_len
    assert plan.num_blocks == -(-stream_len // L)
    assert plan.context_tokens == docs.context_tokens
    assert plan.num_tokens == int(lens.sum())
    everything = list(range(plan.num_blocks)) + [-1]
    picked = data.draw(st.lists(st.sampled_from(everything), max_size=6))
    for blocks in (everything, picked):
        got = plan.spans(np.array(blocks, dtype=np.int64))
        want = former_spans(docs, starts, L, stream_len, np.array(blocks))
        for f in FIELDS:
            assert np.array_equal(getattr(got, f), getattr(want, f)), f
        for f in ("ctx_end", "ends_window"):
            g, w = getattr(got, f), getattr(want, f)
            assert (g is None) == (w is None) and (g is None or np.array_equal(g, w)), f
    for lo in range(0, plan.num_blocks + 1, max(1, plan.num_blocks // 3)):
        a, b = min(lo * L, stream_len), min((lo + 2) * L, stream_len)
        eos_at = starts[1:][docs.has_eos] - 1
        eos = int(np.searchsorted(eos_at, b) - np.searchsorted(eos_at, a))
        c = plan.counts(lo, lo + 2)
        assert (c.tokens, c.eos, c.filled) == (b - a - eos, eos, b - a)


@settings(derandomize=True, max_examples=100, deadline=None)
@given(sel=selections())
def test_window_table_cuts_the_windows_of_window_docs(sel) -> None:
    ids, lens, _, W, ov, cuts = sel
    keep = lens > 0
    ids, lens = ids[keep], lens[keep]
    table = window_table(ids, lens, window=W, overlap=ov, cut_points=cuts)
    v = window_docs(ids, lens, window=W, overlap=ov, cut_points=cuts)
    long = np.flatnonzero(lens + 1 > W)
    assert table.rows.tolist() == long.tolist()
    for i, k in enumerate(long.tolist()):
        mine = np.flatnonzero(v.doc == k)
        ends = v.tok_end[mine] + v.has_eos[mine]
        assert table.windows_of(np.array([i]), lens[k : k + 1])[1].tolist() == ends.tolist()
    assert table.context_tokens == v.context_tokens
    assert table.num_windows == int(np.isin(v.doc, long).sum())
    assert (table.ends is None) == (cuts is None and ov == 0)  # plain cuts are not stored


def test_a_window_table_is_checked_against_the_selection_and_the_options() -> None:
    ids, lens = np.arange(20, dtype=np.int64), np.full(20, 50, dtype=np.int64)
    table = window_table(ids, lens, window=16, overlap=2)
    plan = plan_windowed_epoch(
        ids, lens, seed=0, epoch=0, seq_len=16, window=16, overlap=2, cut_points=table
    )
    assert (
        plan.stream_len
        == plan_windowed_epoch(
            ids, lens, seed=0, epoch=0, seq_len=16, window=16, overlap=2
        ).stream_len
    )
    with pytest.raises(PlanError, match="window=16, overlap=2"):
        plan_windowed_epoch(ids, lens, seed=0, epoch=0, seq_len=16, window=16, overlap=3,
                            cut_points=table)  # fmt: skip
    with pytest.raises(PlanError, match="another selection"):
        plan_windowed_epoch(ids[:9], lens[:9], seed=0, epoch=0, seq_len=16, window=16,
                            overlap=2, cut_points=table)  # fmt: skip


@settings(derandomize=True, max_examples=40, deadline=None)
@given(sel=selections())
def test_cut_points_read_a_batch_of_rows_at_a_time_give_the_same_table(sel) -> None:
    ids, lens, _, W, ov, cuts = sel
    if cuts is None:
        cuts = {}
    asked = []

    def read(positions):  # what the planner does: take the rows' cut points from the table
        asked.append(positions.copy())
        return {int(ids[p]): cuts[int(ids[p])] for p in positions.tolist() if int(ids[p]) in cuts}

    got = window_table(ids, lens, window=W, overlap=ov, cut_points=read)
    want = window_table(ids, lens, window=W, overlap=ov, cut_points=cuts)
    assert got.rows.tolist() == want.rows.tolist() and got.ptr.tolist() == want.ptr.tolist()
    assert got.ends.tolist() == want.ends.tolist()
    long = np.flatnonzero(lens + 1 > W).tolist()
    assert (np.concatenate(asked).tolist() if asked else []) == long  # only the long rows
