"""Pure statistics over stored columns: document lengths, and pad/truncate vs packing.

``length_stats(n_tokens, seq_len=1024)`` gives the length distribution and how much of the
corpus each batching policy keeps; ``plot_length_histogram`` draws it (needs matplotlib).
"""

from tokenloom.stats.lengths import (
    PERCENTILES,
    LengthStats,
    Percentiles,
    SourceLengths,
    length_stats,
    source_codes,
)
from tokenloom.stats.plot import plot_length_histogram

__all__ = [
    "PERCENTILES",
    "LengthStats",
    "Percentiles",
    "SourceLengths",
    "length_stats",
    "source_codes",
    "plot_length_histogram",
]
