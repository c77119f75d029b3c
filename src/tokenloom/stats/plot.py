"""A histogram of document lengths (log-spaced bins) with the block length marked, as a PNG.

matplotlib is optional (``pip install 'tokenloom[plot]'``) and imported only here, on call. The
figure is drawn on matplotlib's Agg canvas directly, without ``pyplot``, so it never touches the
caller's global backend or open figures.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from tokenloom.errors import require
from tokenloom.stats.lengths import source_codes

__all__ = ["plot_length_histogram", "log_bins"]

_BINS_PER_DECADE = 12


def log_bins(max_len: int, *, per_decade: int = _BINS_PER_DECADE) -> np.ndarray:
    """Log-spaced bin edges from 1 to just above ``max_len`` tokens, shape ``(bins + 1,)``."""
    top = max(int(max_len), 1) + 1
    count = max(1, math.ceil(np.log10(top) * per_decade))
    return np.geomspace(1.0, top, count + 1)


def plot_length_histogram(
    n_tokens: np.ndarray,
    path: str | os.PathLike[str],
    *,
    seq_len: int | None = None,
    sources: np.ndarray | None = None,
    title: str | None = None,
) -> Path:
    """Write a histogram of tokens per document to a PNG.

    Args:
        n_tokens: Tokens per document, shape ``(docs,)``. Empty documents (0 tokens) cannot sit
            on a log axis; their count is given in the legend instead.
        path: Output file (PNG).
        seq_len: Block length to mark with a vertical line, with the share of documents longer.
        sources: Optional source label per document, shape ``(docs,)``: one stacked colour
            per source.
        title: Figure title (default: document and token counts).

    Returns:
        ``path`` as a ``Path``.

    Raises:
        MissingDependencyError: matplotlib is not installed; names the install line.
        ValueError: ``n_tokens`` is empty or ``sources`` has another shape.
    """
    require("matplotlib", extra="plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = np.asarray(n_tokens).astype(np.int64, copy=False)
    if counts.ndim != 1 or counts.size == 0:
        raise ValueError(f"n_tokens must be a non-empty 1-D array, got shape {counts.shape}")
    positive = counts > 0
    edges = log_bins(int(counts.max()))

    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if sources is None:
        ax.hist(counts[positive], bins=edges, color="tab:blue", label="documents")
    else:
        names, codes = source_codes(sources, counts.size)
        groups = [counts[positive & (codes == i)] for i in range(len(names))]
        ax.hist(groups, bins=edges, stacked=True, label=[str(n) for n in names])
    if seq_len is not None:
        longer = float((counts > seq_len).mean())
        ax.axvline(seq_len, color="black", linestyle="--", linewidth=1.2)
        ax.text(
            seq_len,
            0.97,
            f" seq_len {seq_len}: {longer:.1%} of docs longer",
            transform=ax.get_xaxis_transform(),
            va="top",
            fontsize=9,
        )
    empty = int((~positive).sum())
    if empty:
        ax.plot([], [], " ", label=f"{empty:,} empty documents not shown")
    ax.set_xscale("log")
    ax.set_xlabel("tokens per document (log scale)")
    ax.set_ylabel("documents")
    ax.set_title(title or f"{counts.size:,} documents, {int(counts.sum()):,} tokens")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, format="png")
    return out
