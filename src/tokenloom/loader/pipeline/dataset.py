"""``PackedStream``: the epoch plan materialised as packed numpy batches (no torch).

The pure plan (:mod:`~tokenloom.loader.plan.epoch`) says which token of which row lands where; this
module reads those tokens (:mod:`~tokenloom.loader.pipeline.read`), packs them
(:mod:`~tokenloom.loader.plan.group`) and hands out batches. Steps are built in *groups* of
consecutive steps, their rows taken with those of the next groups of the same process (spans,
:mod:`~tokenloom.loader.pipeline.fetch`: locally ~1,000 rows a take, in the training process and in
each DataLoader worker alike; on an object store many groups ahead), one pack into a reused buffer
(:mod:`~tokenloom.loader.pipeline.buffers`; compiled, by numba's JIT in the training process and
built ahead of time in a DataLoader worker; both read the taken rows in place), so per-step Python
stays small next to reading.
DataLoader worker ``w`` of ``W`` (:mod:`~tokenloom.loader.pipeline.workers`) builds groups ``w, w+W,
...`` of this rank's steps into shared-memory slots and sends one message per group; the training
process takes the workers' messages round-robin, so the stream is the same for any number of
workers. The state is ``(epoch, step)`` plus a fingerprint of the plan's inputs. Torch's face of
it, ``PackedDataset`` and ``DataLoader``, is :mod:`~tokenloom.loader.pipeline.dataloader`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from tokenloom.loader.observe.gauge import PipelineGauge
from tokenloom.loader.observe.stats import LoaderStats
from tokenloom.loader.pipeline import prebuilt
from tokenloom.loader.pipeline.buffers import RecycledBuffers
from tokenloom.loader.pipeline.fetch import FetchAhead, SpanKey
from tokenloom.loader.pipeline.groups import GroupReader
from tokenloom.loader.pipeline.planner import Planner
from tokenloom.loader.pipeline.planstore import PlanStore
from tokenloom.loader.pipeline.read import (
    SPLIT_TAKE_PARTS,
    SPLIT_TAKE_ROWS,
    Fetched,
    LoaderError,
    TokenReader,
)
from tokenloom.loader.pipeline.readahead import (
    FETCH_AHEAD_BYTES,
    ROW_BLOCK_SIZE,
    ROWS_IN_FLIGHT,
    TAKE_ROWS,
    ReadAhead,
    available_cores,
    log,
    per_row_reads,
    resident_reads,
    rows_per_fetch,
    size_read_ahead,
    timed,
)
from tokenloom.loader.pipeline.transit import BuiltGroup, WorkerRing
from tokenloom.loader.plan.change import (
    DATA_CHANGES,
    StreamChange,
    change_kind,
    changes_from,
    changes_inputs,
)
from tokenloom.loader.plan.epoch import EpochPlan
from tokenloom.loader.plan.pack import TokenSource, use_prebuilt
from tokenloom.loader.plan.spec import LoaderSpec
from tokenloom.loader.plan.state import LoaderState, plan_fingerprint
from tokenloom.loader.plan.stream.cursor import Cursor, StreamCursor
from tokenloom.loader.plan.stream.topology import Topology, worker_groups
from tokenloom.loader.plan.view import EpochView
from tokenloom.table.storage import is_remote
from tokenloom.table.tokens import token_dtype

__all__ = ["PackedStream"]

_META = "_loader"  # per-batch worker metadata, removed by DataLoader
# A worker's groups in transit: its queue (prefetch_factor, 2 by default), the one in the pipe
# and the one the training process is settling. More only makes a worker wait for a slot.
_SLOTS_IN_TRANSIT = 4
# Slots the training process lends to batches at a time (the group being handed out and the one
# before it, which a training loop may still hold a batch of); past that it copies groups out,
# so keeping batches never stalls a worker. A slot is a group of ~1,000 rows: tens of MB.
_SLOTS_LENT = 2
# Packed output of one read group at most (4 int64 fields): in the training process a group
# holds about TAKE_ROWS stretches within this (each group costs a fixed ~100 numpy calls in the
# read threads, which contend for the GIL: measured 400k documents, 1,024-token blocks, batch
# 8: groups of 32 steps 16.1-17.3M tok/s, of 56 steps 18.9-21.2M, alternating); a DataLoader
# worker's groups are smaller: its ring holds a slot per group ahead, in transit and lent.
_GROUP_BYTES = 16 << 20
_WORKER_GROUP_BYTES = 8 << 20
_AHEAD_STEPS = 64  # local read-ahead: 4 groups ahead, fewer big ones covering these steps
_SLOT_WAIT_S = 5.0  # then a group is sent by value instead (slow, never stuck)
# On an object store the fetch spans read (loader/pipeline/fetch.py); the read groups' threads only
# pack, which is CPU work: one thread per core of a 2-core share, 4 groups ahead, as on a local
# table.
_PACK_THREADS = 2
_PACK_AHEAD = 4
_MAX_GROUP_STEPS = 64  # a group's packed blocks stay in memory until handed out
# Locally a take of ~1,000 sorted rows costs a third less CPU per token than one of ~300 (a
# take pays a fixed cost, then each row): the rows of consecutive groups are taken together
# (loader/pipeline/fetch.py's spans) once a group holds fewer, up to this many tokens per take.
_LOCAL_SPAN_TOKENS = 8 << 20
# Rows per local take: in the training process ~4,000 (measured 400k documents, 1,024-token
# blocks, batch 8, alternating in one process with the read bound between: 0.90-1.04x of the
# bound against 0.65-0.89x with ~1,000-row spans, 3-25% less CPU a token).
_LOCAL_SPAN_ROWS = 4096
_LOCAL_SPANS = 2  # spans in flight: the one being packed and the next being taken
# A DataLoader worker's spans in flight hold about as many rows as one training-process span,
# within a token budget (a take's memory grows with its tokens: the loader tree with two workers,
# two spans in flight each, peaked at 907-914 MB with ~1,000 rows a span, 939-945 with ~2,000,
# 966-979 with ~3,000, 1,006-1,014 with ~4,000, past the 1 GB goal). With a core or less a
# worker keeps one span in flight, of ~4,000 rows: the other worker's takes overlap its packing
# (two workers on two cores, the processes' CPU a token of the stream, alternating three rounds:
# the tree 77.2-81.2 ns and 22.9-24.5M tok/s, against 84.4-90.0 ns and 20.4-22.5M with one span
# of ~1,000 rows and 88.3-97.9 ns and 19.4-22.0M with two of ~2,000; peak RSS 938-952 MB against
# 941-945). With more cores it keeps two of ~2,000.
_WORKER_ROWS_IN_FLIGHT = 4096
_WORKER_TOKENS_IN_FLIGHT = 4 << 20  # a worker's spans of longer documents: ~4,000 rows' worth
# A DataLoader worker with a core or less (two workers on two cores) packs its local spans' groups
# on one thread, one group ahead: its spans are taken by the fetcher's threads, so a second
# packing thread and group only contend with the other worker and the training process for the
# cores (measured 400k documents, 1,024-token blocks, batch 8, two workers, alternating three
# rounds: 27.2 / 25.1 / 28.7M tok/s and 67.7-77.1 ns of the tree's CPU a token with two threads
# and two groups ahead, 30.0 / 29.7 / 30.7M and 63.1-65.5 ns with one; RSS 939-947 -> 916-922 MB,
# a ring slot fewer). Explicit io_threads / read_ahead still win.
_WORKER_PACK_THREADS = 1
# Layouts of read groups kept between their span's fetch and their build (~50 KB each): the
# groups of the spans in flight, locally two spans of a few groups; past that (a deep remote
# read-ahead) the oldest are worked out again by their build.
_LAYOUTS_KEPT = 64
# Held token columns shared by DataLoader workers through the plan store (a copy per table
# version and selection, up to 256 MB each): the newest kept on disk.
_HELD_KEPT = 2


def _worker_kernels() -> bool:
    """In a DataLoader worker: pack with the compiled packer built ahead of time
    (:mod:`~tokenloom.loader.pipeline.prebuilt`: numba's kernel without numba and LLVM, which
    would add ~115 MB of RSS to each worker) where the training process could build it; whether
    the worker packs compiled (else with numpy: ~5 ns more CPU a token in the loader tree with
    two workers, measured). The training process packs with numba's JIT."""
    module = prebuilt.load()
    if module is None:
        return False
    use_prebuilt(module)
    return True


class PackedStream(StreamCursor):
    """Packed blocks of a token column, streamed from the table as a
    :class:`~tokenloom.loader.plan.spec.LoaderSpec` says (numpy; torch's face of it is
    :class:`~tokenloom.loader.pipeline.dataloader.PackedDataset`, whose arguments these are). A
    DataLoader worker runs a detached copy (:meth:`detached`) and imports no torch.

    ``PackedDataset(spec, rank=r, world_size=w)`` is the form every tokenloom command uses. The
    keyword form ``PackedDataset("corpus.lance", seq_len=2048, global_batch=16, ...)`` takes the
    spec's fields flat (recipe fields included) and builds the spec.

    Args:
        spec: The :class:`LoaderSpec`, or a table URI / :class:`tokenloom.table.Table` for the
            keyword form.
        token_column: Keyword form only: the spec's ``token_column``.
        rank: This rank (default: ``$RANK`` or 0).
        world_size: Number of ranks (default: ``$WORLD_SIZE`` or 1); it must divide the global
            batch, and each rank packs ``global_batch / world_size`` blocks per step.
        epoch: The epoch to start in.
        storage_options: Object-store options for Lance.
        allow_data_change: Accept a checkpoint whose table version/filter/tokenizer differ
            (the cursor continues on the other data's plan, as is).
        data_change: What :meth:`load_state_dict` does with a checkpoint taken on other data
            (:data:`~tokenloom.loader.plan.change.DATA_CHANGES`): ``"refuse"`` (the default; or as
            ``allow_data_change`` says), or ``"continue"``: record a
            :class:`~tokenloom.loader.plan.change.StreamChange` and finish the epoch with the rows
            not yet delivered that still pass plus the new ones, from this loader's version.
        io_threads: Locally, threads reading and packing ahead (default 2, in-process and in
            each DataLoader worker; 1 in a worker with a core or less whose rows are taken in
            spans, with one group ahead); on an object store, concurrent takes of the fetch spans
            (default: sized from the first span's measured wall and CPU time, see
            :mod:`~tokenloom.loader.pipeline.readahead`). Never part of the stream.
        read_ahead: Locally, read groups in flight (default 4); on an object store, fetch
            spans in flight (:mod:`~tokenloom.loader.pipeline.fetch`; default: sized with
            ``io_threads``, across the epoch boundary in the training process).
        read_group: Steps per group: per pack and per worker message, and locally per
            ``take`` (default: sized to ~256 stretches per group).
        **options: Keyword form only: the other :class:`LoaderSpec` fields.
    """

    def __init__(
        self,
        spec: LoaderSpec | Any,
        token_column: str | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        epoch: int = 0,
        storage_options: dict | None = None,
        allow_data_change: bool = False,
        data_change: str = "refuse",
        io_threads: int | None = None,
        read_ahead: int | None = None,
        read_group: int | None = None,
        **options: Any,
    ) -> None:
        from tokenloom.table import Table

        super().__init__()
        handle = None
        if not isinstance(spec, LoaderSpec):
            if "batch_size" in options:
                raise LoaderError(
                    "PackedDataset takes global_batch= (blocks per global step over all ranks); "
                    "batch_size= is gone because it meant different things in different places"
                )
            if token_column is not None:
                options["token_column"] = token_column
            if isinstance(spec, Table):
                handle = spec
                options.setdefault("version", handle.version)
            uri = handle.uri if handle is not None else spec
            spec = LoaderSpec.from_options(table=uri, **options)
        elif token_column is not None or options:
            raise LoaderError(
                "pass either a LoaderSpec or keyword options, not both "
                f"(got {', '.join(sorted(options)) or 'token_column'}); use spec.replace(...)"
            )
        self.topology = Topology.of(rank, world_size)
        """This rank of the world (:class:`~tokenloom.loader.plan.stream.topology.Topology`)."""
        self.rank, self.world_size = self.topology.rank, self.topology.world_size
        self.blocks_per_rank = spec.per_rank(self.world_size)
        """Blocks this rank packs per step (``global_batch / world_size``)."""
        self._version_given = spec.version is not None
        """Whether the caller pinned the version (else a resume reads the checkpoint's)."""
        self._storage_options = storage_options
        self._pin(spec, handle)
        self.allow_data_change = allow_data_change
        if data_change not in DATA_CHANGES:
            raise LoaderError(
                f"data_change must be one of {', '.join(DATA_CHANGES)}, got {data_change!r}"
            )
        if data_change == "continue" and allow_data_change:
            raise LoaderError(
                "allow_data_change (continue the cursor on the other data's plan) and "
                "data_change='continue' (finish the epoch with the rows not yet delivered) "
                "exclude each other; pass one"
            )
        self.data_change = data_change
        self.change: StreamChange | None = None
        """The stream change :meth:`load_state_dict` recorded (``None``: the data was the
        checkpoint's)."""
        self._readers: dict[int, TokenReader] = {}
        """Readers of earlier phases' table versions (a view spliced by a stream change)."""
        if (
            (io_threads is not None and io_threads < 1)
            or (read_ahead is not None and read_ahead < 1)
            or (read_group is not None and read_group < 1)
        ):
            raise LoaderError(
                f"io_threads, read_ahead and read_group must be >= 1 "
                f"({io_threads}, {read_ahead}, {read_group})"
            )
        self.io_threads = io_threads
        """Locally, threads reading and packing ahead (``take`` and the packer release the
        GIL; ``None``: 2, or 1 in a DataLoader worker with a core or less whose rows are taken
        in spans); on an object store, concurrent takes of the fetch spans (``None``:
        sized from the first span's measured fetch)."""
        self.read_ahead = read_ahead
        """Locally, read groups in flight (``None``: 4); on an object store, fetch spans in
        flight (``None``: sized with ``io_threads``)."""
        self.sizing: ReadAhead | None = None
        """How the last iteration sized its reads (in this process)."""
        self.read_group = read_group
        """Steps per read group (per pack; locally per ``take``); ``None``: sized to about
        256 stretches per group from the plan."""
        self._buffers = RecycledBuffers()
        """Output buffers of packed groups, reused once no batch of theirs is referenced."""
        self._fetcher: FetchAhead | None = None
        """In the training process on an object store: the fetch spans, kept across epochs."""
        self.gauge = PipelineGauge()
        """Queue occupancy of this process's read pipeline (written into :attr:`stats`)."""
        self.at = Cursor(epoch)
        """The cursor: the next global step to deliver (:class:`~.stream.cursor.Cursor`)."""
        self._layouts: OrderedDict[tuple, tuple] = OrderedDict()
        """Read groups' layouts worked out for their span's fetch, kept for their build."""
        self._layouts_lock = threading.Lock()

    def _pin(
        self, spec: LoaderSpec, handle: Any = None, changes: tuple[StreamChange, ...] = ()
    ) -> None:
        """Plan ``spec`` (its version pinned: the latest now when it names none) and open the
        token reader on that version (``changes``: the run's stream changes so far)."""
        self.planner = Planner(
            spec, storage_options=self._storage_options, table=handle, changes=changes
        )
        self.spec = self.planner.spec
        """The spec, with the table version pinned."""
        self.reader = TokenReader(
            self.uri,
            self.version,
            self.spec.token_column,
            storage_options=self._storage_options,
            mask_column=self.spec.loss_mask_column,
        )
        if self.planner.files is not None:  # the plan's rows are groups of the table's rows
            self.reader = GroupReader(self.reader, self.planner.files, self.planner.row_inputs)
        self.stats = LoaderStats(rows_planned=len(self.inputs.row_ids))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fetcher"] = None  # threads and fetched rows stay in this process
        state["_readers"] = {}
        state["_layouts"] = OrderedDict()
        state["_layouts_lock"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._layouts_lock = threading.Lock()

    # -- what the spec resolved to --------------------------------------------------------------

    @property
    def uri(self) -> str:
        return self.planner.uri

    @property
    def version(self) -> int:
        """The pinned table version."""
        return self.planner.version

    @property
    def inputs(self) -> Any:
        """The plan's inputs (:class:`~tokenloom.loader.pipeline.inputs.PlanInputs`)."""
        return self.planner.inputs

    @property
    def eos_id(self) -> int:
        return self.planner.eos_id

    @property
    def pad_id(self) -> int:
        return self.planner.pad_id

    @property
    def global_batch(self) -> int:
        """Blocks per global step (``blocks_per_rank * world_size``)."""
        return self.spec.global_batch

    @property
    def seq_len(self) -> int:
        return self.spec.seq_len

    @property
    def step_values(self) -> int:
        """int64 values one packed step of this rank holds (ids, labels, positions, doc ids)."""
        return 4 * self.blocks_per_rank * self.seq_len

    # -- the plan -----------------------------------------------------------------------------

    def plan(self, epoch: int | None = None) -> Any:
        """The epoch's plan (a :class:`~tokenloom.loader.plan.view.BlockPlan`)."""
        return self.planner.plan(self.at.epoch if epoch is None else epoch)

    def view(self, epoch: int | None = None) -> EpochView:
        """The epoch cut into global steps (:class:`~tokenloom.loader.plan.view.EpochView`)."""
        return self.planner.view(self.at.epoch if epoch is None else epoch)

    def epoch_info(self, epoch: int | None = None) -> dict:
        """Exact sizes of an epoch from stored counts: steps, blocks, tokens, padding, dropped."""
        return self.planner.epoch_info(self.at.epoch if epoch is None else epoch)

    def __len__(self) -> int:
        """Steps in the current epoch (the same on every rank)."""
        return self.view().steps

    def steps(self, epoch: int | None = None) -> int:
        """Global steps of an epoch (default: the current one), the same on every rank."""
        return self.view(epoch).steps

    # -- state --------------------------------------------------------------------------------

    def plan_inputs(self) -> dict:
        """The named inputs the stream depends on (world size and workers are not among them)."""
        return self.planner.plan_inputs()

    def load_state_dict(self, state: dict) -> None:
        """Continue the global stream a state was taken at (on any world size / workers).

        A loader whose spec names no table version (it pinned the latest when it was built)
        moves to the version the state was taken on, as ``tokenloom train --resume`` does: a
        column added since (a later backfill) makes a newer version, not another stream. A
        version given explicitly is kept, and checked like every other input. The state's
        stream changes (:mod:`~tokenloom.loader.plan.change`) are planned again, so a resume after a
        change is exact. With ``data_change="continue"`` a state taken on other data (another
        version, filter or selection) is continued onto this loader's version by a new
        ``continue`` change (:meth:`resume_with_change`; :attr:`change`).

        Raises:
            ResumeMismatchError: naming what changed and the override.
        """
        saved = LoaderState.from_dict(state)
        pinned = saved.inputs.get("table_version")
        changes = changes_from(saved.inputs.get("changes"))
        valid = isinstance(pinned, int) and not isinstance(pinned, bool)
        if self.data_change == "continue" and valid:
            current = {**self.plan_inputs(), **changes_inputs(changes)}
            if plan_fingerprint(**current) != saved.fingerprint:
                self.resume_with_change(state, "continue")
                return
        if changes != self.planner.changes or (
            not self._version_given and valid and pinned != self.version
        ):
            version = pinned if valid and not self._version_given else self.version
            if changes and changes[-1].version_after != version:
                # allow_data_change onto yet another version: its plan as is, no history
                changes = ()
            self._repin(self.spec.replace(version=version), changes)
        self.at.restore(state, self.plan_inputs(), allow_data_change=self.allow_data_change)

    def _repin(self, spec: LoaderSpec, changes: tuple[StreamChange, ...]) -> None:
        if self._fetcher is not None:  # fetched spans of the other version
            self._fetcher.close()
            self._fetcher = None
        self._pin(spec, changes=changes)

    def resume_with_change(
        self, state: dict, kind: str, params: dict | None = None
    ) -> StreamChange:
        """Continue the stream ``state`` was taken on, with a new
        :class:`~tokenloom.loader.plan.change.StreamChange` of ``kind`` at its cursor: this loader's
        spec and version are the new phase; the kind rebuilds the previous phase's spec
        (:meth:`~tokenloom.loader.plan.change.ChangeKind.previous_spec`), which must reproduce the
        state's plan inputs exactly, and says what the new phase may change
        (:meth:`~tokenloom.loader.plan.change.ChangeKind.check_phases`).

        Returns:
            The change (also :attr:`change`); the cursor is the state's.

        Raises:
            ResumeMismatchError: The previous phase does not rebuild the state's stream, or the
                new phase changes what the kind does not allow.
            ChangeError: An unknown kind, or a malformed parameter.
        """
        saved = LoaderState.from_dict(state)
        changes = changes_from(saved.inputs.get("changes"))
        pinned = saved.inputs.get("table_version")
        draft = StreamChange(
            kind=kind,
            epoch=saved.epoch,
            step=saved.step,
            global_step=0,
            version_before=int(pinned) if isinstance(pinned, int) else self.version,
            version_after=self.version,
            params=dict(params or {}),
        )
        how = change_kind(kind)
        before = Planner(
            how.previous_spec(draft, self.spec),
            storage_options=self._storage_options,
            changes=changes,
        )
        saved.check(before.plan_inputs())  # the previous phase is the state's stream, exactly
        how.check_phases(dict(saved.inputs), {**self.plan_inputs(), **changes_inputs(changes)})
        global_step = sum(before.steps(e) for e in range(saved.epoch)) + saved.step
        change = dataclasses.replace(draft, global_step=global_step)
        self._repin(self.spec, (*changes, change))
        self.planner._previous = before  # scanned already
        self.change = change
        self.at.seek(saved.epoch, saved.step)
        if saved.step >= self.steps(saved.epoch):  # nothing left of the epoch to deliver
            self.at.seek(saved.epoch + 1, 0)
        return change

    # -- iteration ----------------------------------------------------------------------------

    def _group_steps(self, view: EpochView, *, worker: bool = False) -> int:
        """Steps packed together (and, on a local table, read with one ``take``): about
        :data:`~tokenloom.loader.pipeline.readahead.TAKE_ROWS` stretches per group (small takes pay
        a fixed cost each; very large ones lose locality), and at most :data:`_GROUP_BYTES` of
        packed output, :data:`_WORKER_GROUP_BYTES` in a DataLoader ``worker`` (its ring holds a
        few groups: their size is most of a worker's memory). On an object store the reads are
        spans of many groups (:meth:`_span_groups`)."""
        if self.read_group is not None:
            return self.read_group
        stretches = len(self.inputs.row_ids) + view.plan.num_blocks  # rows + block cuts
        per_step = max(stretches / max(view.steps, 1) / self.world_size, 1.0)
        fit = (_WORKER_GROUP_BYTES if worker else _GROUP_BYTES) // (self.step_values * 8)
        return int(min(max(TAKE_ROWS // per_step, 1), fit, _MAX_GROUP_STEPS) or 1)

    def _token_bytes(self) -> int:
        """Bytes of the token lists an epoch reads (selected tokens x bytes per token)."""
        return int(self.inputs.n_tokens.sum()) * self.reader.token_width

    def _span_groups(self, view: EpochView, size: int) -> int:
        """Read groups per fetch span on an object store: about
        :func:`~tokenloom.loader.pipeline.readahead.rows_per_fetch` distinct rows per span."""
        rows = max(len(self.inputs.row_ids), 1)
        per_group = max(rows / max(view.steps, 1) / self.world_size * size, 1.0)
        column = self._token_bytes()
        # a table read per row: a GET per row, not Lance's default 64 KiB merge window
        self.reader.use_block_size(ROW_BLOCK_SIZE if per_row_reads(column) else None)
        return int(max(rows_per_fetch(column, rows) // per_group, 1))

    def _local_span_groups(self, view: EpochView, size: int, *, workers: int = 0) -> int:
        """Read groups per take on a local table: enough for about :data:`_LOCAL_SPAN_ROWS`
        distinct rows, at most :data:`_LOCAL_SPAN_TOKENS` of tokens; in one of ``workers``
        DataLoader workers :data:`_WORKER_ROWS_IN_FLIGHT` rows and
        :data:`_WORKER_TOKENS_IN_FLIGHT` tokens over its spans in flight
        (:meth:`_local_spans`). Not with long documents (a mean row longer than
        that over :data:`~tokenloom.loader.pipeline.readahead.TAKE_ROWS`): their groups hold
        few rows, each read once into the long-document cache, which a span fetched ahead would
        read again."""
        if self.read_group is not None:
            return 1  # an explicit group size is also the take's
        rows = max(len(self.inputs.row_ids), 1)
        if self.inputs.n_tokens.sum() / rows > _LOCAL_SPAN_TOKENS / TAKE_ROWS:
            return 1
        per_group = max(rows / max(view.steps, 1) / self.world_size * size, 1.0)
        tokens = max(self.step_values // 4 * size, 1)  # positions of a group
        wanted, budget = _LOCAL_SPAN_ROWS, _LOCAL_SPAN_TOKENS
        if workers:
            spans = self._local_spans(workers)
            wanted, budget = _WORKER_ROWS_IN_FLIGHT // spans, _WORKER_TOKENS_IN_FLIGHT // spans
        most = max(budget // tokens, 1)
        return int(min(-(-wanted // per_group), most))

    @staticmethod
    def _local_spans(workers: int) -> int:
        """Local spans in flight (one take each): the one being packed and the next being
        taken; in a DataLoader worker (one of ``workers``) with a core or less, one: the other
        workers' takes overlap its packing."""
        return 1 if workers and available_cores(workers) < 2 else _LOCAL_SPANS

    def _group_rows(self, view: EpochView, steps: range) -> np.ndarray:
        """The stable row ids a read group's stretches come from (no I/O). Its layout is kept
        for the group's build (:meth:`_group_layout`): a span's fetch asks first."""
        layout, rowids = self._group_layout(view, steps, keep=True)
        if rowids is not None:
            return rowids
        ids = layout.spans.row_id
        lo, parts = 0, []  # across a stream change: this version's stretches only
        for end, source in layout.sources:
            if source.version == self.version:
                parts.append(ids[lo:end])
            lo = end
        ids = np.concatenate(parts) if parts else ids[:0]
        return self.inputs.rowids[np.searchsorted(self.inputs.row_ids, ids)]

    def _group_layout(
        self, view: EpochView, steps: range, *, keep: bool = False
    ) -> tuple[Any, np.ndarray | None]:
        """A read group's layout and, without a stream change in it, the stable row ids of
        its stretches: worked out once per group. The fetch of the group's span asks first
        (``keep``: held for the build, at most :data:`_LAYOUTS_KEPT` groups), the build then
        takes them."""
        key = (id(view), steps.start, steps.stop)
        with self._layouts_lock:
            held = self._layouts.pop(key, None)
        if held is not None and held[0] is view:
            layout, rowids = held[1], held[2]
        else:
            layout = view.group(
                np.arange(steps.start, steps.stop), rank=self.rank, world_size=self.world_size
            )
            rowids = None
            if not layout.sources:
                rowids = self._stable_ids(view, layout.spans)
        if keep:
            with self._layouts_lock:
                self._layouts[key] = (view, layout, rowids)
                while len(self._layouts) > _LAYOUTS_KEPT:
                    self._layouts.popitem(last=False)
        return layout, rowids

    def _stable_ids(self, view: EpochView, spans: Any) -> np.ndarray:
        """The stable row ids of ``spans``' rows. A concat plan of this loader's own selection
        (its ``source_ids`` are the inputs' ``row_ids``) visits documents by their place in the
        selection: the ids are read there directly; any other plan's rows are found by their
        table ids (a binary search of the compact selection: ~0.5 ms more a read group)."""
        plan = view.plan
        if type(plan) is EpochPlan and plan.source_ids is self.inputs.row_ids:
            return self.inputs.rowids[plan.order[spans.doc]]
        return self.inputs.rowids[np.searchsorted(self.inputs.row_ids, spans.row_id)]

    def _reader_of(self, source: Any) -> TokenReader:
        """The token reader of a phase's table version (this loader's own, or one per earlier
        version, opened once)."""
        if source.version == self.version:
            return self.reader
        reader = self._readers.get(source.version)
        if reader is None:
            reader = TokenReader(
                source.uri,
                source.version,
                self.spec.token_column,
                storage_options=self._storage_options,
                mask_column=self.spec.loss_mask_column,  # each version's own mask values
            )
            self._readers[source.version] = reader
        return reader

    def _read_sources(
        self, layout: Any, fetched: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, tuple[int, int, float]]:
        """A group spliced by a stream change: each phase's stretches read from its own table
        version (its loss-mask spans with them), concatenated in the packer's layout."""
        spans = layout.spans
        tokens, offsets, rows, nbytes, secs = [], [np.zeros(1, np.int64)], 0, 0, 0.0
        masks: list[np.ndarray] = []
        lo = 0
        for end, source in layout.sources:
            if end == lo:
                continue
            inputs = source.inputs
            rowids = inputs.rowids[np.searchsorted(inputs.row_ids, spans.row_id[lo:end])]
            own = source.version == self.version
            t, o, m, read = self._reader_of(source).read_masked(
                rowids,
                layout.starts[lo:end],
                layout.stops[lo:end],
                spans.doc_len[lo:end],
                fetched if own else None,
            )
            base = offsets[-1][-1]
            tokens.append(t)
            if m is not None:
                masks.append(m)
            offsets.append(o[1:] + base)
            rows, nbytes, secs = rows + read[0], nbytes + read[1], secs + read[2]
            lo = end
        out = np.concatenate(tokens) if tokens else np.zeros(0, np.int64)
        masked = None
        if self.spec.loss_mask_column is not None:
            masked = np.concatenate(masks) if masks else np.zeros(0, dtype=bool)
        return out, np.concatenate(offsets), masked, (rows, nbytes, secs)

    def _build_group(
        self,
        view: EpochView,
        epoch: int,
        steps: range,
        ring: WorkerRing | None,
        fetch: tuple[Future, bool] | None = None,
        compiled: bool = True,
    ) -> BuiltGroup:
        """Several consecutive steps read with ONE take of all their rows (or from their
        span's fetch, ``fetch``: its future and whether this group carries its read cost) and
        packed with one call (in an I/O thread: ``take`` and the numpy packer release the GIL
        for most of their time); the consumer hands them out step by step. ``ring``: in a
        DataLoader worker, pack into a shared-memory slot that the training process lends to
        the batches."""
        layout, rowids = self._group_layout(view, steps)
        spans = layout.spans
        fetched = None
        if fetch is not None:
            fetched = fetch[0].result()
        if rowids is None:  # across a stream change
            tokens, offsets, masked, read = self._read_sources(layout, fetched)
        else:
            # the ranges where they lie: the compiled packer reads them in place
            tokens, offsets, masked, read = self.reader.locate(
                rowids, layout.starts, layout.stops, spans.doc_len, fetched
            )
        if fetched is not None and fetch is not None and fetch[1]:
            r = fetched.read
            read = (read[0] + r[0], read[1] + r[1], read[2] + r[2])
        self.gauge.fetched()
        started = time.perf_counter()
        shape = (4, len(layout.blocks), self.seq_len)
        slot = None
        if ring is not None:
            slot, out = ring.acquire(shape)
        if slot is None:
            out = self._buffers.take(shape)
        packed = view.pack_group(layout, tokens, offsets, out=out, masked=masked, compiled=compiled)
        counts = view.count_group(layout, packed, len(self.spec.pool_names))
        if slot is not None:
            packed = replace(packed, arrays=None)  # the training process reads the slot
        return BuiltGroup(
            epoch=epoch,
            first=steps.start,
            packed=packed,
            counts=counts,
            pools=layout.pools if self.spec.mixture else None,
            read=read,
            pack_seconds=time.perf_counter() - started,
            seq_len=self.seq_len,
            slot=slot,
        )

    def detached(self) -> PackedStream:
        """This stream as a plain :class:`PackedStream` (what a worker is sent: unpickling it
        imports no torch). Shares this object's state."""
        out = PackedStream.__new__(PackedStream)
        out.__dict__.update(self.__dict__)
        return out

    def batches(self) -> Iterator[dict[str, Any]]:
        """The rest of the current epoch in this process: one dict of numpy arrays per step
        (the cursor moves as each is handed out)."""
        return (group.batch(i) for group, i in self.handed_steps())

    def handed_steps(self) -> Iterator[tuple[BuiltGroup, int]]:
        """The rest of the current epoch in this process, step by step as ``(group, i)``: step
        ``i`` of the read group that holds it (:meth:`BuiltGroup.batch` is its batch; the torch
        loader turns a group's arrays into tensors once, not per step). The cursor moves as each
        is handed out."""
        return self._iterate(None)

    def groups(self, worker: int, workers: int, *, keep: bool = False) -> Iterator[BuiltGroup]:
        """DataLoader worker ``worker`` of ``workers``: its groups of steps of the rest of the
        current epoch (groups ``worker, worker + workers, ...``), packed into a shared-memory
        ring where the platform has one, for the training process to hand out step by step.
        ``keep``: a persistent worker, whose object-store fetches outlive the pass and go on
        into its groups of the next epoch (as the training process's own do)."""
        return self._iterate((worker, workers), keep=keep)

    def _iterate(self, worker: tuple[int, int] | None, keep: bool = False) -> Iterator[Any]:
        info = worker
        wid, workers = worker if worker is not None else (0, 1)
        epoch, first = self.at.at
        view = self.view(epoch)
        total = view.steps
        size = self._group_steps(view, worker=info is not None)
        # worker w builds groups w, w + W, ...: the DataLoader's round-robin keeps the order
        groups = worker_groups(first, total, size, wid, workers)
        snapshot = self.stats.copy()  # a worker sends what it adds from here (sizing included)
        fetcher = None
        remote = is_remote(self.uri)
        # read groups per local take (worked out once: the fetcher's spans, when over one)
        in_worker = workers if info is not None else 0
        local_span = 1 if remote else self._local_span_groups(view, size, workers=in_worker)
        if groups and (remote or local_span > 1):
            fetcher = self._start_fetches(
                view, epoch, groups, size, keep=info is None or keep, worker=(wid, workers),
                local_span=local_span, local_spans=self._local_spans(in_worker),
            )  # fmt: skip
        self._size_reads(view, epoch, groups, fetcher, in_worker)
        assert self.sizing is not None
        threads, depth = self.sizing.io_threads, self.sizing.read_ahead
        if fetcher is not None and remote:  # reading is the fetcher's; these threads pack
            threads, depth = _PACK_THREADS, _PACK_AHEAD
        gauge = self.gauge
        # the group being handed out stays in the packed queue while its successor is submitted
        gauge.start(capacity=(depth + 1) * size)
        with ThreadPoolExecutor(threads, thread_name_prefix="tokenloom-read") as pool:
            ring = None
            if info is not None and groups:
                ring = WorkerRing(
                    depth + _SLOTS_IN_TRANSIT + _SLOTS_LENT, lendable=_SLOTS_LENT,
                    wait_s=_SLOT_WAIT_S,
                )  # fmt: skip
                ring.open(len(groups[0]) * self.step_values)
            # numba's compiled packer in the training process; a DataLoader worker's is built
            # ahead of time (no numba there), else it packs with numpy
            build = partial(self._build_group, compiled=info is None or _worker_kernels())

            def submit(i: int) -> Any:
                g = groups[i]
                fetch = None
                if fetcher is not None:
                    fetch = fetcher.get(i)
                return gauge.submit(pool, build, view, epoch, g, ring, fetch, steps=len(g))

            ahead = deque(submit(i) for i in range(min(depth, len(groups))))
            next_group = len(ahead)
            expected = groups[0].start if groups else total
            for index in range(len(groups)):
                group = gauge.take(ahead.popleft())
                if fetcher is not None:
                    fetcher.done(index)
                if next_group < len(groups):
                    ahead.append(submit(next_group))
                    next_group += 1
                assert group.first == expected  # groups are consumed in order
                expected += workers * size
                if info is not None:
                    # one message per group (the ring's memory crosses with the first one);
                    # the DataLoader splits it into steps and adds the worker's counters once
                    gauge.handed_out(self.stats, steps=group.steps)
                    extra, snapshot = self.stats.delta(snapshot), self.stats.copy()
                    assert ring is not None
                    yield replace(
                        group, worker=wid, slots=ring.descriptor(), extra=extra,
                        sent=time.monotonic(),
                    )  # fmt: skip
                    continue
                for i in range(group.steps):
                    self.stats.add_counts(group.step_stats(i))
                    gauge.handed_out(self.stats, steps=1)
                    self.at.delivered(epoch, group.first + i, total)
                    yield group, i
        if fetcher is not None and info is not None and not keep:
            fetcher.close()  # a worker's copy ends with its epoch, unless it is persistent

    def _warm_packer(self, view: EpochView, steps: range) -> None:
        """Pack read group ``steps`` from zeros of the token column's dtype and throw it away:
        the compiled packer (numba, and its cached code for these types) loads meanwhile, not
        after the first fetch (~1.1 s of CPU at a first pack, measured)."""
        layout, _ = self._group_layout(view, steps, keep=True)
        n = (layout.stops - layout.starts).astype(np.int64)
        offsets = np.zeros(len(n) + 1, dtype=np.int64)
        np.cumsum(n, out=offsets[1:])
        zeros = np.zeros(int(offsets[-1]), dtype=token_dtype(self.reader.field))
        masked = None if self.spec.loss_mask_column is None else np.zeros(len(zeros), dtype=bool)
        view.pack_group(layout, TokenSource(values=zeros, at=offsets[:-1]), offsets, masked=masked)

    def _start_fetches(
        self,
        view: EpochView,
        epoch: int,
        groups: list[range],
        size: int,
        *,
        keep: bool,
        worker: tuple[int, int] = (0, 1),
        local_span: int = 1,
        local_spans: int = _LOCAL_SPANS,
    ) -> FetchAhead:
        """The fetch spans of an object-store pipeline (:mod:`~tokenloom.loader.pipeline.fetch`).
        With ``keep`` (the training process, or a persistent worker) the fetcher outlives the epoch,
        goes on into the next one's first spans of this process's groups (``worker``: its index
        and the number of workers) while this one ends, and the next pass reuses them when it
        starts where this one ends. ``local_span``: on a local table, the read groups of a span
        (:meth:`_local_span_groups`, worked out by the caller), and ``local_spans`` the spans in
        flight (:meth:`_local_spans`)."""
        remote = is_remote(self.uri)
        if remote:
            per_span = self._span_groups(view, size)
            depth, parts = self._fetch_depth(), self._fetch_parts()
        else:  # one take per span, the next one taken while this one is packed
            per_span, depth, parts = local_span, local_spans, 1
        key = SpanKey(
            epoch=epoch, groups=tuple((g.start, g.stop) for g in groups), per_span=per_span
        )
        fetcher = self._fetcher if keep else None
        if fetcher is None:
            fetcher = FetchAhead(self.reader, depth=depth, parts=parts)
            if keep:
                self._fetcher = fetcher

        def rows_of(v: EpochView, gs: list[range]) -> Any:
            return lambda g: self._group_rows(v, gs[g])

        following = None
        if keep:

            def following() -> tuple[SpanKey, Any] | None:
                nxt = self.view(epoch + 1)
                gs = worker_groups(0, nxt.steps, size, *worker)
                if not gs:
                    return None
                k = SpanKey(epoch=epoch + 1, groups=tuple((g.start, g.stop) for g in gs),
                            per_span=per_span)  # fmt: skip
                return k, rows_of(nxt, gs)

        held = held_fetch = None
        # DataLoader workers share one held copy through the node's plan store: one fetches
        # and writes it, the others map it (one copy in the page cache, fetched once)
        store = self.planner.store if worker[1] > 1 else None
        if store is not None and not store.writable():
            store = None  # a copy per worker, within the budget
        copies = 1 if store is not None else worker[1]
        if remote and resident_reads(self._token_bytes(), processes=copies):
            selection = self.inputs.rowids  # every epoch of this version reads these rows

            def held() -> np.ndarray:
                return np.asarray(selection, dtype=np.uint64)

            if store is not None:
                held_fetch = partial(self._shared_held, store)

        carried = fetcher.carried
        fetcher.start(
            key, rows_of(view, groups), following=following, held=held, held_fetch=held_fetch
        )
        self.stats.spans_carried += fetcher.carried - carried
        return fetcher

    def _shared_held(self, store: PlanStore, rows: np.ndarray, parts: int) -> Fetched:
        """The held token lists of ``rows`` (the whole selection) from the plan store: the
        first process to ask fetches them and writes them there, the others map them
        (read-only). Its read is this process's: nothing when it mapped another's copy."""
        h = hashlib.sha256(
            f"held-v1;{self.uri};{self.version};{self.spec.token_column};"
            f"{self.spec.loss_mask_column}".encode()
        )
        h.update(np.ascontiguousarray(rows, dtype=np.uint64).view(np.uint8))
        fetched: list[Fetched] = []

        def build() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
            f = self.reader.fetch(rows, parts=parts, cached=True)
            fetched.append(f)
            arrays = {"rowids": f.rowids, "starts": f.starts, "lengths": f.lengths,
                      "values": f.values}  # fmt: skip
            if f.mask_pairs is not None and f.mask_ptr is not None:
                arrays["mask_pairs"] = f.mask_pairs.reshape(-1)
                arrays["mask_ptr"] = f.mask_ptr
            return arrays, {"rows": len(f.rowids)}

        arrays, _, path = store.arrays(h.hexdigest()[:32], build, folder="held", min_rows=0,
                                       keep=_HELD_KEPT)  # fmt: skip
        if path is None and fetched:  # the store is not writable: this process's own copy
            return fetched[0]
        pairs = arrays.get("mask_pairs")
        return Fetched(
            rowids=arrays["rowids"], starts=arrays["starts"], lengths=arrays["lengths"],
            values=arrays["values"], read=fetched[0].read if fetched else (0, 0, 0.0),
            mask_pairs=None if pairs is None else pairs.reshape(-1, 2),
            mask_ptr=arrays.get("mask_ptr"),
        )  # fmt: skip

    def _fetch_depth(self) -> int:
        """Fetch spans in flight: ``read_ahead`` given or measured (2 until measured)."""
        if self.read_ahead is not None:
            return self.read_ahead
        return self.sizing.read_ahead if self.sizing is not None and self.sizing.measured else 2

    def _fetch_parts(self) -> int:
        """Concurrent takes per fetch span: ``io_threads`` over the spans in flight."""
        threads = self.io_threads
        if threads is None and self.sizing is not None and self.sizing.measured:
            threads = self.sizing.io_threads
        if threads is None:
            return SPLIT_TAKE_PARTS
        return max(threads // self._fetch_depth(), 1)

    def _size_reads(
        self,
        view: EpochView,
        epoch: int,
        groups: list[range],
        fetcher: FetchAhead | None,
        workers: int,
    ) -> None:
        """Size the read pipeline (:attr:`sizing`). Locally: the explicit values, else 2
        threads and 4 groups ahead (fewer big ones covering :data:`_AHEAD_STEPS` steps, one per
        thread at least); a DataLoader worker with a core or less whose rows are taken in spans
        (the fetcher's threads take them: its own threads only pack) builds one group at a
        time, one ahead (:data:`_WORKER_PACK_THREADS`). On an object store (``fetcher``):
        ``read_ahead`` is the fetch spans
        in flight and ``io_threads`` the concurrent takes they are cut into; unless both are
        given, they are sized from the first span, fetched here and timed, with the CPU its
        groups will cost to pack (the first one packed and timed, times the span's groups):
        Little's law over the span's wall time and its whole CPU cost, plus the span being
        packed. Once per process: later epochs reuse the measure."""
        cores = available_cores(max(workers, 1))
        floor = 2
        explicit = self.io_threads is not None and self.read_ahead is not None
        remote = is_remote(self.uri)
        local_spans = fetcher is not None and not remote
        if explicit or fetcher is None or not remote:
            size = len(groups[0]) if groups else 1
            ahead = max(self.io_threads or floor, min(4, -(-_AHEAD_STEPS // size)))
            if local_spans and workers and cores < 2:
                floor = ahead = _WORKER_PACK_THREADS
            self.sizing = size_read_ahead(
                0.0, 0.0, cores=cores, io_threads=self.io_threads or floor,
                read_ahead=self.read_ahead or ahead,
            )  # fmt: skip
            if local_spans:  # one take each, 2 in flight
                assert fetcher is not None
                span_rows = len(np.unique(fetcher.span_rows(0)))
                self.sizing = replace(self.sizing, span_rows=span_rows)
                spans = fetcher.depth  # started at the pass's spans in flight (_local_spans)
                # the counters say what reads, as on an object store: the spans in flight and
                # their takes (the sizing's threads and depth are the packing's)
                reads = replace(self.sizing, io_threads=spans, read_ahead=spans)
                self.stats.record_sizing(reads)
                return
            elif fetcher is not None:  # spans in flight and their takes, as given
                assert self.io_threads is not None and self.read_ahead is not None
                span_rows = len(np.unique(fetcher.span_rows(0)))
                self.sizing = replace(
                    self.sizing, io_threads=self.io_threads, read_ahead=self.read_ahead,
                    span_rows=span_rows,
                )  # fmt: skip
                fetcher.resize(depth=self.read_ahead, parts=self._fetch_parts())
            self.stats.record_sizing(self.sizing)
            return
        if self.sizing is not None and self.sizing.measured:  # a later epoch: measured already
            self.stats.record_sizing(self.sizing)
            return
        self.reader.dataset  # noqa: B018 - opened before the clock starts
        # a held table: the probe is the first group's own rows (its lead), taken alone (its
        # GETs do not queue behind the whole fetch's), then the whole fetch starts; the
        # compiled packer loads while the lead is fetched (its depth is fixed: the probe's CPU
        # does not size anything)
        rows = fetcher.span_rows(0)
        warm = None
        if fetcher.holding and workers == 0:  # (a worker's packer loads no numba)
            warm = ThreadPoolExecutor(1, thread_name_prefix="tokenloom-warm")
            warming = warm.submit(self._warm_packer, view, groups[0])
        fetched, wall, cpu = timed(self.reader.fetch, rows)
        fetcher.hold()
        if warm is not None:
            warming.result()
            warm.shutdown()
        span = fetcher.put(0, fetched)  # nothing else fetched yet: the timing is the pack's
        _, _, pack_cpu = timed(self._build_group, view, epoch, groups[0], None, (span, False))
        pack_cpu *= min(fetcher.per_span, len(groups))  # all the span's groups
        span_bytes = max(fetched.read[1], 1)
        most = max(FETCH_AHEAD_BYTES // span_bytes - 1, 1)
        if self.reader.block_size is not None:  # per-row reads: about a GET per row
            most = min(most, max(ROWS_IN_FLIGHT // max(len(fetched.rowids), 1), 1))
        if fetcher.holding:  # spans are leads, taken while the whole fetch runs: few at once
            most = 1
        depth = size_read_ahead(
            wall, cpu + pack_cpu, cores=cores, read_ahead=self.read_ahead, min_threads=1,
            max_ahead=most,
        ).io_threads + 1  # fmt: skip
        if self.read_ahead is not None:
            depth = self.read_ahead
        # the takes a span is cut into (split_rows never cuts runs under SPLIT_TAKE_ROWS rows)
        parts = min(SPLIT_TAKE_PARTS, max(len(fetched.rowids) // SPLIT_TAKE_ROWS, 1))
        if self.io_threads is not None:
            parts = max(self.io_threads // depth, 1)
        self.sizing = ReadAhead(
            io_threads=self.io_threads or depth * parts, read_ahead=depth, wall_s=wall,
            cpu_s=cpu, cores=cores, measured=True, span_rows=len(fetched.rowids),
            pack_cpu_s=pack_cpu,
        )  # fmt: skip
        fetcher.resize(depth=depth, parts=parts)
        self.stats.record_sizing(self.sizing)
        log.info("%s (%s)", self.sizing.describe(), self.uri)
