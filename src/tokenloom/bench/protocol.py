"""The benchmark protocol shared by ``bench loader`` and ``bench rows`` (seed 001's): every loader
at each of several batch sizes (``--batch-sizes 4,8,16``), each for ``--epochs`` measuring
windows in one fresh process, the rate of each window kept and reported as the mean with its
min–max; beside it the loader's first-batch latency, its CPU utilisation and memory sampled over
time (:class:`~tokenloom.bench.loader_rss.TreeSampler`), the data stall with a model in the loop
and the shuffle it gives (:mod:`~tokenloom.bench.loader_shuffle`'s figures).

This module holds the pure parts: the aggregation (:func:`spread`), one row of the protocol's
table (:class:`ProtocolRow`, one loader at one batch size) and its summary of a usage series.
The files a run leaves are written by :mod:`~tokenloom.bench.protocol_output`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

__all__ = ["Spread", "spread", "parse_sizes", "ProtocolRow", "usage_summary"]


@dataclass(frozen=True)
class Spread:
    """The mean of a few repeated figures with their range."""

    mean: float
    low: float
    high: float
    n: int

    def cell(self, digits: int = 2, scale: float = 1.0) -> str:
        """``mean (low–high)``, each divided by ``scale``; the mean alone for one value."""
        fmt = f"{{:,.{digits}f}}"
        mean = fmt.format(self.mean / scale)
        if self.n < 2:
            return mean
        return f"{mean} ({fmt.format(self.low / scale)}–{fmt.format(self.high / scale)})"


def spread(values: Iterable[float]) -> Spread | None:
    """Mean, min and max of ``values`` (``None`` when empty).

    >>> spread([1.0, 2.0, 6.0])
    Spread(mean=3.0, low=1.0, high=6.0, n=3)
    """
    vals = [float(v) for v in values]
    if not vals:
        return None
    return Spread(mean=sum(vals) / len(vals), low=min(vals), high=max(vals), n=len(vals))


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"4,8,16"`` -> ``(4, 8, 16)``: distinct positive batch sizes in the order given.

    Raises:
        ValueError: naming the bad entry (the CLI turns it into a usage error).
    """
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            size = int(part)
        except ValueError:
            raise ValueError(f"{part!r} is not a whole number; e.g. 4,8,16") from None
        if size < 1:
            raise ValueError(f"batch size {size} must be >= 1; e.g. 4,8,16")
        if size not in out:
            out.append(size)
    if not out:
        raise ValueError(f"{text!r} names no batch size; e.g. 4,8,16")
    return tuple(out)


def usage_summary(series: Sequence[dict]) -> dict[str, float | None]:
    """Mean and peak CPU % and the peak RSS/PSS (MB) of a usage series (dicts of
    :class:`~tokenloom.bench.loader_rss.UsagePoint`)."""
    cpu = [p["cpu_pct"] for p in series]
    pss = [p["pss_mb"] for p in series if p.get("pss_mb") is not None]
    return {
        "cpu_mean_pct": sum(cpu) / len(cpu) if cpu else None,
        "cpu_peak_pct": max(cpu) if cpu else None,
        "rss_peak_mb": max((p["rss_mb"] for p in series), default=None),
        "pss_peak_mb": max(pss) if pss else None,
    }


@dataclass(kw_only=True)
class ProtocolRow:
    """One loader at one batch size: what the protocol's table shows."""

    workload: str
    """``text``, ``image`` or ``image-text``."""
    loader: str
    batch_size: int
    samples_per_s: list[float] = field(default_factory=list)
    """One rate per epoch (measuring window); a sample is a row of the batch (a block of
    ``L`` tokens, an image, an image+text pair)."""
    first_batch_s: float | None = None
    cpu_mean_pct: float | None = None
    """Mean CPU utilisation of the loader's process tree (100 = one core)."""
    peak_rss_mb: float | None = None
    peak_pss_mb: float | None = None
    stall_pct: list[float] = field(default_factory=list)
    """Data stall per epoch with the model in the loop (waiting for data / wall)."""
    model_samples_per_s: list[float] = field(default_factory=list)
    """Samples/s per epoch with the model in the loop."""
    movement: float | None = None
    """Shuffle: mean normalised ``|position change|`` of a sample between two epochs."""
    batch_shards: float | None = None
    """Shuffle: distinct source shards per batch (mean)."""
    batch_shards_uniform: float | None = None
    """What a uniform draw of as many samples gives."""
    error: str | None = None

    @property
    def rate(self) -> Spread | None:
        return spread(self.samples_per_s)

    @property
    def stall(self) -> Spread | None:
        return spread(self.stall_pct)

    @property
    def model_rate(self) -> Spread | None:
        return spread(self.model_samples_per_s)

    def to_json(self) -> dict:
        out = asdict(self)
        for name in ("rate", "stall", "model_rate"):
            s = getattr(self, name)
            out[name] = None if s is None else asdict(s)
        return out
