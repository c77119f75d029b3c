"""The node-local plan store: built once, mapped by every process, equal to the plan in memory."""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import pickle

import numpy as np
import pytest

from tests.loader.tables import token_table
from tokenloom.loader import LoaderSpec, plan_epoch
from tokenloom.loader.pipeline.planner import Planner
from tokenloom.loader.pipeline.planstore import PLAN_CACHE_ENV, PlanStore, default_plan_dir


def selection(n: int = 5000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 900, n).astype(np.int64)
    lens[::7] = 0  # empty rows are left out of the order
    return np.arange(3, 3 + 2 * n, 2, dtype=np.int64), lens


def is_mapped(arr: np.ndarray) -> bool:
    base = arr
    while base is not None:
        if isinstance(base, np.memmap | mmap.mmap):
            return True
        base = getattr(base, "base", None)
    return False


def assert_same_plan(got, want) -> None:
    assert np.array_equal(got.order, want.order) and got.order.dtype == want.order.dtype
    assert np.array_equal(got.marks, want.marks)
    assert (got.stream_len, got.num_blocks, got.empty_rows) == (
        want.stream_len,
        want.num_blocks,
        want.empty_rows,
    )
    blocks = np.arange(want.num_blocks, dtype=np.int64)
    a, b = got.spans(blocks), want.spans(blocks)
    for name in ("block", "pos", "doc", "row_id", "doc_len", "tok_start", "tok_end", "has_eos"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_built_once_then_mapped_read_only(tmp_path) -> None:
    ids, lens = selection()
    first, second = PlanStore(str(tmp_path), min_docs=0), PlanStore(str(tmp_path), min_docs=0)
    want = plan_epoch(ids, lens, seed=5, epoch=1, seq_len=64)
    a = plan_epoch(ids, lens, seed=5, epoch=1, seq_len=64, store=first)
    b = plan_epoch(ids, lens, seed=5, epoch=1, seq_len=128, store=second)  # L is not in the key
    assert (first.built, first.mapped, second.built, second.mapped) == (1, 1, 0, 1)
    assert_same_plan(a, want)
    assert np.array_equal(b.order, want.order)
    path = first.path(ids, lens, seed=5, epoch=1)
    assert sorted(os.listdir(path)) == ["marks.npy", "order.npy"]
    assert is_mapped(a.order) and not a.order.flags.writeable
    assert not is_mapped(want.order)
    with pytest.raises(ValueError):
        a.order[0] = 1


def _plan_in_process(root: str) -> tuple[int, bytes]:
    ids, lens = selection(20_000, seed=3)
    store = PlanStore(root, min_docs=0)
    plan = plan_epoch(ids, lens, seed=9, epoch=0, seq_len=256, store=store)
    return store.built, plan.order.tobytes()


def test_processes_racing_build_it_once(tmp_path) -> None:
    with mp.get_context("spawn").Pool(3) as pool:
        results = pool.map(_plan_in_process, [str(tmp_path)] * 3)
    ids, lens = selection(20_000, seed=3)
    want = plan_epoch(ids, lens, seed=9, epoch=0, seq_len=256).order.tobytes()
    assert sum(built for built, _ in results) == 1  # the others waited on the lock and mapped
    assert all(order == want for _, order in results)


def test_old_epochs_pruned_and_a_bad_layout_rebuilt(tmp_path) -> None:
    ids, lens = selection()
    store = PlanStore(str(tmp_path), min_docs=0, keep_epochs=2)
    for epoch in range(4):
        plan_epoch(ids, lens, seed=1, epoch=epoch, seq_len=32, store=store)
    parent = os.path.dirname(store.path(ids, lens, seed=1, epoch=0))
    assert sorted(n for n in os.listdir(parent) if not n.endswith(".lock")) == ["s1-e2", "s1-e3"]
    np.save(os.path.join(store.path(ids, lens, seed=1, epoch=3), "order.npy"), np.zeros(3))
    again = plan_epoch(ids, lens, seed=1, epoch=3, seq_len=32, store=store)
    assert store.built == 5
    assert_same_plan(again, plan_epoch(ids, lens, seed=1, epoch=3, seq_len=32))


def test_small_selections_stay_in_memory(tmp_path, monkeypatch) -> None:
    ids, lens = selection(100)
    store = PlanStore(str(tmp_path / "plans"), min_docs=1000)
    plan = plan_epoch(ids, lens, seed=0, epoch=0, seq_len=16, store=store)
    assert store.built == store.mapped == 0 and not (tmp_path / "plans").exists()
    assert plan.order.dtype == np.uint32
    monkeypatch.setenv(PLAN_CACHE_ENV, "off")
    assert default_plan_dir() is None and PlanStore.default() is None
    monkeypatch.setenv(PLAN_CACHE_ENV, str(tmp_path / "elsewhere"))
    assert PlanStore.default().root == str(tmp_path / "elsewhere")


def test_planner_through_the_store_delivers_the_same_stream(tmp_path, paragraphs) -> None:
    uri = token_table(tmp_path, paragraphs[:120])
    spec = LoaderSpec(table=uri, seq_len=32, global_batch=4, seed=3, eos_id=0)
    store = PlanStore(str(tmp_path / "plans"), min_docs=0)
    shared, alone = Planner(spec, plan_store=store), Planner(spec, plan_store=None)
    for epoch in (0, 1):
        a, b = shared.view(epoch), alone.view(epoch)
        assert a.steps == b.steps
        for step in range(a.steps):
            pa, pb = a.skeleton(a.layout(step)), b.skeleton(b.layout(step))
            assert np.array_equal(pa.doc_ids, pb.doc_ids)
            assert np.array_equal(pa.spans, pb.spans)
    assert store.built == 2
    clone = pickle.loads(pickle.dumps(shared))  # a spawned DataLoader worker's copy
    assert not clone._plans and clone.store.root == store.root
    assert np.array_equal(clone.plan(1).order, shared.plan(1).order)
    assert clone.store.built == 0  # it mapped the layout the first process wrote


def test_unwritable_store_plans_in_memory(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the store's directory should be
    ids, lens = selection()
    store = PlanStore(str(blocker / "plans"), min_docs=0)
    with pytest.warns(UserWarning, match="not writable"):
        plan = plan_epoch(ids, lens, seed=2, epoch=0, seq_len=64, store=store)
    assert_same_plan(plan, plan_epoch(ids, lens, seed=2, epoch=0, seq_len=64))


def _inputs_equal(got, want) -> None:
    for name in ("row_ids", "n_tokens", "rowids"):
        a, b = getattr(got, name), getattr(want, name)
        assert np.array_equal(a, b) and a.dtype == b.dtype, name
    assert (got.version, got.null_rows, got.tokenizer) == (
        want.version,
        want.null_rows,
        want.tokenizer,
    )


def test_plan_inputs_scanned_once_then_mapped(tmp_path, paragraphs) -> None:
    uri = token_table(tmp_path, paragraphs[:120])
    spec = LoaderSpec(table=uri, seq_len=32, global_batch=4, seed=3, filter="id >= 7")
    root = str(tmp_path / "plans")
    alone = Planner(spec, plan_store=None)
    first = Planner(spec, plan_store=PlanStore(root, min_docs=0))
    second = Planner(spec, plan_store=PlanStore(root, min_docs=0))  # another rank
    assert (first.store.inputs_built, first.store.inputs_mapped) == (1, 1)
    assert (second.store.inputs_built, second.store.inputs_mapped) == (0, 1)
    assert alone.inputs.n_tokens.dtype == np.int32 and alone.inputs.shared is None
    for shared in (first, second):
        _inputs_equal(shared.inputs, alone.inputs)
        assert shared.inputs.shared == first.inputs.shared
        for col in (shared.inputs.row_ids, shared.inputs.n_tokens, shared.inputs.rowids):
            assert is_mapped(col.data) and not col.data.flags.writeable
    assert sorted(os.listdir(first.inputs.shared)) == ["meta.json"] + [
        f"{col}.{part}.npy"
        for col in ("n_tokens", "row_ids", "rowids")
        for part in ("bases", "data", "starts")
    ]
    assert first.plan_inputs() == alone.plan_inputs()
    assert np.array_equal(first.plan(0).order, alone.plan(0).order)
    clone = pickle.loads(pickle.dumps(second))  # a spawned DataLoader worker maps, never copies
    assert len(pickle.dumps(second.inputs)) < 1000
    assert is_mapped(clone.inputs.rowids.data) and clone.inputs.shared == first.inputs.shared
    _inputs_equal(clone.inputs, alone.inputs)
    small = pickle.loads(pickle.dumps(alone.inputs))  # in memory: the arrays travel
    _inputs_equal(small, alone.inputs)


def test_plan_inputs_key_names_the_selection(tmp_path, paragraphs) -> None:
    from tokenloom.loader.pipeline.inputs import plan_inputs_key
    from tokenloom.table import Table

    uri = token_table(tmp_path, paragraphs[:40])
    ds = Table.open(uri).dataset
    base = {
        "token_column": "input_ids",
        "count_column": "n_tokens",
        "filter": None,
        "allow_missing": False,
    }
    keys = {
        plan_inputs_key(ds, **base),
        plan_inputs_key(ds, **{**base, "filter": "id > 3"}),
        plan_inputs_key(ds, **{**base, "count_column": "other"}),
        plan_inputs_key(ds, **{**base, "token_column": "other"}),
        plan_inputs_key(ds, **{**base, "allow_missing": True}),
        plan_inputs_key(ds.checkout_version(1), **base),
    }
    assert len(keys) == 6
    assert plan_inputs_key(Table.open(uri).dataset, **base) == plan_inputs_key(ds, **base)


def test_plan_inputs_racing_threads_scan_once_and_a_bad_copy_is_rebuilt(
    tmp_path, paragraphs
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    uri = token_table(tmp_path, paragraphs[:60])
    spec = LoaderSpec(table=uri, seq_len=32, global_batch=4, seed=1)
    root = str(tmp_path / "plans")
    with ThreadPoolExecutor(3) as pool:  # flock excludes separate opens within one process too
        planners = list(
            pool.map(lambda _: Planner(spec, plan_store=PlanStore(root, min_docs=0)), range(3))
        )
    assert sum(p.store.inputs_built for p in planners) == 1
    want = Planner(spec, plan_store=None).inputs
    path = planners[0].inputs.shared
    (tmp_path / "plans" / "inputs" / os.path.basename(path) / "meta.json").write_text("{")
    again = Planner(spec, plan_store=PlanStore(root, min_docs=0))
    assert again.store.inputs_built == 1 and again.inputs.shared == path
    _inputs_equal(again.inputs, want)
    big = Planner(spec, plan_store=PlanStore(str(tmp_path / "big"), min_docs=10_000))
    assert big.inputs.shared is None and big.store.inputs_built == 0  # small: in memory
    _inputs_equal(big.inputs, want)


def test_mixture_inputs_and_union_shared(tmp_path, paragraphs) -> None:
    uri = token_table(tmp_path, paragraphs[:80])
    spec = LoaderSpec(
        table=uri,
        seq_len=32,
        global_batch=4,
        seed=5,
        mixture={"even": ["id % 2 = 0", 0.4], "low": ["id < 50", 0.6, 3]},  # rows in both
        budget_tokens=20_000,
    )
    shared = Planner(spec, plan_store=PlanStore(str(tmp_path / "plans"), min_docs=0))
    alone = Planner(spec, plan_store=None)
    assert shared.store.inputs_built == 3  # two pools and their union
    _inputs_equal(shared.inputs, alone.inputs)
    for a, b in zip(shared.pool_inputs, alone.pool_inputs, strict=True):
        _inputs_equal(a, b)
    assert shared.plan_inputs() == alone.plan_inputs()
    a, b = shared.view(0), alone.view(0)
    assert a.steps == b.steps
    for step in range(a.steps):
        pa, pb = a.skeleton(a.layout(step)), b.skeleton(b.layout(step))
        assert np.array_equal(pa.spans, pb.spans)


@pytest.mark.parametrize("empty", ["none", "some", "all"])
def test_layout_written_into_the_store_equals_memory(tmp_path, empty: str) -> None:
    """The order is written straight into the store's file (mapped for writing); from compact
    inputs, with or without empty rows, it equals the plan built in memory from plain arrays."""
    from tokenloom.loader.pipeline.inputs import compact_inputs

    ids, lens = selection(3000, seed=4)
    if empty == "none":
        lens = lens + 1
    elif empty == "all":
        lens = np.zeros_like(lens)
    cols = compact_inputs(ids, lens, ids.astype(np.uint64) + (5 << 32))
    store = PlanStore(str(tmp_path), min_docs=0)
    for epoch in (0, 1, 2):
        got = plan_epoch(
            cols["row_ids"], cols["n_tokens"], seed=9, epoch=epoch, seq_len=64, store=store
        )
        want = plan_epoch(ids, lens, seed=9, epoch=epoch, seq_len=64)
        assert is_mapped(got.order) and np.array_equal(got.order, want.order)
        assert np.array_equal(got.marks, want.marks) and got.num_blocks == want.num_blocks
        assert np.array_equal(got.row_ids, want.row_ids)
    assert store.built == 3
    folder = os.path.dirname(store.path(cols["row_ids"], cols["n_tokens"], seed=9, epoch=0))
    assert not [n for n in os.listdir(folder) if n.endswith(".tmp")]


def test_held_sets_built_once_mapped_and_only_the_newest_kept(tmp_path) -> None:
    """Arrays in a folder of their own (a held token column): built once whatever their size
    (``min_rows=0``), mapped read-only by the next process, and only the ``keep`` newest sets
    of the folder kept on disk."""
    store = PlanStore(str(tmp_path / "plans"))  # min_docs: 1M rows by default
    built: list[str] = []

    def build(name: str):
        def make():
            built.append(name)
            return {"values": np.arange(10, dtype=np.uint16)}, {"rows": 10}

        return make

    keys = [f"{k:032x}" for k in range(3)]
    arrays, _, path = store.arrays(keys[0], build("a"), folder="held", min_rows=0, keep=2)
    assert path is not None and arrays["values"].tolist() == list(range(10))
    again, _, same = PlanStore(store.root).arrays(keys[0], build("b"), folder="held", min_rows=0)
    assert same == path and is_mapped(again["values"]) and not again["values"].flags.writeable
    assert built == ["a"] and store.inputs_built == 0  # not counted as plan inputs
    for key in keys[1:]:
        store.arrays(key, build(key), folder="held", min_rows=0, keep=2)
    held = sorted(n for n in os.listdir(tmp_path / "plans" / "held") if not n.endswith(".lock"))
    assert held == keys[1:]  # the oldest set went
    assert store.writable() and not PlanStore("/proc/tokenloom-plans").writable()
