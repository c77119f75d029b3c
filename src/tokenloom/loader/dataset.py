"""``PackedDataset`` and ``DataLoader``: the epoch plan materialised as torch batches.

The pure plan (:mod:`~tokenloom.loader.plan`) says which token of which row lands where; this
module reads those tokens (:mod:`~tokenloom.loader.read`), packs them
(:mod:`~tokenloom.loader.pack`) and hands out tensors. DataLoader worker ``w`` of ``W`` builds the
steps ``w, w+W, ...`` of this rank, and torch's DataLoader delivers workers' batches round-robin,
so the stream is the same for any number of workers. The state is ``(epoch, step)`` plus a
fingerprint of the plan's inputs.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from tokenloom.loader.gauge import PipelineGauge
from tokenloom.loader.planner import Planner
from tokenloom.loader.read import LoaderError, TokenReader
from tokenloom.loader.readahead import (
    READ_AHEAD_BYTES,
    TAKE_ROWS,
    ReadAhead,
    available_cores,
    log,
    rows_per_take,
    size_read_ahead,
    timed,
)
from tokenloom.loader.spec import LoaderSpec
from tokenloom.loader.state import LoaderState
from tokenloom.loader.stats import LoaderStats
from tokenloom.loader.view import EpochView, StepCounts
from tokenloom.process import env_topology
from tokenloom.table.storage import is_remote

__all__ = ["PackedDataset", "as_tensors"]

_META = "_loader"  # per-batch worker metadata, removed by DataLoader


class PackedDataset(IterableDataset):
    """Packed blocks of a token column, streamed from the table as a
    :class:`~tokenloom.loader.spec.LoaderSpec` says.

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
        allow_data_change: Accept a checkpoint whose table version/filter/tokenizer differ.
        io_threads: Threads reading and packing ahead (not part of the stream; default:
            sized from the first read group's measured wall and CPU time, see
            :mod:`~tokenloom.loader.readahead`; at least 2 in-process, 1 per DataLoader worker).
        read_ahead: Read groups in flight (default: sized with ``io_threads``).
        read_group: Steps per ``take`` (default: sized to ~256 rows per call).
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
        self.rank, self.world_size = env_topology(rank, world_size)
        if not 0 <= self.rank < self.world_size:
            raise LoaderError(f"rank {self.rank} is outside world_size {self.world_size}")
        self.blocks_per_rank = spec.per_rank(self.world_size)
        """Blocks this rank packs per step (``global_batch / world_size``)."""
        self.planner = Planner(spec, storage_options=storage_options, table=handle)
        self.spec = self.planner.spec
        """The spec, with the table version pinned."""
        self.allow_data_change = allow_data_change
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
        """Threads reading and packing ahead (``take`` and the packer release the GIL);
        ``None``: sized from a measured read group, at least 2 in the training process and 1
        in each DataLoader worker (the workers already run in parallel)."""
        self.read_ahead = read_ahead
        """Read groups in flight (at least ``io_threads``); ``None``: sized with them."""
        self.sizing: ReadAhead | None = None
        """How the last iteration sized its reads (in this process)."""
        self.read_group = read_group
        """Steps per ``take``; ``None``: sized to about 256 rows per take from the plan."""
        self.reader = TokenReader(
            self.uri, self.version, self.spec.token_column, storage_options=storage_options
        )
        self.stats = LoaderStats(rows_planned=len(self.inputs.row_ids))
        self.gauge = PipelineGauge()
        """Queue occupancy of this process's read pipeline (written into :attr:`stats`)."""
        self.last_counts: StepCounts | None = None
        """Per-pool counts of the batch built last (the DataLoader adds them up)."""
        self._epoch = int(epoch)
        self._step = 0

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
        """The plan's inputs (:class:`~tokenloom.loader.read.PlanInputs`)."""
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

    # -- the plan -----------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def step(self) -> int:
        """Global steps of this epoch delivered so far."""
        return self._step

    def plan(self, epoch: int | None = None) -> Any:
        """The epoch's plan (a :class:`~tokenloom.loader.view.BlockPlan`)."""
        return self.planner.plan(self._epoch if epoch is None else epoch)

    def view(self, epoch: int | None = None) -> EpochView:
        """The epoch cut into global steps (:class:`~tokenloom.loader.view.EpochView`)."""
        return self.planner.view(self._epoch if epoch is None else epoch)

    def epoch_info(self, epoch: int | None = None) -> dict:
        """Exact sizes of an epoch from stored counts: steps, blocks, tokens, padding, dropped."""
        return self.planner.epoch_info(self._epoch if epoch is None else epoch)

    def __len__(self) -> int:
        """Steps in the current epoch (the same on every rank)."""
        return self.view().steps

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch`` (from its start, unless the cursor is already in it)."""
        if epoch != self._epoch:
            self._epoch = int(epoch)
            self._step = 0

    # -- state --------------------------------------------------------------------------------

    def plan_inputs(self) -> dict:
        """The named inputs the stream depends on (world size and workers are not among them)."""
        return self.planner.plan_inputs()

    def state_dict(self) -> dict:
        """The exact cursor of batches delivered so far, with the plan's fingerprint."""
        return LoaderState.create(
            epoch=self._epoch, step=self._step, inputs=self.plan_inputs()
        ).to_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue the global stream a state was taken at (on any world size / workers).

        Raises:
            ResumeMismatchError: naming what changed and the override.
        """
        saved = LoaderState.from_dict(state)
        saved.check(self.plan_inputs(), allow_data_change=self.allow_data_change)
        self._epoch, self._step = saved.epoch, saved.step

    # -- iteration ----------------------------------------------------------------------------

    def _group_steps(self, view: EpochView) -> int:
        """Steps whose rows are read in one ``take``: about
        :func:`~tokenloom.loader.readahead.rows_per_take` rows per call (small takes pay a
        fixed cost each, on an object store one GET per row; very large ones lose locality)."""
        if self.read_group is not None:
            return self.read_group
        remote = is_remote(self.uri)
        # ~ rows + block cuts per step; on an object store distinct rows (what a GET fetches)
        stretches = len(self.inputs.row_ids) + (0 if remote else view.plan.num_blocks)
        per_step = max(stretches / max(view.steps, 1) / self.world_size, 1.0)
        width = self.reader.dataset.schema.field(self.spec.token_column).type.value_type
        take = rows_per_take(
            int(self.inputs.n_tokens.sum()) * max(width.bit_width // 8, 1), remote=remote
        )
        return int(min(max(take // per_step, 1), 64 * take // TAKE_ROWS))

    def _build_group(self, view: EpochView, steps: list[int]) -> list[_Built]:
        """Several steps read with ONE take of all their rows, then packed (in an I/O thread:
        ``take`` and the numpy packer release the GIL for most of their time)."""
        layouts = [view.layout(s, rank=self.rank, world_size=self.world_size) for s in steps]
        ids, rowids = self.inputs.row_ids, self.inputs.rowids
        stable = [rowids[np.searchsorted(ids, lay.spans.row_id)] for lay in layouts]
        docs = None
        if any(len(lay.spans) for lay in layouts):
            lens = np.concatenate([lay.spans.doc_len for lay in layouts])
            docs = self.reader.read(np.concatenate(stable), lens, self.seq_len)
        self.gauge.fetched()
        pools = len(self.spec.pool_names)
        out = []
        for lay, r in zip(layouts, stable, strict=True):
            tokens, offsets = self.reader.gather(
                lay.spans, lay.starts, lay.stops, r, self.seq_len, docs
            )
            started = time.perf_counter()
            packed = view.pack(lay, tokens, offsets)
            batch: dict[str, Any] = {
                "input_ids": packed.input_ids,
                "labels": packed.labels,
                "position_ids": packed.position_ids,
                "doc_ids": packed.doc_ids,
                "cu_seqlens": packed.cu_seqlens,
                "max_seqlen": int(packed.max_seqlen),
                "continues": packed.continues,
                "spans": packed.spans,
            }
            if packed.context is not None:
                batch["context"] = packed.context  # (n, 2) context-only range of each stretch
            if self.spec.mixture:
                batch["block_pool"] = lay.pools  # (B,) mixture pool of each block
            counts = view.count(lay, packed, pools)
            increments = {
                "rows_packed": len(lay.spans),
                "tokens": int(packed.real_tokens),
                "eos": int(packed.eos_positions),
                "padding": int(packed.padding_positions),
                "loss_positions": int(packed.loss_positions),
                "pack_seconds": time.perf_counter() - started,
            }
            out.append(_Built(step=lay.step, batch=batch, counts=counts, increments=increments))
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        wid, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, first = self._epoch, self._step
        view = self.view(epoch)
        total = view.steps
        steps = list(range(first + wid, total, workers))
        snapshot = self.stats.copy()
        size = self._group_steps(view)
        groups = [steps[i : i + size] for i in range(0, len(steps), size)]
        probed = self._size_reads(view, groups, workers if info is not None else 0)
        assert self.sizing is not None
        threads, depth = self.sizing.io_threads, self.sizing.read_ahead
        first_group = 1 if probed else 0
        gauge = self.gauge
        gauge.start(capacity=depth * size)
        with ThreadPoolExecutor(threads, thread_name_prefix="tokenloom-read") as pool:
            ahead = deque(
                gauge.submit(pool, self._build_group, view, g, steps=len(g))
                for g in groups[first_group : first_group + depth]
            )
            built: deque[_Built] = deque(probed)
            next_group = first_group + len(ahead)
            for step in steps:
                if not built:
                    built.extend(gauge.take(ahead.popleft()))
                    if next_group < len(groups):
                        g = groups[next_group]
                        ahead.append(gauge.submit(pool, self._build_group, view, g, steps=len(g)))
                        next_group += 1
                item = built.popleft()
                assert item.step == step  # groups are consumed in order
                batch, s = item.batch, self.stats
                for key, value in item.increments.items():
                    setattr(s, key, getattr(s, key) + value)
                self.last_counts = item.counts
                r = self.reader
                s.rows_read, s.bytes_read, s.read_seconds = (
                    r.rows_read,
                    r.bytes_read,
                    r.read_seconds,
                )
                s.steps += 1
                gauge.handed_out(s)
                if info is not None:
                    batch[_META] = {
                        "epoch": epoch,
                        "step": step,
                        "stats": s.delta(snapshot),
                        "counts": item.counts,
                        "sent": time.monotonic(),  # for the consumer's in-transit gauge
                    }
                    snapshot = s.copy()
                    yield batch  # numpy: one pickle to the main process, not one fd per tensor
                    continue
                self._step = step + 1
                if self._step >= total:
                    self._epoch, self._step = epoch + 1, 0
                yield as_tensors(batch)

    def _size_reads(self, view: EpochView, groups: list[list[int]], workers: int) -> list:
        """Size the read pipeline (:attr:`sizing`): explicit values as given; on an object
        store the others from the first group, built here and timed (its batches are returned,
        not built again; later epochs in this process reuse it); locally 2 threads in-process,
        1 per worker, 4 groups ahead."""
        cores = available_cores(max(workers, 1))
        floor = 1 if workers else 2
        explicit = self.io_threads is not None and self.read_ahead is not None
        if explicit or not groups or not is_remote(self.uri):
            self.sizing = size_read_ahead(
                0.0, 0.0, cores=cores, io_threads=self.io_threads or floor,
                read_ahead=self.read_ahead or max(self.io_threads or floor, 4),
            )  # fmt: skip
            self.stats.record_sizing(self.sizing)
            return []
        if self.sizing is not None and self.sizing.measured:  # a later epoch: measured already
            self.stats.record_sizing(self.sizing)
            return []
        self.reader.dataset  # noqa: B018 - opened before the clock starts
        built, wall, cpu = timed(self._build_group, view, groups[0])
        step_bytes = 4 * self.blocks_per_rank * self.seq_len * 8  # ids, labels, positions, docs
        self.sizing = size_read_ahead(
            wall, cpu, cores=cores, io_threads=self.io_threads, read_ahead=self.read_ahead,
            min_threads=floor, max_ahead=READ_AHEAD_BYTES // (len(groups[0]) * step_bytes),
        )  # fmt: skip
        self.stats.record_sizing(self.sizing)
        log.info("%s (%s)", self.sizing.describe(), self.uri)
        return built


@dataclass(frozen=True, eq=False)
class _Built:
    """One step's batch as an I/O thread built it, with what it adds to the counters."""

    step: int
    batch: dict[str, Any]
    counts: StepCounts
    increments: dict[str, float]


def as_tensors(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch's numpy arrays as torch tensors (zero-copy)."""
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
