"""``StreamSpec``: the part of a loader's spec every stream has, defined and validated once.

A stream is *which rows* (``table``, ``version``, ``filter``), cut into global steps of
``global_batch`` items, shuffled by ``seed``, with or without the last incomplete step
(``drop_last``). :class:`~tokenloom.loader.plan.spec.LoaderSpec` (packed tokens) and
:class:`~tokenloom.rows.spec.RowSpec` (rows) subclass it and add their own fields. Pure: imports
neither Lance nor torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tokenloom.loader.plan.epoch import PlanError

__all__ = ["StreamSpec", "absolute_uri", "check_int"]


def absolute_uri(uri: str) -> str:
    """An object-store or ``file://`` URI unchanged; a local path made absolute (so a record
    written in one directory is read the same from any other).

    Raises:
        StorageError: A malformed URI (:func:`~tokenloom.table.storage.check_uri`).
    """
    from tokenloom.table.storage import check_uri

    text = check_uri(uri)
    if "://" in text:
        return text
    return os.path.abspath(os.path.expanduser(text))


def check_int(name: str, value: Any, *, low: int, optional: bool = False) -> None:
    """Refuse ``value`` unless it is an ``int`` (not a bool) ``>= low`` (or ``None`` if
    ``optional``).

    Raises:
        PlanError: Naming ``name``, the rule and the value.
    """
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PlanError(f"{name} must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamSpec:
    """Which rows a stream visits and how they are cut into global steps (module docstring).

    Subclasses call ``StreamSpec.__post_init__(self)`` first in their own ``__post_init__``.
    """

    table: str
    """The table: a local path (stored absolute) or an object-store URI Lance accepts."""
    version: int | None = None
    """Table version to read; ``None``: the latest when the loader is built (then pinned, and
    the pinned number is what checkpoints record)."""
    filter: str | None = None
    """SQL selecting the rows (``None``: all)."""
    global_batch: int = 8
    """Items per global step ``G``, over all ranks (each of ``W`` ranks takes ``G / W``)."""
    seed: int = 0
    """Shuffle seed; every epoch is a fresh permutation of ``(seed, epoch)``."""
    drop_last: bool = False
    """Leave out an epoch's last, incomplete global step instead of completing it."""

    def __post_init__(self) -> None:
        if not isinstance(self.table, str | os.PathLike) or not os.fspath(self.table):
            raise PlanError(f"table must be a path or URI, got {self.table!r}")
        object.__setattr__(self, "table", absolute_uri(self.table))
        check_int("version", self.version, low=0, optional=True)
        if self.filter is not None and (
            not isinstance(self.filter, str) or not self.filter.strip()
        ):
            raise PlanError(f"filter must be SQL text or None, got {self.filter!r}")
        check_int("global_batch", self.global_batch, low=1)
        check_int("seed", self.seed, low=0)
        if not isinstance(self.drop_last, bool):
            raise PlanError(f"drop_last must be True or False, got {self.drop_last!r}")

    def per_rank(self, world_size: int) -> int:
        """Items each of ``world_size`` ranks takes per step, ``G / W``.

        Raises:
            PlanError: ``G`` is not a multiple of ``world_size``
                (:func:`~tokenloom.loader.plan.stream.topology.split_global_batch`).
        """
        from tokenloom.loader.plan.stream.topology import split_global_batch

        return split_global_batch(self.global_batch, world_size, unit=self.unit)

    @property
    def unit(self) -> str:
        """What one item of a global step is, in messages (``"rows"``, ``"blocks"``)."""
        return "items"

    def stream_inputs(self) -> dict[str, Any]:
        """The common part's named inputs of the plan's fingerprint (subclasses add theirs)."""
        return {
            "filter": self.filter,
            "seed": self.seed,
            "global_batch": self.global_batch,
            "drop_last": self.drop_last,
        }
