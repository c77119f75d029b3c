"""Best-fit packing: agrees with a loop, never cuts a fitting document, conserves tokens."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.loader.helpers import assert_packed_equal, columns, corpora, epochs, make_rows, seeds
from tests.loader.recipe_ref import (
    context_of,
    fast_pack,
    naive_bestfit_blocks,
    naive_pack_positions,
    naive_pieces,
    trained_targets,
)
from tokenloom.loader import PlanError
from tokenloom.loader.plan.bestfit import (
    BESTFIT_ALGORITHM,
    best_fit_blocks,
    best_fit_blocks_reference,
    bestfit_spans,
    naive_best_fit_blocks,
    pack_pieces,
    padding_by_window,
    plan_bestfit,
)
from tokenloom.loader.plan.epoch import plan_epoch
from tokenloom.loader.plan.window import window_docs


def realistic_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Lognormal token counts with median ~450 and mean ~800."""
    sigma = np.sqrt(2 * np.log(800 / 450))
    rng = np.random.default_rng(seed)
    return np.maximum(rng.lognormal(np.log(450), sigma, n).astype(np.int64), 1)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(
    L=st.integers(1, 24),
    data=st.data(),
)
def test_best_fit_blocks_match_the_loop(L: int, data: st.DataObject) -> None:
    sizes = data.draw(st.lists(st.integers(1, L), max_size=40))
    window_of = sorted(
        data.draw(st.lists(st.integers(0, 4), min_size=len(sizes), max_size=len(sizes)))
    )
    block, nb = best_fit_blocks(np.array(sizes, np.int64), np.array(window_of, np.int64), seq_len=L)
    fast = [np.flatnonzero(block == b).tolist() for b in range(nb)]
    assert fast == naive_best_fit_blocks(sizes, window_of, seq_len=L)
    fill = np.bincount(block, weights=sizes, minlength=nb) if sizes else np.zeros(0)
    assert (fill <= L).all()


def _random_case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    """Pieces for the compiled planner: small ``L``, many windows, many ties, sizes ``L`` and 1."""
    # up to 4 levels of the capacity bitset (32 bits a word); counting sort and merge sort
    L = int(rng.choice([1, 2, 3, 5, 8, 16, 31, 32, 33, 64, 100, 1023, 1024, 4096, 70_000]))
    V = int(rng.integers(0, 120))
    kind = int(rng.integers(0, 5))
    if kind == 0:  # few distinct sizes: ties everywhere
        sizes = rng.choice(np.unique(rng.integers(1, L + 1, 3)), V)
    elif kind == 1:  # the extremes only
        sizes = rng.choice([1, L], V)
    elif kind == 2:  # halves and thirds: blocks fill exactly and classes refill
        sizes = rng.choice(np.unique(np.maximum([L // 2, L // 3, L - L // 3, 1], 1)), V)
    else:
        sizes = rng.integers(1, L + 1, V)
    windows = int(rng.choice([1, 2, 5, max(V, 1)]))
    window_of = np.sort(rng.integers(0, windows, V))
    return sizes.astype(np.int64), window_of, L


def test_compiled_best_fit_equals_the_former_loop() -> None:
    """The compiled planner gives exactly the blocks (and their order) of the Python loop."""
    rng = np.random.default_rng(20261202)
    for _ in range(3000):
        sizes, window_of, L = _random_case(rng)
        got, nb = best_fit_blocks(sizes, window_of, seq_len=L)
        want, nb_want = best_fit_blocks_reference(sizes, window_of, seq_len=L)
        assert nb == nb_want
        assert np.array_equal(got, want), (L, sizes.tolist(), window_of.tolist())
    for L in (1024, 2048, 5000):  # windows of hundreds of pieces at a large L: counting sort
        sizes = np.minimum(rng.lognormal(np.log(L / 4), 1.0, 3000).astype(np.int64) + 1, L)
        window_of = np.sort(rng.integers(0, 4, 3000))
        got, nb = best_fit_blocks(sizes, window_of, seq_len=L)
        want, nb_want = best_fit_blocks_reference(sizes, window_of, seq_len=L)
        assert nb == nb_want and np.array_equal(got, want)
    # empty input, one piece, one window of equal pieces (ties to the earliest opened block)
    for sizes, L in (([], 4), ([4], 4), ([1], 4), ([2] * 9, 4), ([3, 1, 1, 3, 2, 2], 4)):
        a, w = np.array(sizes, np.int64), np.zeros(len(sizes), np.int64)
        got, nb = best_fit_blocks(a, w, seq_len=L)
        want, nb_want = best_fit_blocks_reference(a, w, seq_len=L)
        assert nb == nb_want and np.array_equal(got, want)


def test_python_planner_equals_the_former_loop() -> None:
    """:func:`pack_windows_python` (large pieces placed at once, a bytearray of capacities) gives
    exactly the former loop's blocks, their order and the blocks per window."""
    import tokenloom.loader.plan.bestfit as bf

    def packed(fn, sizes, window_of, L):  # noqa: ANN001, ANN202
        V = sizes.shape[0]
        win_ptr = np.concatenate([[0], np.flatnonzero(np.diff(window_of)) + 1, [V]]) if V else [0]
        pieces, count = np.empty(V, np.int64), np.empty(V, np.int64)
        per_window = fn(sizes, np.asarray(win_ptr), L, pieces, count)
        nb = int(per_window.sum())
        return per_window.tolist(), pieces.tolist(), count[:nb].tolist()

    rng = np.random.default_rng(20261203)
    cases = [_random_case(rng) for _ in range(3000)]
    for L in (1024, 2048, 2047):  # windows of hundreds of pieces, a third of them over L / 2
        sizes = np.minimum(rng.lognormal(np.log(L / 3), 1.0, 3000).astype(np.int64) + 1, L)
        cases.append((sizes, np.sort(rng.integers(0, 4, 3000)), L))
    for L in (1, 2, 7):  # every piece large, or none: L // 2 at its edges
        cases.append((rng.integers(1, L + 1, 200), np.sort(rng.integers(0, 3, 200)), L))
    for sizes, window_of, L in cases:
        want = packed(bf._pack_windows_reference, sizes, window_of, L)
        assert packed(bf.pack_windows_python, sizes, window_of, L) == want, (L, sizes.tolist())
        # counting only (empty outputs), as planning does
        none = np.empty(0, np.int64)
        V = sizes.shape[0]
        win_ptr = np.concatenate([[0], np.flatnonzero(np.diff(window_of)) + 1, [V]]) if V else [0]
        assert bf.pack_windows_python(sizes, np.asarray(win_ptr), L, none, none).tolist() == want[0]


def test_compiled_best_fit_breaks_ties_by_smallest_block_id() -> None:
    # L = 10: 6, 6, 6 open blocks 0, 1, 2 (4 left each); 4 goes to block 0 (now full), 3 to block 1
    # (1 left), 3 to block 2 (1 left): class 1 got block 1 then 2; 1 goes to block 1 first.
    sizes = np.array([6, 6, 6, 4, 3, 3, 1, 1])
    block, nb = best_fit_blocks(sizes, np.zeros(8, np.int64), seq_len=10)
    assert nb == 3 and block.tolist() == [0, 1, 2, 0, 1, 2, 1, 2]
    # A class filled out of opening order: block 2 reaches 3 left before block 0 does.
    sizes = np.array([7, 5, 5, 2, 2, 3, 3])  # L = 10
    got, _ = best_fit_blocks(sizes, np.zeros(7, np.int64), seq_len=10)
    want, _ = best_fit_blocks_reference(sizes, np.zeros(7, np.int64), seq_len=10)
    assert got.tolist() == want.tolist()


def test_pack_pieces_lists_each_block_in_visiting_order() -> None:
    sizes = np.array([3, 5, 2, 1, 4], np.int32)
    pieces, ptr, per_window = pack_pieces(sizes, np.array([0, 3, 5]), seq_len=8)
    block, nb = best_fit_blocks_reference(sizes, np.array([0, 0, 0, 1, 1]), seq_len=8)
    assert per_window.tolist() == [2, 1] and ptr.shape == (nb + 1,)
    assert [pieces[ptr[b] : ptr[b + 1]].tolist() for b in range(nb)] == [
        np.flatnonzero(block == b).tolist() for b in range(nb)
    ]


def test_plans_by_the_compiled_and_the_python_planner_are_equal(monkeypatch) -> None:  # noqa: ANN001
    """Small selections plan without numba (:data:`COMPILED_MIN_DOCS`): the same blocks, their
    order and their lookups as the compiled planner's."""
    import tokenloom.loader.plan.bestfit as bf

    rng = np.random.default_rng(11)
    for L, F, n in ((64, 16, 2000), (2048, 1024, 3000), (16, 1, 500)):
        lens = np.where(rng.random(n) < 0.05, 0, realistic_lengths(n, seed=L) % (3 * L) + 1)
        ids = np.cumsum(rng.integers(1, 3, n))
        kw = {"seed": 2, "epoch": 1, "seq_len": L, "fit_window": F}
        python = plan_bestfit(ids, lens, **kw)
        monkeypatch.setattr(bf, "COMPILED_MIN_DOCS", 0)
        compiled = plan_bestfit(ids, lens, **kw)
        monkeypatch.undo()
        assert np.array_equal(python.window_blocks, compiled.window_blocks)
        for got, want in zip(python.layout(), compiled.layout(), strict=True):
            for name in ("doc", "row_id", "size") if hasattr(got, "doc") else (None,):
                a, b = (got, want) if name is None else (getattr(got, name), getattr(want, name))
                assert np.array_equal(a, b), name
        blocks = rng.integers(-1, python.num_blocks, 50)
        a, b = python.spans(blocks), compiled.spans(blocks)
        for name in ("block", "pos", "doc", "row_id", "tok_start", "tok_end", "has_eos"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert bf.pack_kernel(bf.COMPILED_MIN_DOCS - 1) is bf.pack_windows_python


def _former_layout(ids, lens, *, seed, epoch, L, F, W, ov, cuts):  # noqa: ANN001, ANN202
    """The former plan_bestfit: every piece as arrays, then the Python best-fit loop."""
    base = plan_epoch(ids, lens, seed=seed, epoch=epoch, seq_len=L)
    docs = window_docs(base.row_ids, base.lengths, window=W, overlap=ov, cut_points=cuts)
    block, nb = best_fit_blocks_reference(docs.size, docs.doc // F, seq_len=L)
    return docs, np.argsort(block, kind="stable"), np.bincount(block, minlength=nb)


@pytest.mark.parametrize("policy", ["split", "window", "cuts"])
def test_plan_equals_the_former_plan(policy: str) -> None:
    """The whole epoch (pieces, blocks, their order) equals the former planner's, long documents
    split, cut into overlapping windows, or cut at boundaries."""
    rng = np.random.default_rng({"split": 1, "window": 2, "cuts": 3}[policy])
    for trial in range(40):
        L = int(rng.choice([4, 16, 64]))
        n = int(rng.integers(0, 300))
        lens = np.where(rng.random(n) < 0.1, 0, rng.integers(1, 3 * L, n))
        ids = np.cumsum(rng.integers(1, 4, n))
        F = int(rng.choice([1, 3, 16, 1000]))
        W, ov, cuts, kw = L, 0, None, {}
        if policy != "split":
            W = int(rng.integers(2, L + 1))
            ov = int(rng.integers(0, W))
            kw = {"long_docs": "window", "window": W, "overlap": ov}
        if policy == "cuts":
            cuts = {int(i): np.sort(rng.choice(np.arange(1, 3 * L), 5)) for i in ids}
            kw["cut_points"] = cuts
        plan = plan_bestfit(ids, lens, seed=trial, epoch=1, seq_len=L, fit_window=F, **kw)
        docs, pieces, counts = _former_layout(
            ids, lens, seed=trial, epoch=1, L=L, F=F, W=W, ov=ov, cuts=cuts
        )
        got_docs, ptr, got_pieces = plan.layout()
        assert plan.num_blocks == counts.shape[0]
        assert np.array_equal(np.diff(ptr), counts)
        assert np.array_equal(got_pieces, pieces)
        for name in ("doc", "row_id", "tok_start", "tok_end", "has_eos", "ctx_end", "size"):
            assert np.array_equal(getattr(got_docs, name), getattr(docs, name)), name
        assert plan.filled_positions == int(docs.size.sum())
        for lo, hi in ((0, plan.num_blocks), (1, max(plan.num_blocks - 1, 1)), (2, 3)):
            c = plan.counts(lo, hi)
            lo_, hi_ = min(lo, plan.num_blocks), min(max(hi, lo), plan.num_blocks)
            mine = pieces[counts[:lo_].sum() : counts[:hi_].sum()]
            assert c.filled == int(docs.size[mine].sum())
            assert c.eos == int(docs.has_eos[mine].sum())
    assert BESTFIT_ALGORITHM == "bfd-window-close-v1"  # the same plan: the same identity


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    corpus=corpora(max_docs=8),
    seed=seeds,
    epoch=epochs,
    fit_window=st.sampled_from([1, 2, 3, 100]),
    lookahead=st.booleans(),
    data=st.data(),
)
def test_bestfit_packs_like_the_naive_plan(
    corpus: tuple[int, list[int]],
    seed: int,
    epoch: int,
    fit_window: int,
    lookahead: bool,
    data: st.DataObject,
) -> None:
    L, lengths = corpus
    lengths = [min(n, 6 * L) for n in lengths]
    windowed = data.draw(st.booleans())
    W = data.draw(st.integers(1, L)) if windowed else L
    ov = data.draw(st.integers(0, W - 1)) if windowed else 0
    rows = make_rows(lengths)
    kw = {"long_docs": "window", "window": W, "overlap": ov} if windowed else {}
    plan = plan_bestfit(
        *columns(rows), seed=seed, epoch=epoch, seq_len=L, fit_window=fit_window, **kw
    )
    pieces = naive_pieces(rows, seed=seed, epoch=epoch, window=W, overlap=ov)
    ref = naive_bestfit_blocks(rows, pieces, L, fit_window)
    assert len(ref) == plan.num_blocks
    everything = list(range(plan.num_blocks)) + [-1]
    picked = data.draw(st.lists(st.sampled_from(everything), max_size=5))
    for blocks in (everything, picked):
        got = fast_pack(plan, bestfit_spans, rows, blocks, lookahead=lookahead)
        want, want_ctx = naive_pack_positions(rows, ref, blocks, L=L, lookahead=lookahead)
        assert_packed_equal(got, want)
        assert np.array_equal(context_of(got), want_ctx)


@settings(derandomize=True, max_examples=250, deadline=None)
@given(corpus=corpora(max_docs=10), seed=seeds, fit_window=st.integers(1, 12))
def test_never_cuts_a_fitting_document_and_conserves_tokens(
    corpus: tuple[int, list[int]], seed: int, fit_window: int
) -> None:
    L, lengths = corpus
    rows = make_rows(lengths)
    where = {int(x): (rid, t) for rid, toks in rows.items() for t, x in enumerate(toks)}
    plan = plan_bestfit(*columns(rows), seed=seed, epoch=0, seq_len=L, fit_window=fit_window)
    spans = bestfit_spans(plan, np.arange(plan.num_blocks))
    for rid, toks in rows.items():
        mine = np.flatnonzero(spans.row_id == rid)
        n = len(toks)
        if 0 < n and n + 1 <= L:  # fits: one stretch, the whole document and its EOS
            assert len(mine) == 1
            assert (spans.tok_start[mine[0]], spans.tok_end[mine[0]]) == (0, n)
            assert spans.has_eos[mine[0]]
        elif n > 0:  # split: full blocks as concat would cut it, then its tail
            starts = spans.tok_start[mine].tolist()
            assert starts == list(range(0, n + 1, L))[: len(mine)]
            assert (spans.length[mine][:-1] == L).all() and (spans.pos[mine][:-1] == 0).all()
    out = fast_pack(plan, bestfit_spans, rows, np.arange(plan.num_blocks), lookahead=True)
    seen = Counter(where[int(x)] for x in out.input_ids[out.input_ids > 0].tolist())
    assert seen == Counter(where.values())  # each token exactly once per epoch
    assert out.eos_positions == plan.num_docs == sum(1 for n in lengths if n)
    # Padding counted exactly: the plan's figure, the batch's, and the blocks' tails agree.
    fill = np.bincount(spans.block, weights=spans.length, minlength=plan.num_blocks)
    assert int((L - fill).sum()) == plan.padding_positions == out.padding_positions
    assert (fill >= 1).all() and (fill <= L).all()
    targets = Counter(trained_targets(out, where))
    assert targets == Counter((r, t) for r, toks in rows.items() for t in range(1, len(toks) + 1))


def test_worked_example() -> None:
    # Lengths 5, 2, 1 at L = 8: sizes 6, 3, 2. One window: 6 opens block 0 (2 left), 3 opens
    # block 1 (5 left), 2 fits block 0 exactly (least space that fits) -> [[6, 2], [3]].
    rows = make_rows([5, 2, 1])
    plan = plan_bestfit(*columns(rows), seed=0, epoch=0, seq_len=8, fit_window=8)
    assert plan.num_blocks == 2 and plan.padding_positions == 16 - 11
    s = bestfit_spans(plan, np.array([0, 1, -1]))
    groups = [sorted(s.doc_len[s.block == b].tolist()) for b in range(3)]
    assert groups == [[1, 5], [2], []]
    # Window 1: each document alone in its block.
    one = plan_bestfit(*columns(rows), seed=0, epoch=0, seq_len=8, fit_window=1)
    assert one.num_blocks == 3 and one.padding_positions == 24 - 11


def test_rejects_bad_options() -> None:
    ids, n = np.array([1, 2]), np.array([3, 4])
    with pytest.raises(PlanError, match="fit_window must be >= 1"):
        plan_bestfit(ids, n, seed=0, epoch=0, seq_len=8, fit_window=0)
    with pytest.raises(PlanError, match="long_docs must be one of"):
        plan_bestfit(ids, n, seed=0, epoch=0, seq_len=8, fit_window=4, long_docs="drop")
    with pytest.raises(PlanError, match="apply to long_docs='window' only"):
        plan_bestfit(ids, n, seed=0, epoch=0, seq_len=8, fit_window=4, overlap=2)
    with pytest.raises(PlanError, match=r"block 2 is outside the epoch's blocks \[0, 2\)"):
        bestfit_spans(plan_bestfit(ids, n, seed=0, epoch=0, seq_len=5, fit_window=4), [2])


def test_padding_by_window_figure_and_throughput() -> None:
    """Padding vs look-ahead window on realistic lengths (figure of docs/recipes.md)."""
    lengths = realistic_lengths(200_000)
    t0 = time.perf_counter()
    got = padding_by_window(lengths, seq_len=1024, fit_windows=[1, 16, 128, 1024])
    elapsed = time.perf_counter() - t0
    print(
        f"\nbest-fit padding (200k docs, median {np.median(lengths):.0f}, mean "
        f"{lengths.mean():.0f}, L=1024): "
        + ", ".join(f"window {w}: {100 * f:.2f}%" for w, f in got.items())
        + f"; {4 * len(lengths) / elapsed:,.0f} docs/s planned"
    )
    fractions = list(got.values())
    assert fractions == sorted(fractions, reverse=True)
    assert fractions[0] > 0.3 and fractions[-1] < 0.01


@pytest.mark.parametrize("fit_window", [1000, 100_000])
def test_plan_across_chunks_and_from_the_plan_store(tmp_path, fit_window: int) -> None:  # noqa: ANN001
    """Windows that straddle the planner's chunks of the visiting order (or span several), and a
    plan whose order is mapped from the plan store (its counts read again), equal the former."""
    from tokenloom.loader.pipeline.planstore import PlanStore

    rng = np.random.default_rng(fit_window)
    n, L = 140_000, 64
    lens = np.where(rng.random(n) < 0.05, 0, rng.integers(1, 3 * L, n))
    ids = np.arange(n, dtype=np.int64) * 2
    docs, pieces, counts = _former_layout(
        ids, lens, seed=7, epoch=0, L=L, F=fit_window, W=L, ov=0, cuts=None
    )
    first, second = PlanStore(str(tmp_path), min_docs=0), PlanStore(str(tmp_path), min_docs=0)
    for store in (None, first, second):
        plan = plan_bestfit(
            ids, lens, seed=7, epoch=0, seq_len=L, fit_window=fit_window, store=store
        )
        assert plan.num_blocks == counts.shape[0]
        assert (np.diff(plan.window_blocks.astype(np.int64)) >= 1).all()  # no empty window
        got_docs, ptr, got_pieces = plan.layout()
        assert np.array_equal(np.diff(ptr), counts) and np.array_equal(got_pieces, pieces)
        assert np.array_equal(got_docs.size, docs.size)
    assert first.built == 1 and second.mapped == 1 and second.built == 0


def test_lookups_with_a_small_window_cache_equal_fresh_plans(monkeypatch) -> None:  # noqa: ANN001
    """Lookups reuse windows packed before and drop the oldest beyond the cache's size; the
    spans and counts stay those of a plan that packs everything afresh."""
    import tokenloom.loader.plan.bestfit as bf

    monkeypatch.setattr(bf, "_CACHE_PIECES", 40)
    rng = np.random.default_rng(5)
    lens = rng.integers(0, 40, 3000)
    ids = np.arange(3000, dtype=np.int64)
    kw = {"seed": 3, "epoch": 0, "seq_len": 32, "fit_window": 7}
    plan = plan_bestfit(ids, lens, **kw)
    for _ in range(60):
        blocks = rng.integers(-1, plan.num_blocks, int(rng.integers(1, 30)))
        fresh = plan_bestfit(ids, lens, **kw)
        got, want = plan.spans(blocks), fresh.spans(blocks)
        for name in ("block", "pos", "doc", "row_id", "doc_len", "tok_start", "tok_end", "has_eos"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), name
        lo = int(rng.integers(0, plan.num_blocks))
        assert plan.counts(lo, lo + 5) == fresh.counts(lo, lo + 5)
        kept = plan._cache[0]
        assert sum(x.size.shape[0] for x in kept.values()) <= 40 or len(kept) <= len(set(blocks))


def test_compiled_planner_refuses_pieces_that_do_not_fit() -> None:
    """The loop indexes by size: a size outside ``1..L`` or windows out of order are refused."""
    with pytest.raises(PlanError, match="a piece of 0 positions does not fit a block of 4"):
        best_fit_blocks(np.array([0, 1]), np.zeros(2, np.int64), seq_len=4)
    with pytest.raises(PlanError, match="a piece of 5 positions does not fit a block of 4"):
        best_fit_blocks(np.array([5, 1]), np.zeros(2, np.int64), seq_len=4)
    with pytest.raises(PlanError, match="non-decreasing"):
        best_fit_blocks(np.array([1, 1]), np.array([1, 0]), seq_len=4)
    with pytest.raises(PlanError, match="win_ptr must ascend from 0 to 2"):
        pack_pieces(np.array([1, 2]), np.array([0, 3]), seq_len=4)
