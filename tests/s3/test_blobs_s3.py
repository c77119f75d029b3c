"""Lazy blobs on an object store: a transform reads a byte range of a 50 MB blob through its
file object, and the bytes the store sent (counted by a proxy in front of the server) stay far
below the object's size; a range read fetches exactly its bytes."""

from __future__ import annotations

import pyarrow.fs as pafs

from tests.rows.tables import MB, blob_bytes, blob_table, read_span
from tokenloom.dev.proxy import FaultProxy
from tokenloom.rows import RowDataset
from tokenloom.rows.blobs import READ_AHEAD
from tokenloom.table.storage import filesystem

SIZES = (50 * MB, 3000)
TAIL = 100 << 10


def _range_reads(batch):
    """A 4 KiB span of each blob (see :func:`read_span`) plus an exact range read of its last
    100 KiB (or all of a smaller blob)."""
    out = read_span(batch)
    tails = []
    for f in batch.column("video"):
        n = min(f.size(), TAIL)
        tails.append(f.read_range(f.size() - n, n))
    out["tail"] = tails
    return out


def test_a_range_of_a_50mb_blob_on_s3_fetches_a_read_ahead_not_the_object(
    s3_server, s3_prefix, tmp_path
):
    local = blob_table(tmp_path, SIZES)
    remote = f"{s3_prefix}/videos.lance"
    fs, path = filesystem(remote, s3_server.storage_options)
    pafs.copy_files(local, path, destination_filesystem=fs)

    with FaultProxy(s3_server.endpoint[len("http://") :]) as proxy:
        ds = RowDataset(
            remote,
            columns=["k", "video"],
            lazy_blobs=True,
            global_batch=2,
            transform=_range_reads,
            transform_threads=0,
            format="python",
            storage_options=proxy.storage_options(s3_server.storage_options),
        )
        before = proxy.body_bytes  # the manifest and the selection scan
        rows = next(iter(ds))
        sent = proxy.body_bytes - before
    assert sorted(r["k"] for r in rows) == [0, 1]
    for r in rows:
        src = blob_bytes(r["k"], SIZES[r["k"]])
        a = len(src) // 3
        assert r["span"] == src[a : a + 4096]
        assert r["tail"] == src[-TAIL:]
    big = next(r for r in rows if r["k"] == 0)
    assert big["fetched"] == READ_AHEAD  # the file object's own count of the span read
    # what the store sent for the step: the span's read-ahead, the exact tail range, the small
    # row and the rows' other columns; the 50 MB object was not fetched
    assert sent < 2 * MB, sent
