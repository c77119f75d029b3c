"""The compact integer column: exact against plain numpy on random and adversarial data."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.loader.plan.compact import CHUNK, CompactInts, encode, naive_decode

I64 = np.iinfo(np.int64)


def check(col: CompactInts, plain: np.ndarray, seed: int = 0) -> None:
    """Every operation the loader uses agrees with the plain array."""
    n = plain.shape[0]
    assert len(col) == n and col.shape == (n,) and col.dtype == plain.dtype
    assert np.array_equal(np.asarray(col), plain)
    assert np.array_equal(naive_decode(col), plain)
    rng = np.random.default_rng(seed)
    if n:
        idx = rng.integers(-n, n, 300)
        assert np.array_equal(col[idx], plain[idx])
        assert np.array_equal(col[idx.reshape(20, 15)], plain[idx.reshape(20, 15)])
        assert col[int(idx[0])] == plain[int(idx[0])]
        a, b = sorted(rng.integers(0, n + 1, 2).tolist())
        assert np.array_equal(col[a:b], plain[a:b])
        assert np.array_equal(col[::3], plain[::3])
        mask = rng.random(n) < 0.3
        assert np.array_equal(col[mask], plain[mask])
        assert col.min() == plain.min() and col.max() == plain.max()
        wide = np.int64 if plain.dtype.kind == "i" else np.uint64
        assert int(col.sum()) == int(plain.sum(dtype=wide))
        assert col.count_nonzero() == np.count_nonzero(plain)
    assert col[[]].shape == (0,)
    assert np.array_equal(np.concatenate([v for _, v in col.blocks(7)] or [plain[:0]]), plain)
    again = pickle.loads(pickle.dumps(col))
    assert np.array_equal(np.asarray(again), plain)
    arrays, meta = col.parts()
    assert np.array_equal(np.asarray(CompactInts.from_parts(arrays, meta, col.ref)), plain)
    if col.is_sorted and col.ref is None and n:
        lo, hi = int(plain.min()), int(plain.max())
        span = max(hi - lo, 1)
        q = np.unique(np.concatenate([plain[idx], plain[idx] - 1, plain[idx] + 1]))
        q = q[(q >= lo - span) & (q <= hi + span)] if plain.dtype.kind == "i" else q
        q = np.concatenate([q, plain[:1], plain[-1:]])
        for side in ("left", "right"):
            assert np.array_equal(col.searchsorted(q, side), np.searchsorted(plain, q, side))
            assert np.searchsorted(col, q[0], side=side) == np.searchsorted(plain, q[0], side)


values = st.lists(st.integers(I64.min, I64.max), max_size=3 * CHUNK + 5)


@settings(derandomize=True, max_examples=120, deadline=None)
@given(values, st.booleans())
def test_random_int64_exact(xs: list[int], sort: bool) -> None:
    plain = np.array(sorted(xs) if sort else xs, dtype=np.int64)
    check(encode(plain), plain)


@settings(derandomize=True, max_examples=80, deadline=None)
@given(st.lists(st.integers(0, (1 << 64) - 1), max_size=2 * CHUNK + 3))
def test_random_uint64_exact(xs: list[int]) -> None:
    plain = np.array(xs, dtype=np.uint64)
    check(encode(plain), plain)
    check(encode(np.sort(plain)), np.sort(plain))


@settings(derandomize=True, max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 1 << 40), min_size=1, max_size=2 * CHUNK + 3, unique=True),
    st.lists(st.integers(-(1 << 62), 1 << 62), min_size=1, max_size=4),
)
def test_relative_to_ref_exact(ids: list[int], jumps: list[int]) -> None:
    """Row ids stored relative to the ids: exact whatever the difference does (wraps too)."""
    ids_arr = np.array(sorted(ids), dtype=np.int64)
    diff = np.repeat(np.array(jumps, dtype=np.int64), -(-len(ids) // len(jumps)))[: len(ids)]
    rowids = (ids_arr.view(np.uint64) + diff.view(np.uint64)).astype(np.uint64)
    ref = encode(ids_arr)
    check(encode(rowids, ref=ref), rowids)
    check(encode(rowids, ref=ref, ref_values=ids_arr), rowids)


@pytest.mark.parametrize(
    "plain",
    [
        np.zeros(0, dtype=np.int64),
        np.array([7], dtype=np.int64),
        np.array([I64.min, I64.max] * 70, dtype=np.int64),  # every chunk 64 bits wide
        np.arange(-(CHUNK * 3), CHUNK * 2, dtype=np.int64),  # negative ids, ascending
        np.cumsum(np.full(1000, 1 << 40, dtype=np.int64)),  # huge gaps, values > 2**32
        np.arange(5 * CHUNK + 1, dtype=np.int64) * 3 + (1 << 33),
        np.array([2**32 - 1, 2**32, 2**32 + 1, 0, 1] * 60, dtype=np.int64),
        np.full(300, 5, dtype=np.int64),  # sorted, not strictly
        np.array([(1 << 64) - 1, 0] * 80, dtype=np.uint64),
        np.random.default_rng(1).integers(0, 50_000, 1000).astype(np.int32),
        np.array([0, 0, 3, 2**31 - 1, -(2**31)] * 40, dtype=np.int32),
        np.arange(1000, dtype=np.uint32)[::-1].copy(),
    ],
)
def test_adversarial_columns_exact(plain: np.ndarray) -> None:
    check(encode(plain), plain)


def test_row_ids_after_deletion_and_compaction() -> None:
    """Row addresses jump at fragment boundaries and are not monotone after compaction; stored
    relative to the ids they stay exact, and nearly free where the difference is constant."""
    rng = np.random.default_rng(3)
    ids = np.sort(rng.choice(1 << 22, 200_000, replace=False)).astype(np.int64)
    frag = (ids // 50_000).astype(np.uint64)
    rowids = (frag << np.uint64(32)) | (ids % 50_000).astype(np.uint64)
    rowids[1000:2000] = rowids[1000:2000][::-1]  # rows moved by a compaction
    ref = encode(ids)
    col = encode(rowids, ref=ref)
    check(col, rowids)
    # the difference is constant between fragment boundaries: zero bits a row there
    assert col.nbytes < 0.4 * rowids.shape[0]
    assert ref.nbytes < 1.6 * ids.shape[0]  # ids with gaps of ~20: a few bits a row


def test_token_counts_fit_in_two_bytes() -> None:
    from tokenloom.bench.loader_data import CorpusSpec, doc_lengths

    lens = doc_lengths(CorpusSpec(docs=100_000, seed=0)).astype(np.int32)
    col = encode(lens)
    check(col, lens)
    assert col.nbytes < 2 * lens.shape[0]


def test_no_silent_full_copies() -> None:
    col = encode(np.arange(10, dtype=np.int64))
    with pytest.raises(TypeError):
        col + 1  # noqa: B018
    with pytest.raises(TypeError):
        col == 0  # noqa: B015
    with pytest.raises(IndexError):
        col[10]
    with pytest.raises(IndexError):
        col[np.array([0, 11])]
    with pytest.raises(ValueError, match="sorted"):
        encode(np.array([3, 1, 2])).searchsorted([1])
    with pytest.raises(ValueError, match="1-D integer"):
        encode(np.zeros((2, 2), dtype=np.int64))
