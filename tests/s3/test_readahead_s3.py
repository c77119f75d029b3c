"""On an object store the loader sizes its read-ahead from a measured fetch span: through a
proxy adding 20 ms per request it sees the latency, keeps spans in flight, records what it
measured, and the stream equals the local table's."""

from __future__ import annotations

import numpy as np
import pyarrow.fs as pafs
import pytest

from tests.conftest import real_paragraphs
from tests.loader.tables import token_table
from tokenloom.dev.proxy import FaultProxy
from tokenloom.table.storage import filesystem

pytest.importorskip("torch")


def _stream(uri: str, so: dict | None):
    from tokenloom.loader import PackedDataset

    ds = PackedDataset(uri, seq_len=32, global_batch=4, seed=2, read_group=2, storage_options=so)
    return ds, [np.asarray(b["input_ids"]) for b in ds]


def test_read_ahead_is_sized_from_measured_latency(s3_server, s3_prefix, tmp_path):
    local = token_table(tmp_path, real_paragraphs(80))
    remote = f"{s3_prefix}/t.lance"
    fs, path = filesystem(remote, s3_server.storage_options)
    pafs.copy_files(local, path, destination_filesystem=fs)
    _, expected = _stream(local, None)

    with FaultProxy(s3_server.endpoint[len("http://") :], latency_ms=20) as proxy:
        ds, got = _stream(remote, proxy.storage_options(s3_server.storage_options))
    sizing = ds.sizing
    assert sizing is not None and sizing.measured
    assert sizing.wall_s >= 0.020 and sizing.waiting_s > 0  # at least one request's latency
    # fetch spans in flight, and the concurrent takes they are cut into
    assert sizing.read_ahead >= 2 and sizing.io_threads >= sizing.read_ahead
    assert 0 < sizing.span_rows <= 80 and sizing.pack_cpu_s > 0
    assert ds.stats.pipelines == 1 and ds.stats.probe_wall_seconds == sizing.wall_s
    assert "threads" in ds.stats.summary()
    assert len(got) == len(expected) > 4
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)


def test_split_takes_give_the_same_stream(s3_server, s3_prefix, tmp_path, monkeypatch):
    """A group's take cut into several concurrent takes of neighbouring rows reads the same
    tokens (the cut is forced down to one row per take here)."""
    from tokenloom.loader.pipeline import read

    local = token_table(tmp_path, real_paragraphs(80))
    remote = f"{s3_prefix}/t.lance"
    fs, path = filesystem(remote, s3_server.storage_options)
    pafs.copy_files(local, path, destination_filesystem=fs)
    _, expected = _stream(local, None)
    monkeypatch.setattr(read, "SPLIT_TAKE_ROWS", 1)
    parts = []
    real = read.split_rows
    monkeypatch.setattr(
        read, "split_rows", lambda ids, **kw: parts.append(real(ids, **kw)) or parts[-1]
    )
    _, got = _stream(remote, s3_server.storage_options)
    assert max(len(p) for p in parts) == read.SPLIT_TAKE_PARTS  # the takes were split
    assert len(got) == len(expected) > 4
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
