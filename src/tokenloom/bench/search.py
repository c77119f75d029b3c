"""Search on the bundled corpus: index build times and query latency (p50/p95).

The whole corpus (28,222 documents) is ingested and full-text indexed. Embedding every document
with MiniLM on a 2-core machine takes tens of minutes, so the vector part embeds an evenly spread
subset (``id % stride = 0``, about ``embed_rows`` documents; the other rows keep a null embedding
and are invisible to vector search) and measures the embedding throughput, from which the full
corpus' embedding time is extrapolated (labelled as such). Vector queries are timed both flat
(no index: what ``auto`` picks below 10,000 rows) and with an IVF_FLAT index forced on the same
rows. Latencies are end to end in-process calls of :func:`tokenloom.search.query.search` (open the
version, embed the query, search, build snippets) with the model already loaded; each query is
run ``repeats`` times after one warm-up.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

__all__ = ["QUERIES", "SearchBench", "run_search_bench"]

#: Queries across the corpus' sources (English/Spanish/French wiki, Shakespeare, KJV, Python).
QUERIES = [
    "the king of france",
    "wherefore art thou romeo",
    "and god said let there be light",
    "parse command line arguments",
    "open a file for reading",
    "history of the roman empire",
    "la revolución francesa",
    "la ville de paris",
    "a storm at sea and a shipwreck",
    "thread safe queue",
    "the river flows into the sea",
    "love and jealousy",
    "unicode normalization of strings",
    "the battle was lost",
    "famous painters of the renaissance",
    "a prophet in the wilderness",
]


@dataclass(kw_only=True)
class SearchBench:
    """Measured figures of one run (seconds unless named otherwise)."""

    rows: int
    embedded_rows: int
    stride: int
    ingest_seconds: float = 0.0
    fts_index_seconds: float = 0.0
    embed_seconds: float = 0.0
    embed_workers: int = 0
    ivf_index_seconds: float = 0.0
    ivf_partitions: int = 0
    query_embed_ms: list[float] = field(default_factory=list)
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    """Case name → every measured latency."""
    hits: dict[str, float] = field(default_factory=dict)
    """Case name → mean number of hits returned (K = 10)."""

    @property
    def embed_rows_s(self) -> float:
        return self.embedded_rows / self.embed_seconds if self.embed_seconds else 0.0

    @property
    def full_embed_minutes(self) -> float:
        """The whole corpus' embedding time at the measured rate (an extrapolation)."""
        return self.rows / self.embed_rows_s / 60 if self.embed_rows_s else 0.0

    def percentiles(self) -> dict[str, tuple[float, float]]:
        return {k: (_pct(v, 50), _pct(v, 95)) for k, v in self.latencies_ms.items()}

    def to_json(self) -> dict:
        return {
            "rows": self.rows,
            "embedded_rows": self.embedded_rows,
            "stride": self.stride,
            "ingest_seconds": round(self.ingest_seconds, 2),
            "fts_index_seconds": round(self.fts_index_seconds, 2),
            "embed_seconds": round(self.embed_seconds, 1),
            "embed_workers": self.embed_workers,
            "embed_rows_s": round(self.embed_rows_s, 1),
            "full_embed_minutes_extrapolated": round(self.full_embed_minutes, 1),
            "ivf_index_seconds": round(self.ivf_index_seconds, 2),
            "ivf_partitions": self.ivf_partitions,
            "query_embed_ms_p50": round(_pct(self.query_embed_ms, 50), 2),
            "latency_ms": {
                k: {"p50": round(p50, 2), "p95": round(p95, 2), "mean_hits": self.hits[k]}
                for k, (p50, p95) in self.percentiles().items()
            },
        }


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def _time_case(bench: SearchBench, name: str, repeats: int, fn) -> None:  # noqa: ANN001
    lat, hits = [], []
    for query in QUERIES:
        fn(query)  # warm-up (page cache, index cache)
        for _ in range(repeats):
            started = time.perf_counter()
            res = fn(query)
            lat.append((time.perf_counter() - started) * 1000)
            hits.append(len(res.hits))
    bench.latencies_ms[name] = lat
    bench.hits[name] = round(statistics.mean(hits), 2)


def run_search_bench(
    uri: str, *, embed_rows: int = 4000, workers: int = 2, repeats: int = 5
) -> SearchBench:
    """Index and query the (already ingested) table at ``uri``; see the module docstring."""
    from tokenloom.search.embed import embed_table, embed_texts
    from tokenloom.search.index import build_indexes
    from tokenloom.search.query import search
    from tokenloom.table import Table

    rows = Table.open(uri).count_rows()
    stride = max(1, math.ceil(rows / embed_rows))
    subset = f"id % {stride} = 0"
    bench = SearchBench(rows=rows, embedded_rows=Table.open(uri).count_rows(subset), stride=stride)

    started = time.perf_counter()
    build_indexes(uri, vector=None)
    bench.fts_index_seconds = time.perf_counter() - started

    embed = embed_table(uri, workers=workers, where=subset, progress=False)
    bench.embed_seconds, bench.embed_workers = embed.seconds, embed.workers
    embed_texts(["warm up the query model"])
    for query in QUERIES:
        started = time.perf_counter()
        embed_texts([query])
        bench.query_embed_ms.append((time.perf_counter() - started) * 1000)

    kjv = "source = 'kjv'"
    rare = f"id % {stride * 100} = 0"  # 1% of the embedded rows: IVF falls back to flat
    k = 10

    def case(mode: str, where: str | None = None):  # noqa: ANN202
        return lambda q: search(uri, q, mode=mode, where=where, limit=k)

    _time_case(bench, "fts", repeats, case("fts"))
    _time_case(bench, f"fts where {kjv}", repeats, case("fts", kjv))
    _time_case(bench, "vector, flat", repeats, case("vector"))
    _time_case(bench, f"vector, flat, where {kjv}", repeats, case("vector", kjv))
    _time_case(bench, "hybrid, flat", repeats, case("hybrid"))

    started = time.perf_counter()
    res = build_indexes(uri, fts=None, vector_index="ivf_flat")
    bench.ivf_index_seconds = time.perf_counter() - started
    bench.ivf_partitions = res.num_partitions
    _time_case(bench, "vector, IVF_FLAT", repeats, case("vector"))
    _time_case(bench, f"vector, IVF_FLAT, where {kjv}", repeats, case("vector", kjv))
    _time_case(bench, f"vector, IVF_FLAT, where {rare}", repeats, case("vector", rare))
    _time_case(bench, "hybrid, IVF_FLAT", repeats, case("hybrid"))
    return bench
