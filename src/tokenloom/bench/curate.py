"""Tokenize and dedup throughput on the bundled corpus.

Tokenize: the backfill (``tokenize_table``: plan, spawn N workers, read text from Lance, encode,
checkpoint, assemble, commit) next to the raw encoder on the same texts with the same number of
spawned workers (each reads its slice of the table and calls the tokenizer's batch encoder,
nothing written). Runs alternate; medians are compared.

Components: the near-dedup clustering's union-find (:func:`~tokenloom.curate.lsh.
connected_components`) next to ``scipy.sparse.csgraph.connected_components`` (plus the step that
turns scipy's labels into the smallest member index, which clustering needs) on the same pairs:
uniform random pairs, and LSH-like pairs (heavy-tailed clusters, each band linking a cluster's
members in a chain of its own random order, as buckets are visited). Both must give identical
labels; runs alternate; medians are compared.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "TokenizeBench",
    "run_tokenize_bench",
    "run_dedup_bench",
    "scipy_components",
    "component_graphs",
    "run_components_bench",
]


@dataclass(kw_only=True)
class TokenizeBench:
    """Measured figures of one run."""

    tokenizer: str
    workers: int
    tokens: int
    raw_seconds: list[float] = field(default_factory=list)
    backfill_seconds: list[float] = field(default_factory=list)

    @property
    def raw_tokens_s(self) -> float:
        return self.tokens / statistics.median(self.raw_seconds)

    @property
    def backfill_tokens_s(self) -> float:
        return self.tokens / statistics.median(self.backfill_seconds)

    @property
    def ratio(self) -> float:
        """Backfill throughput / raw encoder throughput (goal >= 0.85)."""
        return self.backfill_tokens_s / self.raw_tokens_s

    def to_json(self) -> dict:
        return {
            "tokenizer": self.tokenizer,
            "workers": self.workers,
            "tokens": self.tokens,
            "raw_tokens_s": round(self.raw_tokens_s),
            "backfill_tokens_s": round(self.backfill_tokens_s),
            "ratio": round(self.ratio, 3),
            "raw_seconds": self.raw_seconds,
            "backfill_seconds": self.backfill_seconds,
        }


def _raw_slice(args: tuple[str, str, int, int]) -> int:
    """Worker: read texts with lo <= id < hi and encode them with the bare batch encoder."""
    import lance

    from tokenloom.tokenize import load_tokenizer

    uri, spec, lo, hi = args
    tok = load_tokenizer(spec, num_threads=1)
    texts = lance.dataset(uri).to_table(columns=["text"], filter=f"id >= {lo} AND id < {hi}")
    n = 0
    for batch in texts.to_batches(max_chunksize=512):
        n += sum(len(x) for x in tok._encode_chunks(batch.column(0).to_pylist()))
    return n


def run_tokenize_bench(
    uri: str, *, spec: str = "gpt2", workers: int = 2, repeats: int = 3
) -> TokenizeBench:
    """Alternate the raw encoder pool and ``tokenize_table`` into a fresh column."""
    import lance

    from tokenloom.tokenize.column import tokenize_table

    n_rows = lance.dataset(uri).count_rows()
    slices = max(workers * 4, 1)
    bounds = [round(i * n_rows / slices) for i in range(slices + 1)]
    bench = TokenizeBench(tokenizer=spec, workers=workers, tokens=0)
    ctx = multiprocessing.get_context("spawn")
    for i in range(repeats):
        t0 = time.perf_counter()
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            tokens = sum(
                pool.map(_raw_slice, [(uri, spec, bounds[k], bounds[k + 1]) for k in range(slices)])
            )
        bench.raw_seconds.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        res = tokenize_table(
            uri,
            spec,
            column=f"input_ids_bench{i}",
            workers=workers,
            roundtrip_sample=0,
            progress=False,
        )
        bench.backfill_seconds.append(time.perf_counter() - t0)
        if res.tokens != tokens:
            raise AssertionError(f"backfill stored {res.tokens} tokens, raw encoded {tokens}")
        bench.tokens = tokens
    return bench


def run_dedup_bench(uri: str, *, workers: int = 2) -> dict:
    """Docs/s of exact and near dedup (per-row backfill + global step) on the table."""
    import lance

    from tokenloom.curate.jobs import dedup_exact, dedup_near

    n = lance.dataset(uri).count_rows()
    t0 = time.perf_counter()
    dedup_exact(uri, workers=workers, progress=False)
    exact = time.perf_counter() - t0
    t0 = time.perf_counter()
    dedup_near(uri, workers=workers, progress=False)
    near = time.perf_counter() - t0
    return {
        "docs": n,
        "workers": workers,
        "exact_docs_s": round(n / exact),
        "near_docs_s": round(n / near),
        "exact_seconds": exact,
        "near_seconds": near,
    }


def scipy_components(n: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The baseline: ``scipy.sparse.csgraph.connected_components``, labelled as ours are.

    Returns:
        ``(n,) int64``, the smallest node index of each node's component.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    index = np.int32 if n < 2**31 else np.int64
    graph = coo_matrix(
        (np.ones(len(u), dtype=np.int8), (np.asarray(u, index), np.asarray(v, index))),
        shape=(n, n),
    ).tocsr()
    count, label = connected_components(graph, directed=False)
    smallest = np.full(count, n, dtype=np.int64)
    np.minimum.at(smallest, label, np.arange(n, dtype=np.int64))
    return smallest[label]


def component_graphs(
    nodes: int, pairs: int, *, seed: int = 0
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The benchmark's edge sets over ``nodes`` ids, ``pairs`` edges each: ``{name: (u, v)}``.

    ``random``: uniform pairs. ``lsh``: a fifth of the ids (random ones) in clusters of Zipf(2)
    sizes capped at 10,000 (many pairs, a few large boilerplate clusters), the rest alone; each
    band joins every cluster's members in a chain of its own random order (what the bucket walk
    emits), bands repeat until ``pairs`` edges, so later bands mostly repeat connections.
    """
    rng = np.random.default_rng(seed)
    graphs = {"random": (rng.integers(0, nodes, pairs), rng.integers(0, nodes, pairs))}
    sizes = np.minimum(rng.zipf(2.0, nodes), 10_000)
    sizes = sizes[: np.searchsorted(np.cumsum(sizes), nodes // 5, side="right")]
    label = np.repeat(np.arange(sizes.size), sizes)  # (M,) cluster of each clustered id
    ids = rng.permutation(nodes)[: label.size]
    us, vs, total = [], [], 0
    while total < pairs:
        order = np.lexsort((rng.random(label.size), label))  # clusters, each shuffled
        same = np.flatnonzero(label[order][1:] == label[order][:-1])
        us.append(ids[order[same]])
        vs.append(ids[order[same + 1]])
        total += same.size
    graphs["lsh"] = (np.concatenate(us)[:pairs], np.concatenate(vs)[:pairs])
    return graphs


def run_components_bench(
    *, nodes: int = 2_000_000, pairs: int = 1_000_000, repeats: int = 5, seed: int = 0
) -> dict:
    """Seconds (median of alternating runs) of ours vs scipy on each graph; labels compared."""
    from tokenloom.curate.lsh import connected_components

    out: dict = {"nodes": nodes, "pairs": pairs, "repeats": repeats, "graphs": {}}
    for name, (u, v) in component_graphs(nodes, pairs, seed=seed).items():
        ours = connected_components(nodes, u, v)
        if not np.array_equal(ours, scipy_components(nodes, u, v)):
            raise AssertionError(f"{name}: union-find and scipy disagree on the components")
        times: dict[str, list[float]] = {"tokenloom": [], "scipy": []}
        for _ in range(repeats):
            for key, fn in (("tokenloom", connected_components), ("scipy", scipy_components)):
                t0 = time.perf_counter()
                fn(nodes, u, v)
                times[key].append(time.perf_counter() - t0)
        med = {k: statistics.median(t) for k, t in times.items()}
        out["graphs"][name] = {
            "components": int(np.unique(ours).size),
            "largest": int(np.bincount(ours).max()),
            "tokenloom_seconds": round(med["tokenloom"], 4),
            "scipy_seconds": round(med["scipy"], 4),
            "ratio_tokenloom_scipy": round(med["tokenloom"] / med["scipy"], 3),
        }
    return out
