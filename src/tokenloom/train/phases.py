"""A run's phases: the stream changes it went through (continue, reweight, exclude), as
``tokenloom runs`` and ``tokenloom ledger --run`` show them. Pure: read from the run record."""

from __future__ import annotations

from typing import Any

__all__ = ["run_phases", "describe_phase"]


def _mixture(pools: Any) -> str:
    from tokenloom.loader.plan.spec import parse_pools

    return ", ".join(f"{p.name} {p.share:g}" for p in parse_pools(pools))


def describe_phase(change: dict[str, Any]) -> str:
    """One line on a change (the dict form of a
    :class:`~tokenloom.loader.plan.change.StreamChange`)."""
    kind, p = change["kind"], change.get("params") or {}
    where = (
        f"from step {change['global_step'] + 1} (epoch {change['epoch']}, its step "
        f"{change['step'] + 1})"
    )
    if kind == "reweight":
        return (
            f"{where}: reweight {_mixture(p['mixture_before'])} -> "
            f"{_mixture(p['mixture_after'])} (the epoch's spent quota kept)"
        )
    if kind == "exclude":
        a, b = p["steps"]
        return (
            f"{where}: exclude quarantine {p['quarantine']!r} ({p['rows']:,} rows, "
            f"{p['tokens']:,} tokens fed at steps {a}..{b})"
        )
    if kind == "continue":
        return f"{where}: continue onto table version {change['version_after']}"
    return f"{where}: {kind}"


def run_phases(record: Any) -> list[dict[str, Any]]:
    """The run's changes in order, each with ``from_step`` (1-based) and ``summary``."""
    return [
        {**c.to_dict(), "from_step": c.global_step + 1, "summary": describe_phase(c.to_dict())}
        for c in record.changes
    ]
