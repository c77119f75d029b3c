"""Reweighting a mixture mid-run: the ``reweight`` kind of
:class:`~tokenloom.loader.plan.change.StreamChange`.

``tokenloom train --resume --mixture new.json --reweight`` changes the pools' shares (and caps)
from the checkpoint's step ``s`` of epoch ``e`` on. The quota each pool already spent (its blocks
in steps ``< s``, what the ledger counts) stays as it was; the rest of the epoch's budget,
``budget - s G L`` positions, is planned again with the new shares: the tail is a mixture plan
(:func:`~tokenloom.loader.plan.mixture.plan_mixture`, shares held per step) over each pool's rows
not yet delivered this epoch, in an order seeded from the run's seed, the epoch and the change's
index. So after the epoch, pool ``p`` was fed ``spent_p + taken_p(remaining blocks)`` blocks —
the new schedule's exact count, within one block per step of ``share_p x remaining``. Later
epochs are planned with the new shares from their start.

Only shares and ``max_passes`` may change: the same pools, with the same filters (another filter
selects other rows: that is a data change). A capped pool (``max_passes``) can give the tail at
most that many passes over its remaining rows; shares that the remaining budget cannot meet are
refused, with each pool's numbers (:class:`ReweightError`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenloom.errors import TokenloomError

if TYPE_CHECKING:
    from tokenloom.loader.plan.spec import LoaderSpec, PoolSpec

__all__ = ["REWEIGHT", "ReweightError", "check_pools", "reweight_params", "quota_table"]

REWEIGHT = "reweight"
"""The kind's name."""


class ReweightError(TokenloomError):
    """A new mixture cannot reweight the run (other pools, or shares its budget cannot meet);
    ``tokenloom train`` reports it as a usage error of ``--mixture``."""


def check_pools(before: Sequence[PoolSpec], after: Sequence[PoolSpec]) -> None:
    """Refuse a new mixture that is not a reweighting of ``before``: pools added or removed, or a
    pool's filter changed.

    Raises:
        ReweightError: Naming the pools and the fix.
    """
    if not before:
        raise ReweightError(
            "--reweight applies to a mixture run; this run has no --mixture (start a mixture run "
            "with `tokenloom train --mixture mix.json --budget-tokens N`)"
        )
    old = {p.name: p for p in before}
    new = {p.name: p for p in after}
    added, removed = sorted(set(new) - set(old)), sorted(set(old) - set(new))
    if added or removed:
        what = "; ".join(
            x
            for x in (
                f"added {', '.join(added)}" if added else "",
                f"removed {', '.join(removed)}" if removed else "",
            )
            if x
        )
        raise ReweightError(
            f"--reweight keeps the run's pools ({', '.join(old)}) and changes their shares only, "
            f"but the new mixture {what}; give every pool of the run a share (a pool's rows "
            "change with `--data-change continue`, not with --reweight)"
        )
    for name, p in old.items():
        if new[name].filter != p.filter:
            raise ReweightError(
                f"--reweight: pool {name!r} selects {new[name].filter!r} in the new mixture but "
                f"{p.filter!r} in the run; keep the filter (only shares and max_passes change)"
            )


def reweight_params(before: Sequence[PoolSpec], after: Sequence[PoolSpec]) -> dict[str, Any]:
    """The change's parameters: both mixtures, as lists of pools in the run's order (a pool's
    index seeds its passes; a mapping's keys would be sorted in the record)."""

    def pools(mix: Sequence[PoolSpec]) -> list[dict[str, Any]]:
        return [
            {"name": p.name, "filter": p.filter, "share": p.share, "max_passes": p.max_passes}
            for p in mix
        ]

    return {"mixture_before": pools(before), "mixture_after": pools(after)}


def quota_table(
    names: Sequence[str],
    shares: np.ndarray,
    quota: np.ndarray,
    supply: np.ndarray,
    seq_len: int,
) -> str:
    """One line per pool: new share, blocks (and positions) owed over the remaining budget, and
    what its remaining rows can give (``-1``: unlimited)."""
    total = float(np.sum(shares))
    lines = []
    for i, name in enumerate(names):
        give = (
            "unlimited" if supply[i] < 0 else f"{int(supply[i]):,} ({int(supply[i]) * seq_len:,})"
        )
        lines.append(
            f"  {name}: share {float(shares[i]) / total:.4f}, needs {int(quota[i]):,} blocks "
            f"({int(quota[i]) * seq_len:,} positions), its remaining rows give {give}"
        )
    return "\n".join(lines)


class _Reweight:
    """``reweight``: the previous phase had the old mixture; the tail plans the remaining budget
    with the new shares over the rows not yet delivered."""

    def previous_spec(self, change: Any, spec: LoaderSpec) -> LoaderSpec:
        from tokenloom.loader.plan.spec import parse_pools

        old = parse_pools(change.params["mixture_before"])
        return spec.replace(version=change.version_before, mixture=old)

    def check_phases(self, saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
        from tokenloom.loader.plan.state import check_fingerprint

        # the pools' shares and caps may change; their rows, filters, the budget and all else
        # must not (check_pools named a changed pool already)
        check_fingerprint(_without_shares(saved), _without_shares(current))

    def tail_plan(self, planner: Any, change: Any, index: int, head: Any, delivered: Any) -> Any:
        from tokenloom.loader.plan.change import _not_in, remaining_budget

        spec = planner.spec
        keep = [_not_in(np.asarray(u), delivered.row_ids) for u in planner.universes()]
        plan = planner.plan_rows(
            keep,
            seed=change.tail_seed(spec.seed, index),
            epoch=change.epoch,
            budget_tokens=remaining_budget(spec, change.step),
        )
        if getattr(plan, "limited_by", None) is not None:
            _refuse(plan, spec, change, delivered)
        return plan


def _without_shares(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Plan inputs with each mixture pool's share and cap left out."""
    out = dict(inputs)
    mixture = out.get("mixture")
    if isinstance(mixture, Mapping) and isinstance(mixture.get("pools"), list):
        pools = [
            {k: v for k, v in p.items() if k not in ("share", "max_passes")}
            if isinstance(p, Mapping)
            else p
            for p in mixture["pools"]
        ]
        out["mixture"] = {**mixture, "pools": pools}
    return out


def _refuse(plan: Any, spec: LoaderSpec, change: Any, delivered: Any) -> None:
    """Raise :class:`ReweightError` for a tail whose capped pool ran out before the budget."""
    sched = plan.schedule
    quota = sched.taken(int(plan.budget_blocks))
    supply = np.array(
        [
            int(e[-1]) if p.max_passes is not None else -1
            for p, e in zip(plan.pools, plan.pass_ends, strict=True)
        ],
        dtype=np.int64,
    )
    shares = np.array([p.share for p in plan.pools], dtype=np.float64)
    names = [p.name for p in plan.pools]
    raise ReweightError(
        f"--reweight: the new shares cannot be met by the {int(plan.budget_blocks):,} blocks "
        f"({int(plan.budget_blocks) * spec.seq_len:,} positions) left of epoch {change.epoch}'s "
        f"budget after step {change.step}: pool {plan.limited_by!r} runs out of rows "
        f"({len(delivered.row_ids):,} rows were delivered before the change):\n"
        f"{quota_table(names, shares, quota, supply, spec.seq_len)}\n"
        f"lower {plan.limited_by!r}'s share or raise its max_passes in the --mixture file"
    )


def register() -> None:
    """Make ``reweight`` a kind of stream change."""
    from tokenloom.loader.plan.change import register_kind

    register_kind(REWEIGHT, _Reweight())
