"""Loss curves (train and validation) as a PNG. matplotlib is optional (the ``plot`` extra)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from tokenloom.errors import require

__all__ = ["plot_losses"]


def plot_losses(
    path: str,
    train: Sequence[tuple[int, float]],
    val: Sequence[tuple[int, float]] = (),
    *,
    title: str = "",
    reference: tuple[str, float] | None = None,
) -> str:
    """Draw ``(step, loss)`` curves to ``path``; ``reference`` adds a labelled horizontal line
    (e.g. the unigram entropy). Returns the path.

    Raises:
        MissingDependencyError: matplotlib is not installed; names the install line.
    """
    require("matplotlib", extra="plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if train:
        steps, losses = zip(*train, strict=True)
        ax.plot(steps, losses, lw=1, alpha=0.8, label="train")
    if val:
        steps, losses = zip(*val, strict=True)
        ax.plot(steps, losses, "o-", lw=1.5, ms=4, label="validation")
    if reference:
        ax.axhline(reference[1], ls="--", color="gray", lw=1, label=reference[0])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    return path
