"""``RowDataset``: rows (or batches) of any columns, shuffled by a pure plan, with transforms.

The plan (:mod:`tokenloom.rows.plan`) says which row fills which slot of which global step; this
module reads those rows in chunks of ``read_batch_size`` (:mod:`tokenloom.rows.read`), runs the
transform on each chunk in a pool of ``transform_threads`` threads (Lance's take releases the
GIL, so do Pillow and numpy), refills the slots of rows the transform left out, and hands the
batch out in the chosen format. It is built on the stream skeleton
(:mod:`tokenloom.loader.plan.stream`: spec, topology, cursor, take): :class:`RowStream` is the plan
plus this materialiser, without torch. A :class:`~tokenloom.rows.RowLoader` worker ``w`` of ``W``
(tokenloom's own, :mod:`~tokenloom.loader.pipeline.workers`) builds this rank's steps ``w, w+W,
...`` into a shared-memory ring (:mod:`~tokenloom.loader.pipeline.transit`) and the loader
takes them round-robin, so the stream is the same for any number of workers. State: ``(epoch,
step)`` plus the fingerprint of the plan's inputs.

:class:`RowMapDataset` is the map-style variant (``DataLoader(shuffle=True)`` works): item ``i``
is the ``i``-th selected row (ascending id), a failing row replaced by its refill candidates.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from tokenloom.loader.pipeline.transit import StepMessage, WorkerRing
from tokenloom.loader.plan.stream.cursor import Cursor, PlanCache, StreamCursor
from tokenloom.loader.plan.stream.topology import Topology, worker_groups
from tokenloom.rows.blobs import LazyBatch, returned_blob
from tokenloom.rows.plan import MAX_REFILLS, RowPlan
from tokenloom.rows.read import RowReader, lazy_columns, scan_selection
from tokenloom.rows.spec import RowSpec
from tokenloom.rows.transform import (
    FORMATS,
    ON_ERROR,
    ChunkResult,
    RowLoaderError,
    Transform,
    apply_transform,
    concat_outputs,
    take_rows,
    to_format,
    transform_name,
)

__all__ = ["RowMapDataset", "RowStream", "StepRows"]


def __getattr__(name: str) -> Any:
    # RowDataset, the torch face, lives in its own module: a worker unpickles a RowStream from
    # this one without importing torch
    if name == "RowDataset":
        from tokenloom.rows.iterable import RowDataset

        return RowDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class StepRows:
    """One rank's share of one step, built: the output, the ids delivered, what was skipped."""

    __slots__ = ("step", "output", "row_ids", "skipped", "refills")

    def __init__(self, step: int, output: Any, row_ids: np.ndarray, skipped: Counter, refills: int):
        self.step = step
        self.output = output
        self.row_ids = row_ids
        self.skipped = skipped
        self.refills = refills


_HINTS = {
    "batch_size": "rows per step are the spec's global_batch (each of W ranks gets "
    "global_batch / W): pass global_batch=",
    "shuffle": "every epoch is a fresh shuffle of (seed, epoch): pass seed=",
    "num_workers": "workers belong to the loader: RowLoader(dataset, num_workers=N)",
    "workers": "workers belong to the loader: RowLoader(dataset, num_workers=N)",
    "where": "the rows are selected by filter=",
}
"""For a keyword that belongs elsewhere: where it goes."""


def _check_keywords(cls: type, options: dict[str, Any]) -> None:
    """Refuse keywords that are neither ``cls``'s own nor :class:`RowSpec` fields, naming the
    valid ones (and, for a familiar one such as ``batch_size``, where it belongs)."""
    import dataclasses
    import inspect

    fields = [f.name for f in dataclasses.fields(RowSpec) if f.name != "table"]
    unknown = sorted(set(options) - set(fields))
    if not unknown:
        return
    own = [
        p.name
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    hints = "".join(f"{name}: {_HINTS[name]}; " for name in unknown if name in _HINTS)
    raise RowLoaderError(
        f"{cls.__name__}() got unknown keyword(s) {', '.join(unknown)}; {hints}"
        f"valid keywords are {', '.join(own)}, and the RowSpec fields {', '.join(fields)} "
        "(keyword form, with a table URI instead of a RowSpec)"
    )


class _Rows:
    """What RowDataset and RowMapDataset share: the spec resolved, the reader, the transform."""

    def __init__(
        self,
        spec: RowSpec | Any,
        *,
        transform: Transform | None,
        on_error: str,
        format: str,
        storage_options: dict | None,
        options: dict,
    ) -> None:
        from tokenloom.table import Table

        _check_keywords(type(self), options)
        if not isinstance(spec, RowSpec):
            spec = RowSpec(table=spec, **options)
        elif options:
            raise RowLoaderError(
                f"pass either a RowSpec or keyword options, not both (got {sorted(options)})"
            )
        if on_error not in ON_ERROR:
            raise RowLoaderError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        if format not in FORMATS:
            raise RowLoaderError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        table = Table.open(spec.table, version=spec.version, storage_options=storage_options)
        self.selection = scan_selection(table.dataset, filter=spec.filter, columns=spec.columns)
        self.spec = spec.replace(version=table.version)
        """The spec with the table version pinned."""
        self.transform = transform
        self.on_error = on_error
        self.format = format
        lazy = lazy_columns(table.dataset.schema, self.spec.columns, self.spec.lazy_blobs)
        if lazy and transform is None:
            raise RowLoaderError(
                f"lazy_blobs hands the blob column(s) {', '.join(map(repr, lazy))} to the "
                "transform as file objects, valid within its call; pass transform= a function "
                "that reads what it needs from them, or drop lazy_blobs to get bytes"
            )
        self.reader = RowReader(
            table.uri,
            table.version,
            self.spec.columns,
            storage_options=storage_options,
            lazy=lazy,
        )
        self.skipped: Counter = Counter()
        """Rows left out by the transform so far, by reason (this process)."""
        self.refills = 0
        """Slots filled by a refill candidate so far (a skipped row's, or past the epoch end)."""

    @property
    def version(self) -> int:
        return int(self.spec.version)  # type: ignore[arg-type]

    def plan_inputs(self) -> dict[str, Any]:
        """The named inputs the stream depends on (world size and workers are not among them)."""
        return {
            "table_version": self.version,
            **self.spec.fingerprint_inputs(),
            "transform": transform_name(self.transform),
            "on_error": self.on_error,
        }

    def _chunk(self, positions: np.ndarray) -> ChunkResult:
        """Read and transform the rows at selection ``positions``."""
        ids = self.selection.row_ids[positions]
        batch = self.reader.read(self.selection.rowids[positions], ids)
        if not isinstance(batch, LazyBatch):
            return apply_transform(self.transform, batch, on_error=self.on_error, ids=ids.tolist())
        with batch:  # the file objects live for the transform call only
            res = apply_transform(self.transform, batch, on_error=self.on_error, ids=ids.tolist())
        leaked = returned_blob(res.output)
        if leaked is not None:
            raise RowLoaderError(
                f"transform {transform_name(self.transform)} returned column {leaked}; a lazy "
                "blob is closed when the transform returns: return what you read from it "
                "(bytes, arrays)"
            )
        return res

    def _refill(self, plan: RowPlan, position: int, skipped: Counter) -> tuple[Any, int]:
        """The first refill candidate of ``position`` whose transform passes: (output, row)."""
        for k in range(MAX_REFILLS):
            row = plan.candidate(position, k)
            res = self._chunk(np.array([row], dtype=np.int64))
            if res.failed:
                skipped.update(res.failed.values())
                continue
            return res.output, row
        raise RowLoaderError(
            f"{MAX_REFILLS} refill candidates in a row failed the transform at global position "
            f"{position} of epoch {plan.epoch} (skips so far: {dict(skipped)}); the transform "
            "fails on most rows: check it on a few rows, or filter the bad rows out"
        )


class RowStream(StreamCursor, _Rows):
    """Batches of rows streamed from the table as a :class:`RowSpec` says (no torch; its
    torch face is :class:`RowDataset`, whose arguments these are; a worker of
    :class:`~tokenloom.rows.RowLoader` runs a detached copy, :meth:`detached`).

    ``RowDataset(spec, rank=r, world_size=w, transform=f)``, or the keyword form
    ``RowDataset("img.lance", columns=["image", "text"], global_batch=32, ...)``.

    Args:
        spec: The :class:`RowSpec`, or a table URI for the keyword form.
        transform: ``f(pa.RecordBatch) -> pa.RecordBatch | dict`` run on chunks of rows.
        transform_threads: Threads running read + transform of chunks (``0``: in the calling
            thread — e.g. inside DataLoader workers, which are the parallelism then).
        read_batch_size: Rows per chunk (one take, one transform call).
        prefetch: Steps whose chunks are in flight ahead of the one being delivered.
        format: One of :data:`~tokenloom.rows.transform.FORMATS`.
        on_error: One of :data:`~tokenloom.rows.transform.ON_ERROR`.
        rank, world_size: This rank and the number of ranks (default ``$RANK``/``$WORLD_SIZE``).
        epoch: The epoch to start in.
        storage_options: Object-store options for Lance.
        allow_data_change: Accept a checkpoint whose table version or filter differ.
        **options: Keyword form only: the :class:`RowSpec` fields.
    """

    def __init__(
        self,
        spec: RowSpec | Any,
        *,
        transform: Transform | None = None,
        transform_threads: int = 2,
        read_batch_size: int = 64,
        prefetch: int = 2,
        format: str = "numpy",
        on_error: str = "raise",
        rank: int | None = None,
        world_size: int | None = None,
        epoch: int = 0,
        storage_options: dict | None = None,
        allow_data_change: bool = False,
        **options: Any,
    ) -> None:
        _Rows.__init__(
            self,
            spec,
            transform=transform,
            on_error=on_error,
            format=format,
            storage_options=storage_options,
            options=options,
        )
        self.topology = Topology.of(rank, world_size)
        """This rank of the world (:class:`~tokenloom.loader.plan.stream.topology.Topology`)."""
        self.rank, self.world_size = self.topology.rank, self.topology.world_size
        self.batch_size = self.spec.per_rank(self.world_size)
        for name, value, low in (
            ("transform_threads", transform_threads, 0),
            ("read_batch_size", read_batch_size, 1),
            ("prefetch", prefetch, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise RowLoaderError(f"{name} must be an integer >= {low}, got {value!r}")
        self.transform_threads = transform_threads
        self.read_batch_size = read_batch_size
        self.prefetch = prefetch
        self.allow_data_change = allow_data_change
        self.at = Cursor(epoch)
        """The cursor: the next global step to deliver (:class:`~.stream.cursor.Cursor`)."""
        self._plans: PlanCache[RowPlan] = PlanCache(keep=2)

    # -- the plan -----------------------------------------------------------------------------

    def plan(self, epoch: int | None = None) -> RowPlan:
        """The epoch's :class:`RowPlan` (the last two are kept).

        Every reader of an epoch comes through here, so an epoch of zero steps is refused once
        here: iterating it (or rolling over into the next) would yield nothing, forever.

        Raises:
            RowLoaderError: The epoch has no global step (no row selected, or ``drop_last``
                with fewer rows than one global batch).
        """
        return self._plans.get(self.at.epoch if epoch is None else epoch, self._build_plan)

    def _build_plan(self, e: int) -> RowPlan:
        s = self.spec
        n = len(self.selection.row_ids)
        plan = RowPlan.build(
            n, seed=s.seed, epoch=e, global_batch=s.global_batch, drop_last=s.drop_last
        )
        if plan.steps == 0:
            if n == 0:
                raise RowLoaderError(
                    f"epoch {e} has no step: the filter {s.filter!r} selects no row of "
                    f"{s.table} (version {self.version}); widen the filter"
                )
            raise RowLoaderError(
                f"epoch {e} has no step: its {n:,} rows are fewer than one global batch "
                f"of {s.global_batch} rows, and drop_last leaves that incomplete step out; "
                f"use global_batch={n} or less, or drop_last=False"
            )
        return plan

    def __len__(self) -> int:
        """Steps in the current epoch (the same on every rank)."""
        return self.plan().steps

    def steps(self, epoch: int | None = None) -> int:
        """Global steps of an epoch (default: the current one), the same on every rank."""
        return self.plan(epoch).steps

    # -- state --------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The cursor of batches delivered so far, the fingerprint, and the skip counts."""
        out = StreamCursor.state_dict(self)
        out["skipped"] = dict(self.skipped)
        out["refills"] = self.refills
        return out

    def load_state_dict(self, state: dict) -> None:
        """Continue the global stream a state was taken at (on any world size / workers).

        Raises:
            ResumeMismatchError: naming what changed and the override.
        """
        StreamCursor.load_state_dict(self, state)
        self.skipped = Counter(state.get("skipped", {}))
        self.refills = int(state.get("refills", 0))

    # -- building steps -----------------------------------------------------------------------

    def _submit(self, pool: ThreadPoolExecutor | None, plan: RowPlan, step: int) -> tuple:
        positions = plan.positions(step, rank=self.rank, world_size=self.world_size)
        first = plan.first_rows(positions)
        slots = np.flatnonzero(first >= 0)
        chunks = []
        for lo in range(0, len(slots), self.read_batch_size):
            part = slots[lo : lo + self.read_batch_size]
            rows = first[part]
            fut: Future | ChunkResult
            fut = pool.submit(self._chunk, rows) if pool is not None else self._chunk(rows)
            chunks.append((part, rows, fut))
        return step, positions, first, chunks

    def _finish(self, plan: RowPlan, submitted: tuple) -> StepRows:
        step, positions, first, chunks = submitted
        pieces: list[Any] = []
        base = 0
        where = np.full(len(positions), -1, dtype=np.int64)  # slot -> row in concat(pieces)
        delivered = first.copy()
        skipped: Counter = Counter()
        for part, _rows, fut in chunks:
            res = fut.result() if isinstance(fut, Future) else fut
            skipped.update(res.failed.values())
            if res.output is not None:
                where[part[res.kept]] = base + np.arange(len(res.kept))
                pieces.append(res.output)
                base += len(res.kept)
        refills = 0
        for j in np.flatnonzero(where < 0).tolist():
            out, row = self._refill(plan, int(positions[j]), skipped)
            pieces.append(out)
            where[j] = base
            delivered[j] = row
            base += 1
            refills += 1
        output = take_rows(concat_outputs(pieces), where)
        return StepRows(step, output, self.selection.row_ids[delivered], skipped, refills)

    def build_step(self, step: int, epoch: int | None = None) -> StepRows:
        """This rank's share of global step ``step`` (synchronously, no thread pool)."""
        plan = self.plan(epoch)
        return self._finish(plan, self._submit(None, plan, step))

    # -- iteration ----------------------------------------------------------------------------

    def _built(self, plan: RowPlan, steps: list[int]) -> Iterator[StepRows]:
        """The steps ``steps`` of ``plan`` built in order, ``prefetch`` steps ahead in a pool
        of ``transform_threads`` threads (the skip counts added up here)."""
        threads = self.transform_threads
        pool = ThreadPoolExecutor(threads, thread_name_prefix="tokenloom-rows") if threads else None
        try:
            ahead: deque = deque()
            it = iter(steps)
            for s in it:
                ahead.append(self._submit(pool, plan, s))
                if len(ahead) > self.prefetch:
                    break
            while ahead:
                built = self._finish(plan, ahead.popleft())
                nxt = next(it, None)
                if nxt is not None:
                    ahead.append(self._submit(pool, plan, nxt))
                self.skipped.update(built.skipped)
                self.refills += built.refills
                yield built
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def batches(self) -> Iterator[Any]:
        """The rest of the current epoch in this process, in :attr:`format` (the cursor moves
        as each batch is handed out)."""
        epoch, first = self.at.at
        plan = self.plan(epoch)
        for built in self._built(plan, list(range(first, plan.steps))):
            self.at.delivered(epoch, built.step, plan.steps)
            yield to_format(built.output, built.row_ids, self.format)

    def groups(self, worker: int, workers: int, *, keep: bool = False) -> Iterator[StepMessage]:
        """Worker ``worker`` of ``workers``
        (:class:`~tokenloom.loader.pipeline.workers.WorkerPool`): its steps ``first + worker, first
        + worker + workers, ...`` of the rest of the current epoch, numeric arrays in a
        shared-memory ring (numpy out; the loader converts to torch). ``keep`` (a persistent worker)
        changes nothing here: each pass is told its cursor."""
        del keep
        epoch, first = self.at.at
        plan = self.plan(epoch)
        steps = [g.start for g in worker_groups(first, plan.steps, 1, worker, workers)]
        fmt = "numpy" if self.format == "torch" else self.format
        ring = WorkerRing()
        for built in self._built(plan, steps):
            message = StepMessage(
                epoch=epoch,
                first=built.step,
                batch=to_format(built.output, built.row_ids, fmt),
                extra={"skipped": dict(built.skipped), "refills": built.refills},
                worker=worker,
            )
            yield ring.put(message)

    def detached(self) -> RowStream:
        """This stream as a plain :class:`RowStream` (what a worker is sent: unpickling it
        imports no torch). Shares this object's state."""
        out = RowStream.__new__(RowStream)
        out.__dict__.update(self.__dict__)
        return out


class RowMapDataset(_Rows):
    """Map-style rows: ``ds[i]`` is the ``i``-th selected row (ascending id), transformed.

    Use with ``torch.utils.data.DataLoader(ds, batch_size=B, shuffle=True)``; torch calls
    ``__getitems__`` with a whole batch of indices, read in one take and transformed once. A row
    the transform leaves out (``on_error="skip"|"warn"``) is replaced by its refill candidates
    (a fixed chain per index), so every index yields a row and every rank the same count.

    Items are dicts of per-row values (numpy scalars / arrays; ``format="python"``: Python
    values), which torch's default collate stacks.
    """

    def __init__(
        self,
        spec: RowSpec | Any,
        *,
        transform: Transform | None = None,
        on_error: str = "raise",
        format: str = "numpy",
        storage_options: dict | None = None,
        **options: Any,
    ) -> None:
        if format not in ("numpy", "python"):
            raise RowLoaderError(
                f"RowMapDataset yields rows: format 'numpy' or 'python', not {format!r}"
            )
        super().__init__(
            spec,
            transform=transform,
            on_error=on_error,
            format=format,
            storage_options=storage_options,
            options=options,
        )
        n = len(self.selection.row_ids)
        self._plan = RowPlan.build(n, seed=self.spec.seed, epoch=0, global_batch=1, drop_last=True)

    def __len__(self) -> int:
        return len(self.selection.row_ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        n = len(self)
        idx = np.asarray(indices, dtype=np.int64)
        if len(idx) and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"index out of range for {n} rows")
        idx = np.where(idx < 0, idx + n, idx)
        res = self._chunk(idx)
        self.skipped.update(res.failed.values())
        pieces, where, base = [], np.full(len(idx), -1, dtype=np.int64), 0
        delivered = idx.copy()
        if res.output is not None:
            where[res.kept] = np.arange(len(res.kept))
            pieces.append(res.output)
            base = len(res.kept)
        for j in np.flatnonzero(where < 0).tolist():
            out, row = self._refill(self._plan, int(idx[j]), self.skipped)
            pieces.append(out)
            where[j], delivered[j] = base, row
            base += 1
            self.refills += 1
        cols = to_format(
            take_rows(concat_outputs(pieces), where), self.selection.row_ids[delivered], "numpy"
        )
        rows = [{k: v[i] for k, v in cols.items()} for i in range(len(idx))]
        if self.format == "python":
            return [
                {
                    k: (v.item() if hasattr(v, "item") and np.ndim(v) == 0 else v)
                    for k, v in r.items()
                }
                for r in rows
            ]
        return rows
