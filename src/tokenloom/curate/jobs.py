"""Curation jobs on a table: exact and near dedup, quality scores — each result a column.

Per-row work is a backfill (parallel, checkpointed, incremental); the global step (which rows are
duplicates of which) reads only the small stored columns (``id`` + hash or signature).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenloom.backfill import add_column, default_checkpoint_root
from tokenloom.backfill.engine import _default_workers
from tokenloom.backfill.executors import InlineExecutor, make_executor
from tokenloom.curate.bands import PART_ROWS, LanceSignatures, banded_clusters
from tokenloom.curate.exact import exact_duplicates
from tokenloom.curate.inputs import CurateError
from tokenloom.curate.keep import KeepPolicy, keep_representatives
from tokenloom.curate.lsh import DEFAULT_THRESHOLD
from tokenloom.curate.udfs import ExactLookup, MinHash, NearLookup, Quality, TextHash, write_lookup
from tokenloom.process import release_memory
from tokenloom.progress import progress as show_progress
from tokenloom.table import Table
from tokenloom.table.storage import delete, is_remote, join

__all__ = ["CurationResult", "dedup_exact", "dedup_near", "score_quality"]


@dataclass(kw_only=True)
class CurationResult:
    """What a curation job added and found."""

    columns: list[str]
    versions: list[int] = field(default_factory=list)
    """Table versions this job committed (a per-row column, then the global flags)."""
    rows: int = 0
    flagged: int = 0
    """Rows marked duplicate (or failing at least one quality rule)."""
    groups: int = 0
    """Duplicate groups / clusters with more than one member."""
    seconds: float = 0.0
    examples: list[dict] = field(default_factory=list)
    """A few groups, for a look by hand."""
    by_rule: dict[str, int] = field(default_factory=dict)
    """Quality: rows failing each rule (a row may fail several), most first."""
    by_source: dict[str, dict] = field(default_factory=dict)
    """Per source: ``{"rows", "flagged"}`` for dedup, ``{"rows", "pass", "mean_quality"}`` for
    quality."""
    clustering: dict = field(default_factory=dict)
    """Near: what the clustering did (:class:`~tokenloom.curate.bands.ClusterStats`)."""

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _lookup_path(table: Table, name: str) -> str:
    """Beside the table's backfill checkpoints (inside an object-store table: workers on other
    machines read it through the store)."""
    root = join(default_checkpoint_root(table.uri), "_results")
    if not is_remote(root):
        os.makedirs(root, exist_ok=True)
    return join(root, f"{name}-v{table.version}-{os.getpid()}.arrow")


def _drop(table: Table, columns: list[str]) -> Table:
    present = [c for c in columns if c in table.schema().names]
    if present:
        table.dataset.drop_columns(present)
    return table.checkout()


def _flagged_by_source(sources: pa.ChunkedArray, flagged: np.ndarray) -> dict[str, dict]:
    """Per source (sorted): its rows and how many of them are ``flagged``; ``sources`` and
    ``flagged`` are aligned, one entry per row."""
    by = pa.table({"source": sources, "flagged": flagged}).group_by("source")
    counts = by.aggregate([("flagged", "count"), ("flagged", "sum")]).to_pylist()
    return {
        row["source"]: {"rows": int(row["flagged_count"]), "flagged": int(row["flagged_sum"] or 0)}
        for row in sorted(counts, key=lambda r: str(r["source"]))
    }


def _examples(table: Table, group_of: np.ndarray, ids: np.ndarray, k: int = 5) -> list[dict]:
    dup = ids[group_of != ids]
    out = []
    for gid in np.unique(group_of[np.isin(ids, dup)])[:k]:
        members = ids[group_of == gid][:4]
        rows = table.dataset.to_table(
            columns=["id", "source", "text"], filter=f"id IN ({','.join(map(str, members))})"
        ).to_pylist()
        out.append(
            {
                "group": int(gid),
                "rows": [
                    {
                        "id": r["id"],
                        "source": r["source"],
                        "snippet": r["text"][:70].replace("\n", " "),
                    }
                    for r in rows
                ],
            }
        )
    return out


def dedup_exact(
    uri: str,
    *,
    workers: int | None = None,
    progress: bool | None = None,
    storage_options: Mapping[str, str] | None = None,
    executor: str = "local",
    ray_address: str | None = None,
) -> CurationResult:
    """``text_hash`` per row, then ``is_dup``/``dup_of``: the first occurrence by id is kept.

    Incremental: after an append, only new rows are hashed and flagged (an old row's flag never
    changes, since a newer row cannot be an earlier occurrence).
    """
    started = time.perf_counter()
    res = CurationResult(columns=["text_hash", "is_dup", "dup_of"])
    table = Table.open(uri, storage_options=storage_options)
    backfill = {"workers": workers, "executor": executor, "ray_address": ray_address}
    r1 = add_column(table, None, TextHash, progress=progress, **backfill)
    table = table.checkout()
    data = table.dataset.to_table(columns=["id", "source", "text_hash"])
    ids = data.column("id").to_numpy()
    is_dup, dup_of = exact_duplicates(ids, data.column("text_hash"))
    by_source = _flagged_by_source(data.column("source"), is_dup)
    del data  # the hashes and sources are not needed while the flags are written
    release_memory()
    path = _lookup_path(table, "exact")
    so = table.storage_options or None
    write_lookup(path, ids, {"is_dup": is_dup, "dup_of": dup_of}, storage_options=so)
    lookup = ExactLookup.bind(_path=path, _storage_options=so)
    try:
        r2 = add_column(table, None, lookup, progress=progress, **backfill)
    finally:
        delete(path, so)
    res.versions = [v for v in (r1.version, r2.version) if v is not None]
    res.rows, res.flagged = len(ids), int(is_dup.sum())
    res.groups = len(np.unique(dup_of[is_dup]))
    res.by_source = by_source
    res.examples = _examples(table, dup_of, ids)
    res.seconds = time.perf_counter() - started
    return res


def dedup_near(
    uri: str,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    keep: str | KeepPolicy = "first",
    workers: int | None = None,
    recompute: bool = False,
    progress: bool | None = None,
    storage_options: Mapping[str, str] | None = None,
    executor: str = "local",
    ray_address: str | None = None,
) -> CurationResult:
    """``minhash`` per row, then LSH clusters → ``near_dup_cluster`` (the id of the cluster's
    kept row, chosen by ``keep``: :mod:`tokenloom.curate.keep`) and ``is_near_dup`` (true for
    every member but the kept one).

    A changed threshold or keep policy needs ``recompute=True`` (the cluster columns are dropped
    and rebuilt). After an append, new rows are clustered against everything; old rows keep
    their cluster, and a row kept before stays kept, unless ``recompute=True``.

    The clustering (:func:`~tokenloom.curate.bands.banded_clusters`) never loads the signatures
    whole: band partitions run on ``executor`` (``"local"`` process pool, or ``"ray"`` tasks at
    ``ray_address``), their files under the table's checkpoint folder; a table of at most one
    partition (:data:`~tokenloom.curate.bands.PART_ROWS` rows) is clustered in this process.
    """
    policy = keep if isinstance(keep, KeepPolicy) else KeepPolicy.parse(keep)
    started = time.perf_counter()
    res = CurationResult(columns=["minhash", "near_dup_cluster", "is_near_dup"])
    table = Table.open(uri, storage_options=storage_options)
    if recompute:
        table = _drop(table, ["near_dup_cluster", "is_near_dup"])
    else:
        _check_same_clustering(table, threshold, policy)
    minhash = MinHash.bind()
    backfill = {"workers": workers, "executor": executor, "ray_address": ray_address}
    r1 = add_column(table, None, minhash, progress=progress, **backfill)
    table = table.checkout()
    names = table.schema().names
    extra = [c for c in (policy.column, "is_near_dup") if c not in (None, "source") and c in names]
    data = table.dataset.to_table(columns=["id", "source", *extra])  # not the signatures
    ids = data.column("id").to_numpy()
    so = table.storage_options or None
    n_workers = _default_workers() if workers is None else workers
    runner = (
        InlineExecutor()
        if executor == "local" and (n_workers == 0 or len(ids) <= PART_ROWS)
        else make_executor(executor, n_workers, ray_address=ray_address)
    )
    source = LanceSignatures(table.uri, table.version, rows=len(ids), storage_options=so)
    # Beside the lookups: cleaned up as they are when this process dies mid-run.
    work = join(
        default_checkpoint_root(table.uri), "_results", f"near-v{table.version}-{os.getpid()}"
    )
    with show_progress("near-dedup clusters", total=len(ids), unit="rows", show=progress) as bar:
        labels, _, stats = banded_clusters(
            ids,
            source,
            workdir=work,
            executor=runner,
            threshold=threshold,
            storage_options=so,
            progress=bar,
        )
    res.clustering = stats.to_json()
    values = data.column(policy.column) if policy.column else None
    kept_before = (
        pc.equal(data.column("is_near_dup"), False).fill_null(False).to_numpy(zero_copy_only=False)
        if "is_near_dup" in extra
        else None
    )  # rows an earlier run kept (false, not null)
    cluster = keep_representatives(labels, ids, policy.preference(values, len(ids)), kept_before)
    is_near = cluster != ids
    path = _lookup_path(table, "near")
    so = table.storage_options or None
    write_lookup(
        path, ids, {"near_dup_cluster": cluster, "is_near_dup": is_near}, storage_options=so
    )
    by_source = _flagged_by_source(data.column("source"), is_near)
    del data, values, labels, kept_before
    release_memory()
    # `first` is left out of the identity: columns made before policies existed still match.
    chosen = {"keep": policy.spec()} if policy.kind != "first" else {}
    lookup = NearLookup.bind(
        _path=path,
        _storage_options=so,
        threshold=threshold,
        minhash=minhash.fingerprint(),
        **chosen,
    )
    try:
        r2 = add_column(table, None, lookup, progress=progress, **backfill)
    finally:
        delete(path, so)
    res.versions = [v for v in (r1.version, r2.version) if v is not None]
    res.rows, res.flagged = len(ids), int(is_near.sum())
    res.groups = len(np.unique(cluster[is_near]))
    res.by_source = by_source
    res.examples = _examples(table, cluster, ids)
    res.seconds = time.perf_counter() - started
    return res


def _check_same_clustering(table: Table, threshold: float, policy: KeepPolicy) -> None:
    """Refuse, naming ``--recompute``, to fill new rows under another threshold or policy."""
    if "near_dup_cluster" not in table.schema().names:
        return
    raw = (table.schema().field("near_dup_cluster").metadata or {}).get(b"tokenloom.udf")
    made = (json.loads(raw).get("kwargs") or {}) if raw else {}
    had = (made.get("threshold", DEFAULT_THRESHOLD), made.get("keep", "first"))
    if raw and had != (threshold, policy.spec()):
        raise CurateError(
            f"the near-duplicate columns were made with --threshold {had[0]} --keep {had[1]}; "
            f"pass --recompute to rebuild them with --threshold {threshold} "
            f"--keep {policy.spec()}, or run with the recorded values"
        )


def score_quality(
    uri: str,
    *,
    workers: int | None = None,
    progress: bool | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> CurationResult:
    """``quality`` (fraction of applicable Gopher/C4 rules passed, 1.0 = all) and
    ``quality_reasons`` (the rules a row failed)."""
    started = time.perf_counter()
    res = CurationResult(columns=["quality", "quality_reasons"])
    table = Table.open(uri, storage_options=storage_options)
    r = add_column(table, None, Quality, workers=workers, progress=progress)
    table = table.checkout()
    res.versions = [r.version] if r.version is not None else []
    res.rows = table.count_rows()
    res.flagged = table.count_rows("quality < 1.0")
    data = table.dataset.to_table(columns=["source", "quality", "quality_reasons"])
    rules = pc.value_counts(pc.list_flatten(data.column("quality_reasons"))).to_pylist()
    res.by_rule = {r["values"]: int(r["counts"]) for r in sorted(rules, key=lambda r: -r["counts"])}
    grouped = data.group_by("source").aggregate(
        [("quality", "count"), ("quality", "mean"), ("quality", "min")]
    )
    passing = (
        data.filter(pc.equal(data.column("quality"), 1.0))
        .group_by("source")
        .aggregate([("quality", "count")])
    )
    n_pass = {r["source"]: r["quality_count"] for r in passing.to_pylist()}
    for row in sorted(grouped.to_pylist(), key=lambda r: str(r["source"])):
        res.by_source[row["source"]] = {
            "rows": int(row["quality_count"]),
            "pass": int(n_pass.get(row["source"], 0)),
            "mean_quality": round(float(row["quality_mean"] or 0.0), 4),
        }
    res.seconds = time.perf_counter() - started
    return res
