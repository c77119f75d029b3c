"""Token-quota mixtures: the step schedule, shares per step and window, passes, caps, resume."""

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
from tokenloom.loader.plan.epoch import epoch_steps
from tokenloom.loader.plan.mixture import (
    Pool,
    mixture_block_source,
    mixture_spans,
    naive_step_sources,
    plan_mixture,
    share_weights,
    step_schedule,
    window_share_deviation,
)
from tokenloom.loader.plan.recipe import Recipe
from tokenloom.loader.plan.spec import LoaderSpec

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


ORDERS = ("sequential", "interleave")


@settings(derandomize=True, max_examples=100, deadline=None)
@given(
    weights=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    G=st.integers(1, 16),
    order=st.sampled_from(ORDERS),
    extra=st.integers(0, 50),
)
def test_step_schedule_equals_the_naive_layout(
    weights: list[int], G: int, order: str, extra: int
) -> None:
    w = share_weights(weights)
    sched = step_schedule(w, global_batch=G, block_order=order)
    n = min(3 * sched.period * G + extra, 600)
    want = naive_step_sources(w.tolist(), global_batch=G, block_order=order, num_blocks=n)
    p, j = sched.source(np.arange(n), n)
    assert list(zip(p.tolist(), j.tolist(), strict=True)) == want
    for q in range(len(w)):  # each pool numbers its blocks 0 .. n_p - 1, each once
        assert sorted(j[p == q].tolist()) == list(range(int((p == q).sum())))
    # Counters from the global index alone: blocks taken before k, and each block's position.
    for k in sorted({0, 1, G, sched.period * G - 1, n // 2, n}):
        if 0 <= k <= n:
            assert sched.taken(k).tolist() == np.bincount(p[:k], minlength=len(w)).tolist()
    for q in range(len(w)):
        for i, k in enumerate(np.flatnonzero(p == q).tolist()):
            assert sched.position(q, i) == k


@settings(derandomize=True, max_examples=100, deadline=None)
@given(
    shares=st.lists(st.floats(0.01, 1.0), min_size=1, max_size=8),
    G=st.integers(1, 300),
)
def test_every_step_holds_its_shares_and_prefixes_stay_near_them(shares: list[float], G: int):
    """Stratified: each step gives pool p floor or ceil of G * share blocks, and no pool is ever
    more than 4 blocks from its exact share at a step boundary (measured worst: 3.6)."""
    w = share_weights(shares)
    sched = step_schedule(w, global_batch=G, block_order="interleave")
    steps = np.arange(min(sched.period, 5000) + 1)
    before = sched.steps_before(steps)  # (S + 1, P)
    per_step = np.diff(before, axis=0)
    x = G * w / w.sum()
    assert ((per_step == np.floor(x)) | (per_step == np.ceil(x))).all()
    assert (per_step.sum(axis=1) == G).all()
    assert np.abs(before - steps[:, None] * x[None, :]).max() < 4
    # the slots each step gives each pool agree with the counters
    layout = sched.step_pools(steps[:50])
    for s in range(min(50, len(steps) - 1)):
        assert np.bincount(layout[s], minlength=len(w)).tolist() == per_step[s].tolist()
    # after a whole period every pool has exactly G * w_p blocks
    assert sched.steps_before(np.array([sched.period]))[0].tolist() == (G * w).tolist()


def test_a_mixture_never_fills_a_step_from_one_pool() -> None:
    """The epoch length does not matter: 60 steps (a multiple of the old schedule's period) or 61,
    any block order, every step of 8 holds 4/2/2 or 4/3/1 (shares 50/30/20)."""
    rows = make_rows([40] * 30)
    ids = sorted(rows)
    pools = pools_of(rows, [ids[:10], ids[10:20], ids[20:]], [0.5, 0.3, 0.2], [None] * 3)
    for steps in (60, 61):
        for order in ORDERS:
            plan = plan_mixture(
                pools,
                seed=1,
                epoch=0,
                seq_len=16,
                budget_tokens=steps * 8 * 16,
                global_batch=8,
                block_order=order,
            )
            k = np.arange(plan.num_blocks)
            pools_at = plan.source(k)[0].reshape(steps, 8)
            counts = np.stack([np.bincount(r, minlength=3) for r in pools_at])
            assert (counts[:, 0] == 4).all(), counts
            assert set(map(tuple, counts[:, 1:].tolist())) <= {(2, 2), (3, 1), (2, 1), (3, 0)}
            assert ((counts[:, 1] >= 2) & (counts[:, 1] <= 3)).all()
            assert ((counts[:, 2] >= 1) & (counts[:, 2] <= 2)).all()


@settings(derandomize=True, max_examples=60, deadline=None)
@given(
    shares=st.lists(st.floats(0.01, 1.0), min_size=1, max_size=10),
)
def test_shares_within_tolerance_on_every_window_of_100(shares: list[float]) -> None:
    w = share_weights(shares)
    sched = step_schedule(w, global_batch=1, block_order="sequential")
    # Periodic: the windows starting in one period are all the windows there are.
    n = sched.period + 100
    p, _ = sched.source(np.arange(n), n)
    realised = (w / w.sum()).tolist()
    # steps of one block: every window of 100 within 4 blocks (a prefix is within 3.6 of exact)
    assert window_share_deviation(p, realised, window=100) < 0.04
    target = np.asarray(shares) / sum(shares)
    assert window_share_deviation(p, target.tolist(), window=100) < 0.04 + 1e-4 * len(shares)


@settings(derandomize=True, max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=3, max_size=12),
    recipe=st.sampled_from(RECIPES),
    seed=st.integers(0, 2**32),
    caps=st.lists(st.sampled_from([None, 1, 2, 3]), min_size=3, max_size=3),
    shares=st.lists(st.integers(1, 5), min_size=3, max_size=3),
    budget=st.integers(1, 400),
    G=st.integers(1, 9),
    order=st.sampled_from(ORDERS),
)
def test_each_pass_conserves_its_pool_and_blocks_follow_the_schedule(
    lengths: list[int],
    recipe: Recipe,
    seed: int,
    caps: list,
    shares: list[int],
    budget: int,
    G: int,
    order: str,
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
        pools,
        seed=seed,
        epoch=1,
        seq_len=L,
        recipe=recipe,
        budget_tokens=budget * L,
        global_batch=G,
        block_order=order,
    )
    assert plan.num_blocks <= budget
    if plan.limited_by is None:
        assert plan.num_blocks == budget
    blocks = np.arange(plan.num_blocks)
    p, j, q, b = plan.source(blocks)
    w = plan.schedule.weights.tolist()
    naive = naive_step_sources(w, global_batch=G, block_order=order, num_blocks=plan.num_blocks)
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


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("recipe", RECIPES[:2])
def test_resume_on_another_world_size_continues_the_same_stream(recipe: Recipe, order: str):
    rows = make_rows([5, 17, 2, 30, 8, 11, 3, 25, 9, 14, 1, 6])
    ids = sorted(rows)
    pools = pools_of(rows, [ids[:6], ids[6:9], ids[9:]], [0.6, 0.25, 0.15], [None, 2, None])
    G = 12
    kw = {
        "seed": 7,
        "epoch": 3,
        "seq_len": 8,
        "recipe": recipe,
        "budget_tokens": 8 * 90,
        "global_batch": G,
        "block_order": order,
    }

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
    # Steps of one block (W = 4, offsets s * 3 mod 4 = 0, 3, 2, 1; b owns offset 3): the period
    # is [a, b, a, a] and b's j-th block is global block 4 j + 1. b has 4 blocks per pass, 8
    # under its cap, so the epoch ends at global block 33, the first b cannot supply.
    plan = plan_mixture(pools, seed=0, epoch=0, seq_len=8, budget_tokens=8 * 1000)
    assert plan.source(np.arange(8))[0].tolist() == [0, 1, 0, 0] * 2
    assert (plan.num_blocks, plan.limited_by, plan.budget_blocks) == (33, "pool1", 1000)
    a, b = plan.reports
    assert (b.blocks, b.full_passes, b.passes, b.exhausted) == (8, 2, 2, True)
    assert (a.blocks, a.full_passes, a.passes, a.exhausted) == (25, 2, 3, False)
    assert (a.share, b.share) == (0.75, 0.25)
    assert plan.passes_done(33).tolist() == [2, 2] and plan.passes_done(25).tolist() == [1, 1]
    # With a budget under the cap the budget ends the epoch; without a budget the cap does.
    short = plan_mixture(pools, seed=0, epoch=0, seq_len=8, budget_tokens=8 * 20 - 3)
    assert (short.num_blocks, short.limited_by) == (20, None)
    capped = plan_mixture(pools, seed=0, epoch=0, seq_len=8)
    assert (capped.num_blocks, capped.limited_by) == (33, "pool1")
    assert mixture_block_source(plan, 1) == (1, 0) and mixture_block_source(plan, 7) == (0, 5)
    assert mixture_block_source(plan, np.array([0, 5]))[0].tolist() == [0, 1]


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
        sched = step_schedule(w, global_batch=1, block_order="sequential")
        built = time.perf_counter() - t0
        n = sched.period + 100
        p, _ = sched.source(np.arange(n), n)
        dev = window_share_deviation(p, shares, window=100)
        wide = step_schedule(w, global_batch=64, block_order="interleave")
        t0 = time.perf_counter()
        wide.source(np.arange(1_000_000), 1_000_000)
        lookup = time.perf_counter() - t0
        print(
            f"\nmixture {name}: period {sched.period}, worst deviation over 100-block windows "
            f"{100 * dev:.2f} points; schedule {built * 1e3:.1f} ms, "
            f"{1e6 / lookup:,.0f} lookups/s (steps of 64)"
        )
        assert dev < 0.04


@pytest.mark.parametrize(
    ("shares", "G", "percents"),
    [((40, 45, 15), 32, ("40%", "45%", "15%")), ((1, 1, 1), 12, ("33.3%",) * 3),
     ((0.5, 0.375, 0.125), 8, ("50%", "37.5%", "12.5%"))],
)  # fmt: skip
def test_describe_reads_shares_as_percentages_and_the_blocks_each_step_gets(shares, G, percents):
    """A log line says the shares as the schedule holds them (normalised: shares 40/45/15 are
    40%, not 4000%) and the blocks a pool gives each step, as the schedule lays them out."""
    names = ("prose", "verse", "code")
    mixture = {n: [f"source = '{n}'", s] for n, s in zip(names, shares, strict=True)}
    spec = LoaderSpec(table="t", seq_len=16, global_batch=G, mixture=mixture, budget_tokens=999)
    sched = step_schedule(
        share_weights([float(s) for s in shares]), global_batch=G, block_order="interleave"
    )
    per_step = np.diff(sched.steps_before(np.arange(sched.period + 1)), axis=0)
    want = []
    for n, pct, lo, hi in zip(names, percents, per_step.min(0), per_step.max(0), strict=True):
        want.append(f"{n} {pct} ({lo if lo == hi else f'{lo}-{hi}'})")
    assert spec.describe().endswith(f"mixture of each step's {G} blocks: " + ", ".join(want))
