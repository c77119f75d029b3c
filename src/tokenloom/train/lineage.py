"""A run's lineage: the per-pool counts it carries from the runs it started from, the token
budget of the whole lineage, and the compute its invocations took.

A stage started with ``--init-from RUN`` *carries* RUN's cumulative counts: RUN's own per-pool
counts (its record's ``pools``) plus what RUN itself carried, summed by pool name. They are
kept in the child's record (``parent["carried"]``), so the lineage's totals are known from the
last run's record alone, even when an ancestor's directory is gone. Only additive counts are
carried (blocks, body/separator/padding/loss/overlap tokens, and ``tokens``: block positions
trained on, ``blocks x seq_len`` of that run); distinct documents are per run (a document seen
in two stages counts in each).

``total_budget_tokens`` caps the whole lineage in block positions (the unit of the loader's
``budget_tokens``): a child plans ``(budget - carried) // (global_batch x seq_len)`` steps, or
fewer when ``steps`` asks for fewer, and is refused when not one step remains.

Pure: no torch, no Lance.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tokenloom.loader.plan.view import COUNT_FIELDS

__all__ = [
    "CARRIED_FIELDS",
    "add_pools",
    "compute_summary",
    "lineage_pools",
    "own_pools",
    "parent_record",
    "plan_budget",
    "spent_tokens",
]

CARRIED_FIELDS = ("tokens", *COUNT_FIELDS)
"""Per-pool counts a child run carries from its parent (additive over stages)."""


def own_pools(record: Any) -> list[dict[str, Any]]:
    """A run's own per-pool counts in carried form (``tokens`` = blocks x its block length)."""
    out = []
    for p in record.pools:
        counts = {key: int(p.get(key) or 0) for key in COUNT_FIELDS}
        tokens = counts["blocks"] * int(record.loader.seq_len)
        out.append({"name": str(p["name"]), "tokens": tokens, **counts})
    return out


def add_pools(*groups: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per-pool sums of several lists of carried counts, by pool name (first-seen order)."""
    total: dict[str, dict[str, Any]] = {}
    for group in groups:
        for p in group:
            row = total.setdefault(
                str(p["name"]), {"name": str(p["name"]), **dict.fromkeys(CARRIED_FIELDS, 0)}
            )
            for key in CARRIED_FIELDS:
                row[key] += int(p.get(key) or 0)
    return list(total.values())


def lineage_pools(record: Any) -> list[dict[str, Any]]:
    """The lineage's cumulative per-pool counts up to ``record``'s last checkpoint: its
    ancestors' carried counts plus its own (what a child started from it carries)."""
    carried = (record.parent or {}).get("carried") or []
    return add_pools(carried, own_pools(record))


def spent_tokens(pools: Iterable[Mapping[str, Any]]) -> int:
    """Block positions trained on over ``pools`` (carried form)."""
    return sum(int(p.get("tokens") or 0) for p in pools)


def parent_record(init_from: str | os.PathLike[str] | None) -> Any:
    """The record of ``init_from`` when it is a tokenloom run (``None``: no parent, or a
    ``transformers`` folder, which carries no counts)."""
    if init_from is None:
        return None
    from tokenloom.train.hf import is_hf_folder
    from tokenloom.train.record import read_record

    if is_hf_folder(os.fspath(init_from)):
        return None
    return read_record(init_from)


def plan_budget(cfg: Any, *, resume: bool = False, log: Any = None) -> Any:
    """``cfg`` (a :class:`~tokenloom.train.config.TrainConfig`) with its steps derived from
    ``cfg.total_budget_tokens`` and what its lineage spent before it; ``cfg`` itself when it has
    no total budget.

    A new run counts what its ``init_from`` run's record says the lineage spent; a resumed run
    counts what its own record carried at its start (an ancestor trained further since does
    not shrink a run already planned).

    Raises:
        BudgetError: Less than one step of the budget remains (the numbers and the fix named).
    """
    from tokenloom.train.config import BudgetError
    from tokenloom.train.record import read_record

    budget = cfg.total_budget_tokens
    if budget is None:
        return cfg
    if resume:
        own = read_record(cfg.out)
        carried = (own.parent or {}).get("carried") or []
        origin = (own.parent or {}).get("out")
    else:
        parent = parent_record(cfg.init_from)
        carried = lineage_pools(parent) if parent is not None else []
        origin = parent.out if parent is not None else None
    spent = spent_tokens(carried)
    per_step = cfg.loader.global_batch * cfg.loader.seq_len
    remaining = budget - spent
    fit = max(remaining, 0) // per_step
    if fit < 1:
        lineage = f"the lineage up to {origin}" if origin else "the lineage"
        left = (
            f"{remaining:,} remain, less than one step of"
            if remaining > 0
            else "nothing remains"
            + (f" ({-remaining:,} over)" if remaining else "")
            + " for a step of"
        )
        raise BudgetError(
            f"--total-budget-tokens {budget:,}: {lineage} has trained on {spent:,} tokens, "
            f"{left} {cfg.loader.global_batch} x {cfg.loader.seq_len} = {per_step:,} tokens; "
            "raise --total-budget-tokens, or start from another run"
        )
    steps = fit if cfg.steps is None else min(cfg.steps, fit)
    if log is not None and not resume:
        capped = ""
        if cfg.steps is not None and steps < cfg.steps:
            capped = f" (--steps {cfg.steps} capped)"
        log(
            f"budget: {budget:,} tokens for the lineage, {spent:,} spent before this run, "
            f"{remaining:,} remain: {steps:,} steps of {per_step:,} tokens{capped}"
        )
    return dataclasses.replace(cfg, steps=steps)


def compute_summary(
    topology: Sequence[Mapping[str, Any]], global_batch: int, seq_len: int
) -> dict[str, Any]:
    """Wall time, process-hours, devices and tokens/s of a run, summed over its invocations
    (the record's ``topology`` entries that say how long they ran: ``to_step``,
    ``wall_seconds``, written at each checkpoint)."""
    wall = hours = 0.0
    tokens = 0
    last: Mapping[str, Any] = {}
    for entry in topology:
        if entry.get("wall_seconds") is None or entry.get("to_step") is None:
            continue  # an invocation that wrote no checkpoint, or an older record
        seconds = float(entry["wall_seconds"])
        steps = int(entry["to_step"]) - int(entry["from_step"]) + 1
        wall += seconds
        hours += seconds * int(entry.get("world_size") or 1) / 3600.0
        tokens += max(steps, 0) * int(global_batch) * int(seq_len)
        last = entry
    return {
        "wall_seconds": round(wall, 3),
        "process_hours": round(hours, 6),
        "device_type": last.get("device"),
        "device_name": last.get("device_name"),
        "device_count": last.get("world_size"),
        "tokens": tokens,
        "tokens_per_second": round(tokens / wall, 3) if wall > 0 else None,
    }
