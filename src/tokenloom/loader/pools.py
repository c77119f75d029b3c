"""Mixture pools as the loader takes them: ``{name: (sql_filter, share[, max_passes])}``, and
the one id -> stable-row-id map over every pool's rows (a row may sit in several pools)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tokenloom.loader.read import LoaderError, PlanInputs

__all__ = ["parse_mixture", "union_inputs"]


def parse_mixture(mixture: Mapping[str, Sequence[Any]] | None) -> list[tuple]:
    """``{name: (filter, share[, max_passes])}`` -> ``[(name, filter, share, max_passes)]``."""
    if not mixture:
        return []
    out = []
    for name, spec in mixture.items():
        if isinstance(spec, str) or len(spec) not in (2, 3):
            raise LoaderError(
                f"mixture pool {name!r} must be (sql_filter, share) or (sql_filter, share, "
                f"max_passes), not {spec!r}"
            )
        flt, share, *cap = spec
        out.append((str(name), str(flt), float(share), cap[0] if cap else None))
    return out


def union_inputs(parts: list) -> Any:
    """One row-id -> stable-row-id map over every pool (a row may sit in several pools)."""
    ids = np.concatenate([p.row_ids for p in parts])
    rowids = np.concatenate([p.rowids for p in parts])
    counts = np.concatenate([p.n_tokens for p in parts])
    uniq, first = np.unique(ids, return_index=True)
    return PlanInputs(
        version=parts[0].version,
        row_ids=uniq,
        n_tokens=counts[first],
        rowids=rowids[first],
        null_rows=sum(p.null_rows for p in parts),
        tokenizer=parts[0].tokenizer,
    )
