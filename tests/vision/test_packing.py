"""Image+text packing: budgets and caps respected, every sample once, the knapsack against a
brute force, greedy against its reference, and the block's labels/attention contract."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.vision.packing import (
    IGNORE,
    _knapsack,
    naive_greedy,
    pack_block,
    pack_compact,
    plan_blocks,
    plan_padding,
)

samples = st.lists(st.tuples(st.integers(1, 70), st.integers(0, 1)), min_size=0, max_size=60)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(samples, st.sampled_from(["greedy", "knapsack", "pad_to_longest"]), st.integers(1, 3))
def test_every_fitting_sample_once_within_budget_and_cap(items, policy, cap):
    lengths = [n for n, _ in items]
    images = [k for _, k in items]
    plan = plan_blocks(lengths, images, budget=64, image_cap=cap, policy=policy, window=8)
    packed = np.concatenate(plan.blocks) if plan.blocks else np.zeros(0, np.int64)
    fits = [i for i, (n, k) in enumerate(items) if n <= 64 and k <= cap]
    assert sorted(packed.tolist()) == fits
    assert sorted(plan.dropped.tolist()) == sorted(set(range(len(items))) - set(fits))
    if policy != "pad_to_longest":
        for b in plan.blocks:
            assert sum(lengths[i] for i in b) <= 64 and sum(images[i] for i in b) <= cap
    if policy == "greedy":
        ref = naive_greedy(lengths, images, 64, cap)
        assert [b.tolist() for b in plan.blocks] == ref


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 1)), min_size=1, max_size=9))
def test_knapsack_is_optimal_against_brute_force(items):
    budget, cap = 64, 2
    n = np.array([x for x, _ in items])
    k = np.array([y for _, y in items])
    if n[0] > budget or k[0] > cap:
        return
    pick = _knapsack(n, k, budget, cap)
    assert pick[0] == 0 and n[pick].sum() <= budget and k[pick].sum() <= cap
    best = max(
        n[[0, *rest]].sum()
        for r in range(len(items))
        for rest in itertools.combinations(range(1, len(items)), r)
        if n[[0, *rest]].sum() <= budget and k[[0, *rest]].sum() <= cap
    )
    assert n[pick].sum() == best


@settings(max_examples=80, derandomize=True, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 140), st.integers(0, 2)), max_size=90),
    st.sampled_from([1, 63, 64, 65, 127, 128, 129]),
    st.integers(1, 4),
    st.integers(1, 12),
)
def test_compiled_knapsack_equals_the_reference_block_for_block(items, budget, cap, window):
    # budgets on each side of a 64-bit word: the compiled states are bit sets
    lengths = np.array([n for n, _ in items], dtype=np.int32)
    images = np.array([k for _, k in items], dtype=np.uint8)
    kw = dict(budget=budget, image_cap=cap, policy="knapsack", window=window)
    ref = pack_compact(lengths, images, compiled=False, **kw)
    got = pack_compact(lengths, images, compiled=True, **kw)
    assert got.members.tolist() == ref.members.tolist()
    assert got.starts.tolist() == ref.starts.tolist() and got.starts.dtype == ref.starts.dtype
    assert got.dropped == ref.dropped


def test_knapsack_wastes_less_than_greedy_and_pad_to_longest():
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 120, size=300)
    img = np.where(rng.random(300) < 0.8, rng.integers(4, 17, size=300), 0)
    out = plan_padding(lengths + img, img, budget=256, image_cap=4)
    share = {p: out[p]["padding_share"] for p in out}
    assert share["knapsack"] < share["greedy"] < share["pad_to_longest"]
    assert len({(v["image_tokens"], v["text_tokens"]) for v in out.values()}) == 1


def test_block_masks_loss_to_responses_and_isolates_samples():
    pt = np.ones((2, 12), np.float32)
    a = (pt, np.array([1, 2, 3]), np.array([10, 11]))
    b = (np.zeros((0, 12), np.float32), np.array([4]), np.array([20, 21, 22]))
    blk = pack_block([a, b], budget=16, eos_id=99, pad_id=98, image_id=97, patch_dim=12)
    assert blk.input_ids.tolist() == [97, 97, 1, 2, 3, 10, 11, 99, 4, 20, 21, 22, 99, 98, 98, 98]
    assert blk.image_mask.tolist() == [True] * 2 + [False] * 14
    # targets: response tokens and EOS of each sample, predicted from the position before
    want = [IGNORE] * 16
    want[4:7] = [10, 11, 99]
    want[8:12] = [20, 21, 22, 99]
    assert blk.labels.tolist() == want
    assert blk.doc_ids.tolist() == [0] * 8 + [1] * 5 + [-1] * 3
    assert blk.position_ids.tolist()[:9] == [0, 1, 2, 3, 4, 5, 6, 7, 0]
    assert blk.patches.shape == (2, 12)
