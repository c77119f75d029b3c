"""Small built-in UDFs: useful columns on their own, and the benchmark's cheap workload."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from tokenloom.backfill.udf import udf

__all__ = ["n_words"]


@udf(inputs=["text"], output=pa.field("n_words", pa.int32()), version="1", batch_size=4096)
def n_words(batch: pa.RecordBatch) -> pa.Array:
    """Whitespace-separated words per document (vectorised Arrow compute)."""
    return pc.list_value_length(pc.utf8_split_whitespace(batch.column("text"))).cast(pa.int32())
