"""The shared-memory transit every loader's workers use: a step of arrays of any shapes and dtypes
crosses a worker's ring and comes out equal, its ring's descriptor crossing once."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np

from tokenloom.loader.pipeline.transit import Rings, StepMessage, WorkerRing


def _cross(message: StepMessage) -> StepMessage:
    return pickle.loads(ForkingPickler.dumps(message))  # as a worker's pipe sends it


def _step(i: int, rows: int = 3) -> dict:
    return {
        "row_id": np.arange(rows, dtype=np.int64) + 10 * i,
        "text": [f"row {i}-{k}" for k in range(rows)],  # not an array: by value
        "pixels": np.full((rows, 2, 3), i, dtype=np.uint8),
        "score": np.linspace(0, 1, rows, dtype=np.float32) + i,
        "mask": np.arange(rows) % 2 == 0,
        "scalar": np.int64(i),  # 0-d: by value
    }


def test_steps_cross_a_worker_ring_equal_and_in_key_order():
    ring, rings = WorkerRing(), Rings()
    kept, carried = [], []
    for i in range(6):
        want = _step(i)
        sent = ring.put(StepMessage(epoch=0, first=i, batch=want, worker=1))
        assert sent.slot is not None and "pixels" not in sent.batch  # the arrays are in a slot
        carried.append(sent.slots is not None)
        got = rings.settle(_cross(sent))
        assert got.slot is None and list(got.batch) == list(want)
        for key, value in want.items():
            assert type(got.batch[key]) is type(value), key
            np.testing.assert_array_equal(got.batch[key], value)
            if isinstance(value, np.ndarray):
                assert got.batch[key].dtype == value.dtype and got.batch[key].shape == value.shape
        kept.append(got.batch)  # a loop that keeps its batches: lent twice, then copied
    assert carried == [True] + [False] * 5  # the descriptor crosses with the first step only
    for i, batch in enumerate(kept):  # kept batches still hold their own step
        np.testing.assert_array_equal(batch["pixels"], np.full((3, 2, 3), i, dtype=np.uint8))
    assert _free(ring) == 8 - 2  # the first two steps' batches hold their lent slots
    del kept, batch, got
    assert _free(ring) == 8


def _free(ring: WorkerRing) -> int:
    """Slots the worker can take now (given back at once)."""
    taken = []
    while (slot := ring.ring.acquire((1,), timeout_s=0.0)[0]) is not None:
        taken.append(slot)
    for slot in taken:
        ring.ring.release(slot)
    return len(taken)


def test_a_step_too_big_for_its_slot_or_without_arrays_goes_by_value():
    ring, rings = WorkerRing(), Rings()
    first = ring.put(StepMessage(epoch=0, first=0, batch=_step(0)))
    rings.settle(_cross(first))
    big = _step(1, rows=200_000)  # far past the slot the first step sized
    sent = ring.put(StepMessage(epoch=0, first=1, batch=big))
    assert sent.slot is None and sent.slots is None and sent.batch is big
    got = rings.settle(_cross(sent))
    np.testing.assert_array_equal(got.batch["pixels"], big["pixels"])
    plain = {"text": ["a"], "n": 3}
    sent = ring.put(StepMessage(epoch=0, first=2, batch=plain))
    assert sent.slot is None and rings.settle(_cross(sent)).batch == plain
