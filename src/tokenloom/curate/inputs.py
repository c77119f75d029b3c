"""Coercing what callers pass (Arrow arrays, numpy arrays, lists) into what curation computes on.

Every curation function accepts a column as a backfill batch hands it over (``pa.Array`` or
``pa.ChunkedArray``) and as a test or notebook writes it (``list[str]``, numpy arrays). The
checks here raise :class:`CurateError` naming the bad value and the fix, so that a caller's
mistake never surfaces as a numpy broadcasting error deep inside a vectorised kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from tokenloom.errors import TokenloomError

__all__ = ["CurateError", "TextColumn", "as_texts", "as_ids"]

TextColumn = pa.Array | pa.ChunkedArray | Sequence[str | None] | np.ndarray
"""A column of documents: an Arrow string/large_string array, or a sequence of ``str``."""


class CurateError(TokenloomError):
    """A curation function was given inputs it cannot use (wrong type, shape, or value)."""


def as_texts(texts: TextColumn, *, what: str = "texts") -> list[str | None]:
    """Return the documents as a Python list, nulls as ``None``.

    Args:
        texts: An Arrow ``string``/``large_string`` (Chunked)Array, a numpy array of ``str``, or
            a sequence of ``str``/``None``.
        what: The argument's name, for error messages.

    Returns:
        One ``str`` (or ``None`` for a null) per row, in order.

    Raises:
        CurateError: Not a column of strings.
    """
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
            raise CurateError(
                f"{what} must be an Arrow string or large_string column, not {texts.type}; "
                f"cast it first, e.g. `column.cast(pa.large_string())`"
            )
        return texts.to_pylist()
    if isinstance(texts, str):
        raise CurateError(f"{what} must be a column of documents, not one str; wrap it: [text]")
    out = list(texts)
    for i, value in enumerate(out):
        if value is not None and not isinstance(value, str):
            raise CurateError(
                f"{what}[{i}] is a {type(value).__name__}, not a str; pass decoded text"
            )
    return out


def as_ids(
    ids: np.ndarray | Sequence[int] | pa.Array, *, n: int | None = None, check_unique: bool = True
) -> np.ndarray:
    """Return row ids as a contiguous 1-D ``int64`` array, checking length and uniqueness.

    Args:
        ids: Row ids, shape ``(N,)``, unique (the table's ``id`` column).
        n: The number of rows the ids must describe, when known.
        check_unique: Check that no id repeats (a sort); off when the caller checks itself.

    Returns:
        ``(N,) int64``.

    Raises:
        CurateError: Not 1-D integers, a length other than ``n``, nulls, or a repeated id.
    """
    if isinstance(ids, (pa.Array, pa.ChunkedArray)):
        if ids.null_count:
            raise CurateError(f"ids hold {ids.null_count} null(s); every row needs its id")
        ids = ids.to_numpy()
    arr = np.asarray(ids)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise CurateError(f"ids must be a 1-D integer array, not shape {arr.shape} {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if n is not None and arr.shape[0] != n:
        raise CurateError(f"ids has {arr.shape[0]} rows but the other input has {n}; align them")
    if check_unique and arr.size > 1:
        s = np.sort(arr)
        repeated = s[1:][s[1:] == s[:-1]]
        if repeated.size:
            raise CurateError(
                f"ids must be unique, but id {int(repeated[0])} appears more than once; "
                f"pass the table's `id` column"
            )
    return arr
