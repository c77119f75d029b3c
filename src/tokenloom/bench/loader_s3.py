"""``tokenloom bench loader --store s3``: the loaders reading from a real S3 server, side by side
with the same loaders reading the local copies, at several request latencies.

A SeaweedFS server (:class:`~tokenloom.dev.s3.LocalS3`) is started under the work dir on
127.0.0.1, the bench corpus's table, Parquet file and pre-packed MDS copy
(:mod:`~tokenloom.bench.loader_data`) are uploaded to its bucket, and each loader is measured
locally, then from the bucket directly (0 ms) and through a proxy that delays every request by
the given latency (:class:`~tokenloom.dev.proxy.FaultProxy`, no faults). Each case runs in a
fresh process (:func:`~tokenloom.bench.loader.run_case`); the server and the proxy run in this
one. The server, the proxy and the loaders share the machine's cores, so an S3 figure here is a
floor for a store on other machines; the CPU the server and the proxy used during each case is
reported beside it, with what the proxy saw (requests, bytes, requests in flight).

Two Parquet baselines read the same file: whole 1,024-row groups in random order (a much
weaker shuffle than a per-row one: a batch holds runs of neighbouring documents), and single
documents in a fresh global random order, the shuffle tokenloom delivers, with as many
documents fetched at once as tokenloom's measured read-ahead has concurrent takes at that
store. The ">= 10x random-access Parquet" goal is checked against the second.

The goals of a table larger than the loader's memory are checked on tokenloom's own run at each
store: S3 / local on the same table (>= 0.8x at 20 ms), the bytes the proxy relayed over the
bytes the loader used (<= 1.5x), the loader tree's peak RSS (<= 1 GB), and with ``scale_docs``
the peak RSS on this table over the peak RSS on a table of ``scale_docs`` documents read the
same way (<= 1.2x: flat as the table grows).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tokenloom.bench.loader_cases import CaseResult, CaseSpec
from tokenloom.bench.loader_data import EOS_ID, Built, CorpusSpec

if TYPE_CHECKING:
    from tokenloom.bench.loader import LoaderBenchConfig
    from tokenloom.dev.proxy import FaultProxy
    from tokenloom.dev.s3 import LocalS3

__all__ = [
    "S3_LOADERS",
    "S3BenchConfig",
    "S3Bench",
    "CaseIO",
    "run_s3_bench",
    "format_s3_report",
]

S3_LOADERS = ("tokenloom", "lance-rows", "parquet-rows", "parquet", "mds")
"""The loaders measured from the bucket (tokenloom first: the per-row Parquet baseline gets its
concurrency)."""
_LABELS = {
    "tokenloom": "tokenloom",
    "lance-rows": "Lance per-row takes, no packing (store bound)",
    "parquet-rows": "Parquet single rows, global shuffle",
    "parquet": "Parquet row groups, random order",
    "mds": "MDS pre-packed (remote= on S3)",
}
_COPY = {
    "tokenloom": "table",
    "lance-rows": "table",
    "parquet-rows": "parquet",
    "parquet": "parquet",
    "mds": "mds",
}
"""Which built copy each loader reads."""
_LOCAL = "local"


@dataclass(frozen=True, kw_only=True)
class CaseIO:
    """What the store side did during one case (``None``: not measurable here)."""

    seconds: float
    """Wall time of the case (its process's start-up included)."""
    loader_cpu_s: float | None
    """CPU time of the case's process tree (imports and start-up included)."""
    server_cpu_s: float | None
    """CPU time of the S3 server process."""
    proxy_cpu_s: float | None = None
    """CPU time of the proxy's thread (latency > 0 only)."""
    requests: int | None = None
    """Requests the proxy forwarded."""
    body_bytes: int | None = None
    """Response body bytes the proxy relayed."""
    in_flight_mean: float | None = None
    """Time-weighted mean of requests held by the proxy at once."""
    in_flight_peak: int | None = None


@dataclass(frozen=True, kw_only=True)
class S3BenchConfig:
    """One run of the object-store benchmark."""

    run: LoaderBenchConfig
    """The corpus, block shape, budget per case and work dir, as ``tokenloom bench loader``
    (its ``docs``, ``seq_len``, ``batch_size``, ``seed``, ``seconds``/``steps``, ``workdir``:
    the local copies are cached there, and the server's data lives in a temporary directory
    under it, removed at the end)."""
    latencies_ms: tuple[float, ...] = (0.0, 20.0)
    """Request latencies to measure (0: straight to the server, no proxy)."""
    only: tuple[str, ...] = S3_LOADERS
    """Loaders to measure (``parquet-rows`` takes its thread count from ``tokenloom`` when both
    are measured, else :data:`~tokenloom.loader.pipeline.readahead.MAX_THREADS`)."""
    scale_docs: int | None = None
    """Also measure tokenloom on a table of this many documents at every S3 store (``docs /
    10`` for the 1x-vs-10x memory check); ``None``: not measured."""
    layout: str = "list"
    """How the synthetic tables store the ids (``tokenloom tokenize --layout``)."""
    workers: int = 0
    """DataLoader workers of every case. 0: each loader reads in the measuring process (with
    its own threads); a small corpus's epoch lasts about a second, and spawned workers
    restart every epoch, which would be measured instead of reading."""

    def __post_init__(self) -> None:
        bad = sorted(set(self.only) - set(S3_LOADERS))
        if bad or not self.only:
            raise ValueError(f"the S3 bench measures some of {','.join(S3_LOADERS)}; got {bad}")
        if not self.latencies_ms or any(lat < 0 for lat in self.latencies_ms):
            raise ValueError(f"latencies must be >= 0 ms, got {self.latencies_ms!r}")
        if self.scale_docs is not None and not 0 < self.scale_docs < self.run.docs:
            raise ValueError(f"scale_docs must be in (0, {self.run.docs}), got {self.scale_docs}")
        # measured in S3_LOADERS' order: tokenloom's sizing sets the per-row baseline's threads
        object.__setattr__(self, "only", tuple(n for n in S3_LOADERS if n in self.only))

    @property
    def stores(self) -> list[str]:
        """Column labels: ``local`` and one per latency."""
        return [_LOCAL, *(f"S3 {lat:g} ms" for lat in self.latencies_ms)]


@dataclass(kw_only=True)
class S3Bench:
    """What one run measured: ``results[store][loader]``."""

    config: S3BenchConfig
    builds: dict[str, Built] = field(default_factory=dict)
    results: dict[str, dict[str, CaseResult]] = field(default_factory=dict)
    io: dict[str, dict[str, CaseIO]] = field(default_factory=dict)
    """``io[store][loader]``: the store side of each case."""
    threads: dict[str, int] = field(default_factory=dict)
    """Documents the per-row Parquet baseline fetched at once, per store."""
    scaled: dict[str, CaseResult] = field(default_factory=dict)
    """tokenloom on the ``scale_docs`` table, per S3 store."""
    scaled_io: dict[str, CaseIO] = field(default_factory=dict)

    def tokens_per_s(self, store: str, loader: str) -> float | None:
        r = self.results.get(store, {}).get(loader)
        return r.tokens_per_s if r is not None and r.ok else None

    def ratio(self, a: tuple[str, str], b: tuple[str, str]) -> float | None:
        x, y = self.tokens_per_s(*a), self.tokens_per_s(*b)
        return x / y if x is not None and y else None

    def ratios(self) -> list[tuple[str, str, float | None, str]]:
        """``(name, store, value, goal)`` rows of the report."""
        out = []
        for store in self.config.stores[1:]:
            goal = ">= 0.8 at 20 ms" if store == "S3 20 ms" else ""
            out.append(("tokenloom S3 / local", store, self.ratio(
                (store, "tokenloom"), (_LOCAL, "tokenloom")), goal))  # fmt: skip
            out.append(("Lance per-row takes S3 / local", store, self.ratio(
                (store, "lance-rows"), (_LOCAL, "tokenloom")), ""))  # fmt: skip
            out.append(("tokenloom / Lance per-row takes", store, self.ratio(
                (store, "tokenloom"), (store, "lance-rows")), ""))  # fmt: skip
            out.append(("tokenloom / Parquet rows, both S3", store, self.ratio(
                (store, "tokenloom"), (store, "parquet-rows")), ">= 10"))  # fmt: skip
            out.append(("tokenloom / Parquet row groups", store, self.ratio(
                (store, "tokenloom"), (store, "parquet")), ""))  # fmt: skip
            out.append(("tokenloom / MDS, both S3", store, self.ratio(
                (store, "tokenloom"), (store, "mds")), ""))  # fmt: skip
            out.append(("tokenloom fetched / used bytes", store, self.fetched_over_used(
                store), "<= 1.5"))  # fmt: skip
            # informative: fetches in flight at the first batch and each page's index read on
            # its first use fall inside the window (docs/bench-loader.md has a drained probe)
            for loader in ("tokenloom", "lance-rows"):
                out.append((f"  {loader} reads from batch 1", store,
                            self.token_reads_over_used(store, loader), ""))  # fmt: skip
            r = self.results.get(store, {}).get("tokenloom")
            gb = r.peak_rss_mb / 1024 if r is not None and r.ok and r.peak_rss_mb else None
            out.append(("tokenloom peak RSS (GB)", store, gb, "<= 1.0"))
            small = self.scaled.get(store)
            grew = None
            if gb and small is not None and small.ok and small.peak_rss_mb:
                grew = r.peak_rss_mb / small.peak_rss_mb  # type: ignore[union-attr]
            if self.config.scale_docs is not None:
                out.append(("tokenloom RSS, this table / scale", store, grew, "<= 1.2"))
        return out

    def fetched_over_used(self, store: str, *, scaled: bool = False) -> float | None:
        """Bytes the proxy relayed during tokenloom's case over the token bytes it read."""
        io = (self.scaled_io if scaled else self.io.get(store, {})).get(
            store if scaled else "tokenloom"
        )
        r = self.scaled.get(store) if scaled else self.results.get(store, {}).get("tokenloom")
        used = (r.figures or {}).get("bytes_read") if r is not None else None
        if io is None or not io.body_bytes or not used:
            return None
        return io.body_bytes / used

    def token_reads_over_used(self, store: str, loader: str = "tokenloom") -> float | None:
        """Bytes the token reads fetched from the first batch on, those in flight at the end
        included (Lance's I/O counters of the reader's dataset: no plan scan, no file
        metadata), over the token bytes their takes returned."""
        r = self.results.get(store, {}).get(loader)
        figures = (r.figures or {}) if r is not None else {}
        fetched, used = figures.get("reads_fetched"), figures.get("reads_taken")
        return fetched / used if fetched is not None and used else None

    def to_json(self) -> dict:
        return {
            "config": dataclasses.asdict(self.config),
            "builds": {k: b.__dict__ for k, b in self.builds.items()},
            "results": {
                store: {k: r.to_json() for k, r in row.items()}
                for store, row in self.results.items()
            },
            "io": {
                store: {k: dataclasses.asdict(v) for k, v in row.items()}
                for store, row in self.io.items()
            },
            "parquet_rows_threads": self.threads,
            "scaled": {store: r.to_json() for store, r in self.scaled.items()},
            "scaled_io": {store: dataclasses.asdict(v) for store, v in self.scaled_io.items()},
            "ratios": [
                {"name": n, "store": s, "value": v, "goal": g} for n, s, v, g in self.ratios()
            ],
        }


def _build(config: S3BenchConfig, log: Callable[[str], None]) -> dict[str, Built]:
    from tokenloom.bench.loader_data import build_mds, build_parquet, build_table

    root = os.path.abspath(os.path.expanduser(config.run.workdir))
    corpus = CorpusSpec(docs=config.run.docs, seed=config.run.seed, layout=config.layout)
    jobs = {
        "table": lambda: build_table(os.path.join(root, corpus.name + ".lance"), corpus),
        "parquet": lambda: build_parquet(os.path.join(root, corpus.name + ".parquet"), corpus),
        "mds": lambda: build_mds(
            os.path.join(root, f"{corpus.name}-L{config.run.seq_len}.mds"),
            corpus,
            seq_len=config.run.seq_len,
        ),
    }
    if config.scale_docs is not None:
        small = CorpusSpec(docs=config.scale_docs, seed=config.run.seed, layout=config.layout)
        jobs["scale"] = lambda: build_table(os.path.join(root, small.name + ".lance"), small)
    builds = {}
    names = [_COPY[loader] for loader in config.only]
    for name in dict.fromkeys([*names, *(["scale"] if config.scale_docs else [])]):
        built = jobs[name]()
        log(f"  {'reused' if built.cached else 'built'} {built.path} ({built.mbytes:,.0f} MB)")
        builds[name] = built
    return builds


def _upload(local: str, uri: str, options: dict) -> None:
    import pyarrow.fs as pafs

    from tokenloom.table.storage import filesystem

    fs, path = filesystem(uri, options)
    pafs.copy_files(local, path, destination_filesystem=fs)  # a file, or a directory's tree


def _measure(
    config: S3BenchConfig, loader: str, path: str, options: dict | None, threads: int
) -> CaseResult:
    from tokenloom.bench.loader import run_case

    spec = CaseSpec(
        label=_LABELS[loader],
        kind=loader,
        options=(("threads", threads),) if loader == "parquet-rows" else (),
        path=path,
        workers=config.workers,
        seq_len=config.run.seq_len,
        batch_size=config.run.batch_size,
        seconds=config.run.seconds,
        steps=config.run.steps,
        eos_id=EOS_ID,
        pad_id=EOS_ID,
        storage_options=tuple(sorted((options or {}).items())),
    )
    return run_case(spec, config.run)


def run_s3_bench(
    config: S3BenchConfig, *, log: Callable[[str], None] = lambda _msg: None
) -> S3Bench:
    """Build (or reuse) the local copies, serve them from a local S3 server, measure each
    loader locally and from the bucket at every latency."""
    from tokenloom.dev.proxy import FaultProxy
    from tokenloom.dev.s3 import LocalS3
    from tokenloom.loader.pipeline.readahead import MAX_THREADS

    bench = S3Bench(config=config)
    log("preparing the local copies ...")
    bench.builds = _build(config, log)
    root = os.path.abspath(os.path.expanduser(config.run.workdir))

    def measure(
        store: str,
        paths: dict[str, str],
        options: dict | None,
        server: LocalS3 | None = None,
        proxy: FaultProxy | None = None,
    ) -> None:
        row = bench.results.setdefault(store, {})
        for loader in config.only:
            threads = MAX_THREADS
            sizing = row["tokenloom"].figures if "tokenloom" in row else {}
            if sizing.get("io_threads"):
                threads = max(round(sizing["io_threads"]), 1)
            if loader == "parquet-rows":
                bench.threads[store] = threads
            log(f"measuring {_LABELS[loader]}, {store} ...")
            before = _store_side(server, proxy)
            result = _measure(config, loader, paths[_COPY[loader]], options, threads)
            if server is not None:
                after = _store_side(server, proxy)
                bench.io.setdefault(store, {})[loader] = _case_io(before, after)
            row[loader] = result
            if result.ok:
                log(f"  {result.tokens_per_s / 1e6:.2f}M tok/s, first batch "
                    f"{result.first_batch_s:.2f}s")  # fmt: skip
            else:
                log(f"  FAILED: {(result.error or 'no batches').splitlines()[0]}")

    def scale(
        store: str,
        paths: dict[str, str],
        options: dict | None,
        server: LocalS3,
        proxy: FaultProxy | None = None,
    ) -> None:
        """tokenloom on the ``scale_docs`` table (the 1x of the memory check)."""
        if "scale" not in paths:
            return
        log(f"measuring tokenloom on {config.scale_docs:,} documents, {store} ...")
        before = _store_side(server, proxy)
        result = _measure(config, "tokenloom", paths["scale"], options, 0)
        bench.scaled_io[store] = _case_io(before, _store_side(server, proxy))
        bench.scaled[store] = result
        if result.ok:
            log(f"  {result.tokens_per_s / 1e6:.2f}M tok/s, peak RSS {result.peak_rss_mb:,.0f} MB")

    measure(_LOCAL, {k: b.path for k, b in bench.builds.items() if k != "scale"}, None)
    with ExitStack() as stack:
        data = stack.enter_context(tempfile.TemporaryDirectory(prefix="s3-", dir=root))
        server = stack.enter_context(LocalS3(data))
        base = server.storage_options
        log(f"uploading to s3://{server.bucket} at {server.endpoint} ...")
        remote = {}
        for name, built in bench.builds.items():
            remote[name] = f"s3://{server.bucket}/{os.path.basename(built.path)}"
            _upload(built.path, remote[name], base)
        for store, latency in zip(config.stores[1:], config.latencies_ms, strict=True):
            if latency == 0:
                measure(store, remote, base, server)
                scale(store, remote, base, server)
                continue
            upstream = server.endpoint[len("http://") :]
            with FaultProxy(upstream, latency_ms=latency) as proxy:
                measure(store, remote, proxy.storage_options(base), server, proxy)
                scale(store, remote, proxy.storage_options(base), server, proxy)
    return bench


def _cpu_seconds(path: str) -> float | None:
    """User + system CPU seconds from a ``/proc/.../stat`` file (``None`` off Linux)."""
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _store_side(server: LocalS3 | None, proxy: FaultProxy | None) -> dict:
    """A snapshot of the server's and the proxy's counters (the proxy's in-flight gauge is
    restarted: it covers the next case)."""
    import resource
    import time

    done = resource.getrusage(resource.RUSAGE_CHILDREN)  # the cases' processes, once joined
    out: dict = {"t": time.monotonic(), "loader": done.ru_utime + done.ru_stime}
    if server is not None and server.pid is not None:
        out["server"] = _cpu_seconds(f"/proc/{server.pid}/stat")
    if proxy is not None:
        out["proxy"] = _cpu_seconds(f"/proc/self/task/{proxy.thread_id}/stat")
        out["requests"], out["bytes"] = proxy.requests, proxy.body_bytes
        out["flight"] = proxy.in_flight(reset=True)  # since the last snapshot
    return out


def _case_io(before: dict, after: dict) -> CaseIO:
    def diff(key: str) -> float | None:
        a, b = before.get(key), after.get(key)
        return None if a is None or b is None else b - a

    flight = after.get("flight")
    requests, nbytes = diff("requests"), diff("bytes")
    return CaseIO(
        seconds=after["t"] - before["t"],
        loader_cpu_s=diff("loader"),
        server_cpu_s=diff("server"),
        proxy_cpu_s=diff("proxy"),
        requests=None if requests is None else int(requests),
        body_bytes=None if nbytes is None else int(nbytes),
        in_flight_mean=None if flight is None else flight.mean,
        in_flight_peak=None if flight is None else flight.peak,
    )


def format_s3_report(bench: S3Bench) -> str:
    """The tokens/s table (loaders x stores), the ratios with their goals, what the store side
    did in each case, loader notes."""
    config = bench.config
    stores = config.stores
    lines = [
        f"{config.run.docs:,} documents, (B, L) = ({config.run.batch_size}, {config.run.seq_len}), "
        f"{config.workers} workers per loader; S3 = SeaweedFS on 127.0.0.1 (same cores), "
        "latency added per request by a proxy",
        f"  {'M tokens/s':<46}" + "".join(f"{s:>12}" for s in stores),
    ]
    for loader in config.only:
        cells = []
        for store in stores:
            v = bench.tokens_per_s(store, loader)
            cells.append(f"{v / 1e6:12.2f}" if v is not None else f"{'failed':>12}")
        lines.append(f"  {_LABELS[loader]:<46}" + "".join(cells))
    lines.append("ratios:")
    for name, store, value, goal in bench.ratios():
        unit = " " if "(GB)" in name else "x"
        shown = f"{value:8.2f}{unit}" if value is not None else f"{'n/a':>9}"
        status = ""
        if goal and value is not None:
            op, target = goal.split()[0], float(goal.split()[1])
            status = "PASS" if (value <= target if op == "<=" else value >= target) else "MISS"
        lines.append(f"  {name:<34} {store:<10} {shown}  {goal:<16} {status}".rstrip())
    if "parquet-rows" in config.only and bench.threads:
        per = ", ".join(f"{store} {n}" for store, n in bench.threads.items())
        lines.append(
            "Parquet single rows: each document fetched alone (one row group's column chunk "
            f"read and decoded per document), in a fresh global random order; fetched at once: "
            f"{per} (tokenloom's concurrent takes at that store)"
        )
    if "parquet" in config.only:
        lines.append(
            "Parquet row groups: 1,024 neighbouring documents per group, in file order within "
            "it: a much weaker shuffle than a per-row one, so its ratio carries no goal"
        )
    lines += _io_lines(bench)
    for store in stores:
        r = bench.results.get(store, {}).get("tokenloom")
        if r is not None and r.notes:
            lines.append(f"tokenloom, {store}: {r.notes}")
        if r is not None and r.error:
            lines.append(f"tokenloom, {store}: FAILED {r.error.splitlines()[0]}")
    return "\n".join(lines)


def _io_lines(bench: S3Bench) -> list[str]:
    """One row per S3 case: the proxy's requests, bytes and requests in flight, and the CPU the
    server and the proxy used (as a share of one core over the case)."""
    if not bench.io:
        return []

    def sec(cpu: float | None) -> str:
        return f"{cpu:8.1f}" if cpu is not None else f"{'':>8}"

    out = [
        "store side per case (requests, bytes fetched and in flight mean/peak seen by the "
        "proxy; wall and CPU seconds of the case, start-up included, CPU of its loader "
        "process, the server and the proxy; peak RSS of the loader's process tree):",
        f"  {'case':<50}{'requests':>9}{'rows/GET':>9}{'MB':>8}{'x used':>7}"
        f"{'in flight':>12}{'wall':>8}{'loader':>8}{'server':>8}{'proxy':>8}{'RSS MB':>8}",
    ]
    cases = [(store, loader, io, bench.results.get(store, {}).get(loader), _LABELS[loader])
             for store, row in bench.io.items() for loader, io in row.items()]  # fmt: skip
    cases += [
        (store, "tokenloom", io, bench.scaled.get(store),
         f"tokenloom, {bench.config.scale_docs:,} docs")
        for store, io in bench.scaled_io.items()
    ]  # fmt: skip
    for store, _loader, io, result, label in cases:
        figures = result.figures if result is not None else {}
        rss = f"{result.peak_rss_mb:8,.0f}" if result is not None else f"{'':>8}"
        req = f"{io.requests:9,}" if io.requests is not None else f"{'':>9}"
        per_get = used = ""
        if io.requests and figures.get("rows_read"):
            per_get = f"{figures['rows_read'] / io.requests:.1f}"
        if io.body_bytes and figures.get("bytes_read"):
            used = f"{io.body_bytes / figures['bytes_read']:.2f}"
        mb = f"{io.body_bytes / 1e6:8.0f}" if io.body_bytes is not None else f"{'':>8}"
        flight = ""
        if io.in_flight_mean is not None:
            flight = f"{io.in_flight_mean:.1f}/{io.in_flight_peak}"
        out.append(
            f"  {label + ', ' + store:<50}{req}{per_get:>9}{mb}{used:>7}"
            f"{flight:>12}{io.seconds:8.1f}{sec(io.loader_cpu_s)}{sec(io.server_cpu_s)}"
            f"{sec(io.proxy_cpu_s)}{rss}"
        )
    return out
