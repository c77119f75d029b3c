"""Token-quota mixtures: the periodic schedule, shares per window, passes, caps, elastic resume."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.loader.helpers import make_rows
from tests.loader.recipe_ref import fast_pack
from tokenloom.loader import PlanError, step_blocks
from tokenloom.loader.mixture import (
    Pool,
    deficit_schedule,
    mixture_block_source,
    mixture_spans,
    naive_deficit_sources,
    plan_mixture,
    share_weights,
    window_share_deviation,
)
from tokenloom.loader.plan import epoch_steps
from tokenloom.loader.recipe import Recipe

RECIPES = [
    Recipe(),
    Recipe(packing="best_fit", fit_window=4),
    Recipe(long_docs="window", window=6, overlap=2),
    Recipe(packing="best_fit", fit_window=3, long_docs="window", window=5, overlap=1),
]


def pools_of(rows: dict[int, np.ndarray], parts: list[list[int]], shares, caps) -> list[Pool]:
    """Pools over the given row ids (ascending), with shares and caps."""
    out = []
    for i, (ids, share, cap) in enumerate(zip(parts, shares, caps, strict=True)):
        ids = sorted(ids)
        out.append(
            Pool(
                name=f"pool{i}",
                row_ids=np.array(ids, dtype=np.int64),
                n_tokens=np.array([len(rows[r]) for r in ids], dtype=np.int64),
                share=share,
                max_passes=cap,
            )
        )
    return out


@settings(derandomize=True, max_examples=100, deadline=None)
@given(weights=st.lists(st.integers(1, 12), min_size=1, max_size=6), extra=st.integers(0, 50))
def test_periodic_schedule_equals_the_greedy_from_zero(weights: list[int], extra: int) -> None:
    w = share_weights(weights)
    sched = deficit_schedule(w)
    n = 3 * sched.period + extra
    want = naive_deficit_sources(w.tolist(), n)
    p, j = sched.source(np.arange(n))
    assert list(zip(p.tolist(), j.tolist(), strict=True)) == want
    # Counters from the global index alone: blocks taken before k, and each block's position.
    for k in (0, 1, sched.period - 1, n // 2, n):
        assert sched.taken(k).tolist() == [
            sum(1 for q, _ in want[:k] if q == i) for i in range(len(w))
        ]
    for k, (q, jj) in enumerate(want):
        assert sched.position(q, jj) == k
    # Upper quota at every prefix (taken < share * k + 1, what makes the schedule periodic);
    # the greedy does not promise lower quota, but stays within 2 blocks below.
    counts = np.zeros(len(w))
    for k, (q, _) in enumerate(want):
        counts[q] += 1
        dev = counts - (k + 1) * w / w.sum()
        assert (dev < 1).all() and (dev > -2).all()


@settings(derandomize=True, max_examples=60, deadline=None)
@given(
    shares=st.lists(st.floats(0.01, 1.0), min_size=1, max_size=10),
)
def test_shares_within_tolerance_on_every_window_of_100(shares: list[float]) -> None:
    w = share_weights(shares)
    sched = deficit_schedule(w)
    # Periodic: the windows starting in one period are all the windows there are.
    p, _ = sched.source(np.arange(sched.period + 100))
    realised = (w / w.sum()).tolist()
    assert window_share_deviation(p, realised, window=100) < 0.025  # 2.5 blocks of 100
    target = np.asarray(shares) / sum(shares)
    assert window_share_deviation(p, target.tolist(), window=100) < 0.025 + 1e-4 * len(shares)


@settings(derandomize=True, max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=3, max_size=12),
    recipe=st.sampled_from(RECIPES),
    seed=st.integers(0, 2**32),
    caps=st.lists(st.sampled_from([None, 1, 2, 3]), min_size=3, max_size=3),
    shares=st.lists(st.integers(1, 5), min_size=3, max_size=3),
    budget=st.integers(1, 400),
)
def test_each_pass_conserves_its_pool_and_blocks_follow_the_schedule(
    lengths: list[int], recipe: Recipe, seed: int, caps: list, shares: list[int], budget: int
) -> None:
    lengths = [*lengths[:-3], 5, 9, 13] if sum(lengths) == 0 else lengths
    rows = make_rows(lengths)
    ids = sorted(rows)
    parts = [ids[i::3] for i in range(3)]
    if any(sum(len(rows[r]) for r in part) == 0 for part in parts):
        return  # a pool without tokens is refused (tested below)
    L = 8
    pools = pools_of(rows, parts, shares, caps)
    plan = plan_mixture(
        pools, seed=seed, epoch=1, seq_len=L, recipe=recipe, budget_tokens=budget * L
    )
    assert plan.num_blocks <= budget
    if plan.limited_by is None:
        assert plan.num_blocks == budget
    blocks = np.arange(plan.num_blocks)
    p, j, q, b = plan.source(blocks)
    naive = naive_deficit_sources(plan.schedule.weights.tolist(), plan.num_blocks)
    assert list(zip(p.tolist(), j.tolist(), strict=True)) == naive
    out = fast_pack(plan, mixture_spans, rows, blocks, lookahead=True)
    where = {int(x): (rid, t) for rid, toks in rows.items() for t, x in enumerate(toks)}
    seen: dict[tuple[int, int], Counter] = {}
    for i in range(plan.num_blocks):
        toks = out.input_ids[i][out.input_ids[i] > 0]
        key = (int(p[i]), int(q[i]))
        ctx = Counter()
        if out.context is not None:
            sel = out.spans[:, 0] == i
            for (_, _, rid, _, _), (c0, c1) in zip(
                out.spans[sel].tolist(), out.context[sel].tolist(), strict=True
            ):
                ctx.update((rid, t) for t in range(c0, c1))
        got = Counter(where[int(x)] for x in toks.tolist())
        got.subtract(ctx)
        seen.setdefault(key, Counter()).update(+got)
    for pi, pool in enumerate(pools):
        report = plan.reports[pi]
        everything = Counter((int(r), t) for r in pool.row_ids for t in range(len(rows[int(r)])))
        for qi in range(report.passes):
            got = seen.get((pi, qi), Counter())
            if qi < report.full_passes:
                assert got == everything  # each token of the pool exactly once per pass
            else:
                assert not (got - everything)  # a partial last pass: at most once
        assert report.blocks == int((p == pi).sum())
        if pool.max_passes is not None:
            assert report.passes <= pool.max_passes
    assert plan.num_tokens == out.real_tokens
    assert plan.padding_positions == out.padding_positions


@pytest.mark.parametrize("recipe", RECIPES[:2])
def test_resume_on_another_world_size_continues_the_same_stream(recipe: Recipe) -> None:
    rows = make_rows([5, 17, 2, 30, 8, 11, 3, 25, 9, 14, 1, 6])
    ids = sorted(rows)
    pools = pools_of(rows, [ids[:6], ids[6:9], ids[9:]], [0.6, 0.25, 0.15], [None, 2, None])
    kw = {"seed": 7, "epoch": 3, "seq_len": 8, "recipe": recipe, "budget_tokens": 8 * 90}
    G = 12

    def stream(plan, world: int, first: int) -> list[np.ndarray]:
        steps = epoch_steps(plan, global_batch=G, drop_last=False)
        out = []
        for s in range(first, steps.steps):
            parts = []
            for r in range(world):
                blocks = step_blocks(
                    s,
                    rank=r,
                    world_size=world,
                    batch_size=G // world,
                    num_blocks=plan.num_blocks,
                    drop_last=False,
                )
                parts.append(fast_pack(plan, mixture_spans, rows, blocks, lookahead=True).input_ids)
            out.append(np.concatenate(parts))
        return out

    full = stream(plan_mixture(pools, **kw), 1, 0)
    s = 3
    resumed = plan_mixture(pools, **kw)  # a fresh process: only (epoch, step) carried over
    assert resumed.taken(s * G).tolist() == plan_mixture(pools, **kw).taken(s * G).tolist()
    for world in (2, 3, 4):
        again = stream(resumed, world, s)
        assert len(again) == len(full) - s
        for a, b in zip(again, full[s:], strict=True):
            assert np.array_equal(a, b)


def test_caps_budget_and_reports() -> None:
    rows = make_rows([7] * 10 + [15] * 2)  # pool a: 10 docs x 8 positions; pool b: 2 x 16
    ids = sorted(rows)
    pools = pools_of(rows, [ids[:10], ids[10:]], [3, 1], [None, 2])
    # Period [a, a, b, a]: b's j-th block is global block 4 j + 2. b has 4 blocks per pass, 8
    # under its cap, so the epoch ends at global block 34, the first b cannot supply.
    plan = plan_mixture(pools, seed=0, epoch=0, seq_len=8, budget_tokens=8 * 1000)
    assert plan.schedule.pool_at.tolist() == [0, 0, 1, 0]
    assert (plan.num_blocks, plan.limited_by, plan.budget_blocks) == (34, "pool1", 1000)
    a, b = plan.reports
    assert (b.blocks, b.full_passes, b.passes, b.exhausted) == (8, 2, 2, True)
    assert (a.blocks, a.full_passes, a.passes, a.exhausted) == (26, 2, 3, False)
    assert (a.share, b.share) == (0.75, 0.25)
    assert plan.passes_done(34).tolist() == [2, 2] and plan.passes_done(30).tolist() == [2, 1]
    # With a budget under the cap the budget ends the epoch; without a budget the cap does.
    short = plan_mixture(pools, seed=0, epoch=0, seq_len=8, budget_tokens=8 * 20 - 3)
    assert (short.num_blocks, short.limited_by) == (20, None)
    capped = plan_mixture(pools, seed=0, epoch=0, seq_len=8)
    assert (capped.num_blocks, capped.limited_by) == (34, "pool1")
    assert mixture_block_source(plan, 2) == (1, 0) and mixture_block_source(plan, 7) == (0, 5)
    assert mixture_block_source(plan, np.array([0, 6]))[0].tolist() == [0, 1]


def test_rejects_bad_mixtures() -> None:
    ids, n = np.array([1, 2]), np.array([3, 4])
    with pytest.raises(PlanError, match="needs an end"):
        plan_mixture(
            [Pool(name="a", row_ids=ids, n_tokens=n, share=1.0)], seed=0, epoch=0, seq_len=4
        )
    with pytest.raises(PlanError, match="has no tokens"):
        Pool(name="a", row_ids=ids, n_tokens=np.zeros(2, np.int64), share=1.0)
    with pytest.raises(PlanError, match="share must be > 0"):
        Pool(name="a", row_ids=ids, n_tokens=n, share=0.0)
    with pytest.raises(PlanError, match="max_passes must be None or >= 1"):
        Pool(name="a", row_ids=ids, n_tokens=n, share=1.0, max_passes=0)
    p = Pool(name="a", row_ids=ids, n_tokens=n, share=1.0, max_passes=1)
    with pytest.raises(PlanError, match="names must be unique"):
        plan_mixture([p, p], seed=0, epoch=0, seq_len=4)
    with pytest.raises(PlanError, match="rounds to 0 at resolution"):
        share_weights([1.0, 1e-6])


def test_share_deviation_figure() -> None:
    """Worst share deviation over windows of 100 blocks (figure of docs/recipes.md)."""
    rng = np.random.default_rng(0)
    configs = {
        "70/20/10": [0.7, 0.2, 0.1],
        "50/30/15/5": [0.5, 0.3, 0.15, 0.05],
        "12.3/37.7/25/15/10": [0.123, 0.377, 0.25, 0.15, 0.1],
        "10 random": rng.dirichlet(np.ones(10)).tolist(),
    }
    for name, shares in configs.items():
        w = share_weights(shares)
        t0 = time.perf_counter()
        sched = deficit_schedule(w)
        built = time.perf_counter() - t0
        p, _ = sched.source(np.arange(sched.period + 100))
        dev = window_share_deviation(p, shares, window=100)
        t0 = time.perf_counter()
        sched.source(np.arange(1_000_000) * 7919)
        lookup = time.perf_counter() - t0
        print(
            f"\nmixture {name}: period {sched.period}, worst deviation over 100-block windows "
            f"{100 * dev:.2f} points; schedule {built * 1e3:.1f} ms, "
            f"{1e6 / lookup:,.0f} lookups/s"
        )
        assert dev < 0.025
