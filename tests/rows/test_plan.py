"""The row plan: every row once per epoch, slots independent of the world size, refills."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.loader.plan import PlanError
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
