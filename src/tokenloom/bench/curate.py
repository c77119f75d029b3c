"""Tokenize and dedup throughput on the bundled corpus.

Tokenize: the backfill (``tokenize_table``: plan, spawn N workers, read text from Lance, encode,
checkpoint, assemble, commit) next to the raw encoder on the same texts with the same number of
spawned workers (each reads its slice of the table and calls the tokenizer's batch encoder,
nothing written). Runs alternate; medians are compared.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

__all__ = ["TokenizeBench", "run_tokenize_bench", "run_dedup_bench"]


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
