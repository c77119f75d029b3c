"""What grouping rows into documents does to a selection's plan: documents, blocks, markers.

``python -m tokenloom.dev.group_report --table T --filter SQL [--group-by COL --group-order
COL|imports --file-marker TEXT]`` plans the selection's epoch 0 with ``long_docs="units"``
(``--seq-len`` = window, ``--overlap``, ``--cut-column``), as rows or as groups, and reports:

* ``documents``, ``rows``; ``fit``: documents of at most ``L - 1`` tokens; ``whole``: documents
  whose stretches all lie in one block;
* ``blocks``, ``body_tokens`` and ``marker_tokens`` (the ledger's);
* ``window_ends`` (:func:`~tokenloom.loader.plan.ends.window_end_counts`) and ``at_file_edge``:
  windows (but each document's last) that end where a file of their group starts;
* ``planner_seconds``: building the planner (the plan inputs, the group layout, the windows).

A measuring tool for ``docs/recipes.md``, not a loader path.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

__all__ = ["group_report"]


def group_report(
    uri: str,
    *,
    filter: str | None,
    group: dict | None,
    seq_len: int = 1024,
    overlap: int = 64,
    cut_column: str | None = "cut_structure",
) -> dict[str, Any]:
    """The report of one selection (see the module docstring)."""
    from tokenloom.loader import LoaderSpec, ledger
    from tokenloom.loader.pipeline.planner import Planner
    from tokenloom.loader.plan.ends import window_end_counts

    started = time.perf_counter()
    spec = LoaderSpec.from_options(
        table=uri, seq_len=seq_len, global_batch=8, filter=filter, group=group,
        long_docs="units", window=seq_len, overlap=overlap, cut_column=cut_column,
    )  # fmt: skip
    planner = Planner(spec, plan_store=None)
    seconds = time.perf_counter() - started
    plan = planner.view(0).plan
    sp = plan.spans(np.arange(plan.num_blocks))
    block, ids = sp.blocks[sp.block], sp.row_id
    order = np.lexsort((block, ids))
    ids, block = ids[order], block[order]
    first = np.r_[True, ids[1:] != ids[:-1]]
    new = first | np.r_[True, block[1:] != block[:-1]]
    spread = np.add.reduceat(new.astype(np.int64), np.flatnonzero(first))
    lengths = np.asarray(planner.inputs.n_tokens, dtype=np.int64)
    pool = ledger(planner).pools[0]
    edge = None
    files, table = planner.files, planner.cuts
    if files is not None and table is not None:
        members = np.arange(len(files.rows))
        owner = files.group_of(members)
        start = files.starts[:-1] - files.starts[files.gptr[owner]]
        big = np.int64(1 << 40)
        edges = owner.astype(np.int64) * big + start
        per = np.diff(table.ptr)
        last = np.zeros(len(table.ends), dtype=bool)
        last[table.ptr[1:] - 1] = True
        ends = np.repeat(table.rows.astype(np.int64), per) * big + table.ends.astype(np.int64)
        edge = int(np.isin(ends[~last], edges).sum())
    return {
        "documents": int(lengths.shape[0]),
        "rows": int(len(planner.row_inputs.row_ids)),
        "fit": int((lengths + 1 <= seq_len).sum()),
        "whole": int((spread == 1).sum()),
        "blocks": int(plan.num_blocks),
        "body_tokens": pool.body_tokens,
        "marker_tokens": pool.marker_tokens,
        "window_ends": window_end_counts(planner),
        "at_file_edge": edge,
        "planner_seconds": round(seconds, 2),
    }


def main(argv: list[str] | None = None) -> None:
    """Print :func:`group_report` as JSON."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--table", required=True)
    p.add_argument("--filter", default=None)
    p.add_argument("--group-by", default=None)
    p.add_argument("--group-order", default=None)
    p.add_argument("--file-marker", default=None)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--overlap", type=int, default=64)
    p.add_argument("--cut-column", default="cut_structure")
    a = p.parse_args(argv)
    group = None
    if a.group_by:
        marker = a.file_marker.replace("\\n", "\n") if a.file_marker else None
        group = {"key": a.group_by, "order": a.group_order, "marker": marker}
    report = group_report(
        a.table, filter=a.filter, group=group, seq_len=a.seq_len, overlap=a.overlap,
        cut_column=a.cut_column,
    )  # fmt: skip
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
