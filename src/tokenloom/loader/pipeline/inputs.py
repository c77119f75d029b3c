"""The plan's inputs: ``(id, n_tokens, _rowid)`` of the filtered rows, scanned once per node.

One scan of two small columns, held as bit-packed
:class:`~tokenloom.loader.plan.compact.CompactInts` columns; with a
:class:`~tokenloom.loader.pipeline.planstore.PlanStore` the first process writes them and the others
map them (:func:`plan_inputs_key` names what a scan depends on; :func:`table_identity` tells a table
rebuilt at the same URI apart). Reading the tokens is :mod:`~tokenloom.loader.pipeline.read`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import lance
import numpy as np
import pyarrow.compute as pc

from tokenloom.loader.pipeline.read import LoaderError
from tokenloom.loader.plan.compact import COMPACT_FORMAT, CompactInts, encode
from tokenloom.loader.plan.epoch import narrow_counts
from tokenloom.process import release_memory
from tokenloom.table.filters import validate_filter
from tokenloom.table.tokens import token_dtype

if TYPE_CHECKING:
    from tokenloom.loader.plan.order import Ordering

__all__ = [
    "PlanInputs",
    "INPUTS_FORMAT",
    "compact_inputs",
    "input_parts",
    "input_columns",
    "input_meta",
    "inputs_from",
    "plan_inputs_key",
    "table_identity",
    "tokenizer_identity",
    "scan_plan_inputs",
    "OrderByError",
    "check_order_columns",
    "scan_ordering",
]


INPUTS_FORMAT = (
    f"plan-inputs-v3;{COMPACT_FORMAT};row_ids=int64;n_tokens=int32|int64;rowids=uint64-row_ids"
)
"""Identity of what a shared set of plan inputs holds (part of its key: a store written in
another format is scanned again, never misread)."""

_INPUT_ARRAYS = ("row_ids", "n_tokens", "rowids")


@dataclass(frozen=True, kw_only=True, eq=False)
class PlanInputs:
    """What the plan is computed from, as :class:`~tokenloom.loader.plan.compact.CompactInts`
    columns (about 2.5 bytes per selected row in all for a filter keeping 90% of a table's
    rows, lognormal token counts; see :func:`compact_inputs`). Columns mapped from a plan
    store stay in the page cache, one copy per node; pickling such inputs (a spawned
    DataLoader worker) sends the store's path, and the worker maps the same files."""

    version: int
    row_ids: CompactInts
    """The ``id`` of each selected row, ascending (int64)."""
    n_tokens: CompactInts
    """Stored token counts, null counted as 0: int32 when every count fits (values are exact
    either way), else int64."""
    rowids: CompactInts
    """Stable Lance row ids, aligned with ``row_ids`` (uint64, stored relative to them)."""
    null_rows: int
    """Selected rows whose token list is null (planned as zero-length)."""
    tokenizer: dict
    """The token column's tokenizer identity (from its field metadata), or {}."""
    filter_nulls: int = 0
    """Rows the filter left out because a column it reads holds a null for them (SQL: a
    condition on null is not true, so the row is not selected)."""
    filter_null_columns: tuple[str, ...] = ()
    """The columns read by the filter that are null on those rows."""
    shared: str | None = None
    """The plan store directory the arrays are mapped from (``None``: in this process's memory)."""

    def __reduce__(self) -> tuple:
        if self.shared is not None and os.path.isdir(self.shared):
            return (_map_plan_inputs, (self.shared,))
        fields = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return (_plan_inputs, (fields,))

    def left_out(self) -> str | None:
        """One line saying how many rows the filter left out because of a null, or ``None``."""
        if not self.filter_nulls:
            return None
        cols = " or ".join(repr(c) for c in self.filter_null_columns) or "a column it reads"
        return (
            f"{self.filter_nulls:,} rows left out: {cols} is null for them (SQL: a condition "
            "on null is not true, so the filter does not select the row)"
        )

    @property
    def nbytes(self) -> int:
        """Bytes the three columns hold."""
        return sum(getattr(self, k).nbytes for k in _INPUT_ARRAYS)


def compact_inputs(
    row_ids: np.ndarray, n_tokens: np.ndarray, rowids: np.ndarray
) -> dict[str, CompactInts]:
    """The three columns of :class:`PlanInputs` from plain arrays (what a scan yields): ids as
    int64, counts narrowed (:func:`~tokenloom.loader.plan.epoch.narrow_counts`), row ids as uint64
    stored relative to the ids (their difference is constant over runs of rows written in id
    order)."""
    plain = np.asarray(row_ids).astype(np.int64, copy=False)
    ids = encode(plain)
    return {
        "row_ids": ids,
        "n_tokens": encode(narrow_counts(np.asarray(n_tokens))),
        "rowids": encode(
            np.asarray(rowids).astype(np.uint64, copy=False), ref=ids, ref_values=plain
        ),
    }


def input_parts(
    columns: dict[str, CompactInts], meta: dict[str, Any]
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Columns as the named arrays and meta :meth:`PlanStore.arrays
    <tokenloom.loader.pipeline.planstore.PlanStore.arrays>` writes (``<column>.<part>``)."""
    arrays: dict[str, np.ndarray] = {}
    described: dict[str, Any] = {}
    for name, col in columns.items():
        parts, col_meta = col.parts()
        arrays.update({f"{name}.{k}": v for k, v in parts.items()})
        described[name] = {**col_meta, "ref": "row_ids" if col.ref is not None else None}
    return arrays, {**meta, "rows": len(columns["row_ids"]), "columns": described}


def input_columns(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> dict[str, CompactInts]:
    """:func:`input_parts` read back (``ValueError`` when they do not fit together)."""
    described = meta["columns"]
    if set(described) != set(_INPUT_ARRAYS):
        raise ValueError(f"plan inputs hold {sorted(described)}, not {list(_INPUT_ARRAYS)}")
    out: dict[str, CompactInts] = {}
    for name in _INPUT_ARRAYS:  # row_ids first: the others may be stored relative to it
        col_meta = described[name]
        parts = {k: arrays[f"{name}.{k}"] for k in ("bases", "starts", "data")}
        ref = out[col_meta["ref"]] if col_meta.get("ref") else None
        out[name] = CompactInts.from_parts(parts, col_meta, ref)
    return out


def input_meta(inputs: PlanInputs) -> dict[str, Any]:
    """The scalars of ``inputs`` a plan store keeps beside the arrays (JSON values)."""
    return {
        "version": inputs.version,
        "null_rows": inputs.null_rows,
        "filter_nulls": inputs.filter_nulls,
        "filter_null_columns": list(inputs.filter_null_columns),
    }


def inputs_from(
    arrays: dict[str, np.ndarray], meta: dict[str, Any], path: str | None
) -> PlanInputs:
    """:class:`PlanInputs` from what :func:`input_parts` wrote (``path``: where it is mapped)."""
    return PlanInputs(
        version=int(meta["version"]),
        null_rows=int(meta["null_rows"]),
        filter_nulls=int(meta["filter_nulls"]),
        filter_null_columns=tuple(meta["filter_null_columns"]),
        tokenizer=dict(meta["tokenizer"]),
        shared=path,
        **input_columns(arrays, meta),
    )


def _plan_inputs(fields: dict) -> PlanInputs:
    return PlanInputs(**fields)


def _map_plan_inputs(path: str) -> PlanInputs:
    """The plan inputs a plan store holds at ``path``, mapped read-only."""
    from tokenloom.loader.pipeline.planstore import PLAN_CACHE_ENV, open_arrays

    found = open_arrays(path)
    try:
        if found is None:
            raise ValueError("missing")
        arrays, meta = found
        return inputs_from(arrays, meta, path)
    except (ValueError, KeyError, TypeError) as exc:
        raise LoaderError(
            f"the plan inputs at {path} are gone or unreadable (the plan store was cleared "
            f"while the job ran?); restart the job, or set {PLAN_CACHE_ENV}=off"
        ) from exc


def table_identity(ds: lance.LanceDataset) -> str:
    """A short digest of the pinned version's data files (their names are random per write): a
    table deleted and built again at the same URI has other files under the same version
    numbers, so a checkpoint can tell the two apart. Metadata only; no data is read."""
    names = sorted(f.path for frag in ds.get_fragments() for f in frag.data_files())
    return "files:" + hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def tokenizer_identity(ds: lance.LanceDataset, token_column: str) -> dict:
    """The tokenizer identity recorded on the token column, or {} when none is recorded."""
    meta = ds.schema.field(token_column).metadata or {}
    raw = meta.get(b"tokenloom.tokenizer")
    return json.loads(raw) if raw else {}


def plan_inputs_key(
    ds: lance.LanceDataset,
    *,
    token_column: str,
    count_column: str,
    filter: str | None,
    allow_missing: bool,
) -> str:
    """Digest of everything a scan's result depends on: the table (URI, version and the
    version's data files, so a table rebuilt at the same URI differs), the validated filter,
    the token and count columns, ``allow_missing`` and :data:`INPUTS_FORMAT`."""
    parts = {
        "format": INPUTS_FORMAT,
        "uri": ds.uri,
        "version": int(ds.version),
        "identity": table_identity(ds),
        "filter": filter,
        "token_column": token_column,
        "count_column": count_column,
        "allow_missing": bool(allow_missing),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def scan_plan_inputs(
    ds: lance.LanceDataset,
    *,
    token_column: str,
    count_column: str,
    filter: str | None,
    allow_missing: bool = False,
    store: Any = None,
) -> PlanInputs:
    """Scan ``(id, count)`` of the rows under ``filter``; never reads token lists.

    Args:
        store: Optional :class:`~tokenloom.loader.pipeline.planstore.PlanStore`: the first process
        of
            the node scans and writes the arrays, the others map them (large selections only).

    Raises:
        LoaderError: A column the plan uses is not computed (null) for some rows it selects —
            the token counts, or a column the filter reads, whose null would silently drop or
            keep a row — unless ``allow_missing`` (then null counts are zero-length rows).
    """
    filter = validate_filter(ds, filter)
    scan = {
        "token_column": token_column,
        "count_column": count_column,
        "filter": filter,
        "allow_missing": allow_missing,
    }
    if store is None:
        return _scan_plan_inputs(ds, **scan)

    def build() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        inputs = _scan_plan_inputs(ds, **scan)
        columns = {k: getattr(inputs, k) for k in _INPUT_ARRAYS}
        return input_parts(columns, {**input_meta(inputs), "tokenizer": inputs.tokenizer})

    arrays, meta, path = store.arrays(plan_inputs_key(ds, **scan), build)
    return inputs_from(arrays, meta, path)


def _scan_plan_inputs(
    ds: lance.LanceDataset,
    *,
    token_column: str,
    count_column: str,
    filter: str | None,
    allow_missing: bool,
) -> PlanInputs:
    nulls, null_columns = (0, ()) if filter is None else _filter_nulls(ds, filter, allow_missing)
    for col in (token_column, count_column):
        if col not in ds.schema.names:
            raise LoaderError(
                f"the table has no column {col!r} (version {ds.version}; columns: "
                f"{', '.join(ds.schema.names)}); tokenize first: "
                f"`tokenloom tokenize --table {ds.uri} --tokenizer gpt2`"
            )
    token_dtype(ds.schema.field(token_column))  # a layout every reader of it knows
    # Batch by batch into plain arrays: a whole-table scan and its to_numpy copies held about
    # twice the bytes of the three columns at the peak.
    parts: dict[str, list[np.ndarray]] = {"id": [], "count": [], "rowid": []}
    null_rows = 0
    try:
        scanner = ds.scanner(columns=["id", count_column], filter=filter, with_row_id=True)
        for batch in scanner.to_batches():
            counts = batch.column(count_column)
            null_rows += counts.null_count
            # Copies: a view would keep the scan's buffers (and what they share) alive.
            parts["id"].append(batch.column("id").to_numpy().copy())
            parts["count"].append(pc.fill_null(counts, 0).to_numpy().copy())
            parts["rowid"].append(batch.column("_rowid").to_numpy().copy())
    except (ValueError, OSError, RuntimeError) as exc:
        raise LoaderError(f"filter {filter!r} does not work on this table: {exc}") from exc
    ids, n_tokens, rowids = (_concat(parts.pop(k)) for k in ("id", "count", "rowid"))
    if null_rows and not allow_missing:
        tok = tokenizer_identity(ds, token_column).get("name", "SPEC")
        raise LoaderError(
            f"column {count_column!r} is not computed for {null_rows:,} of the "
            f"{len(ids):,} selected rows (version {ds.version}; rows appended after "
            f"tokenizing?); run `tokenloom refresh --table {ds.uri}` (or `tokenloom tokenize "
            f"--table {ds.uri} --tokenizer {tok} --column {token_column}`), or pass "
            "--allow-missing to plan them as empty"
        )
    if ids.size > 1 and not bool(np.all(ids[1:] > ids[:-1])):
        # A table written in id order (every ingest) scans in id order; sort only otherwise.
        order = np.argsort(ids, kind="stable")
        ids, n_tokens, rowids = ids[order], n_tokens[order], rowids[order]
        del order
    columns = compact_inputs(ids, n_tokens, rowids)
    del ids, n_tokens, rowids
    release_memory()
    return PlanInputs(
        version=ds.version,
        **columns,
        null_rows=int(null_rows),
        filter_nulls=nulls,
        filter_null_columns=null_columns,
        tokenizer=tokenizer_identity(ds, token_column),
    )


def _concat(chunks: list[np.ndarray]) -> np.ndarray:
    """One array of the chunks (emptied as they are copied, so they are not held twice)."""
    if not chunks:
        return np.zeros(0, dtype=np.int64)
    out = np.concatenate(chunks)
    chunks.clear()
    return out


def _filter_nulls(
    ds: lance.LanceDataset, filter: str, allow_missing: bool
) -> tuple[int, tuple[str, ...]]:
    """Rows the filter cannot decide (SQL's null) and the columns it reads that are null there.

    Two causes, told apart by fragment metadata (:mod:`tokenloom.table.coverage`) and the
    column's origin (:func:`tokenloom.refresh.made_by`):

    * a **derived** column (a backfill recorded its UDF) not computed for rows appended after
      it (their fragment holds no data file of it): refused unless ``allow_missing`` — the rows
      would be dropped (or kept under ``NOT``) only because a job has not run yet, and
      ``tokenloom refresh`` computes them;
    * a null **value** (a column made by ingest that some sources leave empty, a UDF that
      returned null, a column no job can compute): SQL's rule, the row is not selected;
      counted, so the commands can say so.

    Returns:
        ``(rows left out, columns null on them)``.
    """
    from tokenloom.refresh import made_by
    from tokenloom.table.coverage import missing_rows, uncovered_fragments

    undecided = f"({filter}) IS NULL"
    unknown = ds.count_rows(filter=undecided)
    if not unknown:
        return 0, ()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", re.sub(r"'(?:[^']|'')*'", "", filter)))
    read = [c for c in ds.schema.names if c in words]
    lacking_rows = missing_rows(ds)
    stale = [c for c in read if c in lacking_rows and made_by(ds, c) is not None]
    if stale and not allow_missing:
        frags = uncovered_fragments(ds, stale)
        scan = ds.scanner(columns=[], filter=undecided, fragments=frags, with_row_id=True)
        lacking = scan.count_rows() if frags else 0
        if lacking:
            cols = ", ".join(repr(c) for c in stale)
            raise LoaderError(
                f"filter {filter!r} cannot decide {lacking:,} rows: {cols} is not computed for "
                f"them (version {ds.version}; rows appended after the column was computed); "
                f"run `tokenloom refresh --table {ds.uri}`, or pass --allow-missing to leave "
                "them out"
            )
    named = tuple(c for c in read if ds.count_rows(filter=f"{undecided} AND `{c}` IS NULL"))
    return int(unknown), named


class OrderByError(LoaderError):
    """An ``order_by`` names a column the table lacks, or one whose values cannot be ordered (a
    usage error: the command line names them)."""

    option = "--order-by"
    """The option at fault: the CLI reports the error as a usage error naming it (exit 2)."""


def check_order_columns(schema: Any, order_by: str) -> tuple[Any, ...]:
    """The :class:`~tokenloom.loader.plan.order.OrderKey` of ``order_by``, each naming a column of
    ``schema`` that holds numbers, booleans, dates or times.

    Raises:
        OrderByError: A column is missing or of another type (named, with the table's columns).
    """
    from tokenloom.loader.plan.order import OrderError, parse_order_by

    try:
        keys = parse_order_by(order_by)
    except OrderError as exc:
        raise OrderByError(str(exc)) from None
    names = list(schema.names)
    for key in keys:
        if key.column not in names:
            raise OrderByError(
                f"order_by {order_by!r}: the table has no column {key.column!r}; its columns: "
                f"{', '.join(names)}"
            )
        kind = schema.field(key.column).type
        if not _orderable(kind):
            usable = [n for n in names if _orderable(schema.field(n).type)]
            raise OrderByError(
                f"order_by {order_by!r}: column {key.column!r} holds {kind}, which has no "
                "order here (order by integers, floats, booleans, dates or times); columns "
                f"that do: {', '.join(usable) or 'none'}"
            )
    return keys


def _orderable(kind: Any) -> bool:
    import pyarrow as pa

    t = pa.types
    return bool(
        t.is_integer(kind) or t.is_floating(kind) or t.is_boolean(kind) or t.is_temporal(kind)
    )


def scan_ordering(
    ds: lance.LanceDataset,
    inputs: PlanInputs,
    *,
    filter: str | None,
    order_by: str,
    jitter: int,
    store: Any = None,
) -> Any:
    """The :class:`~tokenloom.loader.plan.order.Ordering` of the rows ``inputs`` holds: their key
    columns read in one scan of the same rows, sorted at once, and kept as the permutation
    only (4 bytes per row; shared through ``store`` like the inputs themselves).

    Raises:
        OrderByError: A key column is missing or cannot be ordered.
        LoaderError: The scan does not return the rows of ``inputs``.
    """
    from tokenloom.loader.plan.order import (
        ORDER_ALGORITHM,
        Ordering,
        format_order_by,
        rank_rows,
        ranked_digest,
    )

    keys = check_order_columns(ds.schema, order_by)
    canonical = format_order_by(keys)
    filter = validate_filter(ds, filter)

    def build() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        import pyarrow as pa

        if len(keys) == 1:  # the lean path: 32-bit codes, no id and no value kept
            lean = _scan_one_key(ds, filter, keys[0], len(inputs.row_ids), canonical)
            if lean is not None:
                ranked, null_rows = lean
                release_memory()
                meta = {
                    "rows": int(ranked.shape[0]),
                    "null_rows": null_rows,
                    "ranked_digest": ranked_digest(ranked),
                }
                return {"ranked": ranked}, meta
        cols = [k.column for k in keys]
        parts: dict[str, list[np.ndarray]] = {"id": []}
        missing: dict[str, list[np.ndarray]] = {c: [] for c in cols}
        values: dict[str, list[np.ndarray]] = {c: [] for c in cols}
        try:
            scanner = ds.scanner(columns=list(dict.fromkeys(["id", *cols])), filter=filter)
            for batch in scanner.to_batches():
                parts["id"].append(batch.column("id").to_numpy().copy())
                for c in cols:
                    arr = batch.column(c)
                    arr = _as_integers(arr)
                    missing[c].append(arr.is_null().to_numpy(zero_copy_only=False))
                    filled = pc.fill_null(arr, False if pa.types.is_boolean(arr.type) else 0)
                    values[c].append(filled.to_numpy(zero_copy_only=False).copy())
        except (ValueError, OSError, RuntimeError) as exc:
            raise LoaderError(f"order_by {canonical!r}: reading the key failed: {exc}") from exc
        ids = _concat(parts.pop("id"))
        if ids.shape[0] != len(inputs.row_ids):
            raise LoaderError(
                f"order_by {canonical!r}: the key scan returned {ids.shape[0]:,} rows, the plan "
                f"inputs hold {len(inputs.row_ids):,} (version {ds.version}); restart the job"
            )
        by_id = None
        if ids.size > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            by_id = np.argsort(ids, kind="stable")  # the selection's order: ascending id
        del ids
        columns = []
        for c in cols:
            v, m = _concat(values.pop(c)), _concat(missing.pop(c)).astype(bool)
            if by_id is not None:
                v, m = v[by_id], m[by_id]
            columns.append((v, m))
        nulls = np.zeros(len(inputs.row_ids), dtype=bool)
        for v, m in columns:
            nulls |= m
            if np.issubdtype(v.dtype, np.floating):
                nulls |= np.isnan(v)
        ranked = rank_rows(columns, keys)
        del columns, by_id
        release_memory()
        meta = {
            "rows": int(ranked.shape[0]),
            "null_rows": int(nulls.sum()),
            "ranked_digest": ranked_digest(ranked),
        }
        return {"ranked": ranked}, meta

    if store is None:
        arrays, meta, path = (*build(), None)
    else:
        key_of = {
            "inputs": plan_inputs_key(
                ds,
                token_column="-",
                count_column="-",
                filter=filter,
                allow_missing=False,
            ),
            "order_by": canonical,
            "algorithm": ORDER_ALGORITHM,
            "rows": len(inputs.row_ids),
        }
        key = hashlib.sha256(json.dumps(key_of, sort_keys=True).encode()).hexdigest()[:32]
        arrays, meta, path = store.arrays(key, build)
    return Ordering(
        ranked=arrays["ranked"],
        jitter=int(jitter),
        null_rows=int(meta["null_rows"]),
        by=canonical,
        shared=path,
        ranked_digest=str(meta["ranked_digest"]),
        remap=_map_ordering,
    )


def _map_ordering(path: str, jitter: int, null_rows: int, by: str, digest: str) -> Ordering:
    """The curriculum order a plan store holds at ``path``, mapped read-only (how a worker
    unpickles an :class:`~tokenloom.loader.plan.order.Ordering` that was mapped from it)."""
    from tokenloom.loader.pipeline.planstore import open_arrays
    from tokenloom.loader.plan.order import Ordering

    found = open_arrays(path)
    if found is None or "ranked" not in found[0]:
        raise LoaderError(
            f"the sorted order at {path} is gone or unreadable (the plan store was cleared "
            "while the job ran?); restart the job"
        )
    return Ordering(
        ranked=found[0]["ranked"], jitter=jitter, null_rows=null_rows, by=by, shared=path,
        ranked_digest=digest, remap=_map_ordering,
    )  # fmt: skip


def _as_integers(arr: Any) -> Any:
    """A date or time column as the integers it stores (the same order); others unchanged."""
    import pyarrow as pa

    t = arr.type
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return arr.cast(pa.int32())
    if pa.types.is_temporal(t):
        return arr.cast(pa.int64())
    return arr


def _key_batches(ds: lance.LanceDataset, filter: str | None, column: str, canonical: str) -> Any:
    """``(ids, values, missing)`` of one key column, batch by batch (times as int64)."""
    import pyarrow as pa

    try:
        names = list(dict.fromkeys(["id", column]))  # ordering by id itself reads it once
        for batch in ds.scanner(columns=names, filter=filter).to_batches():
            arr = batch.column(column)
            arr = _as_integers(arr)
            missing = arr.is_null().to_numpy(zero_copy_only=False)
            filled = pc.fill_null(arr, False if pa.types.is_boolean(arr.type) else 0)
            yield (
                batch.column("id").to_numpy(),
                filled.to_numpy(zero_copy_only=False),
                missing,
            )
    except (ValueError, OSError, RuntimeError) as exc:
        raise LoaderError(f"order_by {canonical!r}: reading the key failed: {exc}") from exc


def _scan_one_key(
    ds: lance.LanceDataset, filter: str | None, key: Any, rows: int, canonical: str
) -> tuple[np.ndarray, int] | None:
    """The sorted order of one key read as 32-bit codes (4 bytes per row while scanning; 8 for
    an integer column, coded at the end), or ``None`` when the rows do not come in id order or
    the values do not fit the codes (the general sort then reads them again)."""
    from tokenloom.loader.plan.order import float_codes, int_codes, sort_codes

    codes: np.ndarray | None = None
    values: np.ndarray | None = None  # an integer key's values (coded once the range is known)
    missing: np.ndarray | None = None
    at, last = 0, None
    for ids, vals, gone in _key_batches(ds, filter, key.column, canonical):
        k = ids.shape[0]
        if k == 0:
            continue
        if (last is not None and ids[0] <= last) or bool(np.any(ids[1:] <= ids[:-1])):
            return None
        last = ids[-1]
        if at + k > rows:
            break
        if np.issubdtype(vals.dtype, np.floating):
            part = float_codes(vals, gone, key)
            if part is None:
                return None
            if codes is None:
                codes = np.empty(rows, dtype=np.uint32)
            codes[at : at + k] = part
        else:
            if values is None or missing is None:
                values, missing = np.empty(rows, dtype=vals.dtype), np.empty(rows, dtype=bool)
            values[at : at + k], missing[at : at + k] = vals, gone
        at += k
    if at != rows or (rows and codes is None and values is None):
        raise LoaderError(
            f"order_by {canonical!r}: the key scan returned other rows than the plan inputs "
            f"({rows:,}; version {ds.version}); restart the job"
        )
    if values is not None and missing is not None:
        codes = int_codes(values, missing, key)
        del values
        if codes is None:
            return None
    if codes is None:  # no rows
        codes = np.empty(0, dtype=np.uint32)
    low = np.uint32(0) if key.nulls_first else np.uint32(0xFFFFFFFF)
    null_rows = int(np.count_nonzero(codes == low))
    return sort_codes(codes), null_rows
