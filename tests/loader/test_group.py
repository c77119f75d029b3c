"""Several steps packed at once equal the same steps packed one by one; the reused buffers and
the loader's vectorised gather agree with their obvious counterparts."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.loader.helpers import (
    EOS,
    PAD,
    assert_packed_equal,
    columns,
    corpora,
    epochs,
    gather,
    make_rows,
    seeds,
)
from tokenloom.loader import EpochView, plan_epoch, step_blocks
from tokenloom.loader.pipeline.buffers import RecycledBuffers
from tokenloom.loader.pipeline.dataloader import TensorSteps, as_tensors, tensor_steps
from tokenloom.loader.pipeline.read import _gather
from tokenloom.loader.pipeline.transit import BuiltGroup, SharedSlots
from tokenloom.loader.plan.bestfit import plan_bestfit
from tokenloom.loader.plan.epoch import steps_blocks
from tokenloom.loader.plan.window import plan_windowed_epoch


def _plan(kind: str, rows: dict, L: int, seed: int, epoch: int):
    ids, counts = columns(rows)
    if kind == "window":
        window = max(L // 2, 1)
        return plan_windowed_epoch(
            ids, counts, seed=seed, epoch=epoch, seq_len=L, window=window, overlap=window // 2
        )
    if kind == "best_fit":
        return plan_bestfit(ids, counts, seed=seed, epoch=epoch, seq_len=L, fit_window=4)
    return plan_epoch(ids, counts, seed=seed, epoch=epoch, seq_len=L)


@settings(derandomize=True, max_examples=120, deadline=None)
@given(
    corpus=corpora(max_docs=14),
    seed=seeds,
    epoch=epochs,
    kind=st.sampled_from(["concat", "window", "best_fit"]),
    per_rank=st.integers(1, 3),
    world_size=st.integers(1, 3),
    order=st.sampled_from(["sequential", "interleave"]),
    lookahead=st.booleans(),
    drop_last=st.booleans(),
    group=st.integers(1, 5),
    data=st.data(),
)
def test_a_group_of_steps_equals_its_steps_packed_one_by_one(
    corpus, seed, epoch, kind, per_rank, world_size, order, lookahead, drop_last, group, data
):
    L, lengths = corpus
    rows = make_rows(lengths)
    plan = _plan(kind, rows, L, seed, epoch)
    view = EpochView(
        plan,
        global_batch=per_rank * world_size,
        drop_last=drop_last,
        block_order=order,
        lookahead=lookahead,
        eos_id=EOS,
        pad_id=PAD,
    )
    if view.steps == 0:
        return
    rank = data.draw(st.integers(0, world_size - 1))
    first = data.draw(st.integers(0, view.steps - 1))
    steps = np.arange(first, min(first + group, view.steps))
    layout = view.group(steps, rank=rank, world_size=world_size)
    tokens, offsets = gather(layout.spans, rows, lookahead=lookahead)
    packed = view.pack_group(layout, tokens, offsets)
    counts = view.count_group(layout, packed, 1)
    for i, s in enumerate(steps.tolist()):
        one = view.layout(s, rank=rank, world_size=world_size)
        want = view.pack(one, *gather(one.spans, rows, lookahead=lookahead))
        got = packed.step(i)
        assert_packed_equal(got, want)
        assert got.context_positions == want.context_positions
        if want.context is None:
            assert got.context is None
        else:
            np.testing.assert_array_equal(got.context, want.context)
        ref = view.count(one, want, 1)
        np.testing.assert_array_equal(counts.step(i).counts, ref.counts)
        for a, b in zip(counts.step(i).starts, ref.starts, strict=True):
            np.testing.assert_array_equal(a, b)


@settings(derandomize=True, max_examples=60, deadline=None)
@given(
    corpus=corpora(max_docs=14),
    seed=seeds,
    kind=st.sampled_from(["concat", "window", "best_fit"]),
    per_rank=st.integers(1, 3),
    lookahead=st.booleans(),
    drop_last=st.booleans(),
    group=st.integers(1, 5),
)
def test_group_batches_equal_their_steps_with_either_packer(
    corpus, seed, kind, per_rank, lookahead, drop_last, group
):
    """A handed-out batch (:meth:`BuiltGroup.batch`) is its step's arrays, the torch loader's
    (:class:`TensorSteps`) the same as tensors, and a group packed with the numpy reference
    packs and counts exactly as with the compiled packer (the DataLoader workers pack with the
    former, the training process with the latter)."""
    L, lengths = corpus
    rows = make_rows(lengths)
    view = EpochView(
        _plan(kind, rows, L, seed, 0), global_batch=per_rank, drop_last=drop_last,
        block_order="sequential", lookahead=lookahead, eos_id=EOS, pad_id=PAD,
    )  # fmt: skip
    if view.steps == 0:
        return
    layout = view.group(np.arange(min(group, view.steps)))
    tokens, offsets = gather(layout.spans, rows, lookahead=lookahead)
    packed = view.pack_group(layout, tokens, offsets)
    reference = view.pack_group(layout, tokens, offsets, compiled=False)
    counts, ref_counts = view.count_group(layout, packed, 1), view.count_group(layout, reference, 1)
    np.testing.assert_array_equal(counts.counts, ref_counts.counts)
    np.testing.assert_array_equal(counts.starts, ref_counts.starts)
    pools = np.arange(packed.steps * per_rank, dtype=np.int64) % 3 if seed % 2 else None
    built = BuiltGroup(epoch=0, first=0, packed=packed, counts=counts, pools=pools,
                       read=(7, 70, 0.5), pack_seconds=0.25, seq_len=L)  # fmt: skip
    tensors = TensorSteps(built)
    for i in range(packed.steps):
        want = reference.step(i)
        # the torch loader's batch: as_tensors of the numpy batch, key by key in the same order
        _same_batch(tensors.batch(i), as_tensors(built.batch(i)))
        # what the step adds to the counters: one step, the group's reads with its first
        assert built.step_stats(i) == {
            "steps": 1,
            "rows_read": 7 if i == 0 else 0,
            "bytes_read": 70 if i == 0 else 0,
            "read_seconds": 0.5 if i == 0 else 0.0,
            "rows_packed": int(packed.stretch_bounds[i + 1] - packed.stretch_bounds[i]),
            "tokens": want.real_tokens,
            "eos": want.eos_positions,
            "padding": want.padding_positions,
            "loss_positions": want.loss_positions,
            "masked_tokens": 0,
            "pack_seconds": 0.25 / packed.steps,
        }
        assert_packed_equal(packed.step(i), want)
        batch = built.batch(i)
        for name in ("input_ids", "labels", "position_ids", "doc_ids", "cu_seqlens", "continues",
                     "spans"):  # fmt: skip
            got, ref = batch[name], getattr(want, name)
            assert got.dtype == ref.dtype and np.array_equal(got, ref), name
        assert batch["max_seqlen"] == want.max_seqlen
        assert ("context" in batch) == (want.context is not None)
        if want.context is not None:
            np.testing.assert_array_equal(batch["context"], want.context)
    # what the loaders hand out: per group, or step by step for a group of a few steps
    handed = list(tensor_steps((built, i) for i in range(packed.steps)))
    assert [i for _, i, _ in handed] == list(range(packed.steps))
    for _, i, got in handed:
        _same_batch(got, as_tensors(built.batch(i)))


def _same_batch(got: dict, expected: dict) -> None:
    """The same keys in the same order, tensors equal in dtype and value, the rest equal."""
    assert list(got) == list(expected)
    for name, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert got[name].dtype == value.dtype and torch.equal(got[name], value), name
        else:
            assert got[name] == value and type(got[name]) is type(value), name


@settings(derandomize=True, max_examples=60, deadline=None)
@given(
    per_rank=st.integers(1, 4),
    world_size=st.integers(1, 4),
    num_blocks=st.integers(1, 60),
    order=st.sampled_from(["sequential", "interleave"]),
    drop_last=st.booleans(),
)
def test_steps_blocks_is_step_blocks_row_by_row(per_rank, world_size, num_blocks, order, drop_last):
    g = per_rank * world_size
    total = num_blocks // g if drop_last else -(-num_blocks // g)
    kw = dict(batch_size=per_rank, world_size=world_size, num_blocks=num_blocks,
              drop_last=drop_last, order=order)  # fmt: skip
    for rank in range(world_size):
        rows = steps_blocks(np.arange(total), rank=rank, **kw)
        for s in range(total):
            np.testing.assert_array_equal(rows[s], step_blocks(s, rank=rank, **kw))


@settings(derandomize=True, max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(0, 9), max_size=12), data=st.data())
def test_vectorised_gather_equals_slicing(lengths, data):
    buf = np.arange(200, dtype=np.uint16) * 3
    n = np.asarray(lengths, dtype=np.int64)
    begin = np.asarray(
        [data.draw(st.integers(0, len(buf) - k)) for k in lengths], dtype=np.int64
    ).reshape(-1)
    at = np.zeros(len(n) + 1, dtype=np.int64)
    np.cumsum(n, out=at[1:])
    out = np.zeros(int(at[-1]), dtype=buf.dtype)
    _gather(buf, begin, n, at, out)
    want = [buf[b : b + k] for b, k in zip(begin.tolist(), lengths, strict=True)]
    np.testing.assert_array_equal(out, np.concatenate(want) if want else out[:0])


def test_a_buffer_is_reused_only_once_no_view_of_it_is_left():
    pool = RecycledBuffers(keep=4)
    a = pool.take((4, 2, 3))
    view = a[1, :1]
    del a
    b = pool.take((4, 2, 3))
    assert not np.shares_memory(b, view)  # a view keeps its buffer busy
    del view
    c = pool.take((4, 2, 3))
    assert c.shape == (4, 2, 3) and not np.shares_memory(b, c)
    del c
    d = pool.take((4, 2, 3))  # c's buffer is free again
    assert d.flags.c_contiguous and d.dtype == np.int64


def test_a_lent_slot_goes_back_to_the_worker_once_no_batch_of_it_is_left():
    worker = SharedSlots(3, 24, lendable=2)
    trainer = pickle.loads(ForkingPickler.dumps(worker))  # as a DataLoader sends it
    j, out = worker.acquire((4, 2, 3), timeout_s=0)
    assert j is not None and out is not None
    out[...] = np.arange(24).reshape(4, 2, 3)
    arrays = trainer.lend(j, (4, 2, 3))
    np.testing.assert_array_equal(arrays, np.arange(24).reshape(4, 2, 3))  # no copy: the slot
    batch = {"input_ids": torch.from_numpy(arrays[0, 1:]), "labels": arrays[1, 1:]}
    del arrays, out
    assert trainer.lent == 1
    k, _ = worker.acquire((4, 2, 3), timeout_s=0)
    m, _ = worker.acquire((4, 2, 3), timeout_s=0)
    assert {j, k, m} == {0, 1, 2}
    assert worker.acquire((4, 2, 3), timeout_s=0) == (None, None)  # the batch holds slot j
    del batch["input_ids"]
    assert trainer.lent == 1  # the labels view still does
    del batch
    assert trainer.lent == 0
    assert worker.acquire((4, 2, 3), timeout_s=0)[0] == j


def test_past_lendable_slots_the_training_process_copies_instead():
    worker = SharedSlots(4, 6, lendable=1)
    trainer = pickle.loads(ForkingPickler.dumps(worker))
    j, _ = worker.acquire((1, 6), timeout_s=0)
    k, _ = worker.acquire((1, 6), timeout_s=0)
    kept = trainer.lend(j, (1, 6))
    assert trainer.lend(k, (1, 6)) is None  # the caller copies slot k out and releases it
    trainer.release(k)
    assert worker.acquire((1, 6), timeout_s=0)[0] == k
    del kept
    assert trainer.lent == 0
    j, _ = worker.acquire((1, 6), timeout_s=0)
    assert trainer.lend(j, (1, 6)) is not None  # lending again once the first came back


def test_slots_acquired_by_threads_at_once_are_distinct_and_rings_leave_no_descriptor():
    import os
    import threading

    ring = SharedSlots(64, 8, lendable=0)
    got: list[int] = []
    lock = threading.Lock()

    def grab() -> None:
        for _ in range(8):
            slot, _arr = ring.acquire((8,), timeout_s=0.0)
            assert slot is not None
            with lock:
                got.append(slot)

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(64))  # never one slot for two groups
    assert ring.acquire((8,), timeout_s=0.0) == (None, None)
    # a persistent worker makes a ring per pass: each one's descriptor goes with it
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        SharedSlots(2, 8)
    assert len(os.listdir("/proc/self/fd")) <= fds
