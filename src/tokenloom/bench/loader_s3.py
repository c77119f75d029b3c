"""``tokenloom bench loader --store s3``: the loaders reading from a real S3 server, side by side
with the same loaders reading the local copies, at several request latencies.

A SeaweedFS server (:class:`~tokenloom.dev.s3.LocalS3`) is started under the work dir on
127.0.0.1, the bench corpus's table, Parquet file and pre-packed MDS copy
(:mod:`~tokenloom.bench.loader_data`) are uploaded to its bucket, and each loader is measured
locally, then from the bucket directly (0 ms) and through a proxy that delays every request by
the given latency (:class:`~tokenloom.dev.proxy.FaultProxy`, no faults). Each case runs in a
fresh process (:func:`~tokenloom.bench.loader.run_case`); the server and the proxy run in this
one. The server, the proxy and the loaders share the machine's cores, so an S3 figure here is a
floor for a store on other machines.
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

__all__ = ["S3_LOADERS", "S3BenchConfig", "S3Bench", "run_s3_bench", "format_s3_report"]

S3_LOADERS = ("tokenloom", "parquet", "mds")
"""The loaders measured from the bucket."""
_LABELS = {
    "tokenloom": "tokenloom",
    "parquet": "Parquet row groups, random order",
    "mds": "MDS pre-packed (remote= on S3)",
}
_LOCAL = "local"


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
    requests: dict[str, int] = field(default_factory=dict)
    """Requests the proxy forwarded, per store (the MDS download included)."""

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
            out.append(("tokenloom / Parquet, both S3", store, self.ratio(
                (store, "tokenloom"), (store, "parquet")), ">= 10"))  # fmt: skip
            out.append(("tokenloom / MDS, both S3", store, self.ratio(
                (store, "tokenloom"), (store, "mds")), ""))  # fmt: skip
        return out

    def to_json(self) -> dict:
        return {
            "config": dataclasses.asdict(self.config),
            "builds": {k: b.__dict__ for k, b in self.builds.items()},
            "results": {
                store: {k: r.to_json() for k, r in row.items()}
                for store, row in self.results.items()
            },
            "proxy_requests": self.requests,
            "ratios": [
                {"name": n, "store": s, "value": v, "goal": g} for n, s, v, g in self.ratios()
            ],
        }


def _build(config: S3BenchConfig, log: Callable[[str], None]) -> dict[str, Built]:
    from tokenloom.bench.loader_data import build_mds, build_parquet, build_table

    root = os.path.abspath(os.path.expanduser(config.run.workdir))
    corpus = CorpusSpec(docs=config.run.docs, seed=config.run.seed)
    jobs = {
        "tokenloom": lambda: build_table(os.path.join(root, corpus.name + ".lance"), corpus),
        "parquet": lambda: build_parquet(os.path.join(root, corpus.name + ".parquet"), corpus),
        "mds": lambda: build_mds(
            os.path.join(root, f"{corpus.name}-L{config.run.seq_len}.mds"),
            corpus,
            seq_len=config.run.seq_len,
        ),
    }
    builds = {}
    for name in config.only:
        built = jobs[name]()
        log(f"  {'reused' if built.cached else 'built'} {built.path} ({built.mbytes:,.0f} MB)")
        builds[name] = built
    return builds


def _upload(local: str, uri: str, options: dict) -> None:
    import pyarrow.fs as pafs

    from tokenloom.table.storage import filesystem

    fs, path = filesystem(uri, options)
    pafs.copy_files(local, path, destination_filesystem=fs)  # a file, or a directory's tree


def _measure(config: S3BenchConfig, loader: str, path: str, options: dict | None) -> CaseResult:
    from tokenloom.bench.loader import run_case

    spec = CaseSpec(
        label=_LABELS[loader],
        kind=loader,
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

    bench = S3Bench(config=config)
    log("preparing the local copies ...")
    bench.builds = _build(config, log)
    root = os.path.abspath(os.path.expanduser(config.run.workdir))

    def measure(store: str, paths: dict[str, str], options: dict | None) -> None:
        row = bench.results.setdefault(store, {})
        for loader in config.only:
            log(f"measuring {_LABELS[loader]}, {store} ...")
            result = _measure(config, loader, paths[loader], options)
            row[loader] = result
            if result.ok:
                log(f"  {result.tokens_per_s / 1e6:.2f}M tok/s, first batch "
                    f"{result.first_batch_s:.2f}s")  # fmt: skip
            else:
                log(f"  FAILED: {(result.error or 'no batches').splitlines()[0]}")

    measure(_LOCAL, {k: b.path for k, b in bench.builds.items()}, None)
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
                measure(store, remote, base)
                continue
            upstream = server.endpoint[len("http://") :]
            with FaultProxy(upstream, latency_ms=latency) as proxy:
                measure(store, remote, proxy.storage_options(base))
                bench.requests[store] = proxy.requests
    return bench


def format_s3_report(bench: S3Bench) -> str:
    """The tokens/s table (loaders x stores), the ratios with their goals, loader notes."""
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
        shown = f"{value:8.2f}x" if value is not None else f"{'n/a':>9}"
        status = ""
        if goal and value is not None:
            target = float(goal.split()[1])
            status = "PASS" if value >= target else "MISS"
        lines.append(f"  {name:<32} {store:<10} {shown}  {goal:<16} {status}".rstrip())
    for store in stores:
        r = bench.results.get(store, {}).get("tokenloom")
        if r is not None and r.notes:
            lines.append(f"tokenloom, {store}: {r.notes}")
        if r is not None and r.error:
            lines.append(f"tokenloom, {store}: FAILED {r.error.splitlines()[0]}")
    for store, n in bench.requests.items():
        lines.append(f"proxy, {store}: {n:,} requests forwarded")
    return "\n".join(lines)
