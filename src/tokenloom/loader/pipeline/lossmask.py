"""Loss masks as a column: token spans per row whose targets the loader leaves out of the loss.

**The column.** ``list<int32>`` (any integer list type is read), one list per row of flat
``[start_0, end_0, start_1, end_1, ...]`` pairs: half-open ``[start, end)`` ranges of token
positions of the row's token column (token ``t`` is ``input_ids[t]``). Pairs may come in any
order and may overlap; an empty list masks nothing. A pair must satisfy
``0 <= start <= end <= n_tokens`` of its row, and the list must hold an even number of values;
anything else is refused with the row named (never clipped in silence). A null list is refused
for a selected row, unless the loader plans missing values (``allow_missing``), when it masks
nothing. :class:`~tokenloom.backfill.lossmask.LossMask` computes such a column from the text.

**What is masked.** The position whose *target* (its label, the next token of its document) is
token ``t`` of the row gets label ``-100`` when ``t`` lies in a span. So a span ``[s, e)`` takes
the targets ``s .. e - 1`` out of the loss: the positions holding tokens ``s - 1 .. e - 2``. The
tokens stay in ``input_ids`` (the model still reads them as context). The EOS target (``t ==
n_tokens``) is never masked and token 0 is never a target. The rule holds whatever the recipe: a
target carried by a lookahead token (a block cut mid-document) is masked the same way; a window
of a long document masks by the document's own token positions (context-only targets are
``-100`` already); best-fit pieces and mixture pools too. :attr:`masked positions
<tokenloom.loader.plan.pack.PackedArrays.masked_positions>` count the labels the mask turned to
``-100`` that would otherwise have trained (the ledger's ``masked_tokens``).

Pure numpy except :func:`check_mask_field` / :func:`null_mask_rows` (which read a schema or a
column's validity).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from tokenloom.loader.pipeline.read import LoaderError
from tokenloom.loader.pipeline.take import take

__all__ = [
    "MASK_TYPE",
    "LossMaskColumnError",
    "LossMaskDataError",
    "check_mask_field",
    "mask_pairs",
    "check_pairs",
    "stretch_mask",
    "naive_stretch_mask",
    "null_mask_rows",
    "MaskReader",
    "masked_token_count",
    "mask_summary",
]

MASK_TYPE = pa.list_(pa.int32())
"""The documented type of a loss-mask column (flat ``[start, end)`` pairs)."""


class LossMaskColumnError(LoaderError):
    """The loss-mask column does not exist or is not a list of integers (a usage error)."""


class LossMaskDataError(LoaderError):
    """A row's loss-mask list breaks the column's contract (odd length, a span out of range)."""


def check_mask_field(schema: pa.Schema, column: str, uri: str) -> None:
    """Refuse a loss-mask column that is missing or of another type.

    Raises:
        LossMaskColumnError: Naming the column, its type and the fix.
    """
    if column not in schema.names:
        raise LossMaskColumnError(
            f"--loss-mask-column {column!r}: the table {uri} has no such column (columns: "
            f"{', '.join(schema.names)}); compute one with `tokenloom backfill run --table {uri} "
            f"--udf tokenloom.backfill.builtin:LossMask --column {column}`"
        )
    field = schema.field(column)
    if b"tokenloom.tokenizer" in (field.metadata or {}):
        raise LossMaskColumnError(
            f"--loss-mask-column {column!r} is a token column (it records a tokenizer), not "
            "[start, end) spans; name the mask column, e.g. one computed with `tokenloom backfill "
            f"run --table {uri} --udf tokenloom.backfill.builtin:LossMask`"
        )
    typ = field.type
    ok = (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and pa.types.is_integer(
        typ.value_type
    )
    if not ok:
        raise LossMaskColumnError(
            f"--loss-mask-column {column!r} has type {typ}, but a loss-mask column must be "
            "list<int32> (flat [start, end) token pairs per row); pick another column, or "
            f"compute one with `tokenloom backfill run --table {uri} "
            f"--udf tokenloom.backfill.builtin:LossMask --column NAME`"
        )


def mask_pairs(
    col: Any, *, column: str, rowids: np.ndarray | None = None, what: str = "id"
) -> tuple[np.ndarray, np.ndarray]:
    """A loss-mask list array as pairs: ``(pairs, ptr)``.

    Args:
        col: An Arrow list (or chunked list) array, one entry per row; null = no span.
        column: The column's name (for errors).
        rowids: The rows' ids (for errors), in ``col``'s order.
        what: What ``rowids`` are (``id``, ``stable row id``).

    Returns:
        ``pairs`` ``(K, 2)`` int64 ``[start, end)`` and ``ptr`` ``(R + 1,)`` int64: row ``r``'s
        pairs are ``pairs[ptr[r]:ptr[r + 1]]``.

    Raises:
        LossMaskDataError: A row holds an odd number of values.
    """
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks else pa.array([], MASK_TYPE)
    offs = col.offsets.to_numpy().astype(np.int64, copy=False)
    n = np.diff(offs)
    if col.null_count:
        n = np.where(col.is_valid().to_numpy(zero_copy_only=False), n, 0)
    odd = (n % 2) == 1
    if odd.any():
        r = int(np.flatnonzero(odd)[0])
        who = f"the row with {what} {int(rowids[r])}" if rowids is not None else f"row {r}"
        raise LossMaskDataError(
            f"loss-mask column {column!r}: {who} holds {int(n[r])} values, but the list must hold "
            "[start, end) pairs (an even count); recompute the column"
        )
    values = col.values.to_numpy(zero_copy_only=False) if len(col.values) else np.empty(0)
    values = values.astype(np.int64, copy=False)
    ptr = np.zeros(len(n) + 1, dtype=np.int64)
    np.cumsum(n // 2, out=ptr[1:])
    # row r's values start at offs[r] in ``values`` (list slicing included): gather them
    total = int(ptr[-1]) * 2
    at = np.repeat(offs[:-1] - 2 * ptr[:-1], n) + np.arange(total)
    return values[at].reshape(-1, 2), ptr


def check_pairs(
    pairs: np.ndarray,
    ptr: np.ndarray,
    n_tokens: np.ndarray,
    *,
    column: str,
    rowids: np.ndarray,
    what: str = "id",
) -> None:
    """Refuse a span outside its row's tokens or reversed (``0 <= start <= end <= n``).

    Raises:
        LossMaskDataError: Naming the first bad row, its span and its token count.
    """
    if not len(pairs):
        return
    row = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))  # (K,) row of each pair
    n = np.asarray(n_tokens, dtype=np.int64)[row]
    bad = (pairs[:, 0] < 0) | (pairs[:, 0] > pairs[:, 1]) | (pairs[:, 1] > n)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise LossMaskDataError(
            f"loss-mask column {column!r}: the row with {what} {int(rowids[row[k]])} has the span "
            f"[{int(pairs[k, 0])}, {int(pairs[k, 1])}) but the rule is 0 <= start <= end <= its "
            f"{int(n[k])} tokens; the mask was computed for other tokens: recompute it with "
            "`tokenloom backfill run ... --udf tokenloom.backfill.builtin:LossMask` (into a new "
            "column) after `tokenloom tokenize`"
        )


def stretch_mask(
    pairs: np.ndarray,
    ptr: np.ndarray,
    row: np.ndarray,
    starts: np.ndarray,
    stops: np.ndarray,
    offsets: np.ndarray,
) -> np.ndarray:
    """Which of the read tokens lie in a span of their row. Vectorised: O(T + pairs touched).

    Args:
        pairs, ptr: The rows' spans (:func:`mask_pairs`).
        row: ``(S,)`` index of each stretch's row into ``ptr``.
        starts, stops: ``(S,)`` document token range read for each stretch.
        offsets: ``(S + 1,)`` where each stretch's tokens lie in the read tokens.

    Returns:
        ``(T,)`` bool, ``T = offsets[-1]``: read token ``offsets[i] + j`` (document token
        ``starts[i] + j`` of stretch ``i``) lies in a span.
    """
    T = int(offsets[-1]) if len(offsets) else 0
    row = np.asarray(row, dtype=np.int64)
    n = (ptr[1:] - ptr[:-1])[row]  # (S,) pairs of each stretch's row
    total = int(n.sum())
    if total == 0:
        return np.zeros(T, dtype=bool)
    which = np.repeat(np.arange(len(row)), n)  # (Q,) stretch of each (stretch, pair)
    k = np.repeat(ptr[:-1][row], n) + (np.arange(total) - np.repeat(np.cumsum(n) - n, n))
    lo = np.maximum(pairs[k, 0], starts[which])
    hi = np.minimum(pairs[k, 1], stops[which])
    keep = lo < hi
    base = (offsets[:-1][which] - starts[which])[keep]
    # +1 where a span opens, -1 where it closes; covered where the running sum is positive
    delta = np.bincount(lo[keep] + base, minlength=T + 1) - np.bincount(
        hi[keep] + base, minlength=T + 1
    )
    return np.cumsum(delta[:T]) > 0


def naive_stretch_mask(
    spans_of: dict[int, list[tuple[int, int]]],
    rows: list[int],
    starts: list[int],
    stops: list[int],
) -> np.ndarray:
    """Slow reference of :func:`stretch_mask`: ``spans_of[row]`` lists each row's pairs."""
    out: list[bool] = []
    for r, a, b in zip(rows, starts, stops, strict=True):
        out += [any(s <= t < e for s, e in spans_of.get(r, [])) for t in range(a, b)]
    return np.asarray(out, dtype=bool)


def null_mask_rows(ds: Any, column: str, rowids: np.ndarray) -> np.ndarray:
    """The stable row ids among ``rowids`` whose mask is null (one scan of the column's
    validity, filtered by Lance)."""
    table = ds.to_table(columns=[], filter=f"`{column}` IS NULL", with_row_id=True)
    nulls = table.column("_rowid").to_numpy().astype(np.uint64, copy=False)
    if not len(nulls):
        return nulls
    return nulls[np.isin(nulls, np.asarray(rowids, dtype=np.uint64))]


class MaskReader:
    """The loss-mask spans of a step layout's rows, read alone (the ledger reads no token).

    Args:
        ds: The Lance dataset at the loader's pinned version.
        column: The loss-mask column.
        inputs: The plan's inputs (table ids and stable row ids of the selected rows).
    """

    def __init__(self, ds: Any, column: str, inputs: Any) -> None:
        self.ds, self.column, self.inputs = ds, column, inputs

    def __call__(self, layout: Any, offsets: np.ndarray) -> np.ndarray:
        """``(T,)`` bool: which tokens the layout reads (``offsets``: CSR over its stretches)
        lie in a span (:func:`stretch_mask`)."""
        spans = layout.spans
        if not len(spans):
            return np.zeros(int(offsets[-1]), dtype=bool)
        inputs = self.inputs
        rowids = np.asarray(inputs.rowids[np.searchsorted(inputs.row_ids, spans.row_id)])
        uniq, first, inv = np.unique(rowids, return_index=True, return_inverse=True)
        col = take(self.ds, uniq.tolist(), [self.column]).column(self.column)
        ids = spans.row_id[first]
        pairs, ptr = mask_pairs(col, column=self.column, rowids=ids)
        check_pairs(pairs, ptr, spans.doc_len[first], column=self.column, rowids=ids)
        return stretch_mask(pairs, ptr, inv, layout.starts, layout.stops, offsets)


def masked_token_count(pairs: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """``(R,)`` int64 tokens each row's spans cover (overlaps counted once). Vectorised: the
    rows' spans laid end to end on one axis (row ``r`` shifted past every earlier row's largest
    end), sorted, and each span counted past the running maximum of the ends before it."""
    R = len(ptr) - 1
    if not len(pairs):
        return np.zeros(R, dtype=np.int64)
    row = np.repeat(np.arange(R), np.diff(ptr))
    width = int(pairs[:, 1].max()) + 1
    lo, hi = pairs[:, 0] + row * width, pairs[:, 1] + row * width
    order = np.argsort(lo, kind="stable")
    lo, hi, row = lo[order], hi[order], row[order]
    reach = np.maximum.accumulate(hi)  # farthest end so far, this span included
    before = np.concatenate([[lo[0]], reach[:-1]])
    new = np.maximum(hi - np.maximum(lo, before), 0)
    return np.bincount(row, weights=new, minlength=R).astype(np.int64)


def mask_summary(ds: Any, column: str, filter: str | None) -> dict[str, int]:
    """What the loss mask holds over the rows ``filter`` selects: ``rows``, ``rows_masked``
    (with at least one token in a span), ``spans`` and ``masked_tokens`` (tokens in a span,
    overlaps counted once; the labels masked are these, less the first token of a document)."""
    col = ds.to_table(columns=[column], filter=filter).column(column)
    pairs, ptr = mask_pairs(col, column=column)
    per_row = masked_token_count(pairs, ptr)
    return {
        "rows": int(len(ptr) - 1),
        "rows_masked": int((per_row > 0).sum()),
        "spans": int(len(pairs)),
        "masked_tokens": int(per_row.sum()),
    }
