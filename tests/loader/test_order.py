"""Curriculum order (``order_by`` / ``order_jitter``): the spelling, the sort against Python's,
the buckets against a naive shuffle, every recipe and mixture pool on a real table against a
reference computed here from the stored values, the plan store, and the topology (ranks,
DataLoader workers)."""

from __future__ import annotations

import datetime
import math
import pickle

import lance
import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import real_paragraphs
from tests.loader.tables import token_table
from tokenloom.backfill import add_column, udf
from tokenloom.loader import LoaderSpec, Planner, PlanStore
from tokenloom.loader.plan import order as order_mod
from tokenloom.loader.plan.epoch import PlanError
from tokenloom.loader.plan.mixture import pool_seed
from tokenloom.loader.plan.order import (
    Ordering,
    curriculum_order,
    naive_curriculum_order,
    naive_rank_rows,
    parse_order_by,
    rank_rows,
)
from tokenloom.loader.plan.shuffle import epoch_rng


@udf(inputs=["id"], output=pa.schema([pa.field("quality", pa.float64())]), version="1")
def quality(batch: pa.RecordBatch) -> dict:
    """A score with ties (11 values), nulls (id % 7 == 3) and NaN (id % 13 == 5)."""
    out: list[float | None] = []
    for i in batch.column("id").to_pylist():
        out.append(None if i % 7 == 3 else math.nan if i % 13 == 5 else float((i * 37) % 11))
    return {"quality": out}


@udf(inputs=["id"], output=pa.schema([pa.field("wide", pa.float64())]), version="1")
def wide(batch: pa.RecordBatch) -> dict:
    """float64 values no float32 holds exactly, with ties (id % 9) and a null (id 2)."""
    return {"wide": [None if i == 2 else (i % 9) / 3 for i in batch.column("id").to_pylist()]}


@udf(inputs=["id"], output=pa.schema([pa.field("day", pa.date32())]), version="1")
def day(batch: pa.RecordBatch) -> dict:
    """A date with ties (id % 5) and a null (id 7)."""
    start = datetime.date(2024, 1, 1)
    ids = batch.column("id").to_pylist()
    return {"day": [None if i == 7 else start + datetime.timedelta(days=i % 5) for i in ids]}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    uri = token_table(tmp_path_factory.mktemp("order"), real_paragraphs(60))
    add_column(uri, None, quality, workers=0)
    add_column(uri, None, wide, workers=0)
    add_column(uri, None, day, workers=0)
    return uri


def _values(uri: str, flt: str | None = None) -> dict[str, list]:
    return (
        lance.dataset(uri)
        .to_table(columns=["id", "quality", "n_chars", "n_tokens"], filter=flt)
        .to_pydict()
    )


def reference(uri, *, flt=None, desc=True, nulls_first=False, jitter=1, seed=0, epoch=0):
    """``quality [DESC|ASC] NULLS ..., n_chars ASC`` by a Python sort, buckets of ``jitter``
    documents each shuffled by the raw stream of (seed, epoch): the table ids in visiting order."""
    t = _values(uri, flt)
    rows = list(zip(t["id"], t["quality"], t["n_chars"], t["n_tokens"], strict=True))

    def key(r):
        q = r[1]
        gone = q is None or q != q
        value = 0.0 if gone else (-q if desc else q)
        return ((not gone) if nulls_first else gone, value, r[2], r[0])

    docs = [r[0] for r in sorted(rows, key=key) if r[3] > 0]
    raw = epoch_rng(seed=seed, epoch=epoch).bit_generator.random_raw(len(docs))
    out = []
    for a in range(0, len(docs), jitter):
        ks = sorted(range(a, min(a + jitter, len(docs))), key=lambda k: (int(raw[k]), k))
        out += [docs[k] for k in ks]
    return out


def _stream_rows(plan) -> list[int]:
    """Table ids of a recipe plan's documents in visiting order."""
    while not hasattr(plan, "order"):
        plan = plan.stream
    return plan.row_ids.tolist()


# -- spelling --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("quality", "quality ASC NULLS LAST"),
        ("quality desc", "quality DESC NULLS LAST"),
        ("Quality DESC nulls first", "Quality DESC NULLS FIRST"),
        ("  a desc ,b  ", "a DESC NULLS LAST, b ASC NULLS LAST"),
        ("`odd name` DESC", "`odd name` DESC NULLS LAST"),
    ],
)
def test_spellings_are_stored_canonical(table, text, canonical):
    spec = LoaderSpec(table=table, order_by=text)
    assert spec.order_by == canonical and spec.block_order == "sequential"
    assert LoaderSpec(table=table, order_by=canonical).order_by == canonical  # a fixed point
    assert LoaderSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"order_by": "quality DOWN"}, "does not parse"),
        ({"order_by": "quality DESC NULLS"}, "does not parse"),
        ({"order_by": "a, a DESC"}, "twice"),
        ({"order_by": " "}, "must name a key"),
        ({"order_by": "a;b"}, "does not parse"),
        ({"order_jitter": 4}, "applies to an order_by only"),
        ({"order_by": "a", "order_jitter": 0}, ">= 1"),
        ({"order_by": "a", "order_jitter": True}, ">= 1"),
        ({"order_by": "a", "block_order": "interleave"}, "undoes the curriculum"),
    ],
)
def test_bad_options_are_refused_when_the_spec_is_built(table, options, words):
    with pytest.raises(PlanError, match=words):
        LoaderSpec(table=table, **options)


def test_the_order_is_a_fingerprint_input_only_when_set(table):
    plain = LoaderSpec(table=table).fingerprint_inputs()
    assert not any(k.startswith("order") for k in plain)
    ordered = LoaderSpec(table=table, order_by="quality desc", order_jitter=3)
    got = ordered.fingerprint_inputs()
    assert got["order_by"] == "quality DESC NULLS LAST" and got["order_jitter"] == 3
    assert got["order_algorithm"] == order_mod.ORDER_ALGORITHM


# -- the pure math ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_rank_rows_equals_pythons_sort(seed):
    rng = np.random.default_rng(seed)
    n = 200
    floats = rng.integers(0, 5, n).astype(np.float64)
    floats[rng.random(n) < 0.1] = np.nan
    float_null = rng.random(n) < 0.1
    ints = rng.integers(-3, 3, n).astype(np.int64)
    ints[0] = np.iinfo(np.int64).min  # ~x reverses it without overflow
    int_null = rng.random(n) < 0.1
    bools = rng.random(n) < 0.5
    cols = [(floats, float_null), (ints, int_null), (bools, np.zeros(n, bool))]
    pyvals = [
        [None if m else float(v) for v, m in zip(floats, float_null, strict=True)],
        [None if m else int(v) for v, m in zip(ints, int_null, strict=True)],
        [int(b) for b in bools],
    ]
    for text in ("a, b, c", "a DESC, b DESC NULLS FIRST, c", "a NULLS FIRST, b ASC, c DESC"):
        keys = parse_order_by(text)
        got = rank_rows(cols, keys)
        assert got.dtype == np.uint32
        assert got.tolist() == naive_rank_rows(pyvals, keys), text


def _single_keys(rng, n):
    """One-key columns: which take 32-bit codes, which the general sort."""
    f32 = rng.integers(-4, 5, n).astype(np.float32) / np.float32(4)
    f32[:4] = [-0.0, 0.0, np.inf, -np.inf]
    wide = rng.random(n)  # float64 values no float32 holds exactly
    small = rng.integers(-(2**40), -(2**40) + 6, n)  # far from 0, a small span
    big = rng.integers(-3, 3, n)
    big[0] = np.iinfo(np.int64).min
    flags = rng.random(n) < 0.5
    days = np.array(rng.integers(0, 5, n), dtype="datetime64[D]")
    return {
        "float32": (f32, True),
        "float64 exact": (f32.astype(np.float64), True),
        "float64 wide": (wide, False),
        "int small span": (small, True),
        "int wide span": (big, False),
        "bool": (flags, True),
        "date": (days, True),
    }


@pytest.mark.parametrize("kind", list(_single_keys(np.random.default_rng(0), 4)))
def test_one_key_sorts_as_codes_when_they_fit_and_equals_pythons_sort(kind):
    rng = np.random.default_rng(11)
    n = 300
    values, fits = _single_keys(rng, n)[kind]
    missing = rng.random(n) < 0.1
    if np.issubdtype(values.dtype, np.floating):
        values = values.copy()
        values[rng.random(n) < 0.05] = np.nan
    py = [
        None if m else (int(v.astype(np.int64)) if kind == "date" else v.item())
        for v, m in zip(values, missing, strict=True)
    ]
    for text in ("k", "k DESC", "k NULLS FIRST", "k DESC NULLS FIRST"):
        keys = parse_order_by(text)
        assert (order_mod.key_codes(values, missing, keys[0]) is not None) == fits
        got = rank_rows([(values, missing)], keys)
        assert got.tolist() == naive_rank_rows([py], keys), (kind, text)


@pytest.mark.parametrize("chunk", [8, 1 << 18])
@pytest.mark.parametrize("jitter", [1, 2, 3, 7, 16, 50, 500])
def test_curriculum_order_equals_the_naive_buckets(monkeypatch, chunk, jitter):
    monkeypatch.setattr(order_mod, "_CHUNK", chunk)  # 8: large buckets take the packed sort
    rng = np.random.default_rng(jitter)
    lens = rng.integers(0, 4, 300)  # a quarter empty: they are left out before bucketing
    ranked = rng.permutation(300).astype(np.uint32)
    ordering = Ordering(ranked=ranked, jitter=jitter)
    for seed, epoch in ((0, 0), (3, 1)):
        got = curriculum_order(lens, ordering, seed=seed, epoch=epoch)
        want = naive_curriculum_order(lens, ranked, jitter=jitter, seed=seed, epoch=epoch)
        assert got.tolist() == want
        docs = [int(p) for p in ranked if lens[p] > 0]
        for a in range(0, len(docs), jitter):  # each bucket holds the same documents
            assert sorted(got[a : a + jitter].tolist()) == sorted(docs[a : a + jitter])
    if jitter > 1:
        assert not np.array_equal(
            curriculum_order(lens, ordering, seed=0, epoch=0),
            curriculum_order(lens, ordering, seed=0, epoch=1),
        )


def test_an_ordering_pickles_by_value_and_its_digest_names_the_buckets():
    ranked = np.arange(10, dtype=np.uint32)[::-1].copy()
    a = Ordering(ranked=ranked, jitter=2)
    b = pickle.loads(pickle.dumps(a))
    assert b.digest == a.digest and np.array_equal(b.ranked, ranked)
    assert Ordering(ranked=ranked, jitter=3).digest != a.digest
    assert Ordering(ranked=ranked[::-1].copy(), jitter=2).digest != a.digest


# -- a real table, every recipe --------------------------------------------------------------


RECIPES = {
    "concat": {},
    "best_fit": {"packing": "best_fit", "fit_window": 5},
    "window": {"long_docs": "window", "window": 24, "overlap": 4},
}


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize(("jitter", "seed"), [(1, 0), (4, 7), (1000, 2)])
def test_every_recipe_visits_the_reference_order(table, recipe, jitter, seed):
    spec = LoaderSpec.from_options(
        table=table,
        seq_len=32,
        global_batch=2,
        seed=seed,
        filter="id != 4",
        order_by="quality DESC, n_chars",
        order_jitter=jitter,
        **RECIPES[recipe],
    )
    planner = Planner(spec, plan_store=None)
    for epoch in (0, 1):
        got = _stream_rows(planner.plan(epoch))
        assert got == reference(table, flt="id != 4", jitter=jitter, seed=seed, epoch=epoch)
        assert sorted(got) == sorted(set(got)) and 4 not in got  # every row once
    info = planner.epoch_info(0)
    t = _values(table, "id != 4")
    nulls = sum(q is None or q != q for q in t["quality"])
    assert info["order_null_rows"] == nulls > 0 and info["order_by"] == spec.order_by


@pytest.mark.parametrize(
    ("by", "column", "desc"),
    [
        ("wide DESC", "wide", True),  # float64: the general sort
        ("n_chars DESC", "n_chars", True),  # integers: 32-bit codes
        ("id", "id", False),  # the id column itself, read once
        ("day DESC", "day", True),  # date32: as its stored integers
    ],
)
def test_one_key_of_any_width_follows_pythons_sort(table, by, column, desc):
    t = lance.dataset(table).to_table(columns=list(dict.fromkeys(["id", column]))).to_pydict()
    plain = [v.toordinal() if isinstance(v, datetime.date) else v for v in t[column]]
    pairs = list(zip(t["id"], plain, strict=True))
    want = [
        i
        for i, v in sorted(
            pairs, key=lambda p: (p[1] is None, -(p[1] or 0) if desc else p[1], p[0])
        )
    ]
    spec = LoaderSpec(table=table, seq_len=32, order_by=by)
    assert _stream_rows(Planner(spec, plan_store=None).plan(0)) == want


def test_nulls_first_and_ascending(table):
    spec = LoaderSpec(table=table, seq_len=32, order_by="quality ASC NULLS FIRST, n_chars")
    got = _stream_rows(Planner(spec, plan_store=None).plan(0))
    assert got == reference(table, desc=False, nulls_first=True)


def test_best_fit_keeps_documents_within_their_fit_window(table):
    F = 6
    spec = LoaderSpec.from_options(
        table=table, seq_len=48, order_by="quality DESC", packing="best_fit", fit_window=F
    )
    plan = Planner(spec, plan_store=None).plan(0)
    order = _stream_rows(plan)
    edges = plan.window_blocks.tolist()
    for w in range(len(edges) - 1):
        blocks = np.arange(edges[w], edges[w + 1], dtype=np.int64)
        rows = set(plan.spans(blocks).row_id.tolist())
        assert rows == set(order[w * F : (w + 1) * F]), w


def test_mixture_pools_each_follow_their_own_curriculum(table):
    mix = {"even": ["id % 2 = 0", 0.5], "odd": ["id % 2 = 1", 0.5, 2]}
    spec = LoaderSpec(
        table=table, seq_len=32, global_batch=2, seed=5, mixture=mix,
        order_by="quality DESC, n_chars", order_jitter=3,
    )  # fmt: skip
    plan = Planner(spec, plan_store=None).plan(1)
    for p, flt in enumerate(["id % 2 = 0", "id % 2 = 1"]):
        for q in range(2):
            got = _stream_rows(plan.pool_plan(p, q))
            want = reference(table, flt=flt, jitter=3, seed=pool_seed(5, p, q), epoch=1)
            assert got == want, (p, q)


def test_the_plan_store_shares_the_sorted_order(table, tmp_path):
    spec = LoaderSpec(table=table, seq_len=32, order_by="quality DESC", order_jitter=5)
    store = PlanStore(str(tmp_path / "plans"), min_docs=0)
    planner = Planner(spec, plan_store=store)
    assert planner.orderings[0].shared is not None  # mapped from the store
    first = _stream_rows(planner.plan(0))
    again = Planner(spec, plan_store=PlanStore(str(tmp_path / "plans"), min_docs=0))
    assert again.store.inputs_built == 0 and again.store.inputs_mapped >= 2  # inputs + order
    worker = pickle.loads(pickle.dumps(again))  # a spawned DataLoader worker maps the files
    assert worker.orderings[0].shared == planner.orderings[0].shared
    assert (
        _stream_rows(worker.plan(0))
        == first
        == _stream_rows(Planner(spec, plan_store=None).plan(0))
    )
    plain = Planner(
        spec.replace(order_by=None, order_jitter=1, block_order="sequential"), plan_store=store
    )
    assert _stream_rows(plain.plan(0)) != first  # the uniform layout is kept apart


# -- topology --------------------------------------------------------------------------------


def test_ranks_and_workers_read_the_same_global_batches(table):
    torch = pytest.importorskip("torch")
    from tokenloom.loader import DataLoader, PackedDataset

    spec = LoaderSpec(
        table=table, seq_len=32, global_batch=4, seed=3, order_by="quality DESC", order_jitter=4
    )
    whole = [b["input_ids"] for b in DataLoader(PackedDataset(spec), num_workers=0)]
    for workers in (0, 2):
        halves = [
            [
                b["input_ids"]
                for b in DataLoader(PackedDataset(spec, rank=r, world_size=2), num_workers=workers)
            ]
            for r in range(2)
        ]
        assert len(halves[0]) == len(whole)
        for w, a, b in zip(whole, *halves, strict=True):
            assert torch.equal(w, torch.cat([a, b]))
    # the first global batch holds the best rows: the curriculum reaches the batches
    ds = PackedDataset(spec)
    first = next(iter(DataLoader(ds, num_workers=0)))
    rows = {int(r) for r in first["spans"][:, 2].tolist()}
    assert rows <= set(reference(table, jitter=4, seed=3)[:12])
