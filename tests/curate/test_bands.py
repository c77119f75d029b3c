"""Tests of ``tokenloom.curate.bands``: the partitioned clustering equals ``lsh_clusters``."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.backfill.executors import LocalExecutor
from tokenloom.bench.near_dedup import plant_groups, synthetic_rows
from tokenloom.curate import EMPTY, CurateError, lsh_clusters
from tokenloom.curate.bands import ArraySignatures, NpySignatures, banded_clusters

# Tiny alphabets, so that bands collide and pairs verify often; some rows copy an earlier row
# with a few positions changed (planted groups).
_rows = st.integers(2, 24).flatmap(
    lambda n: st.tuples(
        st.lists(
            st.one_of(
                st.lists(st.integers(0, 2), min_size=16, max_size=16),
                st.just([int(EMPTY)] * 16),
            ),
            min_size=n,
            max_size=n,
        ),
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 15)), max_size=n),
    )
)


def _case(rows, copies, seed):
    sig = np.array(rows, dtype=np.uint32)
    for i, (src, flips) in enumerate(copies):
        j = (src + 1 + i) % len(sig)
        sig[j] = sig[src]
        sig[j, :flips] = 7  # a near copy: the first `flips` positions differ
    ids = np.random.default_rng(seed).permutation(len(sig) * 3)[: len(sig)].astype(np.int64)
    return ids, sig


@settings(derandomize=True, max_examples=80, deadline=None)
@given(
    _rows,
    st.sampled_from([0.2, 0.5, 0.75, 1.0]),
    st.sampled_from([None, (4, 4), (3, 2), (16, 1)]),
    st.sampled_from([3, 10, 1000]),  # rows per key partition
    st.integers(0, 9),
)
def test_partitioned_clusters_equal_the_in_memory_ones(
    tmp_path_factory, data, threshold, params, part_rows, seed
):
    ids, sig = _case(*data, seed)
    work = str(tmp_path_factory.mktemp("w") / "near")
    cluster, near, stats = banded_clusters(
        ids,
        ArraySignatures(sig),
        workdir=work,
        threshold=threshold,
        params=params,
        part_rows=part_rows,
    )
    ref_cluster, ref_near = lsh_clusters(ids, sig, threshold=threshold, params=params)
    np.testing.assert_array_equal(cluster, ref_cluster)
    np.testing.assert_array_equal(near, ref_near)
    assert stats.windowed_buckets == 0
    assert not os.path.exists(work)  # the partitions are deleted


def _synthetic(tmp_path, n: int, **kw) -> tuple[str, np.ndarray]:
    source, level = plant_groups(n, **kw)
    sig = synthetic_rows(0, source, level, 128, 0)
    path = str(tmp_path / "sig.npy")
    np.save(path, sig)
    return path, source


def test_planted_groups_on_the_process_pool_equal_lsh_clusters(tmp_path):
    path, source = _synthetic(tmp_path, 4000, dup_fraction=0.3, max_group=50)
    sig = np.load(path)
    ids = np.arange(4000, dtype=np.int64) * 2 + 5
    cluster, near, stats = banded_clusters(
        ids,
        NpySignatures(path),
        workdir=str(tmp_path / "work"),
        executor=LocalExecutor(2),
        part_rows=1500,  # three key partitions
    )
    ref_cluster, ref_near = lsh_clusters(ids, sig)
    np.testing.assert_array_equal(cluster, ref_cluster)
    np.testing.assert_array_equal(near, ref_near)
    planted = source != np.arange(4000)
    assert near.sum() > 0.9 * planted.sum()
    assert stats.verified >= stats.passed > 0 and stats.empty == int(np.all(sig == EMPTY, 1).sum())


def test_a_boilerplate_bucket_costs_linear_work_and_is_reported(tmp_path):
    rng = np.random.default_rng(0)
    m, window = 600, 8
    sig = rng.integers(0, 2**31, (m, 128)).astype(np.uint32)
    sig[:, :4] = 1  # every row shares band 0, nothing else: no pair verifies
    cluster, near, stats = banded_clusters(
        np.arange(m), ArraySignatures(sig), workdir=str(tmp_path / "w"), window=window
    )
    assert not near.any()
    assert stats.windowed_buckets == 1 and stats.windowed_rows == m
    assert stats.verified <= window * m  # exhaustive would be m * (m - 1) / 2 = 179,700
    assert stats.largest_bucket == m


def test_a_giant_cluster_is_joined_in_few_verifications(tmp_path):
    m = 3000
    base = np.arange(128, dtype=np.uint32)
    sig = np.tile(base, (m, 1))
    sig[np.arange(m), 100 + np.arange(m) % 20] = 10_000 + np.arange(m)  # one position differs
    cluster, near, stats = banded_clusters(
        np.arange(m), ArraySignatures(sig), workdir=str(tmp_path)
    )
    assert (cluster == 0).all() and near.sum() == m - 1
    assert stats.verified < 2 * m  # buckets are dropped once joined


def test_bad_arguments_are_named(tmp_path):
    src = ArraySignatures(np.zeros((2, 16), np.uint32))
    with pytest.raises(CurateError, match="window"):
        banded_clusters(np.arange(2), src, workdir=str(tmp_path), window=0)
    with pytest.raises(CurateError, match="params"):
        banded_clusters(np.arange(2), src, workdir=str(tmp_path), params=(8, 4))
    with pytest.raises(CurateError, match="threshold"):
        banded_clusters(np.arange(2), src, workdir=str(tmp_path), threshold=1.5)
    with pytest.raises(CurateError, match="part_rows"):
        banded_clusters(np.arange(2), src, workdir=str(tmp_path), part_rows=0)


def test_dedup_names_an_unknown_executor():
    from tests.conftest import run_cli

    proc = run_cli("dedup", "--table", "t.lance", "--near", "--executor", "spark")
    assert proc.returncode == 2
    assert "--executor" in proc.stderr and "spark" in proc.stderr


def test_a_dead_runs_partitions_are_stale_and_a_live_runs_are_kept(tmp_path):
    import subprocess
    import sys

    import pyarrow as pa

    from tokenloom.backfill.hygiene import stale_backfill_items

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    root = tmp_path / "t.lance.backfill"
    for pid in (int(dead.stdout), os.getpid()):
        part = root / "_results" / f"near-v3-{pid}"
        part.mkdir(parents=True)
        np.save(part / "keys-b0000-p00000.npy", np.zeros(4, np.uint64))
    items = stale_backfill_items(str(root), pa.schema([]))
    assert [os.path.basename(i.path) for i in items] == [f"near-v3-{int(dead.stdout)}"]
