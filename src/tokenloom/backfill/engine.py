"""``add_column``: compute a UDF for every row and commit the result as one new table version.

The flow is plan → run units (parallel, checkpointed) → assemble one data file per fragment
holding only the new column(s) → one ``Merge`` commit. Existing data files are never touched.
A commit that conflicts with a concurrent writer (another backfill's Merge, an append) re-plans
on the newest version; unit results stay valid as long as the data they read is unchanged.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenloom.backfill.checkpoint import JobStore, default_checkpoint_root
from tokenloom.backfill.executors import make_executor
from tokenloom.backfill.hygiene import clean_stale, job_lock
from tokenloom.backfill.plan import Unit, fragments_missing, plan_units
from tokenloom.backfill.udf import UDF
from tokenloom.backfill.worker import UnitResult, UnitTask
from tokenloom.errors import TokenloomError
from tokenloom.table import Table
from tokenloom.table.filters import validate_filter
from tokenloom.table.names import validate_column_name
from tokenloom.table.storage import is_remote, join

__all__ = ["BackfillError", "BackfillResult", "DEFAULT_LOCK_TIMEOUT", "add_column", "UDF_META_KEY"]

#: Field metadata key holding the identity of the UDF that computed a column.
UDF_META_KEY = "tokenloom.udf"
_TMP_PREFIX = "__tokenloom_tmp_"
#: Seconds a backfill waits for another run of the same job before giving up.
DEFAULT_LOCK_TIMEOUT = 600.0


class BackfillError(TokenloomError):
    """A backfill cannot run as asked (it never leaves a half-committed column)."""


@dataclass(kw_only=True)
class BackfillResult:
    """The outcome of :func:`add_column`."""

    columns: list[str]
    version: int | None
    """The new version, or ``None`` when every fragment already had the column."""
    rows: int = 0
    """Rows the column was written for in this commit."""
    units: int = 0
    units_reused: int = 0
    """Units whose checkpointed result was reused (from an interrupted earlier run)."""
    bytes_added: int = 0
    """Size of the data files added (they hold only the new column)."""
    attempts: int = 1
    seconds: float = 0.0
    fragments: list[int] = field(default_factory=list)
    nodes: dict[str, int] = field(default_factory=dict)
    """Units run per node: the Ray node id under Ray, else the host name."""

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def add_column(
    table: str | os.PathLike[str] | Table,
    name: str | None,
    udf: UDF,
    *,
    workers: int | None = None,
    executor: str = "local",
    where: str | None = None,
    unit_rows: int = 16384,
    checkpoint_dir: str | None = None,
    ray_address: str | None = None,
    progress: bool | None = None,
    max_attempts: int = 8,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
) -> BackfillResult:
    """Compute ``udf`` for every row lacking it and commit the column(s) as one new version.

    Args:
        table: Table URI or handle (the latest version is used).
        name: Name of the new column for a single-output UDF (default: the UDF's output name);
            ``None`` for multi-output UDFs.
        udf: The UDF (see :func:`tokenloom.backfill.udf`).
        workers: Parallel workers (default: CPU count, at most 8); 0 runs inline.
        executor: ``"local"`` (spawned processes) or ``"ray"``.
        where: SQL filter; rows outside it get null.
        unit_rows: Rows per work unit (units are made smaller so every worker has work).
        checkpoint_dir: Root of checkpoints (default ``<table>.backfill``).
        ray_address: An existing Ray cluster (default: start a local one).
        progress: Progress bar on stderr (default: when stderr is a terminal).
        max_attempts: Plans/commits tried when concurrent writers conflict.
        lock_timeout: Seconds to wait while another process runs the same job (same column(s),
            same UDF), telling who holds it; ``None`` waits as long as it takes.

    Returns:
        The committed version and what it took.

    Raises:
        UDFError: when the UDF fails (naming the row id); nothing is committed.
        BackfillError: on a bad request (unknown input column, column made by another UDF).
        LockTimeoutError: when the job stayed locked by another process past ``lock_timeout``.
    """
    started = time.perf_counter()
    if name is not None:
        validate_column_name(name)
    handle = table if isinstance(table, Table) else Table.open(table)
    where = validate_filter(handle.dataset, where)  # before any work: a bad filter is one line
    udf = _renamed(udf, name)
    for column in udf.columns:  # they name files too: <root>/<columns>-<fingerprint>/
        validate_column_name(column, what=f"output column of UDF {udf.name}")
    workers = _default_workers() if workers is None else workers
    root = checkpoint_dir or default_checkpoint_root(handle.uri)
    job_dir = join(root, f"{'+'.join(udf.columns)}-{udf.fingerprint()}")
    lock = job_lock(
        job_dir if not is_remote(job_dir) else _local_lock_dir(job_dir),
        f"the backfill of {'+'.join(udf.columns)} ({udf.name} v{udf.version}) on {handle.uri}",
    )
    lock.acquire(lock_timeout)  # before the job directory is written: one driver per job
    try:
        if not is_remote(root):  # TODO(s3-hygiene): stale job prefixes on object stores
            clean_stale(root, handle.schema(), own_dir=job_dir)  # what killed runs left behind
        return _run_job(
            handle, udf, root, where, workers, executor, ray_address, unit_rows, progress,
            max_attempts, started,
        )  # fmt: skip
    finally:
        lock.release()


def _run_job(  # noqa: PLR0913 - add_column's arguments, checked
    handle: Table,
    udf: UDF,
    root: str,
    where: str | None,
    workers: int,
    executor: str,
    ray_address: str | None,
    unit_rows: int,
    progress: bool | None,
    max_attempts: int,
    started: float,
) -> BackfillResult:
    store = JobStore(
        root, "+".join(udf.columns), udf.fingerprint(), storage_options=handle.storage_options
    )
    store.save_job(column="+".join(udf.columns), udf=udf.describe())
    runner = make_executor(executor, workers, ray_address=ray_address)
    result = BackfillResult(columns=udf.columns, version=None)
    vanished = 0
    try:
        for attempt in range(1, max_attempts + 1):
            result.attempts = attempt
            ds = handle.checkout().dataset
            _check_request(ds, udf)
            fragments = fragments_missing(ds, udf.columns)
            units = plan_units(
                ds, fragments, udf.inputs, unit_rows=unit_rows, min_units=4 * max(1, workers)
            )  # several units per worker: rows differ in cost, idle workers take the rest
            if not fragments:
                break  # every fragment has the column: nothing to do
            store.save_plan(units)
            store.save_job(state="running", error="", version=None)
            _run_units(ds, handle, udf, units, where, store, root, runner, result, progress)
            new_frags, schema, nbytes = _assemble(ds, udf, fragments, units, store)
            if new_frags is None:
                vanished += 1
                if vanished > 2:
                    raise BackfillError(
                        f"results of finished units keep disappearing from {store.units_dir}; "
                        "is something cleaning that directory?"
                    )
                continue  # a result vanished while assembling: compute it again
            try:
                committed = handle.commit(
                    lance.LanceOperation.Merge(new_frags, schema),
                    op="backfill",
                    message=f"backfill {', '.join(udf.columns)} with {udf.name}@{udf.version}",
                    properties={
                        "tokenloom.columns": udf.columns,
                        "tokenloom.udf": udf.describe(),
                        "tokenloom.rows": str(sum(u.rows for u in units)),
                        **({"tokenloom.where": where} if where else {}),
                    },
                    read_version=ds.version,
                )
            except Exception as exc:  # noqa: BLE001 - only commit conflicts are retried
                if not _is_conflict(exc) or attempt == max_attempts:
                    raise
                continue
            result.version = committed.version
            result.rows = sum(u.rows for u in units)
            result.units = len(units)
            result.bytes_added = nbytes
            result.fragments = [f.fragment_id for f in fragments]
            store.save_job(state="committed", version=committed.version)
            store.clear_results()
            break
        else:  # pragma: no cover - the loop either breaks or raises
            raise BackfillError(f"backfill could not commit after {max_attempts} attempts")
    except BaseException as exc:
        store.save_job(state="failed", error=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    result.seconds = time.perf_counter() - started
    return result


def _local_lock_dir(job_uri: str) -> str:
    """Where the lock of an object-store job lives: this machine's cache (an object store has
    no file locks; two drivers of one job on *different* machines are not excluded, but their
    unit results and commits stay idempotent)."""
    import hashlib

    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    digest = hashlib.sha256(job_uri.encode()).hexdigest()[:16]
    return os.path.join(os.path.expanduser(cache), "tokenloom", "locks", digest)


def _renamed(udf: UDF, name: str | None) -> UDF:
    if name is None or udf.columns == [name]:
        return udf
    if len(udf.columns) != 1:
        raise BackfillError(
            f"UDF {udf.name} has outputs {udf.columns}; pass name=None for multi-output UDFs"
        )
    return udf.with_output(pa.schema([udf.output.field(0).with_name(name)]))


def _check_request(ds: lance.LanceDataset, udf: UDF) -> None:
    missing = [c for c in udf.inputs if c not in ds.schema.names]
    if missing:
        raise BackfillError(
            f"UDF {udf.name} reads column(s) {missing} that the table does not have "
            f"(columns: {', '.join(ds.schema.names)})"
        )
    present = [c for c in udf.columns if c in ds.schema.names]
    if present and len(present) != len(udf.columns):
        raise BackfillError(
            f"columns {present} exist but {sorted(set(udf.columns) - set(present))} do not; "
            "a UDF's outputs are added together"
        )
    for col in present:
        meta = ds.schema.field(col).metadata or {}
        raw = meta.get(UDF_META_KEY.encode())
        if raw is None:
            continue
        made_by = json.loads(raw)
        if made_by.get("fingerprint") != udf.fingerprint():
            raise BackfillError(
                f"column {col!r} was computed by {made_by.get('name')} v{made_by.get('version')}"
                f"; filling its new rows with {udf.name} v{udf.version} would mix two "
                f"definitions. Drop it first (`ds.drop_columns(['{col}'])`) or use the same UDF"
            )


def _run_units(ds, handle, udf, units, where, store, root, runner, result, progress) -> None:  # noqa: ANN001, PLR0913
    from tokenloom.progress import progress as show_progress

    todo = [u for u in units if not store.has(u)]
    result.units_reused = len(units) - len(todo)
    if not todo:
        return
    run_id = uuid.uuid4().hex
    tasks = [
        UnitTask(
            uri=handle.uri,
            version=ds.version,
            storage_options=handle.storage_options or None,
            udf=udf,
            unit=u,
            where=where,
            store_root=root,
            column="+".join(udf.columns),
            run_id=run_id,
        )
        for u in todo
    ]
    bar = show_progress(
        f"backfill {'+'.join(udf.columns)}",
        total=sum(u.rows for u in todo),
        unit="rows",
        unit_scale=True,
        show=progress,
    )
    by_name = {u.name: u for u in todo}

    def on_result(res: UnitResult) -> None:
        bar.update(by_name[res.unit].rows)
        result.nodes[res.node] = result.nodes.get(res.node, 0) + 1

    try:
        runner.run(tasks, on_result)
    finally:
        bar.close()


def _assemble(
    ds: lance.LanceDataset,
    udf: UDF,
    fragments: Sequence[lance.LanceFragment],
    units: Sequence[Unit],
    store: JobStore,
) -> tuple[list | None, object, int]:
    """One new data file per fragment with the new column(s); nothing committed yet."""
    per_frag: dict[int, list[Unit]] = {}
    for u in units:
        per_frag.setdefault(u.fragment_id, []).append(u)
    vanished = [u for u in units if not store.has(u)]
    if vanished:
        return None, None, 0
    existing = all(c in ds.schema.names for c in udf.columns)
    out_schema = _output_schema(udf, temporary=existing)
    changed: dict[int, object] = {}
    schema = ds.lance_schema
    nbytes = 0
    for frag in fragments:
        parts = [store.read(u) for u in per_frag.get(frag.fragment_id, [])]
        values = pa.concat_tables(parts) if parts else None
        value_func = _lookup(values, out_schema)
        meta, new_schema = frag.merge_columns(value_func, columns=["id"])
        if existing:
            meta = _remap_new_file(meta, new_schema, ds.lance_schema, udf.columns)
        else:
            schema = new_schema
        changed[frag.fragment_id] = meta
        nbytes += sum(df.file_size_bytes or 0 for df in meta.files[len(frag.metadata.files) :])
    new_frags = [changed.get(f.fragment_id, f.metadata) for f in ds.get_fragments()]
    return new_frags, schema, nbytes


def _output_schema(udf: UDF, *, temporary: bool) -> pa.Schema:
    fields = []
    for f in udf.output:
        meta = dict(f.metadata or {})
        meta[UDF_META_KEY.encode()] = json.dumps(udf.describe(), sort_keys=True).encode()
        name = _TMP_PREFIX + f.name if temporary else f.name
        fields.append(pa.field(name, f.type, nullable=True, metadata=meta))
    return pa.schema(fields)


def _lookup(values: pa.Table | None, schema: pa.Schema):  # noqa: ANN202
    """A merge function returning, for each batch of ids, the computed values (null if none)."""
    if values is None or values.num_rows == 0:
        ids = np.empty(0, dtype=np.int64)
        columns = [pa.array([], f.type) for f in schema]
    else:
        ids = values.column("id").to_numpy()
        if len(ids) > 1 and not (np.diff(ids) > 0).all():  # units arrive in id order already
            values = values.take(pc.sort_indices(values.column("id")))
            ids = values.column("id").to_numpy()
        columns = [values.column(i + 1).combine_chunks() for i in range(len(schema))]

    def value_func(batch: pa.RecordBatch) -> pa.RecordBatch:
        want = batch.column("id").to_numpy(zero_copy_only=False)
        n = len(want)
        if n == 0 or len(ids) == 0:
            return pa.record_batch([pa.nulls(n, col.type) for col in columns], schema=schema)
        pos = np.searchsorted(ids, want)
        pos_clipped = np.minimum(pos, len(ids) - 1)
        found = ids[pos_clipped] == want
        if found.all() and (np.diff(pos) == 1).all():  # a contiguous run: zero-copy slice
            arrays = [col.slice(int(pos[0]), n) for col in columns]
        else:
            idx = pa.array(pos_clipped, type=pa.int64(), mask=~found)
            arrays = [col.take(idx) for col in columns]
        return pa.record_batch(arrays, schema=schema)

    return value_func


def _field_tree(schema_fields, names: Sequence[str]) -> list[int]:  # noqa: ANN001
    """Field ids of ``names`` and their children, in a fixed depth-first order."""
    by_name = {f.name(): f for f in schema_fields}
    out: list[int] = []
    for name in names:
        stack = [by_name[name]]
        while stack:
            f = stack.pop(0)
            out.append(f.id())
            stack[:0] = list(f.children())
    return out


def _remap_new_file(meta, new_schema, table_schema, columns: Sequence[str]):  # noqa: ANN001, ANN202
    """Point the data file written under temporary names at the existing columns' field ids."""
    from lance.fragment import DataFile

    tmp_ids = _field_tree(new_schema.fields(), [_TMP_PREFIX + c for c in columns])
    real_ids = _field_tree(table_schema.fields(), list(columns))
    mapping = dict(zip(tmp_ids, real_ids, strict=True))
    files = list(meta.files)
    new_file = files[-1]
    files[-1] = DataFile(
        new_file.path,
        fields=[mapping[i] for i in new_file.fields],
        column_indices=list(new_file.column_indices),
        file_major_version=new_file.file_major_version,
        file_minor_version=new_file.file_minor_version,
        file_size_bytes=new_file.file_size_bytes,
    )
    meta.files = files
    return meta


def _is_conflict(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "conflict" in text or "retryable" in text or "concurrent" in text
