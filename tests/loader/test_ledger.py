"""The ledger, computed from the plan alone, equals what the loader delivers."""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from tests.conftest import real_paragraphs  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tokenloom.cli.main import cli  # noqa: E402
from tokenloom.loader import DataLoader, PackedDataset  # noqa: E402
from tokenloom.loader.observe.ledger import ledger  # noqa: E402

MIX = {"even": ("id % 2 = 0", 0.4), "odd": ("id % 2 = 1", 0.6, 3)}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return token_table(tmp_path_factory.mktemp("ledger"), real_paragraphs(80))


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"packing": "best_fit", "fit_window": 8},
        {"long_docs": "window", "window": 24, "overlap": 8},
        {"mixture": MIX, "budget_tokens": 50_000},
    ],
    ids=["concat", "best_fit", "window", "mixture"],
)
def test_ledger_equals_the_loaders_counts(table, options):
    def ds():
        return PackedDataset(
            table, seq_len=32, global_batch=4, seed=5, **options, block_order="sequential"
        )

    led = ledger(ds().planner)
    dl = DataLoader(ds(), num_workers=2 if "mixture" in options else 0)
    n = sum(1 for _ in dl)
    t, s = led.total, dl.stats
    assert led.steps == n
    assert t["separator_tokens"] == s.eos
    assert t["padding_positions"] == s.padding
    assert t["loss_positions"] == s.loss_positions
    assert t["body_tokens"] + t["overlap_tokens"] == s.tokens
    if options.get("long_docs") == "window":
        assert t["overlap_tokens"] > 0
    assert dl.ledger.pools() == [  # the same per-pool numbers, counted at run time
        dataclasses.replace(p, passes=1) for p in led.pools
    ]
    if "mixture" in options:
        odd = next(p for p in led.pools if p.name == "odd")
        assert odd.passes >= 2 and odd.documents_seen_more_than_once > 0
    else:
        assert led.pools[0].unique_documents == 80
        assert led.pools[0].documents_seen_more_than_once == 0


def test_ledger_cli(table):
    out = CliRunner().invoke(
        cli,
        [
            "ledger",
            "--table",
            table,
            "--seq-len",
            "32",
            "--global-batch-size",
            "4",
            "--steps",
            "10",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["steps"] == 10 and data["total"]["blocks"] == 40


@pytest.mark.parametrize("fold_every", [1, 7, 1 << 16])
def test_document_counts_folded_in_batches_equal_per_step_counting(monkeypatch, fold_every):
    """Documents are folded into `seen` in batches; reading it at any point gives exactly the
    per-step count (repeats within a step and across steps, saturation at 255)."""
    import numpy as np

    from tokenloom.loader.observe.ledger import LedgerCounter
    from tokenloom.loader.plan.view import COUNT_FIELDS, StepCounts

    monkeypatch.setattr(LedgerCounter, "_FLUSH_IDS", fold_every)
    rng = np.random.default_rng(0)
    universes = [np.arange(0, 40, 2), np.arange(1, 41, 2)]  # ids of two pools
    counter = LedgerCounter(["a", "b"], universes)
    naive = [np.zeros(20, np.int64), np.zeros(20, np.int64)]
    hot = np.full(300, 4)  # id 4 seen 300 times: saturates
    for step in range(40):
        starts = tuple(rng.choice(u, size=rng.integers(0, 6)) for u in universes)
        if step < 2:
            starts = (np.concatenate([starts[0], hot[:150]]), starts[1])
        counter.add(StepCounts(counts=np.ones((2, len(COUNT_FIELDS)), np.int64), starts=starts))
        for p, ids in enumerate(starts):
            np.add.at(naive[p], np.searchsorted(universes[p], ids), 1)
        if step % 13 == 0:  # reading mid-run folds what is pending
            for p in range(2):
                np.testing.assert_array_equal(counter.seen[p], np.minimum(naive[p], 255))
    for p in range(2):
        np.testing.assert_array_equal(counter.seen[p], np.minimum(naive[p], 255))
    assert counter.counts.sum() == 40 * 2 * len(COUNT_FIELDS)
    assert counter.seen[0][2] == 255  # id 4


@pytest.mark.parametrize("pools", [1, 3])
def test_steps_added_by_group_equal_steps_added_one_by_one(pools):
    """A training process adds each step it hands out as ``(group, i)``; consecutive steps of a
    group are summed together when the ledger is read. Counts and documents read at any point
    (mid-group too) equal adding every step's :class:`StepCounts` on its own."""
    import numpy as np

    from tokenloom.loader.observe.ledger import LedgerCounter
    from tokenloom.loader.plan.view import COUNT_FIELDS, GroupCounts

    rng = np.random.default_rng(pools)
    universes = [np.arange(p, 60, pools) for p in range(pools)]
    names = [f"p{p}" for p in range(pools)]
    lazy, eager = LedgerCounter(names, universes), LedgerCounter(names, universes)
    for g in range(12):
        k = int(rng.integers(1, 6))
        counts = rng.integers(0, 9, (k, pools, len(COUNT_FIELDS)))
        per = [rng.choice(universes[p], rng.integers(0, 4)) for _ in range(k) for p in range(pools)]
        bounds = np.concatenate([[0], np.cumsum([len(x) for x in per])]).astype(np.int64)
        starts = np.concatenate(per).astype(np.int64) if per else np.zeros(0, np.int64)
        group = GroupCounts(counts=counts, starts=starts, bounds=bounds)
        first = int(rng.integers(0, k))  # a pass may start (resume) mid-group
        for i in range(first, k):
            lazy.add_step(group, i)
            eager.add(group.step(i))
            if rng.random() < 0.3:  # read mid-group: what is pending is added first
                np.testing.assert_array_equal(lazy.counts, eager.counts)
        if g == 5:  # a step of the group again (the same group object): counted again
            lazy.add_step(group, k - 1)
            eager.add(group.step(k - 1))
    np.testing.assert_array_equal(lazy.counts, eager.counts)
    for a, b in zip(lazy.seen, eager.seen, strict=True):
        np.testing.assert_array_equal(a, b)
    assert lazy.pools() == eager.pools()
    lazy.counts = np.zeros_like(lazy.counts)  # as a resumed run sets them
    lazy.add_step(group, 0)
    np.testing.assert_array_equal(lazy.counts, group.counts[0])
