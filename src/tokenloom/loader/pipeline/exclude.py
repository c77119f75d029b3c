"""Leaving quarantined rows out of the rest of a run: the ``exclude`` kind of
:class:`~tokenloom.loader.plan.change.StreamChange`.

``tokenloom train --resume --exclude NAME`` (from the run's latest checkpoint, or from a kept
``RUN/step-N`` to rewind) takes the rows of quarantine ``NAME``
(:mod:`tokenloom.search.quarantine`) out of the stream from the checkpoint's step ``s`` of
epoch ``e`` on, and changes nothing else:

* **epoch ``e``**: steps ``< s`` are as they were; the tail visits the documents the epoch's plan
  had not delivered before ``s`` **in that plan's own order**, minus the excluded ones, packed
  again with the run's recipe (a row partly fed before ``s`` is not fed again, as with every
  change);
* **later epochs**: each epoch's seeded visiting order of the whole selection, with the excluded
  rows filtered out — the permutation of the rest is kept, not drawn again over a smaller set,
  so the other documents come in the order they would have.

The table version does not change. The planner holds the union of the run's excluded rows
(:func:`excluded_rows`, checked against the digest the change recorded), so a later change of
the run keeps them out too. A mixture's pools each keep their own orders over their passes, which
a single filtered order cannot carry: there the rest of the epoch's budget is planned again with
the same shares over the rows not yet delivered minus the excluded ones (in an order seeded from
the run's seed, the epoch and the change, as ``continue`` does), and later epochs plan each pool
without the excluded rows. Vectorised: no Python per row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenloom.errors import TokenloomError

if TYPE_CHECKING:
    from tokenloom.loader.plan.spec import LoaderSpec

__all__ = [
    "EXCLUDE",
    "ExcludeError",
    "rows_digest",
    "exclude_params",
    "excluded_rows",
    "visiting_positions",
    "keep_mask",
]

EXCLUDE = "exclude"
"""The kind's name."""


class ExcludeError(TokenloomError):
    """Rows cannot be excluded (a mixture run, a quarantine of another table, or one changed
    since the run recorded it)."""


def rows_digest(row_ids: np.ndarray) -> str:
    """sha256 of the ascending int64 row ids (what the change records to find its rows again)."""
    ids = np.ascontiguousarray(np.asarray(row_ids, dtype="<i8"))
    return hashlib.sha256(ids.tobytes()).hexdigest()


def exclude_params(q: Any) -> dict[str, Any]:
    """The change's parameters for :class:`~tokenloom.search.quarantine.Quarantine` ``q``."""
    return {
        "quarantine": q.name,
        "table": q.table,
        "run": q.run,
        "steps": [q.first_step, q.last_step],
        "rows": int(len(q.row_ids)),
        "tokens": int(q.tokens),
        "digest": rows_digest(q.row_ids),
    }


def excluded_rows(
    changes: Sequence[Any], *, storage_options: Mapping[str, str] | None = None
) -> np.ndarray:
    """Ascending unique table ids of every row the run's ``exclude`` changes left out.

    Raises:
        ExcludeError: A quarantine no longer holds the rows its change recorded.
        QuarantineError: A quarantine is gone or unreadable.
    """
    from tokenloom.search.quarantine import read_quarantine

    parts = []
    for c in changes:
        if c.kind != EXCLUDE:
            continue
        p = c.params
        q = read_quarantine(p["table"], p["quarantine"], storage_options=storage_options)
        if rows_digest(q.row_ids) != p["digest"]:
            raise ExcludeError(
                f"quarantine {p['quarantine']!r} of {p['table']} no longer holds the {p['rows']:,} "
                "rows the run excluded (its file was replaced); restore it to read this run's "
                "stream"
            )
        parts.append(q.row_ids)
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.concatenate(parts)).astype(np.int64, copy=False)


def keep_mask(row_ids: Any, *drop: np.ndarray) -> np.ndarray:
    """``(n,)`` bool over the ascending ``row_ids``: the rows in none of the ascending ``drop``."""
    ids = np.asarray(row_ids, dtype=np.int64)
    keep = np.ones(len(ids), dtype=bool)
    for d in drop:
        if len(d):
            pos = np.minimum(np.searchsorted(d, ids), len(d) - 1)
            keep &= d[pos] != ids
    return keep


def visiting_positions(plan: Any) -> np.ndarray:
    """The visiting order of a concat, windowed or best-fit plan: positions into its selection.

    Raises:
        ExcludeError: Another kind of plan (a mixture's).
    """
    inner = plan
    while not hasattr(inner, "order"):
        inner = getattr(inner, "stream", None)
        if inner is None:
            raise ExcludeError(
                f"a {type(plan).__name__} has no single visiting order to keep; --exclude "
                "applies to runs without --mixture"
            )
    return np.asarray(inner.order, dtype=np.int64)


def ordered_plan(planner: Any, keep: np.ndarray, order: np.ndarray, epoch: int) -> Any:
    """``planner``'s recipe over the rows ``keep`` selects, visited in ``order`` (positions into
    the selection, filtered to those rows: the earlier order, kept)."""
    return planner.plan_rows([keep], seed=planner.spec.seed, epoch=epoch, order=order[keep[order]])


def later_epoch_plan(planner: Any, epoch: int, excluded: np.ndarray) -> Any:
    """Epoch ``epoch`` of a run that excluded ``excluded``: the usual seeded visiting order of
    the whole selection with those rows filtered out (the rest keeps its order). A mixture's
    pools are planned with the run's seed over their rows without the excluded ones."""
    from tokenloom.loader.plan.epoch import visiting_order

    spec = planner.spec
    if spec.mixture:
        keep = [keep_mask(u, excluded) for u in planner.universes()]
        return planner.plan_rows(keep, seed=spec.seed, epoch=epoch)
    lens = np.asarray(planner.inputs.n_tokens)
    ordering = planner.orderings[0] if planner.orderings else None  # a curriculum's order
    order = visiting_order(lens, seed=spec.seed, epoch=int(epoch), ordering=ordering)
    order = order.astype(np.int64)
    keep = keep_mask(planner.inputs.row_ids, excluded)
    return ordered_plan(planner, keep, order, epoch)


class _Exclude:
    """``exclude``: the same data and order, without the quarantined rows."""

    def previous_spec(self, change: Any, spec: LoaderSpec) -> LoaderSpec:
        return spec.replace(version=change.version_before)

    def check_phases(self, saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
        from tokenloom.loader.plan.state import check_fingerprint

        check_fingerprint(saved, current)  # the same data and spec: only the rows left out

    def tail_plan(self, planner: Any, change: Any, index: int, head: Any, delivered: Any) -> Any:
        if change.version_before != change.version_after:
            raise ExcludeError(
                "an exclude change keeps the table version; continue onto the new version "
                "first (--data-change continue), then exclude"
            )
        if planner.spec.mixture:  # each pool's passes have their own orders: planned again
            from tokenloom.loader.plan.change import remaining_budget

            keep = [keep_mask(u, delivered.row_ids) for u in planner.universes()]
            return planner.plan_rows(
                keep,
                seed=change.tail_seed(planner.spec.seed, index),
                epoch=change.epoch,
                budget_tokens=remaining_budget(planner.spec, change.step),
            )
        order = visiting_positions(head.plan)
        keep = keep_mask(planner.inputs.row_ids, delivered.row_ids, planner.excluded)
        return ordered_plan(planner, keep, order, change.epoch)


def register() -> None:
    """Make ``exclude`` a kind of stream change."""
    from tokenloom.loader.plan.change import register_kind

    register_kind(EXCLUDE, _Exclude())
