"""Tiny row tables for row-loader tests, built through the real ingest (Parquet with a binary
column, so the payload is a blob column), plus transforms that fail on marked rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenloom.ingest import ingest
from tokenloom.rows import SkipRow

BAD = b"BAD"


def row_table(tmp_path, n: int = 40, bad: tuple[int, ...] = ()) -> str:
    """A table of ``n`` rows: ``k`` (int, = id), ``label`` (string), ``payload`` (blob).

    Rows whose index is in ``bad`` carry a payload starting with ``BAD``.
    """
    rows = [
        {
            "text": f"row {i}",
            "k": i,
            "label": f"L{i % 3}",
            "payload": (BAD if i in bad else b"OK") + i.to_bytes(2, "little") * (i + 1),
        }
        for i in range(n)
    ]
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    uri = str(tmp_path / "rows.lance")
    ingest([path], uri, columns="k:int,label:string", progress=False)
    return uri


def decode(batch: pa.RecordBatch) -> dict:
    """A transform: payload length and k doubled; raises ValueError on a BAD payload."""
    payload = batch.column("payload").to_pylist()
    for p in payload:
        if p.startswith(BAD):
            raise ValueError("corrupt payload")
    return {
        "k2": batch.column("k").to_numpy() * 2,
        "size": np.array([len(p) for p in payload], dtype=np.int64),
    }


def decode_skip(batch: pa.RecordBatch) -> dict:
    """As :func:`decode` but leaves a BAD row out on purpose, with a reason."""
    if any(p.startswith(BAD) for p in batch.column("payload").to_pylist()):
        raise SkipRow("bad_payload")
    return decode(batch)


MB = 1 << 20


def blob_bytes(seed: int, size: int) -> bytes:
    """``size`` deterministic pseudo-random bytes (incompressible, like encoded video)."""
    return np.random.default_rng(seed).bytes(size)


def blob_table(tmp_path, sizes: tuple[int | None, ...]) -> str:
    """A table of one row per size: ``k`` (int, = index), ``raw`` (binary, not blob-encoded,
    4 bytes), ``video`` (blob: :func:`blob_bytes` ``(k, size)``, null for ``None``).

    Built through the real ingest from a Parquet file of one row per row group, so the
    generator and the ingest hold one large value at a time.
    """
    schema = pa.schema(
        [
            ("text", pa.string()),
            ("k", pa.int64()),
            ("raw", pa.large_binary()),
            ("video", pa.large_binary()),
        ]
    )
    path = tmp_path / "videos.parquet"
    # random bytes do not compress, and min/max statistics of 50 MB values cost seconds
    plain = dict(compression="none", use_dictionary=False, write_statistics=False)
    with pq.ParquetWriter(path, schema, **plain) as writer:
        for k, size in enumerate(sizes):
            video = None if size is None else blob_bytes(k, size)
            row = {"text": [f"clip {k}"], "k": [k], "raw": [b"raw%d" % k], "video": [video]}
            writer.write_table(pa.table(row, schema=schema))
    uri = str(tmp_path / "videos.lance")
    ingest([path], uri, columns="k:int,raw:binary,video:blob", progress=False)
    return uri


def read_span(batch) -> dict:
    """A lazy-blob transform: bytes ``[size // 3, size // 3 + 4096)`` of each ``video`` (read
    after a seek), its size and the bytes its file object fetched; nulls give empty values."""
    spans, sizes, fetched = [], [], []
    for f in batch.column("video"):
        if f is None:
            spans.append(b"")
            sizes.append(-1)
            fetched.append(0)
            continue
        f.seek(f.size() // 3)
        spans.append(f.read(4096))
        sizes.append(f.size())
        fetched.append(f.bytes_fetched)
    return {
        "k": batch.column("k").to_numpy(),
        "span": spans,
        "size": np.array(sizes, dtype=np.int64),
        "fetched": np.array(fetched, dtype=np.int64),
    }
