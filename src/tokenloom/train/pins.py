"""A run pins the table version it trains on (a Lance tag, :mod:`tokenloom.table.tags`).

Rank 0 tags the version at the run's start, before the first step; a resume finds its own tag
and keeps it (idempotent), and a resume onto another version (``--allow-data-change``) adds a
tag for that one too. The record lists the run's pins (``pins``), which ``tokenloom runs rm``
releases.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from tokenloom.loader.plan.spec import LoaderSpec
from tokenloom.train.config import TrainConfig, TrainError
from tokenloom.train.dist import Dist

__all__ = ["pin_run"]


def pin_run(
    cfg: TrainConfig, spec: LoaderSpec, dist: Dist, *, resume: bool, warn: Any
) -> list[dict[str, Any]]:
    """Tag ``spec``'s table version for the run in ``cfg.out``; the run's pins (earlier ones of
    a resumed run first).

    Raises:
        TagHeldError: The run's tag is held by another run (every rank raises).
    """
    from tokenloom.table.tags import TagHeldError, pin_version, run_tag
    from tokenloom.train.record import read_record, record_path

    earlier: list[dict[str, Any]] = []
    if resume and os.path.isfile(record_path(cfg.out)):
        earlier = list(read_record(cfg.out).pins)
    pin = {"table": spec.table, "version": int(spec.version), "tag": run_tag(cfg.out, spec.version)}
    failed: Exception | None = None
    if dist.is_main:
        try:
            pin_version(
                spec.table,
                int(spec.version),
                cfg.out,
                fresh=not resume,
                storage_options=cfg.storage_options,
            )
        except TagHeldError as exc:
            failed = exc
        except OSError as exc:  # a table this user may read but not write: train, unprotected
            warn(
                f"warning: could not tag version {spec.version} of {spec.table} for this run "
                f"({exc}); `tokenloom gc` keeps it, but Lance's cleanup_old_versions may remove it"
            )
            pin = {}
    if dist.distributed:  # every rank stops together when rank 0 could not take the tag
        flag = torch.tensor([1.0 if failed is not None else 0.0], device=dist.device)
        if float(dist.all_reduce_sum(flag)[0]) and failed is None:
            raise TrainError(f"rank 0 could not tag {spec.table} v{spec.version}: see its error")
    if failed is not None:
        raise failed
    pins = [p for p in earlier if p.get("tag") != pin.get("tag")]
    return [*pins, pin] if pin else pins
