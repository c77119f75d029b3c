"""Real GPT-2 token tables for the verify tests: one tokenized as ``tokenloom tokenize`` does, and
one whose stored ids differ from its text in a single token of a single row.

The corrupting UDF lives here, at module level, so a backfill worker can import it.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from tokenloom.backfill import add_column, udf
from tokenloom.tokenize import load_tokenizer

FLIPPED_TOKEN = 3
"""Index of the token whose id the corrupting UDF changes."""


@udf(
    inputs=["id", "text"],
    output={"input_ids": pa.list_(pa.uint16()), "n_tokens": pa.int64()},
    version="1",
)
class FlipOneId:
    """GPT-2 ids of ``text``, except that row ``row`` gets token ``FLIPPED_TOKEN``'s id + 1."""

    def __init__(self, row: int) -> None:
        self.row = row
        self.tokenizer = load_tokenizer("gpt2")

    def __call__(self, batch: pa.RecordBatch) -> list:
        ids = [
            np.asarray(x, dtype=np.int64)
            for x in self.tokenizer.encode_batch(batch.column("text")).to_pylist()
        ]
        for i, rid in enumerate(batch.column("id").to_pylist()):
            if rid == self.row:
                ids[i][FLIPPED_TOKEN] = (ids[i][FLIPPED_TOKEN] + 1) % self.tokenizer.vocab_size
        return [pa.array(ids, type=pa.list_(pa.uint16())), [len(x) for x in ids]]


def flip_one_id(row: int):  # noqa: ANN201 - a bound UDF
    """The :class:`FlipOneId` UDF for ``row``, writing the gpt2 identity on ``input_ids``."""
    identity = load_tokenizer("gpt2").identity()
    meta = {
        b"tokenloom.tokenizer": json.dumps(identity, sort_keys=True).encode(),
        b"tokenloom.count_column": b"n_tokens",
    }
    schema = pa.schema(
        [
            pa.field("input_ids", pa.list_(pa.uint16()), metadata=meta),
            pa.field("n_tokens", pa.int64()),
        ]
    )
    return FlipOneId.bind(row=row).with_output(schema)


def ingest_texts(tmp_path, texts: list[str], name: str) -> str:
    """Ingest ``texts`` (one row each, ids 0..n-1) into a new table."""
    from tests.conftest import write_jsonl
    from tokenloom.ingest import ingest

    src = tmp_path / f"{name}.jsonl"
    write_jsonl(src, [{"text": t, "source": "docs"} for t in texts])
    uri = str(tmp_path / name)
    ingest([src], uri, progress=False)
    return uri


def gpt2_table(tmp_path, texts: list[str], name: str = "good.lance") -> str:
    """``texts`` tokenized by ``tokenize_table`` with gpt2."""
    from tokenloom.tokenize.column import tokenize_table

    uri = ingest_texts(tmp_path, texts, name)
    tokenize_table(uri, "gpt2", workers=0, progress=False)
    return uri


def corrupt_table(tmp_path, texts: list[str], row: int, name: str = "bad.lance") -> str:
    """``texts`` tokenized with gpt2, but row ``row``'s stored ids differ from its text."""
    uri = ingest_texts(tmp_path, texts, name)
    add_column(uri, None, flip_one_id(row), workers=0)
    return uri
