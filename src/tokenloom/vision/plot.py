"""A bar chart of padding waste per packing policy (seed 004's comparison), as a PNG.

matplotlib is optional (``pip install 'tokenloom[plot]'``) and drawn on the Agg canvas, without
``pyplot``.
"""

from __future__ import annotations

import os
from pathlib import Path

from tokenloom.errors import require

__all__ = ["plot_padding"]


def plot_padding(ledgers: dict[str, dict[str, float]], path: str | os.PathLike[str]) -> Path:
    """Stacked bars of image tokens, text tokens and padding per policy, padding share on top.

    Args:
        ledgers: ``{policy: ledger}`` from :func:`~tokenloom.vision.packing.plan_padding`.
        path: Output PNG.
    """
    require("matplotlib", extra="plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    names = list(ledgers)
    bottom = [0.0] * len(names)
    for key, colour in (
        ("image_tokens", "tab:orange"),
        ("text_tokens", "tab:blue"),
        ("padding", "lightgray"),
    ):
        values = [float(ledgers[n][key]) for n in names]
        ax.bar(names, values, bottom=bottom, color=colour, label=key.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for i, n in enumerate(names):
        ax.text(
            i, bottom[i], f"{ledgers[n]['padding_share']:.1%} padding", ha="center", va="bottom"
        )
    ax.set_ylabel("positions")
    ax.set_title("Image+text packing: positions allocated per policy")
    ax.legend(loc="upper right")
    out = Path(path)
    fig.savefig(out)
    return out
