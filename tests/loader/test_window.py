"""Overlapping windows of long documents: the expansion, the concat plan over them, the packer."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.loader.helpers import (
    assert_packed_equal,
    columns,
    corpora,
    epochs,
    gather,
    make_rows,
    seeds,
)
from tests.loader.recipe_ref import (
    context_of,
    fast_pack,
    naive_concat_blocks,
    naive_pack_positions,
    naive_pieces,
    trained_targets,
)
from tokenloom.loader import IGNORE_INDEX, PlanError, block_spans, pack_blocks, plan_epoch
from tokenloom.loader.plan.window import (
    naive_window_docs,
    plan_windowed_epoch,
    window_docs,
    windowed_spans,
)


@st.composite
def window_options(draw: st.DrawFn, L: int) -> tuple[int, int]:
    W = draw(st.integers(1, L))
    return W, draw(st.integers(0, W - 1))


def as_tuples(v) -> list[tuple]:
    cols = (v.doc, v.row_id, v.tok_start, v.tok_end, v.has_eos, v.ctx_end, v.ends_window)
    return [tuple(x.item() for x in row) for row in zip(*cols, strict=True)]


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 80), max_size=8),
    W=st.integers(1, 20),
    data=st.data(),
    snap=st.booleans(),
)
def test_windows_match_naive_and_carry_exactly_overlap_context(
    lengths: list[int], W: int, data: st.DataObject, snap: bool
) -> None:
    ov = data.draw(st.integers(0, W - 1))
    ids = [5 + 3 * i for i in range(len(lengths))]
    cuts = None
    if snap:
        cuts = {r: np.sort(data.draw(st.lists(st.integers(0, 90), max_size=6))) for r in ids}
    v = window_docs(np.array(ids), np.array(lengths), window=W, overlap=ov, cut_points=cuts)
    assert as_tuples(v) == naive_window_docs(ids, lengths, window=W, overlap=ov, cut_points=cuts)
    assert (v.size <= W).all() or W == 0
    for k, n in enumerate(lengths):
        mine = np.flatnonzero(v.doc == k)
        if n + 1 <= W:
            assert len(mine) == 1
        ctx = v.ctx_end[mine] - v.tok_start[mine]
        assert ctx[0] == 0 and (ctx[1:] == ov).all()  # exactly O context tokens after the first
        assert v.has_eos[mine].tolist() == [False] * (len(mine) - 1) + [True]
        assert v.ends_window[mine].tolist() == [ov > 0] * (len(mine) - 1) + [False]
        # Non-context positions tile [0, n + 1) exactly once, in order.
        new = [
            (int(c), int(e) + int(h))
            for c, e, h in zip(v.ctx_end[mine], v.tok_end[mine], v.has_eos[mine], strict=True)
        ]
        assert new[0][0] == 0 and new[-1][1] == n + 1
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(new, new[1:], strict=False))


def test_worked_windows() -> None:
    # 10 tokens = 11 positions, W = 4, O = 1: stride 3 -> [0,4) [3,7) [6,10) [9,11).
    v = window_docs(np.array([7]), np.array([10]), window=4, overlap=1)
    assert v.tok_start.tolist() == [0, 3, 6, 9]
    assert v.tok_end.tolist() == [4, 7, 10, 10]
    assert v.has_eos.tolist() == [False, False, False, True]
    assert v.ctx_end.tolist() == [0, 4, 7, 10]
    assert v.ends_window.tolist() == [True, True, True, False]
    # Snapping to offered boundaries, only within the window's last eighth (slack W // 8 = 2):
    # W = 16, O = 2, 40 tokens; boundary 15 is taken, 20 is not (beyond the window), 29 is.
    s = window_docs(
        np.array([7]), np.array([40]), window=16, overlap=2, cut_points={7: [5, 15, 20, 29]}
    )
    assert list(zip(s.tok_start.tolist(), s.tok_end.tolist(), strict=True)) == [
        (0, 15),
        (13, 29),
        (27, 40),
    ]
    # A boundary too early in the window (5) is not used: it would waste most of the window.
    early = window_docs(np.array([7]), np.array([40]), window=16, overlap=2, cut_points={7: [5]})
    assert early.tok_end.tolist()[0] == 16


def test_worked_pack_with_context() -> None:
    # One row of 6 tokens [1..6], W = L = 4, O = 2: windows [0,4) [2,6) [4,7).
    rows = make_rows([6])
    plan = plan_windowed_epoch(*columns(rows), seed=0, epoch=0, seq_len=4, window=4, overlap=2)
    out = fast_pack(plan, windowed_spans, rows, range(plan.num_blocks), lookahead=True)
    assert out.input_ids.tolist() == [[1, 2, 3, 4], [3, 4, 5, 6], [5, 6, 0, -1]]
    assert out.labels.tolist() == [
        [2, 3, 4, -100],  # 5 is trained by the next window, with context
        [-100, 5, 6, -100],  # 3 -> 4 is context; 4 -> 5 trains the first new token
        [-100, 0, -100, -100],  # 6 -> EOS
    ]
    assert out.context.tolist() == [[0, 0], [2, 4], [4, 6]]
    assert out.context_positions == 4 and out.loss_positions == 6  # targets 2..6 and the EOS
    assert out.spans.tolist() == [[0, 0, 5, 0, 4], [1, 0, 5, 2, 6], [2, 0, 5, 4, 6]]


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    corpus=corpora(max_docs=6), seed=seeds, epoch=epochs, lookahead=st.booleans(), data=st.data()
)
def test_windowed_concat_packs_like_the_naive_walk(
    corpus: tuple[int, list[int]], seed: int, epoch: int, lookahead: bool, data: st.DataObject
) -> None:
    L, lengths = corpus
    lengths = [min(n, 6 * L) for n in lengths]  # keep the naive walk short
    W, ov = data.draw(window_options(L))
    rows = make_rows(lengths)
    plan = plan_windowed_epoch(
        *columns(rows), seed=seed, epoch=epoch, seq_len=L, window=W, overlap=ov
    )
    ref = naive_concat_blocks(
        rows, naive_pieces(rows, seed=seed, epoch=epoch, window=W, overlap=ov), L
    )
    assert len(ref) == plan.num_blocks
    everything = list(range(plan.num_blocks)) + [-1]
    picked = data.draw(st.lists(st.sampled_from(everything), max_size=5))
    for blocks in (everything, picked):
        got = fast_pack(plan, windowed_spans, rows, blocks, lookahead=lookahead)
        want, want_ctx = naive_pack_positions(rows, ref, blocks, L=L, lookahead=lookahead)
        assert_packed_equal(got, want)
        assert np.array_equal(context_of(got), want_ctx)
        assert got.context_positions == int((want_ctx[:, 1] - want_ctx[:, 0]).sum())


@settings(derandomize=True, max_examples=250, deadline=None)
@given(corpus=corpora(max_docs=8), seed=seeds, data=st.data())
def test_every_new_token_once_and_every_target_trained_once(
    corpus: tuple[int, list[int]], seed: int, data: st.DataObject
) -> None:
    L, lengths = corpus
    W, ov = data.draw(window_options(L))
    rows = make_rows(lengths)
    where = {int(x): (rid, t) for rid, toks in rows.items() for t, x in enumerate(toks)}
    plan = plan_windowed_epoch(*columns(rows), seed=seed, epoch=1, seq_len=L, window=W, overlap=ov)
    out = fast_pack(plan, windowed_spans, rows, range(plan.num_blocks), lookahead=True)
    ctx, prov = context_of(out), out.spans
    new = Counter()
    for (_, _, rid, a, b), (c0, c1) in zip(prov.tolist(), ctx.tolist(), strict=True):
        new.update((rid, t) for t in range(c1, b))
        assert c0 == a and c1 - c0 <= ov
    want = Counter((rid, t) for rid, toks in rows.items() for t in range(len(toks)))
    assert new == want  # every non-context token exactly once per epoch
    assert int((ctx[:, 1] - ctx[:, 0]).sum()) == plan.context_tokens == out.context_positions
    got_t = Counter(trained_targets(out, where))  # the EOS is target n of its row
    want_t = Counter((rid, t) for rid, toks in rows.items() for t in range(1, len(toks) + 1))
    assert got_t == want_t  # every target 1..n (the EOS included) trained exactly once
    assert out.loss_positions == sum(want_t.values())
    assert (out.labels[out.input_ids == 0] == IGNORE_INDEX).all()


def test_window_equal_to_block_without_overlap_is_plain_concat() -> None:
    rows = make_rows([3, 40, 7, 0, 16])
    ids, n = columns(rows)
    plan = plan_windowed_epoch(ids, n, seed=3, epoch=2, seq_len=8, window=8, overlap=0)
    base = plan_epoch(ids, n, seed=3, epoch=2, seq_len=8)
    assert (plan.num_blocks, plan.stream_len) == (base.num_blocks, base.stream_len)
    blocks = np.arange(base.num_blocks)
    a = fast_pack(plan, windowed_spans, rows, blocks, lookahead=True)
    b = fast_pack(base, block_spans, rows, blocks, lookahead=True)
    assert a.context is None
    assert np.array_equal(a.input_ids, b.input_ids) and np.array_equal(a.labels, b.labels)
    assert a.loss_positions == b.loss_positions


@pytest.mark.parametrize(
    ("W", "ov", "L", "match"),
    [(4, 4, 8, "overlap < window"), (0, 0, 8, "overlap < window"), (9, 1, 8, "window <= seq_len")],
)
def test_rejects_bad_windows(W: int, ov: int, L: int, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        plan_windowed_epoch(
            np.array([1]), np.array([5]), seed=0, epoch=0, seq_len=L, window=W, overlap=ov
        )


def test_pack_refuses_a_window_end_holding_the_eos() -> None:
    rows = make_rows([3])
    plan = plan_windowed_epoch(*columns(rows), seed=0, epoch=0, seq_len=4, window=4, overlap=1)
    spans = windowed_spans(plan, np.array([0]))
    bad = dataclasses.replace(spans, ends_window=np.ones(len(spans), dtype=bool))
    tokens, offsets = gather(bad, rows, lookahead=False)
    with pytest.raises(PlanError, match="both ends its window and holds its document's EOS"):
        pack_blocks(
            bad,
            tokens,
            offsets,
            num_blocks_in_batch=1,
            seq_len=4,
            eos_id=0,
            pad_id=-1,
            lookahead=False,
        )
