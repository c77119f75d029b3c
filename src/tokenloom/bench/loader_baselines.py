"""The registry of baselines that read a derived copy of the corpus: which copy each reads,
how that copy is built, and the source that reads it.

Each copy is built once per corpus under the work dir (its build time and bytes on disk are
reported beside the throughput of the baselines reading it); a baseline is one ``--only`` name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenloom.bench.loader_data import (
    Built,
    CorpusSpec,
    build_mds,
    build_parquet,
    build_table,
    build_webdataset,
)
from tokenloom.bench.loader_report import (
    _MDS,
    _MDS_SHUFFLE,
    _PARQUET,
    _PARQUET_ORDER,
    _PARQUET_PRESHUFFLED,
    _PARQUET_ROWS,
    _PREPACKED,
    _WEBDATASET,
)

__all__ = ["Copy", "Baseline", "COPIES", "BASELINES"]


def _build_litdata(path: str, corpus: CorpusSpec, seq_len: int) -> Built:
    from tokenloom.bench.loader_litdata import build_litdata

    return build_litdata(path, corpus, seq_len=seq_len)


def _build_prepacked(path: str, corpus: CorpusSpec, seq_len: int) -> Built:
    from tokenloom.bench.loader_prepacked import build_prepacked  # imports torch

    return build_prepacked(path, corpus, seq_len=seq_len)


@dataclass(frozen=True, kw_only=True)
class Copy:
    """A derived copy of the corpus."""

    suffix: str
    """File name after the corpus name, e.g. ``.parquet`` (``{L}`` becomes the block length)."""
    build: Callable[[str, CorpusSpec, int], Built]
    """``(path, corpus, seq_len) -> Built`` (cached under ``path``)."""
    what: str
    """One line for the report: what the copy holds."""


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """One loader reading a copy."""

    name: str
    """Its ``--only`` name."""
    label: str
    """Its row in the report."""
    kind: str
    """A key of :data:`tokenloom.bench.loader_cases.SOURCES`."""
    copy: str
    """A key of :data:`COPIES`."""
    options: tuple[tuple[str, Any], ...] = ()


COPIES: dict[str, Copy] = {
    "parquet": Copy(
        suffix=".parquet",
        build=lambda path, corpus, _seq_len: build_parquet(path, corpus),
        what="Parquet, documents in id order, row groups of 1,024 rows",
    ),
    "parquet-shuffled": Copy(
        suffix="-shuffled.parquet",
        build=lambda path, corpus, _seq_len: build_parquet(path, corpus, shuffled=True),
        what="Parquet, documents pre-shuffled, row groups of 1,024 rows",
    ),
    "mds": Copy(
        suffix="-L{L}.mds",
        build=lambda path, corpus, seq_len: build_mds(path, corpus, seq_len=seq_len),
        what="MDS, pre-shuffled documents packed into blocks",
    ),
    "mds-ordered": Copy(
        suffix="-L{L}-ordered.mds",
        build=lambda path, corpus, seq_len: build_mds(
            path, corpus, seq_len=seq_len, shuffled=False
        ),
        what="MDS, documents in id order packed into blocks",
    ),
    "webdataset": Copy(
        suffix="-L{L}.wds",
        build=lambda path, corpus, seq_len: build_webdataset(path, corpus, seq_len=seq_len),
        what="WebDataset tar shards, pre-shuffled documents packed into blocks",
    ),
    "prepacked": Copy(
        suffix="-L{L}-blocks.lance",
        build=lambda path, corpus, seq_len: _build_prepacked(path, corpus, seq_len),
        what="Lance table of blocks, pre-shuffled documents packed once, one block per row",
    ),
    "table": Copy(
        suffix=".lance",
        build=lambda path, corpus, _seq_len: build_table(path, corpus),
        what="the tokenloom table itself (no copy)",
    ),
    "litdata": Copy(
        suffix=".litdata",
        build=_build_litdata,
        what="litdata optimize: documents in id order + EOS, TokensLoader chunks",
    ),
}

BASELINES: tuple[Baseline, ...] = (
    Baseline(name="mds", label=_MDS, kind="mds", copy="mds"),
    Baseline(
        name="mds-shuffle",
        label=_MDS_SHUFFLE,
        kind="mds",
        copy="mds-ordered",
        options=(("shuffle_algo", "py1e"),),
    ),
    Baseline(name="webdataset", label=_WEBDATASET, kind="webdataset", copy="webdataset"),
    Baseline(name="parquet", label=_PARQUET, kind="parquet", copy="parquet"),
    Baseline(
        name="parquet-order",
        label=_PARQUET_ORDER,
        kind="parquet",
        copy="parquet",
        options=(("order", "sequential"),),
    ),
    Baseline(
        name="parquet-preshuffled",
        label=_PARQUET_PRESHUFFLED,
        kind="parquet",
        copy="parquet-shuffled",
        options=(("order", "sequential"),),
    ),
    Baseline(name="parquet-rows", label=_PARQUET_ROWS, kind="parquet-rows", copy="parquet"),
    Baseline(name="prepacked", label=_PREPACKED, kind="prepacked", copy="prepacked"),
    Baseline(
        name="ray",
        label="Ray Data read_lance, block order + local shuffle (2 CPUs)",
        kind="ray",
        copy="table",
    ),
    Baseline(
        name="ray-shuffle",
        label="Ray Data read_lance, random_shuffle (2 CPUs)",
        kind="ray",
        copy="table",
        options=(("shuffle", "global"),),
    ),
    Baseline(
        name="ray-parquet",
        label="Ray Data read_parquet, block order + local shuffle (2 CPUs)",
        kind="ray",
        copy="parquet",
        options=(("read", "parquet"),),
    ),
    Baseline(
        name="litdata",
        label="litdata StreamingDataset, shuffle (workers=2)",
        kind="litdata",
        copy="litdata",
    ),
)
"""In the order they are measured."""
