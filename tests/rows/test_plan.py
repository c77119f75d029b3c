"""The row plan: every row once per epoch, slots independent of the world size, refills."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.loader.plan.epoch import PlanError
from tokenloom.rows import MAX_REFILLS, RowPlan, naive_slots


@settings(max_examples=40, derandomize=True, deadline=None)
@given(
    n=st.integers(1, 200),
    g=st.sampled_from([1, 2, 4, 6, 12]),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 2),
    drop_last=st.booleans(),
)
def test_epoch_visits_every_row_once_and_ranks_tile_the_global_batch(n, g, seed, epoch, drop_last):
    plan = RowPlan.build(n, seed=seed, epoch=epoch, global_batch=g, drop_last=drop_last)
    assert plan.steps == (n // g if drop_last else -(-n // g))
    firsts = []
    for s in range(plan.steps):
        whole = plan.positions(s)
        for w in (x for x in (1, 2, 3, 4) if g % x == 0):
            parts = [plan.positions(s, rank=r, world_size=w) for r in range(w)]
            assert np.array_equal(np.concatenate(parts), whole)
        firsts.append(plan.first_rows(whole))
    rows = np.concatenate(firsts) if firsts else np.zeros(0, np.int64)
    real = rows[rows >= 0]
    assert len(set(real.tolist())) == len(real)  # no row twice
    if not drop_last:
        assert sorted(real.tolist()) == list(range(n))  # every row once


def test_refill_chain_is_a_pure_function_of_the_position():
    a = RowPlan.build(50, seed=1, epoch=3, global_batch=8, drop_last=False)
    b = RowPlan.build(50, seed=1, epoch=3, global_batch=8, drop_last=False)
    chain = [a.candidate(17, k) for k in range(MAX_REFILLS)]
    assert chain == [b.candidate(17, k) for k in range(MAX_REFILLS)]
    assert all(0 <= c < 50 for c in chain)
    with pytest.raises(PlanError, match="at most"):
        a.candidate(17, MAX_REFILLS)
    # The bad rows never come out; every slot is filled on every world size alike.
    bad = {int(a.order[3]), int(a.order[9]), int(a.alt[0])}
    for s in range(a.steps):
        whole = naive_slots(a, s, rank=0, world_size=1, bad=bad)
        assert len(whole) == 8 and not set(whole) & bad
        split = sum((naive_slots(a, s, rank=r, world_size=4, bad=bad) for r in range(4)), [])
        assert split == whole


def test_bad_topology_and_step_are_named():
    plan = RowPlan.build(10, seed=0, epoch=0, global_batch=4, drop_last=True)
    with pytest.raises(PlanError, match="multiple of the world size"):
        plan.positions(0, rank=0, world_size=3)
    with pytest.raises(PlanError, match="outside the epoch"):
        plan.positions(2)


@settings(max_examples=30, derandomize=True, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 5), epoch=st.integers(0, 3))
def test_plan_equals_the_int64_permutations_it_replaces(n, seed, epoch):
    # Today's plan holds both permutations in their narrowest dtype; the values are those of
    # the former int64 ones (``epoch_permutation`` and ``refill_permutation``).
    from tokenloom.loader.plan.shuffle import epoch_permutation
    from tokenloom.rows.plan import refill_permutation

    plan = RowPlan.build(n, seed=seed, epoch=epoch, global_batch=4, drop_last=False)
    assert plan.order.dtype == np.uint32 and plan.alt.dtype == np.uint32
    assert np.array_equal(plan.order, epoch_permutation(n, seed=seed, epoch=epoch))
    assert np.array_equal(plan.alt, refill_permutation(n, seed=seed, epoch=epoch))
    if n:
        p = np.arange(n + 5)
        want = np.where(
            p < n, epoch_permutation(n, seed=seed, epoch=epoch)[np.minimum(p, n - 1)], -1
        )
        assert np.array_equal(plan.first_rows(p), want)
        assert plan.candidate(n + 2, 3) == int(
            refill_permutation(n, seed=seed, epoch=epoch)[((n + 2) * MAX_REFILLS + 3) % n]
        )


def test_selection_is_compact_and_reads_back_the_scan():
    from tokenloom.rows.read import compact_selection

    rng = np.random.default_rng(0)
    ids = np.cumsum(rng.geometric(0.7, 5000)).astype(np.int64)
    rowids = ((ids // 1000).astype(np.uint64) << np.uint64(32)) | (ids % 1000).astype(np.uint64)
    sel = compact_selection(3, ids, rowids)
    assert sel.row_ids.nbytes + sel.rowids.nbytes < 3 * len(ids)  # vs 16 bytes per row before
    pick = rng.integers(0, len(ids), 300)
    assert np.array_equal(sel.row_ids[pick], ids[pick])
    assert np.array_equal(sel.rowids[pick], rowids[pick])
    assert int(np.searchsorted(sel.row_ids, ids[17])) == 17
