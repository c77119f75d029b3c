"""RowDataset end to end on a real table: the plan materialised, transforms and their failures,
formats, topology grid, exact elastic resume, the map-style variant."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch

from tests.rows.tables import decode, decode_skip, row_table
from tokenloom.loader.plan.state import ResumeMismatchError
from tokenloom.rows import (
    RowDataset,
    RowLoader,
    RowMapDataset,
    RowSpec,
    RowTransformError,
    naive_slots,
)

BAD = (3, 11, 12, 30)
COLS = ("k", "payload")


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return row_table(tmp_path_factory.mktemp("rows"), n=40, bad=BAD)


def _spec(table, **kw) -> RowSpec:
    return RowSpec(table=table, columns=COLS, global_batch=12, seed=5, **kw)


def _ids(ds, steps=None):
    out = []
    for i, batch in enumerate(ds):
        out.append(batch["row_id"].tolist())
        if steps is not None and i + 1 == steps:
            break
    return out


def test_stream_matches_the_naive_reference_with_skips_refilled(table):
    ds = RowDataset(_spec(table), transform=decode, on_error="skip", read_batch_size=5)
    got = _ids(ds)
    plan = ds.plan(0)
    bad = {int(np.searchsorted(ds.selection.row_ids, b)) for b in BAD}
    ref = [
        ds.selection.row_ids[naive_slots(plan, s, rank=0, world_size=1, bad=bad)].tolist()
        for s in range(plan.steps)
    ]
    assert got == ref and len(got) == 4  # ceil(40 / 12): the last step completed by refills
    assert sum(ds.skipped.values()) >= len(BAD) and set(ds.skipped) == {"ValueError"}
    assert not set(sum(got, [])) & set(BAD)
    assert ds.state_dict()["skipped"] == dict(ds.skipped)


def test_outputs_are_the_transform_of_the_delivered_rows(table):
    ds = RowDataset(_spec(table, filter="k < 30"), transform=decode_skip, on_error="skip")
    for batch in ds:
        ids = batch["row_id"]
        assert np.array_equal(batch["k2"], ids * 2)  # k == id in this table
        assert np.array_equal(batch["size"], 2 + 2 * (ids + 1))
    assert dict(ds.skipped) == {"bad_payload": ds.skipped["bad_payload"]}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_topology_grid_gives_the_same_global_batches(table, world, workers):
    ref = RowDataset(_spec(table), transform=decode, on_error="skip", transform_threads=0)
    whole = _ids(ref) + _ids(ref)  # two epochs: the cursor crosses the boundary
    b = 12 // world
    ranks = range(world) if workers == 0 else [world - 1]  # spawned workers are slow: one rank
    for r in ranks:
        ds = RowDataset(_spec(table), transform=decode, on_error="skip", rank=r, world_size=world)
        if workers:  # one epoch: every epoch spawns the workers again (seconds each here)
            got = _ids(RowLoader(ds, num_workers=workers))
            assert ds.state_dict()["epoch"] == 1 and ds.state_dict()["step"] == 0
            n = len(got)
        else:
            got = _ids(ds) + _ids(ds)
            n = len(whole)
        assert got == [g[r * b : (r + 1) * b] for g in whole[:n]]


def test_persistent_workers_keep_the_stream_across_epochs(table):
    ref = RowDataset(_spec(table), transform=decode, on_error="skip", transform_threads=0)
    whole = _ids(ref) + _ids(ref) + _ids(ref)
    ds = RowDataset(_spec(table), transform=decode, on_error="skip")
    dl = RowLoader(ds, num_workers=2, persistent_workers=True)
    got = _ids(dl)
    kept = dl._iterator
    got += _ids(dl)  # the same workers: each moved its own cursor to epoch 1
    assert dl._iterator is kept
    assert got == whole[: len(got)] and ds.cursor == (2, 0)
    ds.set_epoch(1)  # moved elsewhere: new workers start from the training process's cursor
    again = _ids(dl, steps=2)
    assert dl._iterator is not kept and again == whole[len(got) // 2 : len(got) // 2 + 2]
    rest = _ids(dl)  # left mid-epoch: new workers again, from step 2
    assert again + rest == whole[len(got) // 2 : len(got)]
    dl.close()


def test_exact_resume_on_other_world_sizes_across_an_epoch(table):
    kw = dict(transform=decode, on_error="skip")
    ref = RowDataset(_spec(table), **kw)
    whole = _ids(ref) + _ids(ref) + _ids(ref)
    ds = [RowDataset(_spec(table), rank=r, world_size=2, **kw) for r in range(2)]
    for d in ds:  # epoch 0 (4 steps), then one step of epoch 1
        assert len(_ids(d)) == 4
        assert len(_ids(d, steps=1)) == 1
    state = ds[0].state_dict()
    assert (state["epoch"], state["step"]) == (1, 1)
    for world in (1, 3, 4):
        b = 12 // world
        for r in range(world):
            again = RowDataset(_spec(table), rank=r, world_size=world, **kw)
            again.load_state_dict(state)
            got = _ids(again) + _ids(again)
            assert got == [g[r * b : (r + 1) * b] for g in whole[5:]]


def test_resume_refuses_a_changed_filter_or_transform(table):
    ds = RowDataset(_spec(table), transform=decode, on_error="skip")
    state = ds.state_dict()
    with pytest.raises(ResumeMismatchError, match="filter"):
        RowDataset(_spec(table, filter="k > 1"), transform=decode, on_error="skip").load_state_dict(
            state
        )
    with pytest.raises(ResumeMismatchError, match="transform"):
        RowDataset(_spec(table), transform=decode_skip, on_error="skip").load_state_dict(state)


def test_on_error_raise_names_the_row_and_warn_warns(table):
    with pytest.raises(RowTransformError, match=r"row id (3|11|12|30).*ValueError"):
        _ids(RowDataset(_spec(table), transform=decode))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _ids(RowDataset(_spec(table), transform=decode, on_error="warn", transform_threads=0))
    assert any("skipped and refilled" in str(w.message) for w in caught)


def test_formats(table):
    spec = RowSpec(table=table, columns=("k", "label", "payload"), global_batch=4, seed=1)
    arrow = next(iter(RowDataset(spec, format="arrow")))
    assert isinstance(arrow, pa.RecordBatch)
    assert arrow.schema.names == ["k", "label", "payload", "row_id"]
    assert arrow.column("payload")[0].as_py().startswith((b"OK", b"BAD"))
    tens = next(iter(RowDataset(spec, format="torch", transform=decode_skip, on_error="skip")))
    assert tens["k2"].dtype == torch.int64 and tens["row_id"].shape == (4,)
    rows = next(iter(RowDataset(spec, format="python")))
    assert isinstance(rows, list) and set(rows[0]) == {"k", "label", "payload", "row_id"}
    assert rows[0]["k"] == rows[0]["row_id"]
    npy = next(iter(RowDataset(spec, format="numpy")))
    assert npy["k"].tolist() == npy["row_id"].tolist()


def test_map_style_with_a_shuffling_dataloader(table):
    ds = RowMapDataset(_spec(table), transform=decode, on_error="skip")
    assert len(ds) == 40
    loader = torch.utils.data.DataLoader(
        ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    seen = []
    for batch in loader:
        assert batch["k2"].tolist() == (batch["row_id"] * 2).tolist()
        seen += batch["row_id"].tolist()
    assert len(seen) == 40 and not set(seen) & set(BAD)
    assert set(range(40)) - set(BAD) <= set(seen)  # every good row, bad ones replaced
    assert ds.skipped["ValueError"] >= len(BAD)


def test_an_epoch_without_a_step_is_refused_not_iterated_forever(table):
    from tokenloom.rows import RowLoaderError

    nothing = RowDataset(_spec(table, filter="id < 0"), transform=decode, on_error="skip")
    with pytest.raises(RowLoaderError, match=r"filter 'id < 0' selects no row.*widen the filter"):
        next(iter(nothing))
    short = RowDataset(
        RowSpec(table=table, columns=COLS, global_batch=64, drop_last=True), transform=decode
    )
    with pytest.raises(RowLoaderError, match="40 rows are fewer than one global batch of 64"):
        len(short)


def test_forkserver_workers_give_the_in_process_batches_and_fork_is_refused(table):
    from tokenloom.loader.pipeline.read import LoaderError

    ref = _ids(RowDataset(_spec(table), transform=decode, on_error="skip", transform_threads=0))
    ds = RowDataset(_spec(table), transform=decode, on_error="skip")
    assert _ids(RowLoader(ds, num_workers=2, multiprocessing_context="forkserver")) == ref
    with pytest.raises(LoaderError, match="Lance is not fork-safe"):
        RowLoader(ds, num_workers=2, multiprocessing_context="fork")


def test_a_bytes_layout_token_column_reads_as_lists_of_ids(tmp_path):
    """The row loader reads a token column in either layout as lists of ids."""
    from tests.loader.tables import token_table

    texts = [f"row {i} " * (i % 4 + 1) for i in range(20)]
    got = {}
    for layout in ("list", "bytes"):
        uri = token_table(tmp_path, texts, name=f"{layout}.lance", layout=layout)
        spec = RowSpec(table=uri, columns=("id", "input_ids"), global_batch=5, seed=3)
        batches = list(RowDataset(spec, format="python"))
        got[layout] = [
            (int(r["id"]), np.asarray(r["input_ids"]).tolist()) for b in batches for r in b
        ]
    assert got["bytes"] == got["list"] and len(got["list"]) == len(texts)
    assert all(ids == list(texts[i].encode()) for i, ids in got["list"])
