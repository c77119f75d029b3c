"""PackedDataset / DataLoader against the naive reference, across topologies, epochs, filters,
edge-length documents, resume (also onto another world size) and changed inputs."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.conftest import real_paragraphs, write_jsonl  # noqa: E402
from tests.loader.tables import byte_tokens, token_table  # noqa: E402
from tokenloom.backfill import add_column  # noqa: E402
from tokenloom.ingest import ingest  # noqa: E402
from tokenloom.loader import (  # noqa: E402
    DataLoader,
    EmptyEpochError,
    PackedDataset,
    ResumeMismatchError,
    naive_pack,
    step_blocks,
)
from tokenloom.loader.pipeline.read import LoaderError  # noqa: E402
from tokenloom.loader.plan.epoch import PlanError  # noqa: E402
from tokenloom.table import Table  # noqa: E402

L = 32
G = 12  # global batch: world sizes 1, 2, 3, 4 all divide it


def _texts() -> list[str]:
    """Real text cut to the nasty lengths: 1, L-2 (+EOS = L-1), L-1, L, L+1, 20L; then normal."""
    paras = real_paragraphs(200)
    long = " ".join(paras)
    edge = [long[:n] for n in (1, L - 2, L - 1, L, L + 1, 20 * L)]
    return edge + paras[:40]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return token_table(tmp_path_factory.mktemp("loader"), _texts())


def _rows(uri: str, filter: str | None = None) -> dict[int, list[int]]:
    t = Table.open(uri).dataset.to_table(columns=["id", "input_ids"], filter=filter)
    return {
        i: (ids or [])
        for i, ids in zip(t["id"].to_pylist(), t["input_ids"].to_pylist(), strict=True)
    }


def _global_batches(uri, *, world_size, workers, epoch=0, filter=None, seed=3):
    """Every global batch of an epoch: per step, the ranks' batches concatenated.

    Rank 0 reads through ``workers`` DataLoader workers, the other ranks in-process (spawning
    workers for every rank would only repeat the same per-rank property, slowly)."""
    per_rank = []
    for rank in range(world_size):
        ds = PackedDataset(
            uri,
            seq_len=L,
            global_batch=G,
            seed=seed,
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            filter=filter,
            block_order="sequential",
        )
        per_rank.append(list(DataLoader(ds, num_workers=workers if rank == 0 else 0)))
    steps = len(per_rank[0])
    assert all(len(r) == steps for r in per_rank)
    return [_concat([r[s] for r in per_rank]) for s in range(steps)]


def _concat(batches):
    out = {}
    for key in ("input_ids", "labels", "position_ids", "doc_ids", "continues"):
        out[key] = torch.cat([b[key] for b in batches]).numpy()
    return out


def _naive(uri, *, epoch, filter=None, seed=3):
    rows = _rows(uri, filter)
    total = sum(len(v) + 1 for v in rows.values() if v)
    num_blocks = -(-total // L)
    steps = -(-num_blocks // G)
    out = []
    for s in range(steps):
        blocks = step_blocks(
            s, rank=0, world_size=1, batch_size=G, num_blocks=num_blocks, drop_last=False
        )
        ref = naive_pack(
            rows, blocks, seed=seed, epoch=epoch, seq_len=L, eos_id=256, pad_id=257, lookahead=True
        )
        out.append(ref)
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_matches_naive_reference_for_every_topology(table, world_size, workers):
    for epoch in (0, 1):
        got = _global_batches(table, world_size=world_size, workers=workers, epoch=epoch)
        ref = _naive(table, epoch=epoch)
        assert len(got) == len(ref)
        for g, r in zip(got, ref, strict=True):
            for key in ("input_ids", "labels", "position_ids", "doc_ids", "continues"):
                np.testing.assert_array_equal(g[key], getattr(r, key), err_msg=key)


def test_epochs_differ_and_every_token_appears_once(table):
    rows = _rows(table)
    for epoch in (0, 1):
        ds = PackedDataset(
            table, seq_len=L, global_batch=4, seed=3, epoch=epoch, block_order="sequential"
        )
        covered: dict[int, list[tuple[int, int]]] = {}
        firsts = []
        for batch in ds:
            for _b, _pos, rid, start, end in batch["spans"].tolist():
                if end > start:
                    covered.setdefault(rid, []).append((start, end))
            firsts.append(batch["input_ids"][0, :8].tolist())
        for rid, toks in rows.items():
            ranges = sorted(covered.get(rid, []))
            assert ranges[0][0] == 0 and ranges[-1][1] == len(toks), rid
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False)), rid
        if epoch == 0:
            first_epoch = firsts
    assert firsts != first_epoch  # a fresh permutation per epoch


@pytest.mark.parametrize("filter, n_rows", [("id < 0", 0), ("id = 7", 1), (None, 46)])
def test_filters_selecting_none_one_all(table, filter, n_rows):
    ds = PackedDataset(
        table, seq_len=L, global_batch=2, seed=0, filter=filter, block_order="sequential"
    )
    if n_rows == 0:  # an epoch without a step is refused, never iterated as an empty one
        with pytest.raises(EmptyEpochError, match="selects 0 rows and no token"):
            ds.epoch_info()
        with pytest.raises(EmptyEpochError, match="selects 0 rows and no token"):
            list(ds)
        return
    info = ds.epoch_info()
    assert info["rows"] == n_rows
    batches = list(ds)
    assert len(batches) == len(ds) == info["steps"]
    tokens = sum(int((b["labels"] != -100).sum()) for b in batches)
    rows = _rows(table, filter)
    # every token predicts the next one of its document, or its EOS: one target per token
    assert tokens == sum(len(v) for v in rows.values())


def test_null_token_lists_are_planned_as_zero_length(tmp_path):
    texts = real_paragraphs(30)
    src = tmp_path / "a.jsonl"
    write_jsonl(src, [{"text": t} for t in texts])
    uri = str(tmp_path / "t.lance")
    ingest([src], uri, progress=False)
    add_column(uri, None, byte_tokens, workers=0, where="id % 5 != 2")  # rows 2, 7, ... null
    with pytest.raises(LoaderError, match="'n_tokens' is not computed for 6 of the 30 selected"):
        PackedDataset(uri, seq_len=L, global_batch=2, block_order="sequential")
    ds = PackedDataset(uri, seq_len=L, global_batch=2, block_order="sequential", allow_missing=True)
    info = ds.epoch_info()
    assert info["null_rows"] == 6 and info["empty_rows"] == 6
    seen = {rid for b in ds for rid in b["spans"][:, 2].tolist()}
    assert seen == {i for i in range(30) if i % 5 != 2}


def _stream(dl, n=None):
    out = []
    for batch in dl:
        out.append(batch["input_ids"].clone())
        if n is not None and len(out) == n:
            break
    return out


@pytest.mark.parametrize("k, new_world, new_workers", [(5, 4, 0), (13, 1, 2), (0, 2, 0)])
def test_exact_resume_onto_another_topology(table, k, new_world, new_workers):
    def ds(rank=0, world=2):
        return PackedDataset(
            table,
            seq_len=L,
            global_batch=G,
            seed=3,
            rank=rank,
            world_size=world,
            block_order="sequential",
        )

    full = [b["input_ids"] for b in DataLoader(ds(world=1), num_workers=0)]
    first = DataLoader(ds(world=2, rank=0), num_workers=2)
    consumed = _stream(first, k) if k else []
    state = first.state_dict()
    assert state["step"] == k
    rest = []
    for rank in range(new_world):
        d = ds(rank=rank, world=new_world)
        d.load_state_dict(state)
        rest.append(_stream(DataLoader(d, num_workers=new_workers)))
    merged = [torch.cat([r[s] for r in rest]) for s in range(len(rest[0]))]
    assert len(consumed) + len(merged) == len(full)
    for a, b in zip(full[k:], merged, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(full[:k], consumed, strict=True):
        assert torch.equal(a[: G // 2], b)  # rank 0 of 2 holds the first half of each step


def test_resume_across_an_epoch_boundary(table):
    ds = PackedDataset(table, seq_len=L, global_batch=G, seed=3, block_order="sequential")
    n = len(ds)
    epoch0 = _stream(ds)
    assert ds.state_dict()["epoch"] == 1 and ds.state_dict()["step"] == 0
    ds.set_epoch(1)
    epoch1 = _stream(ds)
    again = PackedDataset(
        table, seq_len=L, global_batch=G, seed=3, rank=1, world_size=2, block_order="sequential"
    )
    state = PackedDataset(
        table, seq_len=L, global_batch=G, seed=3, block_order="sequential"
    ).state_dict()
    state["step"] = n - 2  # two steps before the end of epoch 0
    again.load_state_dict(state)
    tail = _stream(again)
    assert len(tail) == 2 and again.state_dict()["epoch"] == 1
    for got, want in zip(tail, epoch0[-2:], strict=True):
        assert torch.equal(got, want[G // 2 :])
    nxt = _stream(again, 1)[0]
    assert torch.equal(nxt, epoch1[0][G // 2 :])


def test_changed_table_or_filter_is_refused_with_the_override(tmp_path):
    uri = token_table(tmp_path, real_paragraphs(20))
    old = PackedDataset(uri, seq_len=L, global_batch=2, block_order="sequential")
    state = old.state_dict()
    write_jsonl(tmp_path / "more.jsonl", [{"text": t} for t in real_paragraphs(25)[20:]])
    ingest([tmp_path / "more.jsonl"], uri, progress=False)
    add_column(uri, None, byte_tokens, workers=0)
    latest = Table.open(uri).version
    new = PackedDataset(uri, seq_len=L, global_batch=2, version=latest, block_order="sequential")
    with pytest.raises(ResumeMismatchError, match=r"table version .* pass `version=") as err:
        new.load_state_dict(state)
    assert str(old.version) in str(err.value)
    PackedDataset(
        uri, seq_len=L, global_batch=2, version=old.version, block_order="sequential"
    ).load_state_dict(state)
    unpinned = PackedDataset(uri, seq_len=L, global_batch=2, block_order="sequential")
    unpinned.load_state_dict(state)  # no version asked for: the state's, as train --resume
    assert unpinned.version == old.version
    PackedDataset(
        uri, seq_len=L, global_batch=2, version=latest, allow_data_change=True,
        block_order="sequential",
    ).load_state_dict(state)  # fmt: skip
    other = PackedDataset(
        uri,
        seq_len=L,
        global_batch=2,
        version=old.version,
        filter="id > 3",
        block_order="sequential",
    )
    with pytest.raises(ResumeMismatchError, match="filter"):
        other.load_state_dict(state)


def test_stats_add_up_across_workers(table):
    """Each worker's counters travel with its batches: the merged totals are the epoch's,
    neither multiplied nor lost, and the queue gauges come from every pipeline."""
    for workers in (0, 1, 2):
        ds = PackedDataset(
            table, seq_len=L, global_batch=4, seed=0, block_order="sequential", read_group=2
        )
        dl = DataLoader(ds, num_workers=workers)
        batches = list(dl)
        info = ds.epoch_info(0)
        s = dl.stats
        assert s.steps == len(batches) == info["steps"]
        assert s.tokens == info["tokens"]
        assert s.padding == info["padding_positions"]
        assert s.rows_packed == sum(len(b["spans"]) for b in batches)
        assert s.loss_positions == sum(int((b["labels"] != -100).sum()) for b in batches)
        assert s.rows_read >= s.rows_planned == len(_rows(table))
        # one pipeline per worker, each holding at most read_ahead (4) groups of 2 steps ahead
        # plus the group being handed out
        assert s.pipelines == max(workers, 1) and s.capacity == 10
        assert 0 < s.planned_max <= 8 and 0 < s.packed_max <= s.capacity
        assert s.pipeline_seconds > 0 and s.planned_area > 0
        assert (s.transit_max > 0) == (workers > 0)
        assert s.startup_seconds > 0 and s.wall_seconds >= s.wait_seconds > 0
        assert "stall" in s.summary() and "is the bottleneck" in s.summary()


def test_rank_and_world_from_torchrun_environment(table, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    ds = PackedDataset(table, seq_len=L, global_batch=12, block_order="sequential")
    assert (ds.rank, ds.world_size, ds.global_batch, ds.blocks_per_rank) == (1, 3, 12, 4)
    with pytest.raises(PlanError, match="does not split evenly over 3 ranks"):
        PackedDataset(table, seq_len=L, global_batch=4)


def test_a_huge_document_is_read_once_not_once_per_block(tmp_path):
    paras = real_paragraphs(200)
    huge = (" ".join(paras) * 2)[:150_000]  # 150k tokens: ~2,300 blocks of 64
    uri = token_table(tmp_path, [huge, *paras[:10]])
    ds = PackedDataset(uri, seq_len=64, global_batch=2, seed=0, block_order="sequential")
    steps = sum(1 for _ in ds)
    assert steps == len(ds) > 1000
    column_bytes = Table.open(uri).dataset.to_table(columns=["input_ids"]).nbytes
    # without the long-document cache every step would fetch the 150k-token list again
    assert ds.stats.bytes_read < 2 * column_bytes
    assert ds.stats.tokens == sum(len(t.encode()) for t in [huge, *paras[:10]])


def test_options_a_packed_dataset_would_silently_ignore_are_refused(table):
    ds = PackedDataset(table, seq_len=L, global_batch=4)
    with pytest.raises(LoaderError, match="would be ignored"):
        DataLoader(ds, batch_size=8)
    with pytest.raises(LoaderError, match="shuffles the whole selection"):
        DataLoader(ds, shuffle=True)
    with pytest.raises(LoaderError, match="global_batch="):
        PackedDataset(table, seq_len=L, batch_size=4)
    with pytest.raises(PlanError, match="spelled 'best_fit'"):
        PackedDataset(table, seq_len=L, packing="bestfit")
    with pytest.raises(PlanError, match="unknown loader option"):
        PackedDataset(table, seq_len=L, fit_windw=8)


def test_worker_batches_lent_from_shared_memory_equal_in_process_ones(table):
    """Batches handed over from a worker's slots without a copy hold every field of the
    in-process batches, whether the loop drops each batch at once or keeps the last few (a slot
    goes back to its worker only once no batch of it is left)."""

    def loader(workers):
        ds = PackedDataset(
            table, seq_len=L, global_batch=4, seed=1, block_order="sequential", read_group=1
        )
        return DataLoader(ds, num_workers=workers)

    want = list(loader(0))
    assert len(want) > 20  # more groups than a worker's ring holds: slots are reused
    held: list[dict] = []
    for i, batch in enumerate(loader(2)):
        held.append(batch)
        if len(held) > 3:
            held.pop(0)
        for j, got in enumerate(held, start=i - len(held) + 1):  # checked again while held
            assert got.keys() == want[j].keys()
            for key, value in got.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(value, want[j][key]), (j, key)
                else:
                    assert value == want[j][key], (j, key)
