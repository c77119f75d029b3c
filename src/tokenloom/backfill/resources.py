"""What one work unit of a UDF asks of a Ray cluster: CPUs, GPUs, memory, custom resources.

Declared on the UDF (``@udf(..., num_gpus=1, resources={"a100": 1})``) or overridden per run
(``UDF.with_resources``, ``tokenloom backfill run --num-gpus 1``). They are scheduling hints,
not identity: two runs of one UDF with different resources reuse each other's results. The
local process pool ignores them (it runs ``--workers`` processes whatever a unit asks).

An amount no node of the cluster has would leave Ray's tasks pending forever; :func:`infeasible`
finds that before anything is submitted, from the nodes' resource totals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenloom.errors import TokenloomError

__all__ = ["Resources", "infeasible"]

#: Ray's names of the built-in resources, by our field names.
_BUILTIN = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}


@dataclass(frozen=True, kw_only=True)
class Resources:
    """Per-unit resource request of a UDF, passed to Ray tasks as they are."""

    num_cpus: float | None = None
    """CPUs reserved per unit (Ray's ``num_cpus``); ``None``: 1."""
    num_gpus: float | None = None
    """GPUs per unit, fractions allowed (Ray's ``num_gpus``); ``None``: none."""
    memory: int | None = None
    """Bytes of memory reserved per unit for scheduling (Ray's ``memory``); ``None``: none."""
    custom: Mapping[str, float] = field(default_factory=dict)
    """Custom resources by name (Ray's ``resources``), e.g. ``{"a100": 1}`` for the nodes
    started with ``ray start --resources '{"a100": 8}'``."""

    def __post_init__(self) -> None:
        for name in ("num_cpus", "num_gpus", "memory"):
            value = getattr(self, name)
            if value is not None and not _amount(value):
                raise TokenloomError(f"UDF resource {name}={value!r} must be a finite number >= 0")
        if self.memory is not None and int(self.memory) != self.memory:
            raise TokenloomError(f"UDF resource memory={self.memory!r} must be whole bytes")
        if not isinstance(self.custom, Mapping):
            raise TokenloomError(
                f"UDF resources must map names to amounts, e.g. {{'a100': 1}}, not {self.custom!r}"
            )
        for key, value in self.custom.items():
            if not isinstance(key, str) or not key:
                raise TokenloomError(f"UDF custom resource names must be strings, not {key!r}")
            if key in _BUILTIN.values():
                own = next(k for k, v in _BUILTIN.items() if v == key)
                raise TokenloomError(
                    f"UDF custom resource {key!r} is built in; pass {own}= instead"
                )
            if not _amount(value):
                raise TokenloomError(
                    f"UDF custom resource {key}={value!r} must be a finite number >= 0"
                )
        object.__setattr__(self, "custom", dict(self.custom))

    def merged(self, **override: Any) -> Resources:
        """These resources with the given fields replaced (``None`` keeps the current value)."""
        fields = {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "memory": self.memory,
            "custom": self.custom,
        }
        fields.update({k: v for k, v in override.items() if v is not None})
        return Resources(**fields)

    def ray_options(self) -> dict[str, Any]:
        """Keyword arguments for ``ray.remote(...)`` / ``.options(...)``: one CPU by default."""
        out: dict[str, Any] = {"num_cpus": 1 if self.num_cpus is None else self.num_cpus}
        if self.num_gpus:
            out["num_gpus"] = self.num_gpus
        if self.memory:
            out["memory"] = int(self.memory)
        if self.custom:
            out["resources"] = dict(self.custom)
        return out

    def demand(self) -> dict[str, float]:
        """The request in Ray's resource names (``CPU``, ``GPU``, ``memory``, custom), non-zero
        amounts only."""
        opts = self.ray_options()
        out = {
            _BUILTIN[k]: float(opts[k]) for k in ("num_cpus", "num_gpus", "memory") if opts.get(k)
        }
        out.update({k: float(v) for k, v in self.custom.items() if v})
        return out

    def to_json(self) -> dict[str, Any]:
        """The non-default fields, for a job record or a summary."""
        out: dict[str, Any] = {
            k: getattr(self, k) for k in ("num_cpus", "num_gpus", "memory") if getattr(self, k)
        }
        if self.custom:
            out["custom"] = dict(self.custom)
        return out


def infeasible(demand: Mapping[str, float], nodes: Sequence[Mapping[str, float]]) -> bool:
    """Whether no node holds every amount of ``demand`` (so a task asking it never runs).

    Args:
        demand: Resource name → amount one task needs (see :meth:`Resources.demand`).
        nodes: Each alive node's total resources (``ray.nodes()[i]["Resources"]``).
    """
    return not any(
        all(node.get(name, 0.0) >= amount for name, amount in demand.items()) for node in nodes
    )


def _amount(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )
