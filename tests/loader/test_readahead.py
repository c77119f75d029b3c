"""Read-ahead sizing: the pure Little's-law function and rows per take, and the loader on a local
table (fixed depth, explicit values win, recorded in the stats, the stream does not depend on
it). The measured sizing on an object store is tested in tests/s3/test_readahead_s3.py."""

from __future__ import annotations

import numpy as np
import pytest

from tokenloom.loader.pipeline.readahead import MAX_THREADS, available_cores, size_read_ahead


def test_cpu_bound_reads_get_one_thread_per_core():
    s = size_read_ahead(0.010, 0.010, cores=2, min_threads=1)
    assert (s.io_threads, s.read_ahead, s.measured) == (2, 4, True)
    assert s.waiting_s == 0.0


def test_waiting_time_adds_threads_by_littles_law():
    # 5 ms of CPU and 20 ms waiting per group: 25 ms in flight per 5 ms of a core's work
    s = size_read_ahead(0.025, 0.005, cores=2)
    assert s.io_threads == 10  # ceil(2 * 25 / 5)
    assert s.read_ahead == 12  # every thread busy + the group consumed + one ready
    assert s.waiting_s == pytest.approx(0.020)
    assert "10 threads" in s.describe() and "20.0 ms waiting" in s.describe()


def test_bounds_floor_and_cap():
    assert size_read_ahead(0.001, 0.002, cores=1, min_threads=2).io_threads == 2
    assert size_read_ahead(10.0, 0.001, cores=4).io_threads == MAX_THREADS
    assert size_read_ahead(0.5, 0.0, cores=2, max_threads=8).io_threads == 8  # no CPU measured
    with pytest.raises(ValueError, match="cores=0"):
        size_read_ahead(0.1, 0.1, cores=0)


def test_a_memory_budget_caps_measured_values_only():
    s = size_read_ahead(1.0, 0.01, cores=2, max_ahead=3)
    assert (s.io_threads, s.read_ahead) == (3, 3)
    s = size_read_ahead(1.0, 0.01, cores=2, max_ahead=0)
    assert (s.io_threads, s.read_ahead) == (1, 1)
    s = size_read_ahead(1.0, 0.01, cores=2, io_threads=6, read_ahead=8, max_ahead=2)
    assert (s.io_threads, s.read_ahead) == (6, 8)


def test_explicit_values_are_kept():
    s = size_read_ahead(0.5, 0.01, cores=2, io_threads=3)
    assert (s.io_threads, s.read_ahead, s.measured) == (3, 5, True)  # depth still sized
    s = size_read_ahead(0.5, 0.01, cores=2, read_ahead=7)
    assert (s.io_threads, s.read_ahead) == (MAX_THREADS, MAX_THREADS)  # depth >= threads
    s = size_read_ahead(0.5, 0.01, cores=2, io_threads=3, read_ahead=9)
    assert (s.io_threads, s.read_ahead, s.measured) == (3, 9, False)
    assert "explicit" in s.describe()


def test_available_cores_is_shared_among_workers():
    n = available_cores()
    assert n >= 1 and available_cores(n * 4) == 1


def test_local_tables_keep_the_fixed_depth_and_explicit_values_win(tmp_path):
    pytest.importorskip("torch")
    from tests.conftest import real_paragraphs
    from tests.loader.tables import token_table
    from tokenloom.loader import DataLoader, PackedDataset

    uri = token_table(tmp_path, real_paragraphs(60))

    def stream(**kw):
        ds = PackedDataset(uri, seq_len=32, global_batch=4, seed=1, **kw)
        return ds, [np.asarray(b["input_ids"]) for b in ds]

    ds, default = stream(read_group=8)
    assert (ds.sizing.io_threads, ds.sizing.read_ahead, ds.sizing.measured) == (2, 4, False)
    assert ds.stats.pipelines == 1 and ds.stats.probe_wall_seconds == 0
    # groups of 64 steps or more: one ahead per thread (a worker's ring holds fewer big groups)
    big, _ = stream(read_group=64)
    assert (big.sizing.io_threads, big.sizing.read_ahead) == (2, 2)
    ds2, explicit = stream(io_threads=1, read_ahead=1, read_group=1)
    assert (ds2.sizing.io_threads, ds2.sizing.read_ahead) == (1, 1)
    ds3, deep = stream(io_threads=5, read_ahead=9, read_group=2)
    assert len(default) == len(explicit) == len(deep) > 4
    for a, b, c in zip(default, explicit, deep, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)

    dl = DataLoader(
        PackedDataset(uri, seq_len=32, global_batch=4, seed=1, read_group=8), num_workers=2
    )
    assert sum(1 for _ in dl) == len(default)
    assert dl.stats.pipelines == 2 and dl.stats.io_threads == 4  # two threads per worker
    assert "read-ahead 2 threads, 4 groups ahead" in dl.stats.summary()


def test_rows_per_take_fills_the_object_store_merge_window():
    from tokenloom.loader.pipeline.readahead import (
        COALESCE_BYTES,
        MAX_REMOTE_TAKE_ROWS,
        TAKE_ROWS,
        rows_per_take,
    )

    assert rows_per_take(10e9, remote=False) == TAKE_ROWS
    assert rows_per_take(1e6, remote=True) == TAKE_ROWS  # a small table: the local size
    # 32 MiB of tokens: 2,048 rows per take leave 16 KiB between neighbours (window / 4)
    assert rows_per_take(32 << 20, remote=True) == 2048 == 4 * (32 << 20) // COALESCE_BYTES
    assert rows_per_take(10e9, remote=True) == MAX_REMOTE_TAKE_ROWS


def test_split_rows_cuts_ascending_ids_into_neighbouring_runs():
    from tokenloom.loader.pipeline.read import split_rows

    ids = np.arange(10, 1010, dtype=np.uint64)
    parts = split_rows(ids, min_rows=256, max_parts=4)
    assert [len(p) for p in parts] == [334, 333, 333]  # 1000 // 256 = 3 runs of >= 256
    np.testing.assert_array_equal(np.concatenate(parts), ids)
    assert len(split_rows(ids, min_rows=256, max_parts=2)) == 2
    assert len(split_rows(ids[:511], min_rows=256, max_parts=4)) == 1
    assert [len(p) for p in split_rows(ids[:3], min_rows=1, max_parts=4)] == [1, 1, 1]
