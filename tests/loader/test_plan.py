"""The epoch plan and the step/rank split: exact sizes, empty rows, topology independence."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.loader.helpers import columns, corpora, epochs, make_rows, seeds
from tokenloom.errors import TokenloomError
from tokenloom.loader import (
    PlanError,
    epoch_permutation,
    epoch_steps,
    plan_epoch,
    step_blocks,
    steps_in_epoch,
    stream_counts,
)


def test_small_plan_exact() -> None:
    ids = np.array([2, 4, 6, 8, 10])
    n = np.array([3, 0, 10, 1, 2])
    plan = plan_epoch(ids, n, seed=0, epoch=0, seq_len=4)
    keep = np.array([2, 6, 8, 10])
    perm = epoch_permutation(4, seed=0, epoch=0)
    assert plan.row_ids.tolist() == keep[perm].tolist()
    assert plan.lengths.tolist() == np.array([3, 10, 1, 2])[perm].tolist()
    assert plan.starts.tolist() == [0, *np.cumsum(plan.lengths + 1).tolist()]
    assert (plan.empty_rows, plan.num_tokens, plan.stream_len) == (1, 16, 20)
    assert (plan.num_blocks, plan.padding_positions, plan.num_docs) == (5, 0, 4)
    with pytest.raises(ValueError):
        plan.starts[0] = 1  # the plan's arrays are read-only


@settings(derandomize=True, max_examples=80, deadline=None)
@given(corpus=corpora(), seed=seeds, epoch=epochs)
def test_plan_invariants(corpus: tuple[int, list[int]], seed: int, epoch: int) -> None:
    L, lengths = corpus
    ids, n = columns(make_rows(lengths))
    plan = plan_epoch(ids, n, seed=seed, epoch=epoch, seq_len=L)
    nonempty = n > 0
    assert sorted(plan.row_ids.tolist()) == ids[nonempty].tolist()
    assert plan.empty_rows == int((~nonempty).sum())
    assert plan.num_tokens == int(n.sum())
    assert plan.stream_len == plan.num_tokens + plan.num_docs
    assert plan.num_blocks == -(-plan.stream_len // L)
    assert plan.num_blocks * L == plan.stream_len + plan.padding_positions
    assert 0 <= plan.padding_positions < L or plan.num_blocks == 0
    # stream_counts against a walk of the stream.
    kind = np.concatenate([np.r_[np.ones(k), 0] for k in plan.lengths] or [np.zeros(0)])
    for lo, hi in [(0, plan.stream_len), (1, L + 3), (L, 3 * L), (5, 2), (-4, 10**9)]:
        a, b = min(max(lo, 0), plan.stream_len), min(max(hi, 0), plan.stream_len)
        part = kind[a:b] if a < b else kind[:0]
        assert stream_counts(plan, lo, hi) == (int(part.sum()), int((part == 0).sum()))


@pytest.mark.parametrize(
    ("ids", "n", "seq_len", "match"),
    [
        ([1, 2, 3], [1, 2], 4, "row_ids has 3 rows but n_tokens has 2"),
        ([1, 3, 2], [1, 2, 3], 4, r"strictly ascending \(row_ids\[1\]=3, row_ids\[2\]=2\)"),
        ([1, 1], [1, 2], 4, "strictly ascending"),
        ([1, 2], [1, -2], 4, "n_tokens must be >= 0, got -2 for row id 2"),
        ([1, 2], [1, 2], 0, "seq_len must be an integer >= 1, got 0"),
        ([[1, 2]], [[1, 2]], 4, "one-dimensional"),
        ([1, 2], [1.0, 2.0], 4, "must hold integers"),
    ],
)
def test_plan_rejects_bad_input(ids: list, n: list, seq_len: int, match: str) -> None:
    with pytest.raises(PlanError, match=match) as info:
        plan_epoch(np.array(ids), np.array(n), seed=0, epoch=0, seq_len=seq_len)
    assert isinstance(info.value, TokenloomError)


def test_empty_selection() -> None:
    plan = plan_epoch(np.zeros(0, np.int64), np.zeros(0, np.int64), seed=1, epoch=0, seq_len=8)
    assert (plan.num_blocks, plan.stream_len, plan.num_docs) == (0, 0, 0)
    assert steps_in_epoch(plan, global_batch=(2) * 2, drop_last=False) == 0
    only_empty = plan_epoch(np.arange(3), np.zeros(3, np.int64), seed=1, epoch=0, seq_len=8)
    assert (only_empty.num_blocks, only_empty.empty_rows) == (0, 3)


@pytest.mark.parametrize("global_batch", range(1, 13))
def test_global_batch_identical_across_world_sizes(global_batch: int) -> None:
    num_blocks = 37
    batches: dict[int, list[list[int]]] = {}
    for world in range(1, 5):
        if global_batch % world:
            continue
        b = global_batch // world
        steps = -(-num_blocks // global_batch)
        batches[world] = [
            np.concatenate(
                [
                    step_blocks(
                        s,
                        rank=r,
                        world_size=world,
                        batch_size=b,
                        num_blocks=num_blocks,
                        drop_last=False,
                    )
                    for r in range(world)
                ]
            ).tolist()
            for s in range(steps)
        ]
    reference = batches[1]
    flat = [x for step in reference for x in step]
    assert flat == list(range(num_blocks)) + [-1] * (len(flat) - num_blocks)
    for world, got in batches.items():
        assert got == reference, world


@settings(derandomize=True, max_examples=60, deadline=None)
@given(
    num_blocks=st.integers(0, 60),
    batch_size=st.integers(1, 4),
    world_size=st.integers(1, 4),
    drop_last=st.booleans(),
)
def test_steps_cover_blocks_once(
    num_blocks: int, batch_size: int, world_size: int, drop_last: bool
) -> None:
    ids, n = columns(make_rows([1] * num_blocks))  # one token + EOS = 2 positions
    plan = plan_epoch(ids, n, seed=0, epoch=0, seq_len=2)
    assert plan.num_blocks == num_blocks
    info = epoch_steps(plan, global_batch=(batch_size) * world_size, drop_last=drop_last)
    g = batch_size * world_size
    seen = [
        step_blocks(
            s,
            rank=r,
            world_size=world_size,
            batch_size=batch_size,
            num_blocks=num_blocks,
            drop_last=drop_last,
        )
        for s in range(info.steps)
        for r in range(world_size)
    ]
    flat = np.concatenate(seen) if seen else np.zeros(0, np.int64)
    real = flat[flat >= 0]
    assert np.array_equal(np.sort(real), np.arange(len(real)))
    assert (flat < 0).sum() == info.padding_blocks
    if drop_last:
        assert info.steps == num_blocks // g and info.padding_blocks == 0
        assert len(real) + info.dropped_blocks == num_blocks
        assert info.dropped_tokens == info.dropped_eos == info.dropped_blocks
    else:
        assert len(real) == num_blocks and info.steps == -(-num_blocks // g)
        assert info.padding_positions == 2 * info.padding_blocks
    with pytest.raises(PlanError, match=f"step {info.steps} is outside the epoch"):
        step_blocks(
            info.steps,
            rank=0,
            world_size=world_size,
            batch_size=batch_size,
            num_blocks=num_blocks,
            drop_last=drop_last,
        )


def test_drop_last_reports_skipped_tokens() -> None:
    # 3 docs of 5 tokens, seq_len 4: stream 18 positions, 5 blocks; G = 2 keeps 4 blocks (16).
    ids, n = columns(make_rows([5, 5, 5]))
    plan = plan_epoch(ids, n, seed=3, epoch=0, seq_len=4)
    info = epoch_steps(plan, global_batch=(1) * 2, drop_last=True)
    assert (info.steps, info.dropped_blocks) == (2, 1)
    assert (info.dropped_tokens, info.dropped_eos, info.padding_positions) == (1, 1, 0)
    kept = epoch_steps(plan, global_batch=(1) * 2, drop_last=False)
    assert (kept.steps, kept.padding_blocks, kept.padding_positions) == (3, 1, 2 + 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rank": 2, "world_size": 2}, r"rank must be in \[0, 2\), got 2"),
        ({"rank": 0, "world_size": 0}, "world_size must be >= 1"),
        ({"rank": 0, "world_size": 1, "batch_size": 0}, "batch_size must be >= 1"),
    ],
)
def test_step_blocks_rejects_bad_topology(kwargs: dict, match: str) -> None:
    args = {"batch_size": 2, "num_blocks": 10, "drop_last": False, **kwargs}
    with pytest.raises(PlanError, match=match):
        step_blocks(0, **args)


def test_plan_of_a_million_rows_is_fast() -> None:
    rng = np.random.default_rng(0)
    n = 1_000_000
    ids = np.arange(n, dtype=np.int64) * 2
    lengths = rng.lognormal(6.1, 1.0, n).astype(np.int64)  # median ~450, mean ~740 tokens
    lengths[rng.random(n) < 0.01] = 0
    t0 = time.perf_counter()
    plan = plan_epoch(ids, lengths, seed=1, epoch=0, seq_len=2048)
    elapsed = time.perf_counter() - t0
    print(f"\nplan_epoch: {n:,} rows, {plan.num_tokens:,} tokens in {elapsed * 1e3:.0f} ms")
    assert plan.num_docs + plan.empty_rows == n
    assert plan.stream_len == int(lengths.sum()) + plan.num_docs
