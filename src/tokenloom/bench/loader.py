"""Loader throughput next to LanceDB's StreamingDataset and baselines reading derived copies
(pre-packed MDS and WebDataset, Parquet in several access orders; see
:mod:`~tokenloom.bench.loader_baselines`), on the same synthetic corpus, measured side by side
in one run, with the input's page cache warm or dropped (:mod:`~tokenloom.bench.loader_cache`).

Every loader delivers ``(B, L) = (8, 1024)`` int64 torch tensors and nothing consumes them (no
model). Each case runs in a fresh spawned process so that its peak memory (the process plus its
DataLoader workers, sampled by :mod:`~tokenloom.bench.loader_rss`) is its own; throughput is
counted after the first batch, whose latency (dataset construction included) is reported apart.
The goals are ratios against tokenloom with two workers, all measured in the same run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from tokenloom.bench.loader_baselines import BASELINES, COPIES
from tokenloom.bench.loader_cache import CACHE_MODES, prepare_cache
from tokenloom.bench.loader_cases import CaseResult, CaseSpec, merge_rounds
from tokenloom.bench.loader_data import (
    EOS_ID,
    Built,
    CorpusSpec,
    build_table,
)
from tokenloom.bench.loader_report import (
    _BESTFIT,
    _BOUND,
    _BOUND2,
    _LONG,
    _MIXTURE,
    _TL0,
    _TL2,
    Goal,
    LoaderBench,
    format_report,
    in_process,
)
from tokenloom.bench.loader_rss import TreeSampler, tree_pids
from tokenloom.progress import progress

__all__ = [
    "ALL_LOADERS",
    "KNOWN_LOADERS",
    "LANCEDB_SWEEP",
    "LoaderBenchConfig",
    "Goal",
    "LoaderBench",
    "build_inputs",
    "plan_cases",
    "run_case",
    "run_loader_bench",
    "format_report",
]

ALL_LOADERS = (
    "tokenloom",
    "bound-workers",
    "lancedb",
    *(b.name for b in BASELINES),
    "long",
    "recipes",
)
"""The default selection (every loader ``--only`` knows; ``bound-workers``: the read bound with
tokenloom's two DataLoader workers too, beside the in-process one ``tokenloom`` brings)."""
KNOWN_LOADERS = ALL_LOADERS

LANCEDB_SWEEP: tuple[tuple[tuple[str, object], ...], ...] = (
    # Its defaults (io_queue_depth=4, one transform thread per core) through its own loader.
    (("loader", "own"), ("num_splits", 2)),
    # The tuned setting of LANCE-NOTES (best measured there), through a plain DataLoader.
    (
        ("io_queue_depth", 1),
        ("loader", "plain"),
        ("num_splits", 8),
        ("transform_parallelism", 1),
        ("transform_queue_depth", 4),
    ),
    # The same with one split per worker (fewer, longer packing buffers).
    (
        ("io_queue_depth", 1),
        ("loader", "plain"),
        ("num_splits", 2),
        ("transform_parallelism", 1),
        ("transform_queue_depth", 4),
    ),
)
"""The LanceDB knobs tried (num_splits / io_queue_depth / transform_*); the best is compared."""


@dataclass(frozen=True, kw_only=True)
class LoaderBenchConfig:
    """One benchmark run."""

    docs: int = 400_000
    """Documents of the synthetic corpus (lognormal lengths, median 450 / mean 800 tokens)."""
    seconds: float = 20.0
    """Measuring budget per loader, after its first batch."""
    steps: int | None = None
    """Measure this many batches per loader instead of a time budget."""
    workdir: str = "~/.cache/tokenloom/bench-loader"
    """Where the corpus and its copies are built once and reused."""
    only: tuple[str, ...] = ALL_LOADERS
    """Loaders to run (``long``: tokenloom on the long-document table)."""
    seq_len: int = 1024
    """Block length ``L`` of every loader."""
    batch_size: int = 8
    """Blocks per batch ``B`` of every loader: the size the goals and the main table are at."""
    batch_sizes: tuple[int, ...] = ()
    """The protocol's sweep (every loader at each ``B``; empty: ``batch_size`` alone)."""
    epochs: int = 1
    """Measuring windows of the budget per loader and batch size, each one rate
    (:mod:`tokenloom.bench.protocol`)."""
    rounds: int = 1
    """Times every loader is measured, in turn: round 1 runs each loader once (each in a fresh
    process), then round 2, ... A ratio is then the median of its rounds' ratios, each of two
    loaders measured minutes apart at most (on a shared machine whose speed drifts, one run
    each can be 20% off either way)."""
    seed: int = 0
    """Seed of the corpus (lengths and token ids)."""
    long_docs: int = 40
    """Documents of the long-document table."""
    long_tokens: int = 2_000_000
    """Tokens of each long document."""
    cache: tuple[str, ...] = ("warm",)
    """Page-cache states each case is measured in (``warm``, ``cold``), one run per state."""
    isolate: bool = True
    """Run each case in a fresh process (its own memory); ``False`` runs in this process."""
    rss_cap_mb: float = 8192.0
    """A case whose process tree passes this RSS is stopped and reported (shared machine)."""
    startup_timeout_s: float = 300.0
    """Time allowed on top of the budget (imports, plan, worker start, shutdown)."""
    lancedb_sweep: tuple[tuple[tuple[str, object], ...], ...] = LANCEDB_SWEEP

    def __post_init__(self) -> None:
        bad = sorted(set(self.only) - set(KNOWN_LOADERS))
        if bad or not self.only:
            raise ValueError(f"--only takes some of {','.join(KNOWN_LOADERS)}; got {self.only!r}")
        if self.docs < 1 or self.long_docs < 1 or self.long_tokens < 1:
            raise ValueError("docs, long_docs and long_tokens must be >= 1")
        if self.steps is None and self.seconds <= 0:
            raise ValueError(f"seconds must be > 0, got {self.seconds}")
        if not self.cache or set(self.cache) - set(CACHE_MODES):
            raise ValueError(f"cache takes some of {','.join(CACHE_MODES)}; got {self.cache!r}")
        if (
            self.epochs < 1
            or self.rounds < 1
            or self.batch_size < 1
            or any(b < 1 for b in self.batch_sizes)
        ):
            raise ValueError("epochs, rounds and batch sizes must be >= 1")

    @property
    def sizes(self) -> tuple[int, ...]:
        """The batch sizes measured, ``batch_size`` (the goals') first."""
        rest = tuple(b for b in self.batch_sizes if b != self.batch_size)
        return (self.batch_size, *rest)

    @property
    def corpus(self) -> CorpusSpec:
        return CorpusSpec(docs=self.docs, seed=self.seed)

    @property
    def long_corpus(self) -> CorpusSpec:
        return CorpusSpec(docs=self.long_docs, seed=self.seed, fixed_len=self.long_tokens)


BASELINE_WORKERS = (2, 0)
"""Every baseline (LanceDB's settings included) runs with two DataLoader workers and in the
measuring process: its best of the two is what tokenloom is compared with."""


def _lancedb_label(options: tuple[tuple[str, object], ...], workers: int = 2) -> str:
    o = dict(options)
    if o.get("loader") == "own":
        return (
            f"LanceDB defaults, StreamingDataLoader, {o.get('num_splits')} splits "
            f"(workers={workers})"
        )
    return (
        f"LanceDB {o.get('num_splits')} splits io={o.get('io_queue_depth')} "
        f"tx={o.get('transform_parallelism')} txq={o.get('transform_queue_depth')} "
        f"(workers={workers})"
    )


def plan_cases(config: LoaderBenchConfig, paths: dict[str, str]) -> list[CaseSpec]:
    """The cases of a run, in the order they are measured."""
    common = {
        "seq_len": config.seq_len,
        "batch_size": config.batch_size,
        "seconds": config.seconds,
        "steps": config.steps,
        "epochs": config.epochs,
        "eos_id": EOS_ID,
        "pad_id": EOS_ID,
    }
    cases = []
    if "tokenloom" in config.only or "long" in config.only:
        for workers, label in ((2, _TL2), (0, _TL0)):
            if workers == 0 and "tokenloom" not in config.only:
                continue
            cases.append(
                CaseSpec(
                    label=label, kind="tokenloom", path=paths["table"], workers=workers, **common
                )
            )
    if "tokenloom" in config.only:
        # the read bound: the same rows, plain takes, no packing (in the measuring process)
        cases.append(
            CaseSpec(label=_BOUND, kind="read-bound", path=paths["table"], workers=0, **common)
        )
    if "bound-workers" in config.only:
        # the same takes in as many DataLoader workers as tokenloom's: like for like
        cases.append(
            CaseSpec(label=_BOUND2, kind="read-bound", path=paths["table"], workers=2, **common)
        )
    if "long" in config.only:
        cases.append(CaseSpec(label=_LONG, kind="tokenloom", path=paths["long"], **common))
    if "recipes" in config.only:
        cases.append(
            CaseSpec(
                label=_BESTFIT,
                kind="tokenloom",
                path=paths["table"],
                options=(("packing", "best_fit"),),
                **common,
            )
        )
        cases.append(
            CaseSpec(
                label=_MIXTURE,
                kind="tokenloom",
                path=paths["table"],
                options=(("mixture", 330_000_000),),
                **common,
            )
        )
    if "lancedb" in config.only:
        for options in config.lancedb_sweep:
            for workers in BASELINE_WORKERS:
                cases.append(
                    CaseSpec(
                        label=_lancedb_label(options, workers),
                        kind="lancedb",
                        path=paths["table"],
                        options=options,
                        workers=workers,
                        **common,
                    )
                )
    for b in BASELINES:
        if b.name in config.only:
            for workers in BASELINE_WORKERS:
                cases.append(
                    CaseSpec(
                        label=b.label if workers else in_process(b.label),
                        kind=b.kind,
                        path=paths[b.copy],
                        options=b.options,
                        workers=workers,
                        **common,
                    )
                )
    return cases


def build_inputs(config: LoaderBenchConfig, log: Callable[[str], None]) -> dict[str, Built]:
    """Build (or reuse) the table and the copies the selected loaders read."""
    root = os.path.abspath(os.path.expanduser(config.workdir))
    corpus, long_corpus = config.corpus, config.long_corpus
    wanted = set(config.only)
    jobs: list[tuple[str, Callable[[], Built]]] = []
    if wanted & {"tokenloom", "bound-workers", "lancedb", "long"}:
        path = os.path.join(root, corpus.name + ".lance")
        jobs.append(("table", lambda: build_table(path, corpus)))
    if "long" in wanted:
        lpath = os.path.join(root, long_corpus.name + ".lance")
        jobs.append(("long", lambda: build_table(lpath, long_corpus)))
    copies = dict.fromkeys(b.copy for b in BASELINES if b.name in wanted)
    for name in copies:
        copy = COPIES[name]
        cpath = os.path.join(root, corpus.name + copy.suffix.replace("{L}", str(config.seq_len)))
        jobs.append((name, lambda c=copy, p=cpath: c.build(p, corpus, config.seq_len)))
    builds = {}
    for name, job in jobs:
        log(f"preparing {name} ...")
        built = job()
        how = "reused" if built.cached else "built"
        log(
            f"  {how} {built.path} ({built.docs:,} docs, {built.tokens:,} tokens, "
            f"{built.mbytes:,.0f} MB, build {built.seconds:.1f}s)"
        )
        builds[name] = built
    return builds


def _child(spec: CaseSpec, results: mp.Queue) -> None:
    """Entry point of a case's process: measure, send the result (or the error) back."""
    from tokenloom.bench.loader_cases import measure_case

    try:
        results.put(("ok", measure_case(spec)))
    except BaseException as exc:  # noqa: BLE001 - reported as the case's error
        tail = "".join(traceback.format_exception(exc)[-6:])
        results.put(("error", f"{type(exc).__name__}: {exc}\n{tail}"))


def _kill_tree(root: int) -> None:
    """SIGKILL the case's process and its descendants (only processes this run started)."""
    for pid in reversed(tree_pids(root)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def run_case(spec: CaseSpec, config: LoaderBenchConfig) -> CaseResult:
    """Measure one case, with the peak memory of its process tree and its CPU/memory over
    time."""
    if not config.isolate:
        from tokenloom.bench.loader_cases import measure_case

        with TreeSampler(os.getpid()) as sampler:
            try:
                result = measure_case(spec)
            except Exception as exc:  # noqa: BLE001 - reported, the other cases still run
                result = _failed(spec, f"{type(exc).__name__}: {exc}")
        return _with_memory(result, sampler)

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_child, args=(spec, results), name=f"tokenloom-bench-{spec.kind}")
    budget = spec.seconds if spec.steps is None else 600.0
    deadline = time.monotonic() + budget + config.startup_timeout_s
    outcome: tuple[str, object] | None = None
    proc.start()
    with TreeSampler(proc.pid) as sampler:
        while outcome is None:
            try:
                outcome = results.get(timeout=0.2)
            except queue_mod.Empty:
                if not proc.is_alive():
                    outcome = ("error", f"the case's process exited ({proc.exitcode}) silently")
                elif sampler.last.rss > config.rss_cap_mb * 2**20:
                    outcome = (
                        "error",
                        f"stopped: process tree RSS passed the cap of {config.rss_cap_mb:,.0f} MB",
                    )
                elif time.monotonic() > deadline:
                    limit = budget + config.startup_timeout_s
                    outcome = ("error", f"stopped: no result within {limit:.0f}s")
        proc.join(timeout=60)
        if proc.is_alive():
            _kill_tree(proc.pid)
            proc.join()
    kind, payload = outcome
    result = payload if kind == "ok" else _failed(spec, str(payload))
    return _with_memory(result, sampler)  # type: ignore[arg-type]


def _failed(spec: CaseSpec, error: str) -> CaseResult:
    return CaseResult(
        label=spec.label,
        kind=spec.kind,
        workers=spec.workers,
        options=dict(spec.options),
        batch_size=spec.batch_size,
        error=error,
    )


def _with_memory(result: CaseResult, sampler: TreeSampler) -> CaseResult:
    result.peak_rss_mb = sampler.peak_rss / 2**20
    result.peak_pss_mb = None if sampler.peak_pss is None else sampler.peak_pss / 2**20
    result.processes = sampler.peak_processes
    result.series = [asdict(p) for p in sampler.series]
    return result


def run_loader_bench(
    config: LoaderBenchConfig, *, log: Callable[[str], None] = lambda _msg: None
) -> LoaderBench:
    """Build or reuse the inputs, then measure every selected loader, one after the other,
    ``config.rounds`` times in turn (each case's rounds merged: :func:`merge_rounds`)."""
    bench = LoaderBench(config=config)
    bench.builds = build_inputs(config, log)
    paths = {name: built.path for name, built in bench.builds.items()}
    data = {path: name for name, path in paths.items()}
    # every loader at each batch size, one after the other (the goals' size first)
    cases = [
        replace(spec, batch_size=size)
        for spec in plan_cases(config, paths)
        for size in config.sizes
    ]
    runs = [
        (n, case, mode)
        for n in range(config.rounds)
        for case in enumerate(cases)
        for mode in config.cache
    ]
    measured: dict[tuple[int, str], list[CaseResult]] = {}
    with progress("bench loader", total=len(runs), unit="loaders") as bar:
        say = bar.logger(log)
        for n, (index, spec), mode in runs:
            at = f"B={spec.batch_size}, {mode}" if len(config.sizes) > 1 else mode
            if config.rounds > 1:
                at += f", round {n + 1}/{config.rounds}"
            bar.note(f"{spec.label} [{at}]")
            say(f"measuring {spec.label} [{at}] ...")
            state = prepare_cache([spec.path], mode)
            result = run_case(spec, config)
            result.data = data.get(spec.path, "")
            result.cache, result.resident, result.cache_note = mode, state.resident, state.note
            measured.setdefault((index, mode), []).append(result)
            bar.update()
            if result.ok:
                say(
                    f"  {result.tokens_per_s / 1e6:.2f}M tok/s, first batch "
                    f"{result.first_batch_s:.2f}s, peak RSS {result.peak_rss_mb:,.0f} MB"
                    f"{'; ' + state.note if state.note else ''}"
                )
            else:
                say(f"  FAILED: {(result.error or 'no batches').splitlines()[0]}")
    bench.results = [merge_rounds(rounds) for rounds in measured.values()]
    return bench
