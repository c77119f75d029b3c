"""Near-dedup clustering at scale: synthetic MinHash signatures with planted near-duplicate groups.

The signatures are written to a ``.npy`` file chunk by chunk (10M rows x 128 permutations is
5.1 GB on disk, never whole in memory): each value is a hash of (source row, position), so a
planted group's members start from its first member's signature and each member replaces a
random fraction (uniform in ``[0, noise)``) of its positions with its own values. About
``dup_fraction`` of the rows are in groups of Zipf(2) sizes (2 up to ``max_group + 1``: a few
large clusters), one row in a thousand is empty, the rest are unrelated.

:func:`run_cluster_bench` clusters the file with
:func:`~tokenloom.curate.bands.banded_clusters` on the local process pool and reports wall time,
CPU time (this process and its workers) and the peak RSS summed over the process tree (sampled),
plus how the clusters match the planted groups.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time

import numpy as np

from tokenloom.curate.minhash import EMPTY

__all__ = [
    "plant_groups",
    "write_synthetic_signatures",
    "synthetic_rows",
    "run_cluster_bench",
    "build_dedup_table",
    "run_stage_bench",
]

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)


def _mix(x: np.ndarray) -> np.ndarray:
    x = x * _M1
    x ^= x >> np.uint64(31)
    x *= _M2
    return x ^ (x >> np.uint64(29))


def plant_groups(
    n: int, *, dup_fraction: float = 0.2, max_group: int = 10_000, noise: float = 0.3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The planted structure: ``(source, noise)``, the row each row copies (itself when alone or
    the first member of its group) and the fraction of positions it changes (16-bit fixed
    point; 0 for sources)."""
    rng = np.random.default_rng(seed)
    sizes: list[np.ndarray] = []
    total, target = 0, int(dup_fraction * n)
    while total < target:
        s = np.minimum(rng.zipf(2.0, 4096), max_group) + 1
        sizes.append(s)
        total += int(s.sum())
    size = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
    size = size[: np.searchsorted(np.cumsum(size), target, side="right")]
    grouped = rng.permutation(n)[: int(size.sum())]
    first = np.repeat(np.cumsum(size) - size, size)  # position of each member's group head
    source = np.arange(n, dtype=np.int64)
    source[grouped] = grouped[first]
    level = np.zeros(n, dtype=np.uint16)
    level[grouped] = (rng.uniform(0, noise, grouped.size) * 65536).astype(np.uint16)
    level[grouped[np.cumsum(size) - size]] = 0
    return source, level


def synthetic_rows(
    lo: int, source: np.ndarray, level: np.ndarray, num_perm: int, seed: int
) -> np.ndarray:
    """Signatures of rows ``lo : lo + len(source)`` (``source``/``level`` sliced to them)."""
    rows = np.arange(lo, lo + source.size, dtype=np.uint64)[:, None]
    pos = np.arange(num_perm, dtype=np.uint64)[None, :]
    salt = np.uint64(seed) * np.uint64(0x2545F4914F6CDD1D)
    base = _mix(source.astype(np.uint64)[:, None] * np.uint64(num_perm) + pos + salt)
    own = _mix((rows * np.uint64(num_perm) + pos) ^ ~salt)
    change = (own & np.uint64(0xFFFF)) < level.astype(np.uint64)[:, None]
    out = np.where(change, own >> np.uint64(32), base >> np.uint64(32)).astype(np.uint32)
    out &= np.uint32(0xFFFFFFFE)  # never the empty marker
    empty = (_mix(rows[:, 0] ^ salt) % np.uint64(1000)) == 0
    out[empty] = EMPTY
    return out


def write_synthetic_signatures(
    path: str,
    n: int,
    *,
    num_perm: int = 128,
    dup_fraction: float = 0.2,
    max_group: int = 10_000,
    noise: float = 0.3,
    seed: int = 0,
    chunk: int = 1 << 16,
) -> np.ndarray:
    """Write ``(n, num_perm) uint32`` signatures to the ``.npy`` file ``path``, a chunk at a
    time; returns each row's planted source (see :func:`plant_groups`)."""
    source, level = plant_groups(
        n, dup_fraction=dup_fraction, max_group=max_group, noise=noise, seed=seed
    )
    with open(path, "wb") as fh:
        header = {"descr": "<u4", "fortran_order": False, "shape": (n, num_perm)}
        np.lib.format.write_array_header_2_0(fh, header)
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            fh.write(synthetic_rows(lo, source[lo:hi], level[lo:hi], num_perm, seed).tobytes())
    return source


def _planted_match(cluster: np.ndarray, source: np.ndarray, empty: np.ndarray) -> dict:
    """How the clusters match the planted groups (row ids are row numbers here)."""
    planted = (source != np.arange(source.size)) & ~empty & ~empty[source]
    joined = cluster[planted] == cluster[source[planted]]
    # Clusters holding rows of more than one planted group (or an unrelated row).
    pairs = np.unique(np.stack([cluster[~empty], source[~empty]]), axis=1)
    groups_per_cluster = np.bincount(np.searchsorted(np.unique(pairs[0]), pairs[0]))
    return {
        "planted_members": int(planted.sum()),
        "joined_to_their_group": int(joined.sum()),
        "recall": round(float(joined.mean()) if joined.size else 1.0, 5),
        "clusters_mixing_groups": int((groups_per_cluster > 1).sum()),
    }


def run_cluster_bench(
    *,
    rows: int = 10_000_000,
    workers: int = 2,
    workdir: str | None = None,
    seed: int = 0,
    dup_fraction: float = 0.2,
    keep: bool = False,
) -> dict:
    """Generate (or reuse) the signature file under ``workdir``, then time and measure the
    clustering. Goals: under 10 minutes and at most 4 GB peak RSS (all processes)."""
    from tokenloom.backfill.executors import make_executor
    from tokenloom.bench.loader_rss import TreeSampler
    from tokenloom.curate.bands import NpySignatures, banded_clusters

    own = workdir is None
    root = tempfile.mkdtemp(prefix="tokenloom-near-") if own else workdir
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, f"signatures-{rows}-{seed}-{dup_fraction}.npy")
    t0 = time.perf_counter()
    if os.path.exists(path):
        generated = 0.0
    else:
        write_synthetic_signatures(path + ".tmp.npy", rows, seed=seed, dup_fraction=dup_fraction)
        os.replace(path + ".tmp.npy", path)
        generated = time.perf_counter() - t0
    try:
        source = NpySignatures(path)
        ids = np.arange(rows, dtype=np.int64)
        cpu0 = _cpu_seconds()
        with TreeSampler(os.getpid(), interval_s=0.2) as sampler:
            start = time.perf_counter()
            cluster, near, stats = banded_clusters(
                ids,
                source,
                workdir=os.path.join(root, "work"),
                executor=make_executor("local", workers),
            )
            wall = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu0
        del ids
        src, level = plant_groups(rows, seed=seed, dup_fraction=dup_fraction)
        del level
        empty = np.zeros(rows, dtype=bool)
        for lo in range(0, rows, 1 << 20):
            empty[lo : lo + (1 << 20)] = np.all(
                source.read(lo, min(rows, lo + (1 << 20))) == EMPTY, 1
            )
        match = _planted_match(cluster, src, empty)
    finally:
        if own and not keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    peak = sampler.peak_rss
    return {
        "rows": rows,
        "num_perm": 128,
        "workers": workers,
        "generate_seconds": round(generated, 1),
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1),
        "peak_rss_bytes": peak,
        "peak_processes": sampler.peak_processes,
        "near_duplicates": int(near.sum()),
        "clusters": int(np.unique(cluster[near]).size),
        "planted": match,
        "stats": stats.to_json(),
        "goals": {
            "wall_under_600s": "PASS" if wall < 600 else "MISS",
            "rss_at_most_4GB": "PASS" if peak <= 4 * 10**9 else "MISS",
        },
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _cpu_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def build_dedup_table(uri: str, docs: int, *, seed: int = 0, dup_fraction: float = 0.2) -> None:
    """A tokenloom table of ``docs`` short synthetic documents (twenty words) in which the
    planted groups of :func:`plant_groups` are near copies (the last word changed) of their
    first member; for measuring the whole ``dedup_near`` stage."""
    import lance
    import pyarrow as pa
    from lance.fragment import write_fragments

    from tokenloom.table import BASE_SCHEMA, NEXT_ID_KEY, Table

    source, _ = plant_groups(docs, dup_fraction=dup_fraction, seed=seed, max_group=1000)

    def batches():
        chunk = 8192
        for lo in range(0, docs, chunk):
            src = source[lo : lo + chunk].astype(np.uint64)
            rows = np.arange(lo, lo + src.size, dtype=np.uint64)
            words = _mix(src[:, None] * np.uint64(32) + np.arange(20, dtype=np.uint64)) >> 40
            copy = src != rows
            words[copy, 19] = _mix(rows[copy] + np.uint64(docs)) >> 40
            texts = [" ".join(f"w{w}" for w in row) for row in words.tolist()]
            yield pa.record_batch(
                [
                    pa.array(rows.astype(np.int64)),
                    pa.array(texts, type=pa.large_string()),
                    pa.array(["synthetic"] * src.size),
                    pa.array([len(t) for t in texts], type=pa.int64()),
                    pa.array(["{}"] * src.size),
                ],
                schema=BASE_SCHEMA,
            )

    table = Table.create(uri)
    reader = pa.RecordBatchReader.from_batches(BASE_SCHEMA, batches())
    frags = write_fragments(
        reader, uri, schema=BASE_SCHEMA, mode="overwrite", max_rows_per_file=1 << 18
    )
    table.commit(
        lance.LanceOperation.Overwrite(BASE_SCHEMA, frags),
        op="bench",
        message=f"synthetic near-dedup corpus: {docs} docs",
        properties={NEXT_ID_KEY: str(docs)},
    )


def run_stage_bench(*, docs: int, workers: int = 2, workdir: str | None = None) -> dict:
    """Peak RSS (all processes, sampled) and wall time of the whole ``dedup_near`` stage
    (MinHash backfill, clustering, flag backfill) on :func:`build_dedup_table`'s table."""
    import shutil

    from tokenloom.bench.loader_rss import TreeSampler
    from tokenloom.curate.jobs import dedup_near

    root = tempfile.mkdtemp(prefix="tokenloom-near-stage-", dir=workdir)
    try:
        uri = os.path.join(root, "t.lance")
        build_dedup_table(uri, docs)
        cpu0 = _cpu_seconds()
        with TreeSampler(os.getpid(), interval_s=0.2) as sampler:
            start = time.perf_counter()
            res = dedup_near(uri, workers=workers, progress=False)
            wall = time.perf_counter() - start
        return {
            "docs": docs,
            "workers": workers,
            "wall_seconds": round(wall, 1),
            "cpu_seconds": round(_cpu_seconds() - cpu0, 1),
            "peak_rss_bytes": sampler.peak_rss,
            "flagged": res.flagged,
            "clustering_seconds": res.clustering.get("seconds"),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
