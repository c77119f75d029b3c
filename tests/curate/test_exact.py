"""Tests of ``tokenloom.curate.exact``: the vectorised sort against the dict reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.curate import CurateError, exact_duplicates, exact_duplicates_naive, text_hashes


@settings(derandomize=True, max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 5), max_size=40).flatmap(
        lambda keys: st.tuples(
            st.just(keys), st.permutations(range(len(keys))), st.booleans(), st.booleans()
        )
    )
)
def test_fast_path_agrees_with_the_reference(case):
    keys, perm, same_prefix, gaps = case
    n = len(keys)
    ids = np.array(perm, dtype=np.int64) * (7 if gaps else 1) - 3  # any order, any spacing
    hashes = np.zeros((n, 16), dtype=np.uint8)
    hashes[:, 15] = keys  # few distinct values: many duplicates
    if not same_prefix:
        hashes[:, 0] = np.array(keys) * 37 % 5  # also vary the first 64 bits
    is_dup, dup_of = exact_duplicates(ids, hashes)
    ref_dup, ref_of = exact_duplicates_naive(ids.tolist(), [bytes(h) for h in hashes])
    assert is_dup.tolist() == ref_dup and dup_of.tolist() == ref_of
    assert is_dup.dtype == bool and dup_of.dtype == np.int64


def test_planted_copies_of_real_text_point_to_the_smallest_id(wiki):
    texts = [r["text"] for r in wiki[:300]]
    # copies differing only in whitespace, placed before and after their originals by id
    copies = [t.replace(" ", "  \n", 2) for t in texts[:40]]
    all_texts = texts + copies
    ids = np.arange(len(all_texts), dtype=np.int64)[::-1].copy()  # copies get the small ids
    is_dup, dup_of = exact_duplicates(ids, text_hashes(all_texts))
    assert is_dup.sum() == 40
    assert is_dup[:40].all() and not is_dup[40:300].any() and not is_dup[300:].any()
    assert (dup_of[:40] == ids[300:]).all()  # original i points to its copy's smaller id
    assert (dup_of[300:] == ids[300:]).all()  # kept rows point to themselves
    assert (is_dup == (dup_of != ids)).all()


def test_hash_formats_and_errors():
    h = text_hashes(["a", "b", "a"])
    as_bytes = h.to_pylist()
    s16 = np.array(as_bytes, dtype="S16")
    for form in (h, as_bytes, s16, np.frombuffer(b"".join(as_bytes), np.uint8).reshape(3, 16)):
        is_dup, dup_of = exact_duplicates(np.array([5, 6, 7]), form)
        assert is_dup.tolist() == [False, False, True] and dup_of.tolist() == [5, 6, 5]
    empty = exact_duplicates(np.zeros(0, np.int64), np.zeros((0, 16), np.uint8))
    assert empty[0].shape == (0,) and empty[1].dtype == np.int64
    with pytest.raises(CurateError, match="appears more than once"):
        exact_duplicates(np.array([3, 1, 3]), h)
    with pytest.raises(CurateError, match="align"):
        exact_duplicates(np.array([1, 2]), h)
    with pytest.raises(CurateError, match=r"\(N, 16\) uint8"):
        exact_duplicates(np.array([1, 2, 3]), np.zeros((3, 8), np.uint8))
