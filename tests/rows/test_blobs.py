"""Blob columns read lazily (``lazy_blobs``): a transform reads a byte range of a 50 MB blob
through a file object, fetching a bounded read-ahead instead of the object; the file object's
io surface, its lifetime (the transform call), pickling, DataLoader workers, and the refusals."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

from tests.rows.tables import MB, blob_bytes, blob_table, read_span
from tokenloom.loader.plan.epoch import PlanError
from tokenloom.rows import RowDataset, RowLoaderError, RowMapDataset, RowReader, RowSpec
from tokenloom.rows.blobs import READ_AHEAD, LazyBatch
from tokenloom.rows.read import scan_selection

SIZES = (50 * MB, None, 8 * MB, 0, 5000)
"""Blob sizes by ``k``: a 50 MB object, a null, 8 MB, an empty blob, a small one."""


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    return blob_table(tmp_path_factory.mktemp("videos"), SIZES)


def _lazy_batch(uri: str, ks: list[int]) -> LazyBatch:
    """The rows ``k in ks`` (ids = k) read by a RowReader with ``video`` lazy."""
    import lance

    ds = lance.dataset(uri)
    sel = scan_selection(ds, filter=None, columns=["k", "video"])
    pos = np.asarray(ks, dtype=np.int64)  # ids are 0..n-1, ascending: positions = ids
    reader = RowReader(uri, ds.version, ["k", "video"], lazy=("video",))
    batch = reader.read(sel.rowids[pos], sel.row_ids[pos])
    assert isinstance(batch, LazyBatch)
    return batch


def test_a_transform_reads_a_range_of_a_50mb_blob_without_fetching_it(videos):
    ds = RowDataset(
        videos,
        columns=["k", "video"],
        lazy_blobs=True,
        global_batch=len(SIZES),
        transform=read_span,
        transform_threads=0,
        format="python",
    )
    ds.reader.dataset.io_stats_incremental()  # counted from here: the blob reads of one step
    rows = next(iter(ds))
    stats = ds.reader.dataset.io_stats_incremental()
    assert sorted(r["k"] for r in rows) == list(range(len(SIZES)))
    for r in rows:
        size = SIZES[r["k"]]
        if size is None:
            assert (r["span"], r["size"], r["fetched"]) == (b"", -1, 0)
            continue
        a = size // 3
        assert r["size"] == size
        assert r["span"] == blob_bytes(r["k"], size)[a : a + 4096]
        assert r["fetched"] <= max(READ_AHEAD, 4096)  # one read-ahead, not the object
    # everything Lance read for the step (three read-aheads, descriptors, the k column) is far
    # below the 58 MB of blobs the step's rows hold
    assert stats.read_bytes < 2 * MB, stats
    big = next(r for r in rows if r["k"] == 0)
    assert big["fetched"] == READ_AHEAD


def test_the_file_object_reads_seeks_and_counts_like_a_file(videos):
    src = blob_bytes(2, 8 * MB)
    with _lazy_batch(videos, [2, 1, 3]) as batch:
        f, null, empty = batch.column("video")
        assert null is None and empty.size() == 0 and empty.read() == b""
        assert (f.size(), len(f), f.tell()) == (8 * MB, 8 * MB, 0)
        assert f.readable() and f.seekable() and not f.writable()
        assert f.seek(-10, io.SEEK_END) == 8 * MB - 10 and f.read() == src[-10:]
        assert f.read(5) == b"" and f.seek(8 * MB + 99) == 8 * MB + 99 and f.read(1) == b""
        f.seek(100)
        assert f.seek(50, io.SEEK_CUR) == 150
        buf = bytearray(1000)
        assert f.readinto(buf) == 1000 and bytes(buf) == src[150:1150] and f.tell() == 1150
        arr = np.empty(64, dtype=np.uint8)
        assert f.readinto(arr) == 64 and arr.tobytes() == src[1150:1214]
        before = f.bytes_fetched  # the last 10 bytes, then one read-ahead serving two reads
        assert before == 10 + READ_AHEAD
        assert f.read_range(3 * MB, 777) == src[3 * MB : 3 * MB + 777] and f.tell() == 1214
        assert f.bytes_fetched == before + 777  # a range read fetches exactly its bytes
        f.seek(5 * MB)
        assert f.read(2 * MB) == src[5 * MB : 7 * MB]  # a large read: exactly its bytes too
        assert f.bytes_fetched == before + 777 + 2 * MB
        buffered = io.BufferedReader(f.copy())  # closes its raw file when dropped: a copy
        buffered.seek(7 * MB)
        assert buffered.read(100) == src[7 * MB : 7 * MB + 100]
        with pytest.raises(ValueError, match="negative seek position"):
            f.seek(-1)
        with pytest.raises(ValueError, match="whence"):
            f.seek(0, 7)
        rows = batch.to_pylist()
        assert [r["k"] for r in rows] == [2, 1, 3] and rows[0]["video"] is f
        assert batch.column(1) is batch["video"] and batch.num_rows == len(batch) == 3
    with pytest.raises(ValueError, match="valid within the transform call"):
        f.read(1)  # the batch closed its file objects


def test_slices_get_fresh_file_objects_closed_with_the_batch(videos):
    batch = _lazy_batch(videos, [4, 2])
    f = batch.column("video")[0]
    f.read(10)
    part = batch.slice(0, 1)
    g = part.column("video")[0]
    assert g is not f and g.tell() == 0 and g.read(10) == blob_bytes(4, 5000)[:10]
    assert part.column("k").to_pylist() == [4] and part.num_rows == 1
    batch.close()
    assert f.closed and g.closed


def test_a_blob_pickles_as_its_address_and_reads_where_it_was(videos):
    src = blob_bytes(0, 50 * MB)
    with _lazy_batch(videos, [0]) as batch:
        f = batch.column("video")[0]
        f.seek(20 * MB)
        g = pickle.loads(pickle.dumps(f))  # no Lance handle inside: opened again on first read
        assert g.tell() == 20 * MB and g.size() == 50 * MB
        assert g.read(1000) == src[20 * MB : 20 * MB + 1000]
        assert g.bytes_fetched == READ_AHEAD
        g.close()
    with pytest.raises(ValueError, match="valid within the transform call"):
        pickle.dumps(f)


def _read_first_16_then_fail_on_k4(batch):
    """Reads 16 bytes of each blob from where the file object stands, then fails on ``k == 4``:
    the row-by-row rerun must see file objects at position 0 again."""
    heads = [f.read(16) if f is not None else b"" for f in batch.column("video")]
    if 4 in batch.column("k").to_pylist():
        raise ValueError("k 4")
    return {"k": batch.column("k").to_numpy(), "head": heads}


def test_a_failing_row_is_left_out_and_the_others_read_from_the_start(videos):
    ds = RowMapDataset(
        videos,
        columns=["k", "video"],
        lazy_blobs=["video"],
        transform=_read_first_16_then_fail_on_k4,
        on_error="skip",
    )
    rows = ds.__getitems__([0, 2, 4])
    assert ds.skipped["ValueError"] >= 1
    for r in rows:
        assert r["k"] != 4
        size = SIZES[int(r["k"])]
        assert r["head"] == (blob_bytes(int(r["k"]), size)[:16] if size else b"")


def test_workers_read_the_blobs_in_their_process(videos):
    from tokenloom.rows import RowLoader

    def stream(loader):
        return [(b["k"].tolist(), b["span"]) for b in loader]

    kw = dict(columns=["k", "video"], lazy_blobs=True, global_batch=2, transform=read_span)
    ref = stream(RowDataset(videos, transform_threads=0, **kw))
    got = stream(RowLoader(RowDataset(videos, **kw), num_workers=1))
    assert got == ref and len(ref) == 3


def _return_the_files(batch):
    return {"video": batch.column("video")}


def test_refusals_name_the_column_and_the_fix(videos):
    kw = dict(global_batch=2, transform=read_span)
    with pytest.raises(RowLoaderError, match=r"'raw', which is not a blob column.*raw:blob"):
        RowDataset(videos, columns=["k", "raw", "video"], lazy_blobs=["raw"], **kw)
    with pytest.raises(RowLoaderError, match=r"'k', which is not a blob column \(stored as int64"):
        RowDataset(videos, columns=["k", "video"], lazy_blobs="k", **kw)
    with pytest.raises(RowLoaderError, match=r"none of the columns read is a blob column"):
        RowDataset(videos, columns=["k", "raw"], lazy_blobs=True, **kw)
    with pytest.raises(RowLoaderError, match="pass transform="):
        RowDataset(videos, columns=["k", "video"], lazy_blobs=True, global_batch=2)
    with pytest.raises(PlanError, match=r"'audio', not among the columns read"):
        RowSpec(table=videos, columns=["k", "video"], lazy_blobs=["audio"])
    with pytest.raises(PlanError, match="lazy_blobs must be True, False or blob column names"):
        RowSpec(table=videos, columns=["k", "video"], lazy_blobs=1)
    assert RowSpec(table=videos, columns=["k", "video"], lazy_blobs="video").lazy_blobs == (
        "video",
    )
    leaky = RowDataset(
        videos, columns=["k", "video"], lazy_blobs=True, global_batch=2, transform=_return_the_files
    )
    with pytest.raises(RowLoaderError, match=r"returned column 'video' \(a file object"):
        next(iter(leaky))


def test_a_row_group_of_large_blobs_is_ingested_a_few_rows_at_a_time(tmp_path, monkeypatch):
    """A Parquet row group is read in batches of at most ``_PARQUET_BATCH_BYTES`` (here 1 MiB,
    so two 400 KiB blobs a batch, not the group's eight) and every blob lands whole."""
    import lance
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tokenloom.ingest import ingest, readers

    monkeypatch.setattr(readers, "_PARQUET_BATCH_BYTES", 1 << 20)
    seen: list[int] = []
    real = readers._parquet_batch
    monkeypatch.setattr(
        readers, "_parquet_batch", lambda batch, *a: seen.append(batch.num_rows) or real(batch, *a)
    )
    blobs = [blob_bytes(k, 400 << 10) for k in range(8)]
    path = tmp_path / "group.parquet"
    pq.write_table(pa.table({"text": [f"c{k}" for k in range(8)], "video": blobs}), path)
    assert pq.ParquetFile(path).num_row_groups == 1
    uri = str(tmp_path / "group.lance")
    ingest([path], uri, progress=False)
    assert seen == [2, 2, 2, 2]
    ds = lance.dataset(uri)
    assert ds.schema.field("video").metadata[b"lance-encoding:blob"] == b"true"
    ids = ds.scanner(columns=["id"], with_row_id=True).to_table().column("_rowid").to_pylist()
    assert [f.readall() for f in ds.take_blobs("video", ids=ids)] == blobs


def test_a_lance_blob_v2_column_reads_lazily_and_whole(tmp_path):
    """A column of Lance's newer blob type (an adopted table's, 2.2 files) is a blob column too:
    read by range when lazy, as bytes otherwise."""
    import lance
    import pyarrow as pa
    from lance.blob import blob_array

    values = [blob_bytes(7, 3 * MB), None, b"tiny"]
    table = pa.table({"id": pa.array([0, 1, 2], pa.int64()), "video": blob_array(values)})
    uri = str(tmp_path / "v2.lance")
    ds = lance.write_dataset(table, uri, data_storage_version="2.2", enable_stable_row_ids=True)
    sel = scan_selection(ds, filter=None, columns=["video"])
    pos = np.array([2, 0, 1])
    eager = RowReader(uri, ds.version, ["video"]).read(sel.rowids[pos], sel.row_ids[pos])
    assert eager.column("video").to_pylist() == [values[2], values[0], None]
    lazy = RowReader(uri, ds.version, ["video"], lazy=("video",))
    with lazy.read(sel.rowids[pos], sel.row_ids[pos]) as batch:
        tiny, big, null = batch.column("video")
        assert tiny.read() == b"tiny" and null is None
        assert big.read_range(MB, 10) == values[0][MB : MB + 10] and big.bytes_fetched == 10
