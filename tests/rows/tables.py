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
