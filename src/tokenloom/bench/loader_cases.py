"""One measured loader run ("case"): a source of ``(B, L)`` token tensors, driven for a budget.

Every source is a function ``spec -> iterator of (B, L) int64 tensors`` that builds its dataset
and loader when first advanced (so construction counts in the first-batch latency) and moves to
the next epoch by itself. :func:`measure_case` drives one in the current process; the
orchestrator (:mod:`tokenloom.bench.loader`) runs each in a fresh process to measure its memory.
torch, Lance and the baselines' packages are imported only inside the sources.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from tokenloom.bench.loader_rss import tree_cpu_total

__all__ = ["CaseSpec", "CaseResult", "SOURCES", "measure_case", "merge_rounds"]


@dataclass(frozen=True, kw_only=True)
class CaseSpec:
    """What to measure."""

    label: str
    """Row name in the report, e.g. ``tokenloom (workers=2)``."""
    kind: str
    """A key of :data:`SOURCES`."""
    path: str
    """The table, Parquet file, MDS or WebDataset directory read."""
    workers: int = 2
    """DataLoader worker processes (0: in the measuring process)."""
    seq_len: int = 1024
    batch_size: int = 8
    seconds: float = 20.0
    """Time budget after the first batch (ignored when ``steps`` is set)."""
    steps: int | None = None
    """Measure exactly this many batches after the first instead of a time budget."""
    epochs: int = 1
    """Measuring windows of the budget, back to back after the first batch (the protocol's
    epochs: each window's rate is kept, see :mod:`tokenloom.bench.protocol`)."""
    eos_id: int = 50256
    pad_id: int = 50256
    options: tuple[tuple[str, Any], ...] = ()
    """Source-specific knobs (the LanceDB sweep), as sorted pairs so the spec stays hashable."""
    storage_options: tuple[tuple[str, str], ...] = ()
    """Object-store options of ``path`` (sorted pairs); empty for a local path."""

    def __post_init__(self) -> None:
        if self.kind not in SOURCES:
            raise ValueError(f"unknown loader kind {self.kind!r}; one of {sorted(SOURCES)}")
        if self.workers < 0 or self.seq_len < 1 or self.batch_size < 1:
            raise ValueError(f"bad topology in {self}")
        if self.steps is None and self.seconds <= 0:
            raise ValueError(f"seconds must be > 0, got {self.seconds}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")

    def option(self, name: str, default: Any = None) -> Any:
        return dict(self.options).get(name, default)


@dataclass(kw_only=True)
class CaseResult:
    """What one case measured. Token counts are positions of the delivered ``input_ids``."""

    label: str
    kind: str
    workers: int
    options: dict = field(default_factory=dict)
    batch_size: int = 8
    """``B`` of the batches measured."""
    tokens: int = 0
    """``B * L`` per batch delivered after the first one."""
    steps: int = 0
    seconds: float = 0.0
    first_batch_s: float = 0.0
    """From constructing the dataset/loader to the first batch in hand."""
    baseline_rss_mb: float = 0.0
    """RSS of the measuring process after its imports, before the loader was built."""
    peak_rss_mb: float = 0.0
    """Peak of RSS summed over the process tree (set by the orchestrator)."""
    peak_pss_mb: float | None = None
    """Peak of PSS summed over the process tree (shared pages divided; ``None``: unknown)."""
    processes: int = 0
    data: str = ""
    """Which built input it read (a key of the run's builds: ``table``, ``mds``, ...)."""
    cache: str = "warm"
    """Page-cache state of that input when the case started (:mod:`.loader_cache`)."""
    resident: float | None = None
    """Share of the input's pages in the page cache at the start (``None``: not measurable)."""
    cache_note: str = ""
    """Why a ``cold`` run was not cold, when it was not."""
    notes: str = ""
    figures: dict = field(default_factory=dict)
    """Named figures a source reports (tokenloom: its read-ahead sizing and rows read), and what
    later passes attach (``model``, ``shuffle``)."""
    windows: list[float] = field(default_factory=list)
    """Tokens/s of each measuring window (epoch) after the first batch."""
    rounds: list[float] = field(default_factory=list)
    """Tokens/s of each round (``--rounds``: every loader measured once a round, in a fresh
    process, the rounds one after another), in order; empty with one round."""
    series: list[dict] = field(default_factory=list)
    """CPU % and RSS/PSS of the process tree over time (set by the orchestrator)."""
    cpu_seconds: float | None = None
    """CPU time (user + system) of the process tree over the measured windows (``None``: not
    measured)."""
    error: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_ns_per_token(self) -> float | None:
        """CPU nanoseconds the whole tree spent per token delivered: what a loader costs the
        machine, beside what it delivers (``None``: not measured)."""
        if self.cpu_seconds is None or self.tokens <= 0:
            return None
        return self.cpu_seconds / self.tokens * 1e9

    @property
    def ok(self) -> bool:
        return self.error is None and self.tokens > 0

    def to_json(self) -> dict:
        out = asdict(self)
        out["tokens_per_s"] = round(self.tokens_per_s, 1)
        ns = self.cpu_ns_per_token
        out["cpu_ns_per_token"] = None if ns is None else round(ns, 2)
        return out


def merge_rounds(results: list[CaseResult]) -> CaseResult:
    """One case's results of several rounds as one: tokens and seconds summed (its rate is the
    rounds' pooled rate), every window kept, :attr:`CaseResult.rounds` the rate of each round,
    the peaks the highest, the first batch the mean; series, figures and notes of the first
    round. A round that failed makes the case failed (its error, with the round's number): a
    figure is never judged on the rounds that happened to run.

    Raises:
        ValueError: No results, or results of different cases.
    """
    if not results:
        raise ValueError("no results to merge")
    first = results[0]
    if any(r.label != first.label or r.batch_size != first.batch_size for r in results):
        raise ValueError("merge_rounds takes the rounds of one case")
    if len(results) == 1:
        return first
    failed = next(((i, r) for i, r in enumerate(results) if not r.ok), None)
    if failed is not None:
        i, r = failed
        return replace(r, error=f"round {i + 1} of {len(results)}: {r.error or 'no batches'}")
    return replace(
        first,
        tokens=sum(r.tokens for r in results),
        steps=sum(r.steps for r in results),
        seconds=sum(r.seconds for r in results),
        first_batch_s=sum(r.first_batch_s for r in results) / len(results),
        baseline_rss_mb=max(r.baseline_rss_mb for r in results),
        peak_rss_mb=max(r.peak_rss_mb for r in results),
        peak_pss_mb=None
        if any(r.peak_pss_mb is None for r in results)
        else max(r.peak_pss_mb for r in results),  # type: ignore[type-var]
        processes=max(r.processes for r in results),
        cpu_seconds=None
        if any(r.cpu_seconds is None for r in results)
        else sum(r.cpu_seconds for r in results),  # type: ignore[misc]
        windows=[w for r in results for w in r.windows],
        rounds=[r.tokens_per_s for r in results],
    )


class _Notes:
    """Where a source leaves a one-line summary for the report (loader stats, chosen knobs)."""

    def __init__(self) -> None:
        self.text = ""
        self.figures: dict[str, float] = {}


def worker_args(workers: int, *, kept: bool = False) -> dict:
    """A bench case's torch ``DataLoader`` keywords with ``workers``: spawned workers (Lance is
    not fork-safe, and a fresh interpreter per worker is what training jobs pay too), kept from
    one epoch to the next with ``kept`` (a loader whose one ``DataLoader`` runs epoch after
    epoch: starting its workers again each epoch, ~1 s here, is not its best configuration, and
    the read bound's takes run on across epochs)."""
    if workers == 0:
        return {}
    args: dict = {"multiprocessing_context": "spawn"}
    if kept:
        args["persistent_workers"] = True
    return args


def tokenloom_batches(spec: CaseSpec, notes: _Notes) -> Iterator[Any]:
    """tokenloom's ``PackedDataset`` + ``DataLoader`` (epochs follow one another)."""
    from tokenloom.loader import DataLoader, PackedDataset

    recipe: dict[str, Any] = {}
    if spec.option("filter"):  # the read bound takes the rows the same filter selects
        recipe["filter"] = spec.option("filter")
    if spec.option("packing"):
        recipe["packing"] = spec.option("packing")
    if spec.option("mixture"):
        recipe["mixture"] = {"most": ("id % 10 != 0", 0.7), "tenth": ("id % 10 = 0", 0.3)}
        recipe["budget_tokens"] = int(spec.option("mixture"))
    ds = PackedDataset(
        spec.path,
        seq_len=spec.seq_len,
        global_batch=spec.batch_size,
        block_order="sequential",
        seed=0,
        eos_id=spec.eos_id,
        pad_id=spec.pad_id,
        storage_options=dict(spec.storage_options) or None,
        **recipe,
    )
    # workers kept from one epoch to the next, as the read bound's takes run on (on a small table
    # starting two workers each epoch, ~1 s, was most of an epoch's time); not worker_args: this
    # DataLoader chooses its workers' start method itself
    dl = DataLoader(ds, num_workers=spec.workers, persistent_workers=spec.workers > 0)
    first: tuple[int, int] | None = None  # (fetched, taken) token bytes at the first batch

    def io() -> tuple[int, int]:
        """Bytes the reader's dataset fetched (Lance's own I/O counters) and the bytes its takes
        returned, so far (this process's reader: ``workers=0``)."""
        dataset = ds.reader._ds
        return (dataset.io_stats_snapshot().read_bytes if dataset is not None else 0,
                ds.reader.bytes_read)  # fmt: skip

    try:
        while True:
            for batch in dl:
                yield batch["input_ids"]
                if first is None and spec.workers == 0:
                    first = io()  # what the start cost (each file's metadata) stays out
    finally:
        stats = dl.stats
        notes.text = stats.summary()
        n = max(stats.pipelines, 1)
        notes.figures = {
            "io_threads": stats.io_threads / n,
            "read_ahead": stats.read_ahead / n,
            "span_rows": stats.span_rows / n,
            "rows_read": stats.rows_read,
            "bytes_read": stats.bytes_read,
        }
        if first is not None:
            # what the token reads cost at the store once running: the proxy's figure also
            # holds the plan's scan and each file's metadata. The fetches in flight finish
            # first, so that both counters hold them.
            if ds._fetcher is not None:
                ds._fetcher.close()
                ds._fetcher._pool.shutdown(wait=True)
            fetched, taken = io()
            notes.figures["reads_fetched"] = fetched - first[0]
            notes.figures["reads_taken"] = taken - first[1]
        dl.close()  # the workers kept between epochs


def _lancedb_blocks_per_epoch(path: str, seq_len: int, num_splits: int) -> int:
    """The exact budget from the stored counts: floor((tokens + one EOS per doc) / L), rounded
    down to a multiple of ``num_splits`` (what its ``"auto"`` estimates from a sample)."""
    import lance
    import pyarrow.compute as pc

    counts = lance.dataset(path).to_table(columns=["n_tokens"]).column(0)
    blocks = (int(pc.sum(counts).as_py()) + len(counts)) // seq_len
    return blocks - blocks % num_splits


def lancedb_batches(spec: CaseSpec, notes: _Notes) -> Iterator[Any]:
    """``lancedb.streaming.StreamingDataset`` in its packed mode, through its own
    ``StreamingDataLoader`` (``loader="own"``) or a plain torch ``DataLoader``.

    ``spec.path`` is the tokenloom table itself (its own metadata lives in the ``id`` field,
    see :mod:`tokenloom.table.meta`, which LanceDB's reader accepts).
    """
    import os

    import lancedb
    from lancedb.streaming import StreamingDataLoader, StreamingDataset
    from torch.utils.data import DataLoader

    db = lancedb.connect(os.path.dirname(spec.path))
    table = db.open_table(os.path.basename(spec.path).removesuffix(".lance"))
    splits = int(spec.option("num_splits", max(spec.workers, 1)))
    knobs = {
        k: spec.option(k)
        for k in ("io_queue_depth", "transform_parallelism", "transform_queue_depth")
        if spec.option(k) is not None
    }
    budget = _lancedb_blocks_per_epoch(spec.path, spec.seq_len, splits)
    loader_cls = StreamingDataLoader if spec.option("loader", "plain") == "own" else DataLoader
    epoch = 0
    while True:
        ds = StreamingDataset(
            table,
            num_splits=splits,
            shuffle=True,
            shuffle_seed=0,
            epoch=epoch,
            columns=["input_ids"],
            pack_sequences=spec.seq_len,
            eos_id=spec.eos_id,
            pad_id=spec.pad_id,
            blocks_per_epoch=budget,
            **knobs,
        )
        dl = loader_cls(
            ds, batch_size=spec.batch_size, num_workers=spec.workers, **worker_args(spec.workers)
        )
        for batch in dl:
            yield batch["input_ids"]
        epoch += 1


def mds_batches(spec: CaseSpec, notes: _Notes) -> Iterator[Any]:
    """MosaicML ``StreamingDataset(local=...)`` over a pre-packed copy: ``shuffle=False`` on
    the pre-shuffled one, or its own shuffle (``options=(("shuffle_algo", "py1e"),)``)."""
    from torch.utils.data import DataLoader

    from tokenloom.bench.loader_mds import MDSBlocks, collate_blocks

    ds = MDSBlocks(
        spec.path,
        batch_size=spec.batch_size,
        shuffle_algo=spec.option("shuffle_algo"),
        storage_options=dict(spec.storage_options),
    )
    dl = DataLoader(
        ds,
        batch_size=spec.batch_size,
        num_workers=spec.workers,
        collate_fn=collate_blocks,
        **worker_args(spec.workers, kept=True),
    )
    while True:
        yield from dl


def _parquet_epochs(spec: CaseSpec, single_rows: bool) -> Iterator[Any]:
    """Epoch after epoch of a Parquet reader (see ``loader_parquet``) through a DataLoader."""
    from torch.utils.data import DataLoader

    from tokenloom.bench.loader_parquet import ParquetBlocks, ParquetRows

    source: Any = ParquetBlocks
    if single_rows:
        source = partial(ParquetRows, threads=int(spec.option("threads", 1)))
    epoch = 0
    while True:
        ds = source(
            spec.path,
            seq_len=spec.seq_len,
            batch_size=spec.batch_size,
            eos_id=spec.eos_id,
            epoch=epoch,
            order=spec.option("order", "random"),
            storage_options=dict(spec.storage_options),
        )
        args = worker_args(spec.workers)  # a new dataset (its epoch's order) each epoch
        yield from DataLoader(ds, batch_size=None, num_workers=spec.workers, **args)
        epoch += 1


def parquet_batches(spec: CaseSpec, notes: _Notes) -> Iterator[Any]:
    """Parquet row groups in random order (or ``options=(("order", "sequential"),)``: in file
    order), packed with numpy."""
    return _parquet_epochs(spec, single_rows=False)


def parquet_rows_batches(spec: CaseSpec, notes: _Notes) -> Iterator[Any]:
    """Parquet documents read one by one in a global random order, packed with numpy
    (``options=(("threads", N),)``: N documents fetched at once)."""
    return _parquet_epochs(spec, single_rows=True)


def webdataset_batches(spec: CaseSpec, notes: _Notes) -> Iterator[Any]:
    """``webdataset.WebDataset`` over the pre-packed, pre-shuffled tar shards."""
    from tokenloom.bench.loader_webdataset import batches

    return batches(
        spec.path,
        batch_size=spec.batch_size,
        workers=spec.workers,
        args=worker_args(spec.workers, kept=True),
    )


def prepacked_batches(spec: CaseSpec, notes: _Notes) -> Iterator[Any]:
    """The pre-packed Lance blocks copy (see ``loader_prepacked``)."""
    from tokenloom.bench.loader_prepacked import prepacked_batches as batches

    return batches(spec, notes)


def lance_rows_batches(spec: CaseSpec, notes: _Notes) -> Iterator[Any]:
    """The token column's rows taken in a fresh global random order and joined with EOS into
    ``(B, L)`` batches, nothing else: the rate the store allows a per-row reader (no plan, no
    ledger). Rows are taken as a per-row reader takes them (Lance's merge window
    :data:`~tokenloom.loader.pipeline.readahead.ROW_BLOCK_SIZE`), ``take_rows`` sorted rows per take
    and :data:`~tokenloom.loader.pipeline.readahead.ROWS_IN_FLIGHT` rows requested at once
    (``options=(("take_rows", N),)``)."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    import lance
    import numpy as np
    import torch

    from tokenloom.loader.pipeline.readahead import ROW_BLOCK_SIZE, ROWS_IN_FLIGHT
    from tokenloom.table.storage import is_remote
    from tokenloom.table.tokens import token_lists

    extra = {"block_size": ROW_BLOCK_SIZE} if is_remote(spec.path) else {}
    ds = lance.dataset(spec.path, storage_options=dict(spec.storage_options) or None, **extra)
    field = ds.schema.field("input_ids")
    k = int(spec.option("take_rows", 256))
    rows = np.random.default_rng(0).permutation(ds.count_rows())
    per_batch = spec.batch_size * spec.seq_len
    eos = np.array([spec.eos_id], dtype=np.int64)
    counts = {"rows": 0, "bytes": 0}

    def take(lo: int) -> np.ndarray:
        col = ds.take(np.sort(rows[lo : lo + k]).tolist(), columns=["input_ids"]).column(0)
        lists = token_lists(col, field)
        values, offs = lists.values, lists.offsets
        counts["rows"] += len(offs) - 1
        counts["bytes"] += int(offs[-1] - offs[0]) * values.itemsize
        parts = np.split(values[offs[0] : offs[-1]].astype(np.int64), offs[1:-1] - offs[0])
        return np.concatenate([x for p in parts for x in (p, eos)])

    held = np.zeros(0, dtype=np.int64)
    threads = max(ROWS_IN_FLIGHT // k, 1)
    first: tuple[int, int] | None = None
    pool = ThreadPoolExecutor(threads, thread_name_prefix="lance-rows")

    def parts() -> Iterator[np.ndarray]:
        """The takes' rows in order, ``threads`` takes in flight (epoch after epoch)."""
        ahead: deque = deque()
        while True:
            for lo in range(0, len(rows), k):
                ahead.append(pool.submit(take, lo))
                if len(ahead) >= threads:
                    yield ahead.popleft().result()

    try:
        for part in parts():
            held = np.concatenate([held, part])
            n = len(held) // per_batch
            for b in held[: n * per_batch].reshape(n, spec.batch_size, spec.seq_len):
                yield torch.from_numpy(b)
                if first is None:
                    first = (ds.io_stats_snapshot().read_bytes, counts["bytes"])
            held = held[n * per_batch :]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # the takes in flight finish: counted
        notes.text = f"{k} rows per take, {threads} takes at once"
        notes.figures = {"rows_read": counts["rows"], "bytes_read": counts["bytes"]}
        if first is not None:
            notes.figures["reads_fetched"] = ds.io_stats_snapshot().read_bytes - first[0]
            notes.figures["reads_taken"] = counts["bytes"] - first[1]


BOUND_TAKE_ROWS = 1024
"""Rows per take of the read bound (:func:`read_bound_batches`)."""


def read_bound_batches(spec: CaseSpec, notes: _Notes) -> Iterator[Any]:
    """The **read bound** of tokenloom on the same table: the rows tokenloom's plan selects
    (its ``filter`` included: the same :class:`~tokenloom.loader.pipeline.planner.Planner`), taken
    in a fresh random order each epoch, :data:`BOUND_TAKE_ROWS` sorted rows per plain Lance take
    through tokenloom's reader's own take, one take at a time in the measuring process
    (``options=(("takes_in_flight", N),)``: N at once in threads; with ``spec.workers`` > 0 the
    takes run in that many DataLoader workers, :mod:`tokenloom.bench.loader_bound`), and each
    take's token lists flattened into one int64 tensor — no plan, no packing, no EOS, no labels.
    The ``(B, L)``
    batches are views of that tensor (a batch across two takes is joined), so every token read
    is delivered and counted once."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import torch

    from tokenloom.bench.loader_bound import bound_order, flat_take
    from tokenloom.bench.loader_bound import worker_takes as from_workers
    from tokenloom.loader.pipeline.planner import Planner
    from tokenloom.loader.pipeline.read import TokenReader
    from tokenloom.loader.plan.spec import LoaderSpec

    filt = spec.option("filter")
    planner = Planner(
        LoaderSpec.from_options(
            table=spec.path, seq_len=spec.seq_len, global_batch=spec.batch_size,
            eos_id=spec.eos_id, pad_id=spec.pad_id, **({"filter": filt} if filt else {}),
        ),
        storage_options=dict(spec.storage_options) or None,
    )  # fmt: skip
    rowids = np.asarray(planner.inputs.rowids, dtype=np.uint64)
    reader = TokenReader(
        planner.uri, planner.version, planner.spec.token_column,
        storage_options=dict(spec.storage_options) or None,
    )  # fmt: skip
    k = int(spec.option("take_rows", BOUND_TAKE_ROWS))
    in_flight = int(spec.option("takes_in_flight", 1))
    per_batch = spec.batch_size * spec.seq_len
    counts = {"rows": 0, "tokens": 0}

    def take(ids: np.ndarray) -> torch.Tensor:
        flat = flat_take(reader, ids).astype(np.int64)
        counts["rows"] += len(ids)
        counts["tokens"] += len(flat)
        return torch.from_numpy(flat)

    def takes() -> Iterator[torch.Tensor]:
        epoch = 0
        pool = ThreadPoolExecutor(in_flight, thread_name_prefix="read-bound")
        try:
            while True:
                order = bound_order(rowids, epoch)
                if in_flight == 1:
                    for lo in range(0, len(order), k):
                        yield take(order[lo : lo + k])
                else:
                    ahead: deque = deque()
                    for lo in range(0, len(order), k):
                        ahead.append(pool.submit(take, order[lo : lo + k]))
                        if len(ahead) >= in_flight:
                            yield ahead.popleft().result()
                    while ahead:
                        yield ahead.popleft().result()
                epoch += 1
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def worker_takes() -> Iterator[torch.Tensor]:
        for flat, rows in from_workers(reader, rowids, k, spec.workers):
            counts["rows"] += rows
            counts["tokens"] += len(flat)
            yield flat

    held = torch.empty(0, dtype=torch.int64)
    source = worker_takes() if spec.workers > 0 else takes()
    try:
        for flat in source:
            if len(held):  # the batch across the two takes: its two parts joined
                need = per_batch - len(held)
                if len(flat) < need:
                    held = torch.cat([held, flat])
                    continue
                yield torch.cat([held, flat[:need]]).view(spec.batch_size, spec.seq_len)
                flat = flat[need:]
            n = len(flat) // per_batch
            yield from flat[: n * per_batch].view(n, spec.batch_size, spec.seq_len)
            held = flat[n * per_batch :]
    finally:
        source.close()  # stops the workers
        at_once = f"{spec.workers} DataLoader workers" if spec.workers else f"{in_flight} take(s)"
        notes.text = f"read bound: {k} rows per take, {at_once} at once"
        notes.figures = {"rows_read": counts["rows"], "tokens_read": counts["tokens"]}


def _lazy(module: str, name: str) -> Callable[[CaseSpec, _Notes], Iterator[Any]]:
    """A source defined in ``tokenloom.bench.<module>`` (imported when the case runs)."""
    import importlib

    return getattr(importlib.import_module(f"tokenloom.bench.{module}"), name)


SOURCES: dict[str, Callable[[CaseSpec, _Notes], Iterator[Any]]] = {
    "tokenloom": tokenloom_batches,
    "prepacked": prepacked_batches,
    "lancedb": lancedb_batches,
    "mds": mds_batches,
    "parquet": parquet_batches,
    "parquet-rows": parquet_rows_batches,
    "webdataset": webdataset_batches,
    "lance-rows": lance_rows_batches,
    "read-bound": read_bound_batches,
    "ray": lambda spec, notes: _lazy("loader_ray", "ray_batches")(spec, notes),
    "litdata": lambda spec, notes: _lazy("loader_litdata", "litdata_batches")(spec, notes),
}

_IMPORTS = {
    "tokenloom": ("torch", "lance", "tokenloom.loader.pipeline.dataloader"),
    "lancedb": ("torch", "lance", "lancedb.streaming"),
    "mds": ("torch", "tokenloom.bench.loader_mds"),
    "parquet": ("torch", "pyarrow.parquet", "tokenloom.bench.loader_parquet"),
    "parquet-rows": ("torch", "pyarrow.parquet", "tokenloom.bench.loader_parquet"),
    "webdataset": ("torch", "webdataset", "tokenloom.bench.loader_webdataset"),
    "prepacked": ("torch", "lance", "tokenloom.bench.loader_prepacked"),
    "lance-rows": ("torch", "lance"),
    "read-bound": (
        "torch",
        "lance",
        "tokenloom.loader.pipeline.planner",
        "tokenloom.bench.loader_bound",
    ),
    "ray": ("torch", "lance", "tokenloom.bench.loader_ray"),
    "litdata": ("torch", "tokenloom.bench.loader_litdata"),
}


def _rss_mb() -> float:
    import os

    from tokenloom.bench.loader_rss import tree_memory

    return tree_memory([os.getpid()], with_pss=False).rss / 2**20


def _window(spec: CaseSpec, it: Iterator[Any]) -> tuple[int, int, float]:
    """Drive ``it`` for one budget (``spec.steps`` batches or ``spec.seconds``): tokens,
    batches and seconds."""
    t0 = time.perf_counter()
    tokens = steps = 0
    while True:
        if spec.steps is not None:
            if steps >= spec.steps:
                break
        elif time.perf_counter() - t0 >= spec.seconds:
            break
        batch = next(it)
        tokens += batch.numel()
        steps += 1
    return tokens, steps, time.perf_counter() - t0


def measure_case(spec: CaseSpec) -> CaseResult:
    """Drive one source in this process: time to the first batch, then tokens for the budget,
    ``spec.epochs`` times (one rate per window in ``windows``).

    The imports are done before the clock starts (every loader pays them once per process).
    """
    import importlib

    for name in _IMPORTS[spec.kind]:
        importlib.import_module(name)
    result = CaseResult(
        label=spec.label,
        kind=spec.kind,
        workers=spec.workers,
        options=dict(spec.options),
        batch_size=spec.batch_size,
    )
    result.baseline_rss_mb = _rss_mb()
    notes = _Notes()
    started = time.perf_counter()
    it = SOURCES[spec.kind](spec, notes)
    try:
        first = next(it)
        result.first_batch_s = time.perf_counter() - started
        if tuple(first.shape) != (spec.batch_size, spec.seq_len):
            raise AssertionError(f"{spec.label}: batch shape {tuple(first.shape)}")
        tokens = steps = 0
        seconds = 0.0
        cpu = tree_cpu_total()
        for _ in range(spec.epochs):
            got, took, took_s = _window(spec, it)
            tokens, steps, seconds = tokens + got, steps + took, seconds + took_s
            result.windows.append(got / took_s if took_s > 0 else 0.0)
        result.cpu_seconds = tree_cpu_total() - cpu
        result.seconds = seconds
        result.tokens, result.steps = tokens, steps
    finally:
        it.close()  # shuts the DataLoader's workers down
    result.notes = notes.text
    result.figures = dict(notes.figures)
    return result
