"""Which member of a near-duplicate cluster is kept: ``--keep first|longest|source-priority:a,b``.

Clustering (:func:`~tokenloom.curate.lsh.lsh_clusters`) only says which rows belong together;
this module picks one row per cluster to keep, and every other member is flagged
``is_near_dup``. ``near_dup_cluster`` holds the kept row's id, so
``near_dup_cluster = id`` selects exactly the kept rows.

============================  ==================================================================
policy                        kept row
============================  ==================================================================
``first`` (default)           the smallest id (the earliest ingested)
``longest``                   the most characters (``n_chars``); ties: the smallest id
``source-priority:a,b``       the row whose ``source`` comes first in the list (sources not
                              listed come after every listed one); ties: the smallest id
============================  ==================================================================

A row kept by an earlier run (``is_near_dup`` false) is kept again before the policy is asked,
so an appended row never displaces a row already kept (``--recompute`` decides every row
afresh). The policy's canonical text is part of the recorded ``NearLookup`` UDF, so ``tokenloom
refresh`` applies the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenloom.curate.inputs import CurateError

__all__ = [
    "KEEP_POLICIES",
    "KeepPolicy",
    "keep_representatives",
    "keep_representatives_naive",
]

KEEP_POLICIES = ("first", "longest", "source-priority")


@dataclass(frozen=True, kw_only=True)
class KeepPolicy:
    """A parsed ``--keep`` value."""

    kind: str = "first"
    """``first``, ``longest`` or ``source-priority``."""
    sources: tuple[str, ...] = ()
    """For ``source-priority``: the sources, most preferred first."""

    def __post_init__(self) -> None:
        if self.kind not in KEEP_POLICIES:
            raise CurateError(
                f"keep policy {self.kind!r} is not one of first, longest, source-priority:A,B"
            )
        if (self.kind == "source-priority") != bool(self.sources):
            raise CurateError(
                "source-priority needs its sources, e.g. --keep source-priority:wiki_en,web "
                "(and only it takes a list)"
            )

    @classmethod
    def parse(cls, text: str) -> KeepPolicy:
        """``first``, ``longest`` or ``source-priority:a,b`` (spaces around names ignored)."""
        kind, _, rest = text.strip().partition(":")
        sources = tuple(s.strip() for s in rest.split(",") if s.strip())
        if len(set(sources)) != len(sources):
            raise CurateError(f"--keep {text!r} names a source twice")
        return cls(kind=kind.strip(), sources=sources)

    def spec(self) -> str:
        """The canonical text (what is recorded, and what :meth:`parse` reads back)."""
        return f"{self.kind}:{','.join(self.sources)}" if self.sources else self.kind

    @property
    def column(self) -> str | None:
        """The table column the policy reads, if any."""
        return {"longest": "n_chars", "source-priority": "source"}.get(self.kind)

    def preference(self, values: np.ndarray | None, n: int) -> np.ndarray:
        """``(N,) int64``: lower is preferred (before the id tie-break).

        Args:
            values: The :attr:`column` of each row (``None`` for ``first``): a numpy or Arrow
                array.
            n: Number of rows.
        """
        if self.kind == "first":
            return np.zeros(n, dtype=np.int64)
        assert values is not None, f"{self.kind} needs the {self.column} column"
        if self.kind == "longest":
            return -np.asarray(values, dtype=np.int64)
        import pyarrow as pa
        import pyarrow.compute as pc

        # Arrow's index_in: no Python string per row (a corpus has millions of rows).
        if not isinstance(values, (pa.Array, pa.ChunkedArray)):
            values = pa.array(values, pa.string())
        at = pc.index_in(values, value_set=pa.array(self.sources, pa.string()))
        rank = pc.fill_null(at, len(self.sources))
        return np.asarray(rank.to_numpy(zero_copy_only=False), dtype=np.int64)


def keep_representatives(
    labels: np.ndarray,
    ids: np.ndarray,
    preference: np.ndarray,
    kept_before: np.ndarray | None = None,
) -> np.ndarray:
    """The id kept in each row's cluster.

    Args:
        labels: ``(N,)`` any cluster label per row (equal labels: one cluster).
        ids: ``(N,) int64`` unique row ids.
        preference: ``(N,) int64`` lower is preferred (:meth:`KeepPolicy.preference`).
        kept_before: ``(N,) bool`` rows an earlier run kept; preferred above all.

    Returns:
        ``(N,) int64``: per row, the id of its cluster's kept row: the first of the cluster by
        (kept before, preference, id).
    """
    labels, ids = np.asarray(labels), np.asarray(ids, dtype=np.int64)
    n = ids.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    before = np.zeros(n, dtype=bool) if kept_before is None else np.asarray(kept_before, bool)
    order = np.lexsort((ids, np.asarray(preference), ~before, labels))  # last key sorts first
    sorted_labels = labels[order]
    first = np.concatenate(([True], sorted_labels[1:] != sorted_labels[:-1]))  # (N,) group heads
    head = order[np.flatnonzero(first)[np.cumsum(first) - 1]]  # (N,) in sorted order
    kept = np.empty(n, dtype=np.int64)
    kept[order] = ids[head]
    return kept


def keep_representatives_naive(
    labels: np.ndarray,
    ids: np.ndarray,
    preference: np.ndarray,
    kept_before: np.ndarray | None = None,
) -> np.ndarray:
    """Reference for :func:`keep_representatives`: a dict of the best row per label."""
    before = [False] * len(ids) if kept_before is None else list(kept_before)
    best: dict = {}
    for i, label in enumerate(labels.tolist()):
        key = (not before[i], int(preference[i]), int(ids[i]))
        if label not in best or key < best[label]:
            best[label] = key
    return np.array([best[label][2] for label in labels.tolist()], dtype=np.int64)
