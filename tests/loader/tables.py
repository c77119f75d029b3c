"""Tiny token tables for loader tests, built through the real ingest and backfill APIs.

The "tokenizer" is UTF-8 bytes (ids 0..255, EOS 256, PAD 257): exact, and any text decodes back.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from tokenloom.backfill import add_column, udf
from tokenloom.table.tokens import layout_field, to_layout

BYTE_TOKENIZER = {
    "name": "bytes",
    "vocab_size": 258,
    "eos_id": 256,
    "bos_id": None,
    "pad_id": 257,
    "vocab_hash": "bytes-v1",
}
_META = {b"tokenloom.tokenizer": json.dumps(BYTE_TOKENIZER).encode()}


@udf(
    inputs=["text"],
    output=pa.schema(
        [
            pa.field("input_ids", pa.list_(pa.uint16()), metadata=_META),
            pa.field("n_tokens", pa.int64()),
        ]
    ),
    version="1",
)
def byte_tokens(batch: pa.RecordBatch) -> dict:
    """Token ids = the UTF-8 bytes of the text."""
    return _byte_ids(batch)


def _byte_ids(batch: pa.RecordBatch) -> dict:
    ids, lens = [], []
    for text in batch.column("text").to_pylist():
        arr = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)
        ids.append(arr)
        lens.append(len(arr))
    return {"input_ids": pa.array(ids, type=pa.list_(pa.uint16())), "n_tokens": lens}


@udf(
    inputs=["text"],
    output=pa.schema(
        [
            layout_field("input_ids", pa.uint16(), "bytes", _META),
            pa.field("n_tokens", pa.int64()),
        ]
    ),
    version="1",
)
def byte_tokens_raw(batch: pa.RecordBatch) -> dict:
    """The same ids as :func:`byte_tokens`, stored in the ``bytes`` token layout."""
    out = _byte_ids(batch)
    return {**out, "input_ids": to_layout(out["input_ids"], "bytes")}


def token_table(tmp_path, texts: list[str], *, name: str = "t.lance", layout: str = "list") -> str:
    """Ingest ``texts`` (one row each, ids 0..n-1) and add byte tokens (in ``layout``)."""
    from tests.conftest import write_jsonl
    from tokenloom.ingest import ingest

    src = tmp_path / f"{name}.jsonl"
    write_jsonl(
        src, [{"text": t, "source": "even" if i % 2 == 0 else "odd"} for i, t in enumerate(texts)]
    )
    uri = str(tmp_path / name)
    ingest([src], uri, progress=False)
    add_column(uri, None, byte_tokens if layout == "list" else byte_tokens_raw, workers=0)
    return uri
