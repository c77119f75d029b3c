"""What a worker does for one unit: read its rows, run the UDF, write the result atomically.

Runs in a spawned process, a Ray task, or inline. Datasets and UDF instances are cached per
process, so a class UDF's setup (loading a tokenizer or a model) happens once per worker.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Any

import lance
import pyarrow as pa

from tokenloom.backfill.checkpoint import JobStore
from tokenloom.backfill.plan import Unit
from tokenloom.backfill.udf import UDF, UDFError

__all__ = ["UnitTask", "UnitResult", "run_unit"]

_DATASETS: dict[tuple[str, int, str], lance.LanceDataset] = {}
_UDFS: dict[str, UDF] = {}


@dataclass(frozen=True, kw_only=True)
class UnitTask:
    """Everything a worker needs for one unit (picklable)."""

    uri: str
    version: int
    storage_options: dict[str, str] | None
    udf: UDF
    unit: Unit
    where: str | None
    store_root: str
    column: str
    run_id: str = ""
    """Unique per planning attempt: a table recreated at the same URI is never read stale."""


@dataclass(frozen=True, kw_only=True)
class UnitResult:
    """What a worker reports back."""

    unit: str
    rows: int
    seconds: float
    node: str = ""
    """Where it ran: the Ray node id under Ray, else the host name."""


def _dataset(task: UnitTask) -> Any:
    key = (task.uri, task.version, task.run_id)
    if key not in _DATASETS:
        while len(_DATASETS) >= 4:
            _DATASETS.pop(next(iter(_DATASETS)))
        _DATASETS[key] = lance.dataset(
            task.uri, version=task.version, storage_options=task.storage_options
        )
    return _DATASETS[key]


def _udf(udf: UDF) -> UDF:
    # Keyed by every argument, run-time ones included: a new results file is a new instance.
    key = udf.fingerprint() + json.dumps(udf.kwargs, sort_keys=True)
    return _UDFS.setdefault(key, udf)


_NOT_A_UDF_FAILURE = (KeyboardInterrupt, SystemExit, GeneratorExit)
"""What passes through untouched: the process is being stopped, not the UDF failing."""


def _udf_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is the UDF's own failure. Extensions raise more than ``Exception``: a Rust
    panic (``pyo3_runtime.PanicException``, a ``BaseException``: say a tokenizer regex over
    Oniguruma's retry limit) is a failing UDF too, and must not reach the pool unreported."""
    return not isinstance(exc, _NOT_A_UDF_FAILURE)


def _describe(exc: BaseException) -> str:
    """``Type: message`` as plain text: what crosses the process boundary is never the
    exception itself (an extension's exception may not unpickle in the driver)."""
    text = str(exc).strip().rstrip(".") or "(no message)"
    return f"{type(exc).__name__}: {text[:2000]}"


def _failing_row(udf: UDF, batch: pa.RecordBatch) -> tuple[int, BaseException] | None:
    """Find the first row on which the UDF raises (the error path only)."""
    for i in range(batch.num_rows):
        try:
            udf(batch.slice(i, 1))
        except BaseException as exc:  # noqa: BLE001 - reported with the row id
            if not _udf_failed(exc):
                raise
            return int(batch.column("id")[i].as_py()), exc
    return None


def compute_rows(udf: UDF, table: pa.Table) -> pa.Table:
    """Run ``udf`` over ``table`` (which holds ``id`` and the inputs) in batches.

    Returns:
        A table of ``id`` and the output columns.

    Raises:
        UDFError: naming the UDF and the first row id it failed on.
    """
    outputs = []
    if table.num_rows:
        try:
            udf.setup()
        except UDFError:
            raise
        except BaseException as exc:
            if not _udf_failed(exc):
                raise
            raise UDFError(
                f"UDF {udf.name} v{udf.version} could not be set up{_arguments(udf)}: "
                f"{_describe(exc)}. Nothing was committed; fix it and run again"
            ) from None
    for batch in table.to_batches(max_chunksize=udf.batch_size):
        try:
            outputs.append(udf(batch))
        except UDFError:
            raise
        except BaseException as exc:
            if not _udf_failed(exc):
                raise
            found = _failing_row(udf, batch)
            row_id, cause = found if found is not None else (None, exc)
            where = f"row id {row_id}" if row_id is not None else "a batch (no single row fails)"
            raise UDFError(
                f"UDF {udf.name} v{udf.version}{_arguments(udf)} failed on {where}: "
                f"{_describe(cause)}. Nothing was committed; fix the UDF, bump its "
                "version and run again"
            ) from None
    ids = table.column("id").combine_chunks() if table.num_rows else pa.array([], pa.int64())
    if outputs:
        out = pa.Table.from_batches(outputs)
    else:
        out = udf.output.empty_table()
    return out.add_column(0, "id", ids)


def _arguments(udf: UDF) -> str:
    """The UDF's constructor arguments, for the message (which tokenizer, which model)."""
    shown = {k: v for k, v in udf.kwargs.items() if not k.startswith("_")}
    if not shown:
        return ""
    text = ", ".join(f"{k}={_short(repr(v))}" for k, v in sorted(shown.items()))
    return f" ({text})"


def _short(text: str, most: int = 300) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def _read_unit(frag: Any, unit: Unit, columns: list[str], where: str | None) -> pa.Table:
    """The unit's rows: by offset/limit when the fragment's ids ascend (reads only them), else
    by an id-range filter (late materialisation: only matching rows' inputs are decoded)."""
    if unit.offset >= 0 and not where:
        table = frag.to_table(columns=columns, offset=unit.offset, limit=unit.rows)
        ids = table.column("id")
        if table.num_rows == unit.rows and ids[0].as_py() == unit.lo and ids[-1].as_py() == unit.hi:
            return table
    flt = f"id >= {unit.lo} AND id <= {unit.hi}"
    if where:
        flt = f"({flt}) AND ({where})"
    return frag.scanner(columns=columns, filter=flt, late_materialization=True).to_table()


def run_unit(task: UnitTask) -> UnitResult:
    """Compute one unit and checkpoint its result; returns quickly if it is already done."""
    started = time.perf_counter()
    udf = _udf(task.udf)
    store = JobStore(
        task.store_root, task.column, udf.fingerprint(), storage_options=task.storage_options
    )
    if store.has(task.unit):
        return UnitResult(unit=task.unit.name, rows=0, seconds=0.0, node=socket.gethostname())
    ds = _dataset(task)
    frag = ds.get_fragment(task.unit.fragment_id)
    columns = ["id", *[c for c in udf.inputs if c != "id"]]
    table = _read_unit(frag, task.unit, columns, task.where)
    store.write(task.unit, compute_rows(udf, table))
    return UnitResult(
        unit=task.unit.name,
        rows=table.num_rows,
        seconds=time.perf_counter() - started,
        node=socket.gethostname(),
    )
