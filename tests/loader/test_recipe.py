"""Recipes: config, fingerprint, dispatch, and whole epochs across world sizes per policy."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.loader.helpers import columns, corpora, make_rows, seeds
from tests.loader.recipe_ref import fast_pack
from tokenloom.loader import (
    EpochPlan,
    PlanError,
    epoch_steps,
    plan_epoch,
    plan_fingerprint,
    step_blocks,
)
from tokenloom.loader.plan.bestfit import BestFitPlan
from tokenloom.loader.plan.recipe import Recipe, plan_recipe_epoch
from tokenloom.loader.plan.window import WindowedPlan

RECIPES = [
    Recipe(),
    Recipe(long_docs="window", overlap=2),
    Recipe(long_docs="window", window=5, overlap=0),
    Recipe(packing="best_fit", fit_window=1),
    Recipe(packing="best_fit", fit_window=5),
    Recipe(packing="best_fit", fit_window=64, long_docs="window", window=6, overlap=3),
]


def test_recipe_validation_and_fingerprint() -> None:
    assert Recipe().is_default and Recipe().fingerprint_inputs() == {}
    assert Recipe(fit_window=7).fingerprint_inputs() == {}  # unused by concat
    bf = Recipe(packing="best_fit", fit_window=128)
    assert bf.fingerprint_inputs() == {
        "recipe": {
            "packing": "best_fit",
            "long_docs": "split",
            "fit_window": 128,
            "algorithm": "bfd-window-close-v1",
        }
    }
    win = Recipe(long_docs="window", window=512, overlap=64)
    assert win.fingerprint_inputs()["recipe"]["overlap"] == 64
    prints = {
        plan_fingerprint(seq_len=8, **r.fingerprint_inputs())
        for r in [Recipe(), bf, win, Recipe(packing="best_fit", fit_window=64)]
    }
    assert len(prints) == 4
    for bad, match in [
        ({"packing": "greedy"}, "packing must be one of"),
        ({"packing": "bestfit"}, "it is spelled 'best_fit'"),
        ({"cut_column": "cut_points"}, "apply to long_docs='window' only"),
        ({"long_docs": "truncate"}, "long_docs must be one of"),
        ({"fit_window": 0}, "fit_window must be an integer >= 1"),
        ({"overlap": 3}, "apply to long_docs='window' only"),
        ({"long_docs": "window", "window": 4, "overlap": 4}, "overlap < window"),
    ]:
        with pytest.raises(PlanError, match=match):
            Recipe(**bad)
    with pytest.raises(PlanError, match="window <= seq_len"):
        plan_recipe_epoch(
            np.array([1]),
            np.array([3]),
            seed=0,
            epoch=0,
            seq_len=4,
            recipe=Recipe(long_docs="window", window=8, overlap=1),
        )


def test_dispatch() -> None:
    ids, n = columns(make_rows([3, 20, 5]))
    kinds = [type(plan_recipe_epoch(ids, n, seed=0, epoch=0, seq_len=8, recipe=r)) for r in RECIPES]
    assert kinds == [EpochPlan, WindowedPlan, WindowedPlan, BestFitPlan, BestFitPlan, BestFitPlan]


@settings(derandomize=True, max_examples=150, deadline=None)
@given(
    corpus=corpora(max_docs=8),
    seed=seeds,
    recipe=st.sampled_from(RECIPES),
    global_batch=st.sampled_from([1, 2, 3, 4, 6, 12]),
    drop_last=st.booleans(),
)
def test_whole_epoch_across_world_sizes(
    corpus: tuple[int, list[int]], seed: int, recipe: Recipe, global_batch: int, drop_last: bool
) -> None:
    L, lengths = corpus
    if recipe.long_docs == "window":  # fit the window to the drawn block length
        W = min(recipe.window or L, L)
        recipe = Recipe(
            packing=recipe.packing,
            fit_window=recipe.fit_window,
            long_docs="window",
            window=W,
            overlap=min(recipe.overlap, W - 1),
        )
    rows = make_rows(lengths)
    plan = plan_recipe_epoch(*columns(rows), seed=seed, epoch=2, seq_len=L, recipe=recipe)
    by_world = {}
    for world in (w for w in range(1, 5) if global_batch % w == 0):
        b = global_batch // world
        info = epoch_steps(plan, global_batch=(b) * world, drop_last=drop_last)
        if isinstance(plan, EpochPlan):
            assert info == epoch_steps(plan, global_batch=(b) * world, drop_last=drop_last)
        batches, real, eos, pad = [], 0, 0, 0
        for s in range(info.steps):
            parts = []
            for r in range(world):
                blocks = step_blocks(
                    s,
                    rank=r,
                    world_size=world,
                    batch_size=b,
                    num_blocks=plan.num_blocks,
                    drop_last=drop_last,
                )
                out = fast_pack(plan, lambda p, b: p.spans(b), rows, blocks, lookahead=True)
                parts.append(out.input_ids)
                real += out.real_tokens
                eos += out.eos_positions
                pad += out.padding_positions
            batches.append(np.concatenate(parts))
        by_world[world] = batches
        everything = plan.counts(0, plan.num_blocks)
        assert real + info.dropped_tokens == everything.tokens
        assert (
            eos + info.dropped_eos
            == everything.eos
            == plan_epoch(*columns(rows), seed=0, epoch=0, seq_len=L).num_docs
        )
        assert pad == info.padding_positions
    for batches in by_world.values():  # topology independence
        assert len(batches) == len(by_world[1])
        for a, b in zip(batches, by_world[1], strict=True):
            assert np.array_equal(a, b)


def test_planning_throughput() -> None:
    """Print planning throughput of each policy on realistic lengths (no timing assertion)."""
    sigma = np.sqrt(2 * np.log(800 / 450))
    lens = np.maximum(
        np.random.default_rng(0).lognormal(np.log(450), sigma, 200_000).astype(np.int64), 1
    )
    ids = np.arange(lens.shape[0], dtype=np.int64)
    for name, recipe in [
        ("concat", Recipe()),
        ("concat+window(512, 64)", Recipe(long_docs="window", window=512, overlap=64)),
        ("bestfit(1024)", Recipe(packing="best_fit", fit_window=1024)),
        (
            "bestfit(1024)+window(1024, 128)",
            Recipe(packing="best_fit", fit_window=1024, long_docs="window", overlap=128),
        ),
    ]:
        t0 = time.perf_counter()
        plan = plan_recipe_epoch(ids, lens, seed=0, epoch=0, seq_len=1024, recipe=recipe)
        planned = time.perf_counter() - t0
        t0 = time.perf_counter()
        for s in range(100):
            plan.spans(np.arange(8 * s, 8 * s + 8))
        spans = (time.perf_counter() - t0) / 800
        print(
            f"\n{name}: {lens.shape[0] / planned:,.0f} docs/s planned, "
            f"{1 / spans:,.0f} blocks/s of spans, "
            f"padding {plan.padding_positions / (plan.num_blocks * 1024):.2%}"
        )


def test_recipe_modules_import_no_torch_and_no_lance() -> None:
    code = (
        "import sys\n"
        "import tokenloom.loader.plan.window, tokenloom.loader.plan.bestfit\n"
        "import tokenloom.loader.plan.mixture, tokenloom.loader.plan.recipe\n"
        "print(sorted(m for m in ('torch', 'lance', 'pyarrow', 'numba') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
