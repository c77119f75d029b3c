"""Transforms on Arrow RecordBatches, what happens when one fails on a row, and output formats.

A transform is a plain function ``f(batch: pa.RecordBatch) -> pa.RecordBatch | dict`` (a dict
maps names to numpy arrays or lists with one entry per row). It runs on a chunk of rows; when it
raises and the policy is not ``raise``, the chunk is run again row by row to find the rows at
fault, which are left out and counted by reason (the exception's class name, or the ``reason``
of a :class:`SkipRow` the transform raised on purpose). Pure Python, no torch: torch is imported
only by :func:`to_format` for ``format="torch"``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from tokenloom.errors import TokenloomError

__all__ = [
    "RowLoaderError",
    "ON_ERROR",
    "FORMATS",
    "SkipRow",
    "RowTransformError",
    "Transform",
    "ChunkResult",
    "apply_transform",
    "reason_of",
    "take_rows",
    "concat_outputs",
    "to_format",
    "transform_name",
]

ON_ERROR = ("raise", "skip", "warn")
"""``raise``: stop with the row id; ``skip``: leave the row out (refilled, counted);
``warn``: as ``skip`` plus a warning naming the row and the reason."""

FORMATS = ("arrow", "numpy", "torch", "python")
"""Batch formats: a RecordBatch; a dict of numpy arrays; a dict of tensors (numeric columns,
others as lists); a list of row dicts."""

Transform = Callable[[pa.RecordBatch], Any]
Output = Any  # pa.RecordBatch | dict[str, np.ndarray | list]


class RowLoaderError(TokenloomError):
    """The row loader cannot be built or run as asked (tokenloom's one error boundary)."""


class SkipRow(Exception):  # noqa: N818 - a signal, not an error
    """Raise from a transform to leave a row out on purpose, with a counted ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RowTransformError(RowLoaderError):
    """A transform failed on a row under ``on_error="raise"``."""


def reason_of(exc: BaseException) -> str:
    """The counted reason of a failure: a :class:`SkipRow` reason, else the exception class."""
    return exc.reason if isinstance(exc, SkipRow) else type(exc).__name__


def transform_name(transform: Transform | None) -> str | None:
    """``module:qualname`` of a transform (its identity in the fingerprint), or ``None``."""
    if transform is None:
        return None
    target = getattr(transform, "func", transform)  # functools.partial
    module = getattr(target, "__module__", None) or type(target).__module__
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{name}"


def _rows(out: Output) -> int:
    if isinstance(out, pa.RecordBatch):
        return out.num_rows
    if isinstance(out, dict):
        lens = {len(v) for v in out.values()}
        if len(lens) > 1:
            raise RowLoaderError(f"transform returned columns of different lengths {sorted(lens)}")
        return lens.pop() if lens else 0
    raise RowLoaderError(
        f"a transform must return a pyarrow RecordBatch or a dict of per-row arrays, got "
        f"{type(out).__name__}"
    )


def _normalise(out: Any) -> Output:
    if isinstance(out, pa.Table):
        return out.combine_chunks().to_batches()[0] if out.num_rows else out.schema.empty_table()
    return out


@dataclass
class ChunkResult:
    """A transformed chunk: the output of the rows that passed and the failures."""

    output: Output | None
    """Rows that passed, in chunk order (``None`` when none did)."""
    kept: np.ndarray
    """``(k,)`` chunk indices of the output's rows."""
    failed: dict[int, str] = field(default_factory=dict)
    """Chunk index -> reason, for each row left out."""


def apply_transform(
    transform: Transform | None, batch: pa.RecordBatch, *, on_error: str, ids: Sequence[int]
) -> ChunkResult:
    """Run ``transform`` on a chunk; on failure find and leave out the failing rows.

    Args:
        transform: The function (``None``: the batch as read).
        batch: The chunk, one row per id.
        on_error: One of :data:`ON_ERROR`.
        ids: Table ids of the chunk's rows (named in errors and warnings).

    Raises:
        RowTransformError: ``on_error="raise"`` and a row fails (names its id).
    """
    n = batch.num_rows
    if transform is None:
        return ChunkResult(batch, np.arange(n, dtype=np.int64))
    try:
        out = _normalise(transform(batch))
        if _rows(out) != n:
            raise RowLoaderError(
                f"transform {transform_name(transform)} returned {_rows(out)} rows for {n}; "
                "a transform maps each row to one row (leave rows out with SkipRow)"
            )
        return ChunkResult(out, np.arange(n, dtype=np.int64))
    except RowLoaderError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's function; handled by policy
        if on_error == "raise" and n == 1:
            raise _raise_error(transform, ids[0], exc) from exc
        first = exc
    pieces, kept, failed = [], [], {}
    for i in range(n):
        try:
            out = _normalise(transform(batch.slice(i, 1)))
            if _rows(out) != 1:
                raise RowLoaderError(
                    f"transform {transform_name(transform)} returned {_rows(out)} rows for 1"
                )
        except RowLoaderError:
            raise
        except Exception as exc:  # noqa: BLE001
            if on_error == "raise":
                raise _raise_error(transform, ids[i], exc) from exc
            failed[i] = reason_of(exc)
            if on_error == "warn":
                warnings.warn(
                    f"row id {ids[i]}: transform {transform_name(transform)} failed "
                    f"({reason_of(exc)}: {exc}); row skipped and refilled",
                    stacklevel=2,
                )
            continue
        pieces.append(out)
        kept.append(i)
    if not failed:  # the chunk failed as a whole but no row alone: not a row's fault
        raise first
    output = concat_outputs(pieces) if pieces else None
    return ChunkResult(output, np.asarray(kept, dtype=np.int64), failed)


def _raise_error(transform: Transform, row_id: int, exc: BaseException) -> RowTransformError:
    return RowTransformError(
        f"transform {transform_name(transform)} failed on row id {row_id}: "
        f"{type(exc).__name__}: {exc}; fix it, or pass on_error='skip' (or --on-error skip) to "
        "leave such rows out, counted"
    )


def concat_outputs(pieces: Sequence[Output]) -> Output:
    """Concatenate outputs row-wise (all RecordBatches or all dicts with the same keys)."""
    if all(isinstance(p, pa.RecordBatch) for p in pieces):
        return pa.Table.from_batches(list(pieces)).combine_chunks().to_batches()[0]
    if all(isinstance(p, dict) for p in pieces):
        keys = list(pieces[0])
        out: dict[str, Any] = {}
        for k in keys:
            parts = [p[k] for p in pieces]
            if all(isinstance(v, np.ndarray) for v in parts):
                out[k] = np.concatenate(parts)
            else:
                out[k] = [x for v in parts for x in list(v)]
        return out
    raise RowLoaderError("a transform returned RecordBatches for some rows and dicts for others")


def take_rows(out: Output, index: np.ndarray) -> Output:
    """Rows ``index`` of an output, in that order."""
    if isinstance(out, pa.RecordBatch):
        return out.take(pa.array(index, type=pa.int64()))
    result: dict[str, Any] = {}
    for k, v in out.items():
        result[k] = v[index] if isinstance(v, np.ndarray) else [v[i] for i in index.tolist()]
    return result


def _numpy_column(col: pa.Array) -> Any:
    if pa.types.is_fixed_size_list(col.type) and col.null_count == 0:
        flat = col.flatten().to_numpy(zero_copy_only=False)
        return flat.reshape(len(col), col.type.list_size)
    if isinstance(col.type, pa.FixedShapeTensorType):
        return col.to_numpy_ndarray()
    return col.to_numpy(zero_copy_only=False)


def to_format(out: Output, row_ids: np.ndarray, fmt: str) -> Any:
    """An output (plus a ``row_id`` column: the ids delivered) in format ``fmt``."""
    ids = np.asarray(row_ids, dtype=np.int64)
    if fmt == "arrow":
        if isinstance(out, pa.RecordBatch):
            batch = out
        else:
            arrays, names = [], []
            for k, v in out.items():
                if isinstance(v, np.ndarray) and v.ndim > 1:
                    arrays.append(pa.FixedShapeTensorArray.from_numpy_ndarray(v))
                else:
                    arrays.append(pa.array(v))
                names.append(k)
            batch = pa.record_batch(arrays, names=names)
        if "row_id" in batch.schema.names:
            return batch
        return batch.append_column("row_id", pa.array(ids, type=pa.int64()))
    if isinstance(out, pa.RecordBatch):
        cols = {name: _numpy_column(out.column(name)) for name in out.schema.names}
    else:
        cols = dict(out)
    cols.setdefault("row_id", ids)
    if fmt == "numpy":
        return cols
    if fmt == "python":
        n = len(ids)
        lists = {k: (v.tolist() if isinstance(v, np.ndarray) else list(v)) for k, v in cols.items()}
        return [{k: lists[k][i] for k in lists} for i in range(n)]
    if fmt == "torch":
        import torch

        result: dict[str, Any] = {}
        for k, v in cols.items():
            if isinstance(v, np.ndarray) and v.dtype.kind in "biuf":
                result[k] = torch.from_numpy(np.ascontiguousarray(v))
            else:
                result[k] = v.tolist() if isinstance(v, np.ndarray) else v
        return result
    raise RowLoaderError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
