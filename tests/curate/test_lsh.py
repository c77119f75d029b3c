"""Tests of ``tokenloom.curate.lsh``: parameters, the reference, monotonicity, real clusters."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.curate import (
    DEFAULT_THRESHOLD,
    EMPTY,
    CurateError,
    lsh_clusters,
    lsh_clusters_naive,
    minhash_signatures,
    optimal_params,
)
from tokenloom.curate.lsh import connected_components


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.8, 0.9])
def test_unrestricted_params_are_datasketchs(threshold):
    lsh = pytest.importorskip("datasketch.lsh")
    expected = lsh._optimal_param(threshold, 128, 0.5, 0.5)
    assert optimal_params(threshold, 128, weights=(0.5, 0.5), nested=False) == expected


def test_nested_rows_grow_with_the_threshold():
    for num_perm in (64, 128, 256):
        params = [optimal_params(t / 100, num_perm) for t in range(5, 101, 2)]
        rows = [r for _, r in params]
        assert rows == sorted(rows), num_perm  # what makes the clustering monotone
        assert all(b == num_perm // r and r & (r - 1) == 0 for b, r in params)
    assert optimal_params(DEFAULT_THRESHOLD, 128) == (32, 4)


# Small signature sets over a tiny alphabet, so that bands collide and pairs verify often.
_signatures = st.integers(2, 12).flatmap(
    lambda n: st.lists(
        st.one_of(
            st.lists(st.integers(0, 2), min_size=16, max_size=16),
            st.just([int(EMPTY)] * 16),
        ),
        min_size=n,
        max_size=n,
    )
)


def _case(rows: list[list[int]], seed: int) -> tuple[np.ndarray, np.ndarray]:
    sig = np.array(rows, dtype=np.uint32)
    ids = np.random.default_rng(seed).permutation(len(rows) * 3)[: len(rows)].astype(np.int64)
    return ids, sig


@settings(derandomize=True, max_examples=100, deadline=None)
@given(
    _signatures,
    st.sampled_from([0.2, 0.5, 0.75, 1.0]),
    st.sampled_from([None, (4, 4), (3, 2)]),
    st.integers(0, 9),
)
def test_fast_path_agrees_with_the_reference(rows, threshold, params, seed):
    ids, sig = _case(rows, seed)
    cluster, near = lsh_clusters(ids, sig, threshold=threshold, params=params)
    ref_cluster, ref_near = lsh_clusters_naive(ids, sig, threshold=threshold, params=params)
    np.testing.assert_array_equal(cluster, ref_cluster)
    np.testing.assert_array_equal(near, ref_near)
    assert (near == (cluster != ids)).all()


@settings(derandomize=True, max_examples=100, deadline=None)
@given(_signatures, st.floats(0.05, 1.0), st.floats(0.05, 1.0), st.integers(0, 9))
def test_a_higher_threshold_only_splits_clusters(rows, t1, t2, seed):
    lo, hi = sorted((t1, t2))
    ids, sig = _case(rows, seed)
    coarse, _ = lsh_clusters(ids, sig, threshold=lo)
    fine, _ = lsh_clusters(ids, sig, threshold=hi)
    for i, j in itertools.combinations(range(len(ids)), 2):
        if fine[i] == fine[j]:
            assert coarse[i] == coarse[j]


@settings(derandomize=True, max_examples=100, deadline=None)
@given(
    st.integers(1, 15).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=20),
        )
    )
)
def test_components_label_each_node_with_its_smallest_member(case):
    n, edges = case
    u, v = (
        (np.array(x, dtype=np.int64) for x in zip(*edges, strict=True))
        if edges
        else (
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
        )
    )
    labels = connected_components(n, u, v)
    groups = [{i} for i in range(n)]
    for a, b in edges:  # the slow way: merge sets
        merged = groups[a] | groups[b]
        for x in merged:
            groups[x] = merged
    assert labels.tolist() == [min(g) for g in groups]


def _bfs_components(n: int, u: np.ndarray, v: np.ndarray) -> list[int]:
    """The slow reference: breadth-first search from each unvisited node, in index order."""
    adjacent: list[list[int]] = [[] for _ in range(n)]
    for a, b in zip(u.tolist(), v.tolist(), strict=True):
        adjacent[a].append(b)
        adjacent[b].append(a)
    label = [-1] * n
    for start in range(n):  # the first unvisited node is its component's smallest
        if label[start] < 0:
            label[start], queue = start, [start]
            while queue:
                x = queue.pop()
                for y in adjacent[x]:
                    if label[y] < 0:
                        label[y] = start
                        queue.append(y)
    return label


@pytest.mark.parametrize("edges", [0, 300, 1000, 1500, 3000, 8000])
def test_components_equal_bfs_and_scipy_on_random_graphs(edges):
    from tokenloom.bench.curate import component_graphs, scipy_components

    n = 3000  # below, at and above the giant component's threshold (n / 2 edges)
    rng = np.random.default_rng(edges)
    u, v = rng.integers(0, n, edges), rng.integers(0, n, edges)
    labels = connected_components(n, u, v)
    assert labels.tolist() == _bfs_components(n, u, v)
    np.testing.assert_array_equal(labels, scipy_components(n, u, v))
    lu, lv = component_graphs(n, edges or 1, seed=edges)["lsh"]  # the benchmark's LSH-like pairs
    np.testing.assert_array_equal(connected_components(n, lu, lv), _bfs_components(n, lu, lv))


@pytest.fixture(scope="module")
def play_signatures(plays):
    return minhash_signatures([r["text"] for r in plays])


def test_the_two_editions_of_each_play_cluster_and_nothing_else(plays, play_signatures):
    ids = np.arange(len(plays), dtype=np.int64)
    cluster, near = lsh_clusters(ids, play_signatures)
    groups: dict[int, list[int]] = {}
    for i, c in enumerate(cluster.tolist()):
        groups.setdefault(c, []).append(i)
    clustered = [g for g in groups.values() if len(g) > 1]
    assert all(len(g) == 2 and plays[g[0]]["work"] == plays[g[1]]["work"] for g in clustered)
    works = {plays[g[0]]["work"] for g in clustered}
    twins = {r["work"] for r in plays if r["edition"] == "folio"}
    # Gutenberg's Cymbeline lacks a third of the play (Jaccard 0.46 < 0.5): it joins at 0.4
    assert twins - works == {"cymbeline"} and len(works) == 34
    assert near.sum() == 34 and not near[:42].any()  # the modern edition has the smaller ids
    lower, _ = lsh_clusters(ids, play_signatures, threshold=0.4)
    assert len(set(lower.tolist())) == len(plays) - 35


def test_edited_wiki_copies_join_their_originals(long_wiki):
    originals = long_wiki[:300]
    edited = []
    for text in originals[:30]:  # a word changed, and a sentence appended
        words = text.split()
        words[len(words) // 2] = "changed"
        edited.append(" ".join(words) + " This sentence was added by an editor.")
    texts = originals + edited
    ids = np.arange(len(texts), dtype=np.int64)
    sig = minhash_signatures(texts)
    cluster, near = lsh_clusters(ids, sig)
    assert (cluster[300:] == ids[:30]).all() and near[300:].all()
    assert not near[:300].any()
    assert len(set(cluster[:300].tolist())) == 300  # the originals stay apart


def test_empty_documents_never_cluster():
    sig = minhash_signatures(["", "", "...", "the cat sat on the mat", "the cat sat on the mat"])
    cluster, near = lsh_clusters(np.arange(5), sig)
    assert cluster.tolist() == [0, 1, 2, 3, 3] and near.tolist() == [False] * 4 + [True]


def test_bad_arguments_are_named():
    sig = minhash_signatures(["a b c", "d e f"])
    ids = np.array([1, 2])
    with pytest.raises(CurateError, match="threshold"):
        lsh_clusters(ids, sig, threshold=0)
    with pytest.raises(CurateError, match="num_perm=64"):
        lsh_clusters(ids, sig, num_perm=64)
    with pytest.raises(CurateError, match="params"):
        lsh_clusters(ids, sig, params=(64, 4))
    with pytest.raises(CurateError, match="uint32"):
        lsh_clusters(ids, sig.astype(np.int64))
    with pytest.raises(CurateError, match="more than once"):
        lsh_clusters(np.array([1, 1]), sig)
