"""``tokenloom trace`` for an image+text run: which samples a training step held, or at which
steps a row was seen, recomputed from the run record's pinned spec (no log of samples).

Optimizer step ``k`` (1-based) is the run's global step ``k - 1`` counted across epochs (epoch
``e`` has :meth:`~tokenloom.vision.ImageTextDataset.steps` steps); its blocks are rank-split by
the world size of the invocation that trained it (the record's topology).
"""

from __future__ import annotations

from typing import Any

__all__ = ["trace_vlm_run"]


def _world_at(topology: list[dict[str, Any]], step: int) -> int:
    world = 1
    for t in topology:
        if int(t.get("from_step", 1)) <= step:
            world = int(t.get("world_size", 1))
    return world


def trace_vlm_run(
    record: Any,
    *,
    step: int | None = None,
    row_id: int | None = None,
    rank: int | None = None,
    storage_options: dict | None = None,
) -> list[dict[str, Any]]:
    """Per sample: ``step`` (1-based), ``epoch``, ``rank``, ``block``, ``position`` (its place
    in the block) and ``row_id``; for ``step``, or for every step up to the record's that held
    ``row_id``.

    Raises:
        ImageTextError: ``step`` is past the record's steps.
    """
    import numpy as np

    from tokenloom.vision.dataset import ImageTextError, ImageTextStream

    ds = ImageTextStream(record.loader, rank=0, world_size=1, threads=0,
                          storage_options=storage_options)  # fmt: skip
    done = int(record.step)
    if step is not None and not 1 <= step <= done:
        raise ImageTextError(f"step {step} is outside the run: it has trained {done} steps")
    G = ds.spec.global_batch
    ids = ds.sizes.selection.row_ids
    out: list[dict[str, Any]] = []
    first, epoch = 1, 0  # 1-based optimizer step of the epoch's first step
    while first <= done:
        n = ds.steps(epoch)
        last = min(first + n - 1, done)
        wanted = [step] if step is not None else range(first, last + 1)
        if row_id is not None:
            plan = ds.plan(epoch)
            pos = int(ids.searchsorted(row_id))  # ids ascend
            if pos >= len(ids) or int(ids[[pos]][0]) != row_id:
                return []  # not a selected row: no step saw it
            hits = np.flatnonzero(plan.members.astype(np.int64) == pos)
            blocks = np.searchsorted(plan.starts.astype(np.int64), hits, side="right") - 1
            wanted = sorted({first + int(b) // G for b in blocks if first + int(b) // G <= last})
        for k in wanted:
            if not first <= k <= last:
                continue
            world = _world_at(record.topology, k)
            per = G // world
            for t in ds.trace(k - first, epoch=epoch):
                r = (t["block"] - (k - first) * G) // per
                if rank is not None and r != rank:
                    continue
                for p, rid in enumerate(t["row_ids"]):
                    if row_id is None or rid == row_id:
                        out.append({"step": k, "epoch": epoch, "rank": r, "block": t["block"],
                                    "position": p, "row_id": rid})  # fmt: skip
        if step is not None and step <= last:
            break
        first, epoch = first + n, epoch + 1
    return out
