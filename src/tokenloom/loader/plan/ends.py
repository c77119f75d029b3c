"""What the windows of long documents end at: a section, a paragraph, a line, or nothing.

Read from the :class:`~tokenloom.loader.plan.window.WindowTable` the planner cuts once per selection
(per pool in a mixture), so it costs one ``bincount`` over the windows: no text is read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenloom.loader.plan.window import END_KINDS, END_OF_DOC, WindowTable

__all__ = ["ENDS", "window_end_counts"]

ENDS = ("section", "paragraph", "line", "none")
"""The kinds a window that stops before its document's end can end at (``none``: the hard
limit, no boundary in the window's last part)."""


def window_end_counts(planner: Any) -> dict[str, int] | None:
    """Windows of the selection's long rows by what they end at, or ``None`` when the recipe
    cuts no windows.

    Returns:
        ``{"section": a, "paragraph": b, "line": c, "none": d, "windows": a + b + c + d,
        "long_docs": rows cut into windows}``: each long row's last window (it ends with the
        document) is not counted among the windows.
    """
    tables = [t for t in [planner.cuts, *planner.pool_cuts] if isinstance(t, WindowTable)]
    if not planner.spec.recipe.windows or not tables:
        return None
    counts = dict.fromkeys(ENDS, 0)
    rows = 0
    for t in tables:
        rows += int(t.rows.shape[0])
        if t.kinds is None:  # no cut column: every window but a row's last ends at the limit
            counts["none"] += t.num_windows - int(t.rows.shape[0])
            continue
        got = np.bincount(t.kinds.astype(np.int64) + 1, minlength=END_OF_DOC + 2)
        for k, name in END_KINDS.items():
            if name in counts:
                counts[name] += int(got[k + 1])
    return {**counts, "windows": sum(counts.values()), "long_docs": rows}
