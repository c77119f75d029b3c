"""``tokenloom bench plan``: build time and memory of the epoch plan at corpus scale.

The plan is computed from the stored counts alone, so it is measured on synthetic ``n_tokens``
arrays (lognormal lengths, median 450 / mean 800 tokens, as :mod:`tokenloom.bench.loader_data`)
of millions of documents, without a table. The selection stands for a filter keeping ``keep`` of
a table's rows (ids ascending with random gaps) whose ``_rowid`` are Lance row addresses
(fragment << 32 | offset, ``fragment_rows`` rows per fragment, written in id order). Each case
runs in fresh forked processes which first take the plan's inputs as a rank does after scanning
the table (:func:`~tokenloom.loader.pipeline.inputs.compact_inputs`: the ``id``, ``n_tokens`` and
``_rowid`` columns of :class:`~tokenloom.loader.pipeline.inputs.PlanInputs`, bit-packed), then plan
``epochs`` epochs from them and keep them, like the planner's cache of the current and next epoch
(both are held while a run crosses an epoch boundary):

* ``reference``: the former layout (int64 ``row_ids``, ``lengths``, ``starts`` by a stable
  ``argsort``) from the former inputs (three int64 arrays per process), for a side-by-side ratio;
* ``memory`` / ``memory xN``: :func:`~tokenloom.loader.plan.epoch.plan_epoch` without a store, each
of
  1 or N processes with its own inputs;
* ``shared xN``: N processes started together on an empty
  :class:`~tokenloom.loader.pipeline.planstore.PlanStore`; one writes the inputs and builds each
  layout, the others wait and map them
  (:meth:`~tokenloom.loader.pipeline.planstore.PlanStore.arrays`, as the planner's shared scan).

Memory is read, not estimated: each process's growth of anonymous memory (``Anonymous`` of
``/proc/self/smaps_rollup``: its private heap, what the node pays per process) and what numpy
holds (``tracemalloc``); the store's files are counted once per node. Bytes per document = (sum
over processes of the anonymous growth + the files) / documents, inputs included. Goals: < 10 s
per epoch and <= 12 bytes per document for the whole node. Lookups: microseconds per step of
``_LOOKUP_BATCH`` blocks to find their spans (``EpochPlan.spans``) and to resolve the spans'
stable row ids (``rowids[searchsorted(row_ids, span ids)]``, what the dataset does per step).
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import multiprocessing as mp
import os
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tokenloom.bench.loader_rss import allocated_bytes, anon_bytes, trim_heap

__all__ = [
    "GOAL_SECONDS",
    "GOAL_BYTES_PER_DOC",
    "PlanBenchConfig",
    "ProcRun",
    "PlanCase",
    "RecipeCost",
    "RECIPES",
    "synthetic_cut_points",
    "PlanBench",
    "run_plan_bench",
    "format_plan_report",
]

GOAL_SECONDS = 10.0
"""Most seconds to plan one epoch (the job waits on it before its first step)."""
GOAL_BYTES_PER_DOC = 12.0
"""Most bytes per document the plan may hold on one node, all processes together."""

_LOOKUP_STEPS = 200  # random steps whose spans are looked up, per process
_LOOKUP_BATCH = 64  # blocks per step in that lookup
_SAMPLE_S = 0.01  # seconds between two samples of the node's memory


RECIPES = ("concat", "window", "window_table", "best_fit", "mixture", "rows")
"""Recipes ``--recipes`` measures: concat; windows (``W = L``, ``O = L/8``) with cut points, an
epoch planned from the window table the planner keeps (``window``) and that table cut once from
the cut points when the planner opens (``window_table``); best-fit (fit window 1024, long rows
split; an epoch planned from the split table the planner cuts when it opens, counted with the
inputs); a 3-pool mixture (concat); the row loader's selection and plan."""


@dataclass(frozen=True, kw_only=True)
class PlanBenchConfig:
    """What ``tokenloom bench plan`` measures."""

    docs: tuple[int, ...] = (17_500_000, 100_000_000)
    """Corpus sizes (documents) to plan."""
    procs: int = 4
    """Processes sharing one node's store in the ``shared xN`` case."""
    epochs: int = 2
    """Epochs each process plans and keeps (the planner keeps the current and the next)."""
    seq_len: int = 2048
    """Positions per block."""
    seed: int = 0
    """Seed of the lengths and of the visiting order."""
    keep: float = 0.9
    """Share of the synthetic table's rows the selection keeps (the rest are gaps in the ids)."""
    fragment_rows: int = 1 << 20
    """Rows per fragment of the synthetic table (row addresses jump between fragments)."""
    reference_max_docs: int = 20_000_000
    """The former layout (~57 bytes per document while building) is measured up to this size."""
    recipe_docs: int = 1_000_000
    """Documents of the recipe measurement (0: skip it)."""
    recipes: tuple[str, ...] = RECIPES
    """Recipes measured at ``recipe_docs`` documents (see :data:`RECIPES`)."""
    workdir: str | None = None
    """Directory of the stores (a temporary directory by default; removed after)."""

    def __post_init__(self) -> None:
        if (not self.docs and not self.recipe_docs) or (self.docs and min(self.docs) < 1):
            raise ValueError(
                f"docs must be positive sizes (0 alone: recipes only), got {self.docs}"
            )
        if not 0 < self.keep <= 1 or self.fragment_rows < 1:
            raise ValueError(f"need 0 < keep <= 1 and fragment_rows >= 1 ({self})")
        bad = [r for r in self.recipes if r not in RECIPES]
        if bad:
            raise ValueError(f"recipes must be among {', '.join(RECIPES)}, got {bad}")
        if self.procs < 1 or self.epochs < 1 or self.seq_len < 1:
            raise ValueError(f"procs, epochs and seq_len must be >= 1 ({self})")


@dataclass(frozen=True, kw_only=True)
class ProcRun:
    """One process of a case."""

    seconds: float
    """Wall time to plan (or map) all its epochs, from the common start."""
    cpu_seconds: float
    """CPU time it spent on that (less sensitive than wall time to other jobs on the cores)."""
    anon_bytes: int
    """Growth of its anonymous memory while it holds the plans (-1: not on Linux)."""
    heap_bytes: int
    """Bytes numpy and Python hold for the plans (``tracemalloc``)."""
    heap_peak: int
    """Peak of that while planning."""
    built: int
    """Layouts this process built into the store."""
    lookup_us: float
    """Microseconds to look up one step's spans (``_LOOKUP_BATCH`` blocks), 0 when not measured."""
    rowid_us: float = 0.0
    """Microseconds to resolve the stable row ids of one step's spans, 0 when not measured."""
    inputs_bytes: int = 0
    """Bytes of the plan inputs this process holds in its own memory (0 when mapped)."""


@dataclass(frozen=True, kw_only=True)
class PlanCase:
    """One way of planning one corpus size."""

    name: str
    docs: int
    procs: int
    epochs: int
    runs: list[ProcRun]
    file_bytes: int
    """Bytes of the store's files, inputs included (counted once per node)."""
    inputs_file_bytes: int = 0
    """Of which the plan inputs' files."""
    peak_bytes: int = 0
    """Most the node held at any sampled moment while planning: every process's growth of
    anonymous memory plus the store's files (sampled every ``_SAMPLE_S`` seconds; the heap's
    free pages kept by the allocator count too)."""

    boundary_bytes: int = 0
    """Of which the most while crossing an epoch boundary: every process holds the previous
    epoch and the next one is planned (0 with one epoch)."""

    @property
    def peak_per_doc(self) -> float:
        return self.peak_bytes / self.docs

    @property
    def boundary_per_doc(self) -> float:
        return self.boundary_bytes / self.docs

    @property
    def inputs_per_doc(self) -> float:
        """Bytes per document the node holds for the plan's inputs (every process's own copy,
        or the store's files once)."""
        return (sum(r.inputs_bytes for r in self.runs) + self.inputs_file_bytes) / self.docs

    @property
    def seconds_per_epoch(self) -> float:
        """The slowest process's time per epoch."""
        return max(r.seconds for r in self.runs) / self.epochs

    @property
    def cpu_per_epoch(self) -> float:
        """The busiest process's CPU time per epoch."""
        return max(r.cpu_seconds for r in self.runs) / self.epochs

    @property
    def node_bytes(self) -> int:
        """Anonymous growth of every process (heap if unknown) plus the files once."""
        own = sum(max(r.anon_bytes, 0) if r.anon_bytes >= 0 else r.heap_bytes for r in self.runs)
        return own + self.file_bytes

    @property
    def bytes_per_doc(self) -> float:
        return self.node_bytes / self.docs

    @property
    def passed(self) -> bool:
        return self.seconds_per_epoch < GOAL_SECONDS and self.bytes_per_doc <= GOAL_BYTES_PER_DOC


@dataclass(frozen=True, kw_only=True)
class RecipeCost:
    """Time and memory of one epoch of one recipe, built in a fresh process from the inputs a
    rank holds (:func:`~tokenloom.loader.pipeline.inputs.compact_inputs`, or the row loader's
    selection).

    Memory is the process's anonymous memory, sampled every ``_SAMPLE_S`` seconds by the parent
    while the plan is built, over what the process held just before (its inputs)."""

    name: str
    docs: int
    seconds: float
    cpu_seconds: float = 0.0
    heap_bytes: int = 0
    """Growth of anonymous memory the plan still holds once built (heap trimmed)."""
    heap_peak: int = 0
    """Most growth of anonymous memory sampled while building (temporaries included)."""
    inputs_bytes: int = 0
    """Bytes of the inputs the plan is built from (held by the process before and after)."""

    @property
    def bytes_per_doc(self) -> float:
        return self.heap_bytes / self.docs

    @property
    def peak_per_doc(self) -> float:
        """Inputs plus the sampled peak of the build, per document: what the node needs."""
        return (self.inputs_bytes + self.heap_peak) / self.docs

    @property
    def passed(self) -> bool:
        """Within both goals; time is the process's CPU time (robust to other jobs on the
        cores, and no less than the wall time of a single-threaded build)."""
        return self.cpu_seconds < GOAL_SECONDS and self.peak_per_doc <= GOAL_BYTES_PER_DOC


@dataclass(frozen=True, kw_only=True)
class PlanBench:
    """Everything ``tokenloom bench plan`` measured."""

    config: PlanBenchConfig
    tokens: dict[int, int]
    """Real tokens of each corpus size."""
    cases: list[PlanCase]
    recipes: list[RecipeCost] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Cases left out, with the reason."""

    def to_json(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "goals": {"seconds_per_epoch": GOAL_SECONDS, "bytes_per_doc": GOAL_BYTES_PER_DOC},
            "tokens": {str(k): v for k, v in self.tokens.items()},
            "cases": [
                {
                    "name": c.name,
                    "docs": c.docs,
                    "procs": c.procs,
                    "epochs": c.epochs,
                    "seconds_per_epoch": c.seconds_per_epoch,
                    "cpu_seconds_per_epoch": c.cpu_per_epoch,
                    "node_bytes": c.node_bytes,
                    "bytes_per_doc": c.bytes_per_doc,
                    "file_bytes": c.file_bytes,
                    "inputs_file_bytes": c.inputs_file_bytes,
                    "inputs_bytes_per_doc": c.inputs_per_doc,
                    "peak_bytes_per_doc": c.peak_per_doc,
                    "boundary_peak_bytes_per_doc": c.boundary_per_doc,
                    "passed": c.passed,
                    "runs": [asdict(r) for r in c.runs],
                }
                for c in self.cases
            ],
            "recipes": [
                {
                    **asdict(r),
                    "bytes_per_doc": r.bytes_per_doc,
                    "peak_bytes_per_doc": r.peak_per_doc,
                    "passed": r.passed,
                }
                for r in self.recipes
            ],
            "skipped": self.skipped,
        }


def _reference_plan(ids: np.ndarray, lens: np.ndarray, seed: int, epoch: int) -> tuple:
    """The former in-memory layout: int64 row ids, lengths and every start, by stable argsort."""
    from tokenloom.loader.plan.shuffle import naive_epoch_permutation

    keep = lens > 0
    kept_ids, kept_lens = ids[keep], lens[keep]
    perm = naive_epoch_permutation(kept_ids.shape[0], seed=seed, epoch=epoch)
    order_ids, order_lens = kept_ids[perm], kept_lens[perm]
    starts = np.zeros(order_lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(order_lens + 1, out=starts[1:])
    return order_ids, order_lens, starts


def _lookup_us(plan: Any, seed: int, inputs: dict[str, Any]) -> tuple[float, float]:
    """Microseconds per step to find the spans of ``_LOOKUP_BATCH`` consecutive blocks, and to
    resolve their stable row ids as the dataset does."""
    steps = max(plan.num_blocks // _LOOKUP_BATCH, 1)
    picks = np.random.default_rng(seed).integers(0, steps, _LOOKUP_STEPS)
    found = []
    started = time.perf_counter()
    for s in picks.tolist():
        lo = s * _LOOKUP_BATCH
        blocks = np.arange(lo, min(lo + _LOOKUP_BATCH, plan.num_blocks), dtype=np.int64)
        found.append(plan.spans(blocks).row_id)
    spans = (time.perf_counter() - started) / _LOOKUP_STEPS * 1e6
    ids, rowids = inputs["row_ids"], inputs["rowids"]
    started = time.perf_counter()
    for row_id in found:
        rowids[np.searchsorted(ids, row_id)]
    spent = (time.perf_counter() - started) / _LOOKUP_STEPS * 1e6
    return spans, spent


def _child(
    mode: str,
    cfg: PlanBenchConfig,
    ids: np.ndarray,
    lens: np.ndarray,
    rowids: np.ndarray,
    root: str,
    barrier: Any,
    results: Any,
    phases: Any,
    slot: int,
) -> None:
    from tokenloom.loader.pipeline.inputs import compact_inputs, input_columns, input_parts
    from tokenloom.loader.pipeline.planstore import PlanStore
    from tokenloom.loader.plan.epoch import plan_epoch

    gc.collect()
    trim_heap()
    tracemalloc.start()
    anon0 = anon_bytes()
    store = PlanStore(root, min_docs=0) if mode == "shared" else None
    results.put((os.getpid(), anon0))  # the parent samples the node's memory from here on
    barrier.wait()
    started, cpu = time.perf_counter(), time.process_time()
    codec = (compact_inputs, input_parts, input_columns)  # imported before measuring
    inputs = _inputs(mode, ids, lens, rowids, store, cfg.seed, codec)
    del ids, lens, rowids  # the parent's arrays stand for the table; the process plans from
    # its inputs
    own = 0 if mode == "shared" else sum(a.nbytes for a in inputs.values())
    held: list[Any] = []
    for epoch in range(cfg.epochs):
        if epoch:  # crossing an epoch boundary: the previous epochs are held
            gc.collect()
            trim_heap()
            phases[slot] = epoch
        if mode == "reference":
            held.append(_reference_plan(inputs["row_ids"], inputs["n_tokens"], cfg.seed, epoch))
        else:
            plan = plan_epoch(
                inputs["row_ids"],
                inputs["n_tokens"],
                seed=cfg.seed,
                epoch=epoch,
                seq_len=cfg.seq_len,
                store=store,
            )
            int(np.add.reduce(plan.order, dtype=np.uint64))  # every page read once
            held.append(plan)
    phases[slot] = cfg.epochs
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    heap, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    gc.collect()
    trim_heap()  # what is held, not the free pages the allocator keeps from building
    anon = anon_bytes()
    lookup, rowid_us = _lookup_us(held[0], cfg.seed, inputs) if mode != "reference" else (0, 0)
    results.put(
        ProcRun(
            seconds=seconds,
            cpu_seconds=cpu,
            anon_bytes=anon - anon0 if anon0 >= 0 and anon >= 0 else -1,
            heap_bytes=heap,
            heap_peak=peak,
            built=store.built if store is not None else 0,
            lookup_us=lookup,
            rowid_us=rowid_us,
            inputs_bytes=own,
        )
    )
    del held, inputs


def _inputs(
    mode: str,
    ids: np.ndarray,
    lens: np.ndarray,
    rowids: np.ndarray,
    store: Any,
    seed: int,
    codec: tuple[Callable, Callable, Callable],
) -> dict[str, Any]:
    """The columns a rank holds after resolving its selection (the parent's arrays stand for
    the scan; ``codec``: :func:`~tokenloom.loader.pipeline.inputs.compact_inputs`, ``input_parts``
    and
    ``input_columns``, imported before measuring)."""
    compact, parts, columns = codec
    if mode == "reference":  # the former inputs: three int64 arrays
        return {
            "row_ids": ids.copy(),
            "n_tokens": lens.astype(np.int64),
            "rowids": rowids.astype(np.int64),
        }
    if store is None:
        return compact(ids, lens, rowids)
    key = hashlib.sha256(f"plan-bench;{ids.shape[0]};{seed}".encode()).hexdigest()[:32]
    arrays, meta, _ = store.arrays(key, lambda: parts(compact(ids, lens, rowids), {}))
    for a in arrays.values():
        int(np.add.reduce(a, dtype=np.uint64))  # every page read once, as a rank's plan does
    return columns(arrays, meta)


def _run_case(
    name: str,
    mode: str,
    procs: int,
    cfg: PlanBenchConfig,
    ids: np.ndarray,
    lens: np.ndarray,
    rowids: np.ndarray,
    root: str,
) -> PlanCase:
    ctx = mp.get_context("fork")  # children share the inputs copy-on-write, as workers do
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    phases = ctx.Array("i", procs, lock=False)  # epoch each process is planning
    children = [
        ctx.Process(
            target=_child,
            args=(mode, cfg, ids, lens, rowids, root, barrier, results, phases, k),
        )
        for k in range(procs)
    ]
    for c in children:
        c.start()
    start = dict(results.get() for _ in children)  # pid -> anonymous memory before planning
    stop, peak = threading.Event(), [0, 0]
    sampler = threading.Thread(
        target=_sample_node, args=(start, root, stop, peak, phases, cfg.epochs), daemon=True
    )
    sampler.start()
    runs = [results.get() for _ in children]
    stop.set()
    sampler.join()
    for c in children:
        c.join()
        if c.exitcode != 0:
            raise RuntimeError(f"plan bench process of {name!r} exited with {c.exitcode}")
    files = inputs = 0
    for base, _, names in os.walk(root):
        size = sum(os.path.getsize(os.path.join(base, n)) for n in names if n.endswith(".npy"))
        files += size
        if os.path.relpath(base, root).split(os.sep)[0] == "inputs":
            inputs += size
    return PlanCase(
        name=name,
        docs=int(ids.shape[0]),
        procs=procs,
        epochs=cfg.epochs,
        runs=runs,
        file_bytes=files,
        inputs_file_bytes=inputs,
        peak_bytes=peak[0],
        boundary_bytes=peak[1],
    )


def _sample_node(
    start: dict[int, int], root: str, stop: Any, peak: list[int], phases: Any, epochs: int
) -> None:
    """Every ``_SAMPLE_S``: the processes' growth of anonymous memory plus the store's files
    (temporary ones being written included); ``peak[0]`` keeps the largest sum, ``peak[1]``
    the largest while every process holds epoch 0 and some plan a later epoch."""
    while True:
        phase = min(phases)
        total = allocated_bytes(root)
        for pid, anon0 in start.items():
            anon = anon_bytes(pid)
            total += max(anon - anon0, 0) if anon >= 0 and anon0 >= 0 else 0
        peak[0] = max(peak[0], total)
        if 1 <= phase < epochs:
            peak[1] = max(peak[1], total)
        if stop.wait(_SAMPLE_S):
            return


def synthetic_selection(n: int, cfg: PlanBenchConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, rowids)`` of ``n`` selected rows: ids ascending with geometric gaps (a filter
    keeping ``cfg.keep`` of the rows), row addresses of a table written in id order in
    fragments of ``cfg.fragment_rows`` rows."""
    rng = np.random.default_rng(cfg.seed + 1)
    ids = np.cumsum(rng.geometric(cfg.keep, n)) - 1 if cfg.keep < 1 else np.arange(n)
    ids = ids.astype(np.int64, copy=False)
    frag = cfg.fragment_rows
    rowids = ((ids // frag).astype(np.uint64) << np.uint64(32)) | (ids % frag).astype(np.uint64)
    return ids, rowids


_RECIPE_NAMES = {
    "concat": "concat",
    "window": "window (W=L, O=L/8, cut points)",
    "window_table": "window table (once, from cut points)",
    "best_fit": "best_fit (fit_window=1024)",
    "mixture": "mixture (3 pools, concat)",
    "rows": "rows (selection + plan)",
}
_CUT_GAP = 60  # mean tokens between two synthetic cut points (sentence ends)


def synthetic_cut_points(
    ids: np.ndarray, lens: np.ndarray, window: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut points of the rows longer than ``window`` positions, as ``(row ids, offsets, values)``
    (CSR: row ``rows[i]``'s sorted token offsets are ``values[offsets[i]:offsets[i + 1]]``),
    about one per ``_CUT_GAP`` tokens, as sentence ends stored by ``tokenize --boundaries``."""
    rng = np.random.default_rng(seed + 2)
    long = np.flatnonzero(lens + 1 > window)
    n = lens[long]
    draws = np.maximum(n // _CUT_GAP, 1)
    offsets = np.zeros(long.shape[0] + 1, dtype=np.int64)
    np.cumsum(draws, out=offsets[1:])
    within = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], draws)
    spacing = np.repeat(n // draws, draws)
    values = within * spacing + rng.integers(1, np.maximum(spacing, 2))
    return ids[long], offsets, values


def _recipe_child(
    recipe: str,
    cfg: PlanBenchConfig,
    data: dict[str, Any],
    barrier: Any,
    results: Any,
) -> None:
    """Build one recipe's epoch 0 (and its view) from the inputs a rank holds; report."""
    from tokenloom.loader.pipeline.inputs import compact_inputs
    from tokenloom.loader.plan.mixture import Pool, plan_mixture
    from tokenloom.loader.plan.recipe import Recipe, plan_recipe_epoch
    from tokenloom.loader.plan.view import EpochView
    from tokenloom.loader.plan.window import CutPoints, window_table
    from tokenloom.rows.plan import RowPlan
    from tokenloom.rows.read import compact_selection

    ids, lens, rowids = data["ids"], data["lens"], data["rowids"]
    L = cfg.seq_len
    inputs: Any
    if recipe == "rows":  # what the row loader's scan leaves: the selection it holds
        inputs = compact_selection(1, ids, rowids)
        held = inputs.row_ids.nbytes + inputs.rowids.nbytes
    elif recipe == "mixture":  # one scan per pool (a filter each), then their union
        third = np.arange(ids.shape[0]) % 3
        inputs = [
            compact_inputs(ids[third == k], lens[third == k], rowids[third == k]) for k in (0, 1, 2)
        ]
        del third
        union = compact_inputs(ids, lens, rowids)  # the planner's map over every pool's rows
        held = sum(a.nbytes for cols in [*inputs, union] for a in cols.values())
    else:
        inputs = compact_inputs(ids, lens, rowids)
        held = sum(a.nbytes for a in inputs.values())
        if recipe.startswith("window"):  # as read_cut_points holds them: CSR, int32 offsets
            rows, offs, values = data["cuts"]  # the parent's arrays stand for the column

            def read(at: np.ndarray) -> Any:  # a batch of long rows' cut points, as the planner
                k = np.searchsorted(rows, ids[at])
                counts = offs[k + 1] - offs[k]
                ptr = np.zeros(k.shape[0] + 1, dtype=np.int64)
                np.cumsum(counts, out=ptr[1:])
                take = np.repeat(offs[k] - ptr[:-1], counts) + np.arange(int(ptr[-1]))
                return CutPoints(ids[at], ptr, values[take].astype(np.int32))

            inputs["cuts"] = read
            if recipe == "window":  # what the planner keeps, once it is open
                inputs["cuts"] = window_table(
                    inputs["row_ids"], inputs["n_tokens"], window=L, overlap=L // 8,
                    cut_points=read,
                )  # fmt: skip
        if recipe == "best_fit":  # the planner cuts the long rows' pieces once, when it opens
            inputs["cuts"] = window_table(
                inputs["row_ids"], inputs["n_tokens"], window=L, overlap=0
            )
        if "cuts" in inputs and not callable(inputs["cuts"]):
            t = inputs["cuts"]
            held += sum(a.nbytes for a in (t.rows, t.ptr, t.ends, t.bits) if a is not None)
    gc.collect()
    trim_heap()
    anon0 = anon_bytes()
    results.put((os.getpid(), anon0))
    barrier.wait()
    started, cpu = time.perf_counter(), time.process_time()
    common = {"seed": cfg.seed, "epoch": 0, "seq_len": L}
    if recipe == "rows":
        plan: Any = RowPlan.build(
            len(inputs.row_ids), seed=cfg.seed, epoch=0, global_batch=256, drop_last=False
        )
    elif recipe == "window_table":
        plan = window_table(
            inputs["row_ids"], inputs["n_tokens"], window=L, overlap=L // 8,
            cut_points=inputs["cuts"],
        )  # fmt: skip
    elif recipe == "mixture":
        pools = [
            Pool(name=f"p{k}", row_ids=cols["row_ids"], n_tokens=cols["n_tokens"], share=s)
            for k, (cols, s) in enumerate(zip(inputs, (0.5, 0.3, 0.2), strict=True))
        ]
        plan = plan_mixture(pools, budget_tokens=data["tokens"], global_batch=8, **common)
    else:
        rec = {
            "concat": Recipe(),
            "window": Recipe(long_docs="window", overlap=L // 8, cut_column="cut_points"),
            "best_fit": Recipe(packing="best_fit", fit_window=1024),
        }[recipe]
        plan = plan_recipe_epoch(
            inputs["row_ids"],
            inputs["n_tokens"],
            recipe=rec,
            cut_points=inputs.get("cuts"),
            **common,
        )
    if recipe not in ("rows", "window_table"):
        view = EpochView(
            plan,
            global_batch=8,
            drop_last=False,
            block_order="sequential",
            lookahead=False,
            eos_id=0,
            pad_id=0,
        )
        view.sizes  # noqa: B018 - what the planner's view computes
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    gc.collect()
    trim_heap()
    anon = anon_bytes()
    results.put(
        RecipeCost(
            name=_RECIPE_NAMES[recipe],
            docs=int(ids.shape[0]),
            seconds=seconds,
            cpu_seconds=cpu,
            heap_bytes=max(anon - anon0, 0) if anon0 >= 0 and anon >= 0 else 0,
            inputs_bytes=int(held),
        )
    )
    del plan, inputs


def _recipe_costs(
    cfg: PlanBenchConfig, root: str, log: Callable[[str], None] = print
) -> list[RecipeCost]:
    """Each recipe of ``cfg.recipes`` in its own forked process, memory sampled by the parent."""
    from tokenloom.bench.loader_data import CorpusSpec, doc_lengths

    n = cfg.recipe_docs
    lens = doc_lengths(CorpusSpec(docs=n, seed=cfg.seed))
    ids, rowids = synthetic_selection(n, cfg)
    data: dict[str, Any] = {"ids": ids, "lens": lens, "rowids": rowids, "tokens": int(lens.sum())}
    if "window" in cfg.recipes or "window_table" in cfg.recipes:
        data["cuts"] = synthetic_cut_points(ids, lens, cfg.seq_len, cfg.seed)
    ctx = mp.get_context("fork")
    out = []
    for recipe in cfg.recipes:
        barrier, results = ctx.Barrier(1), ctx.Queue()
        child = ctx.Process(target=_recipe_child, args=(recipe, cfg, data, barrier, results))
        child.start()
        start = dict([results.get()])
        stop, peak = threading.Event(), [0, 0]
        phases = ctx.Array("i", 1, lock=False)
        sampler = threading.Thread(
            target=_sample_node, args=(start, root, stop, peak, phases, 1), daemon=True
        )
        sampler.start()
        cost = results.get()
        stop.set()
        sampler.join()
        child.join()
        if child.exitcode != 0:
            raise RuntimeError(
                f"plan bench process of recipe {recipe!r} exited with {child.exitcode}"
            )
        cost = dataclasses.replace(cost, heap_peak=max(peak[0], cost.heap_bytes))
        log(
            f"[plan] {cost.name}: {cost.seconds:.2f} s ({cost.cpu_seconds:.2f} s cpu), "
            f"peak {cost.peak_per_doc:.2f} B/doc"
        )
        out.append(cost)
    return out


def run_plan_bench(cfg: PlanBenchConfig, *, log: Callable[[str], None] = print) -> PlanBench:
    """Measure every case of the module docstring for each corpus size of ``cfg``."""
    from tokenloom.bench.loader_data import CorpusSpec, doc_lengths

    cases: list[PlanCase] = []
    tokens: dict[int, int] = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tokenloom-plan-bench-", dir=cfg.workdir) as tmp:
        for n in cfg.docs:
            log(f"[plan] {n:,} documents: drawing lengths")
            lens = doc_lengths(CorpusSpec(docs=n, seed=cfg.seed))
            ids, rowids = synthetic_selection(n, cfg)
            tokens[n] = int(lens.sum())
            plan_cases = [("memory", "memory", 1), ("shared x1", "shared", 1)]
            if cfg.procs > 1:
                plan_cases.insert(1, (f"memory x{cfg.procs}", "memory", cfg.procs))
                plan_cases.append((f"shared x{cfg.procs}", "shared", cfg.procs))
            if n <= cfg.reference_max_docs:
                plan_cases.insert(0, ("reference (int64 arrays)", "reference", 1))
            else:
                skipped.append(
                    f"reference at {n:,} documents (over --reference-max-docs "
                    f"{cfg.reference_max_docs:,}: ~57 bytes per document while building)"
                )
            for name, mode, procs in plan_cases:
                log(f"[plan] {n:,} documents: {name}")
                root = os.path.join(tmp, f"{n}-{mode}-{procs}")
                os.makedirs(root)
                cases.append(_run_case(name, mode, procs, cfg, ids, lens, rowids, root))
            del ids, lens, rowids
            gc.collect()
        recipes = []
        if cfg.recipe_docs:
            log(f"[plan] recipes at {cfg.recipe_docs:,} documents")
            root = os.path.join(tmp, "recipes")
            os.makedirs(root)
            recipes = _recipe_costs(cfg, root, log)
    return PlanBench(config=cfg, tokens=tokens, cases=cases, recipes=recipes, skipped=skipped)


def format_plan_report(bench: PlanBench) -> str:
    """The bench as a text table with PASS/MISS against the goals."""
    cfg = bench.config
    lines = [
        f"epoch plan, lognormal lengths (median 450 / mean 800), seq_len {cfg.seq_len}, "
        f"{cfg.epochs} epoch(s) held per process; goals: < {GOAL_SECONDS:g} s per epoch, "
        f"<= {GOAL_BYTES_PER_DOC:g} B/doc per node (s/epoch: wall time of the slowest process; "
        "cpu s: its CPU time; B/doc node includes the plan inputs of every process, of which "
        "'inputs')",
        f"{'docs':>12}  {'case':<26}{'s/epoch':>8}{'cpu s':>7}{'B/doc node':>11}"
        f"{'peak':>7}{'@e1':>7}"
        f"{'inputs':>8}{'files MB':>9}{'heap B/doc':>11}{'peak B/doc':>11}{'spans us/step':>14}"
        f"{'rowids us':>10}  goal",
    ]
    if not bench.cases:  # --docs 0: the recipes only
        lines = []
    refs = {c.docs: c for c in bench.cases if c.name.startswith("reference")}
    for c in bench.cases:
        n = c.docs
        heap = max(r.heap_bytes for r in c.runs) / n
        peak = max(r.heap_peak for r in c.runs) / n
        lookup = max(r.lookup_us for r in c.runs)
        rowid_us = max(r.rowid_us for r in c.runs)
        lines.append(
            f"{n:>12,}  {c.name:<26}{c.seconds_per_epoch:>8.2f}{c.cpu_per_epoch:>7.2f}"
            f"{c.bytes_per_doc:>11.2f}{c.peak_per_doc:>7.2f}"
            f"{c.boundary_per_doc:>7.2f}{c.inputs_per_doc:>8.2f}"
            f"{c.file_bytes / 1e6:>9.1f}{heap:>11.2f}{peak:>11.2f}"
            f"{(f'{lookup:.0f}' if lookup else '-'):>14}"
            f"{(f'{rowid_us:.0f}' if rowid_us else '-'):>10}  {'PASS' if c.passed else 'MISS'}"
        )
    for n, ref in refs.items():
        for c in bench.cases:
            if c.docs == n and c is not ref:
                speed = ref.seconds_per_epoch / c.seconds_per_epoch
                saved = ref.bytes_per_doc / max(c.bytes_per_doc, 1e-9)
                lines.append(
                    f"{n:>12,}  reference / {c.name}: time {speed:.2f}x, node memory {saved:.1f}x"
                )
    if bench.recipes:
        lines.append(
            f"recipes, epoch 0 in a fresh process ({bench.recipes[0].docs:,} documents; peak: "
            "the inputs held plus the sampled peak of the build, per document):"
        )
        lines.append(
            f"  {'recipe':<38}{'s':>7}{'cpu s':>7}{'inputs':>8}{'held':>7}{'peak':>7}  goal"
        )
        for r in bench.recipes:
            lines.append(
                f"  {r.name:<38}{r.seconds:>7.2f}{r.cpu_seconds:>7.2f}"
                f"{r.inputs_bytes / r.docs:>8.2f}{r.bytes_per_doc:>7.2f}{r.peak_per_doc:>7.2f}"
                f"  {'PASS' if r.passed else 'MISS'} (< {GOAL_SECONDS:g} s cpu, "
                f"<= {GOAL_BYTES_PER_DOC:g} B/doc)"
            )
    lines += [f"skipped: {s}" for s in bench.skipped]
    return "\n".join(lines)
