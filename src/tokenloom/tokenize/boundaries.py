"""Line boundaries of a token column, as a column: where a long document may be cut.

For each row, the token offsets ``c`` such that token ``c - 1`` ends a line (its text ends with
a newline). The loader's ``long_docs="window"`` ends a window at the latest such offset within the
window's last eighth (else at the hard limit), so windows end at line or paragraph breaks when the
text offers one. Stored as a column, the plan stays a function of stored data.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenloom.backfill import UDF, add_column
from tokenloom.table.tokens import as_token_lists

__all__ = ["LineBoundaries", "boundaries_column_for", "add_boundaries"]


def boundaries_column_for(token_column: str) -> str:
    """``input_ids`` -> ``cut_points``; ``input_ids_bpe`` -> ``cut_points_bpe``."""
    if token_column.startswith("input_ids"):
        return "cut_points" + token_column[len("input_ids") :]
    return f"{token_column}_cut_points"


class LineBoundaries:
    """Per row, the offsets after every token whose text ends with a newline."""

    def __init__(self, spec: str, vocab_hash: str, column: str) -> None:
        from tokenloom.tokenize.registry import load_tokenizer

        tok = load_tokenizer(spec, num_threads=1)
        if tok.vocab_hash != vocab_hash:
            raise RuntimeError(f"tokenizer {spec!r} changed on disk while computing boundaries")
        self.column = column
        self.ends_line = np.array(
            [tok.decode([i]).endswith("\n") for i in range(tok.vocab_size)], dtype=bool
        )

    def __call__(self, batch: pa.RecordBatch) -> pa.Array:
        ids = as_token_lists(batch.column(self.column), batch.schema.field(self.column))
        offsets = ids.offsets.to_numpy().astype(np.int64)
        offsets = offsets - offsets[0]  # a sliced list array keeps absolute offsets
        flat = pc.list_flatten(ids).to_numpy(zero_copy_only=False).astype(np.int64)
        hits = np.flatnonzero(self.ends_line[flat])  # flat positions of line-ending tokens
        row = np.searchsorted(offsets, hits, side="right") - 1
        cuts = (hits - offsets[row] + 1).astype(np.int32)
        counts = np.bincount(row, minlength=len(ids))
        out_offsets = np.zeros(len(ids) + 1, dtype=np.int32)
        np.cumsum(counts, out=out_offsets[1:])
        arr = pa.ListArray.from_arrays(pa.array(out_offsets), pa.array(cuts, type=pa.int32()))
        return arr if not ids.null_count else pc.if_else(ids.is_null(), None, arr)


def add_boundaries(
    uri: str,
    column: str = "input_ids",
    *,
    workers: int | None = None,
    progress: bool | None = None,
    storage_options: dict[str, str] | None = None,
):  # noqa: ANN201 - BackfillResult
    """Add the line-boundary column of ``column`` (its tokenizer read from the field metadata)."""
    import json

    from tokenloom.table import Table

    table = Table.open(uri, storage_options=storage_options)
    field = table.schema().field(column)
    ident = json.loads((field.metadata or {})[b"tokenloom.tokenizer"])
    udf = UDF(
        LineBoundaries,
        inputs=[column],
        output=pa.field(boundaries_column_for(column), pa.list_(pa.int32())),
        version="1",
        name="LineBoundaries",
        batch_size=512,
        kwargs={"spec": ident["name"], "vocab_hash": ident["vocab_hash"], "column": column},
    )
    return add_column(table, None, udf, workers=workers, progress=progress)
