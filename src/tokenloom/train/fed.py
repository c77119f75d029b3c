"""What a run was fed, per mixture pool, summed over ranks (the ledger's numbers at run time)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from tokenloom.loader.observe.ledger import LedgerCounter
from tokenloom.train.dist import Dist

__all__ = ["fed_totals", "as_dicts", "pool_line"]


def fed_totals(loader, dist: Dist):  # noqa: ANN001, ANN202
    """Per-pool counters of everything the run was fed, summed over ranks (a collective)."""
    counter = loader.ledger
    if not dist.distributed:
        return counter
    counts = torch.from_numpy(counter.counts.copy()).to(dist.device)
    dist.all_reduce_sum(counts)
    seen = []
    for arr in counter.seen:
        t = torch.from_numpy(arr.astype(np.int32)).to(dist.device)
        dist.all_reduce_sum(t)
        seen.append(t.cpu().numpy())
    total = LedgerCounter(counter.names, counter.universes)
    total.counts = counts.cpu().numpy()
    total.merge_seen(seen)
    return total


def as_dicts(counter) -> list[dict]:  # noqa: ANN001
    return [dataclasses.asdict(p) for p in counter.pools()]


def pool_line(pools: list[dict]) -> str:
    return "  ".join(
        f"{p['name']} {p['body_tokens'] / 1e6:.2f}M tok/{p['unique_documents']:,} docs/"
        f"{p['documents_seen_more_than_once']:,} rep"
        + (f"/{p['masked_tokens']:,} masked" if p.get("masked_tokens") else "")  # a loss mask
        for p in pools
    )
