"""Which stage of the loader sets the pace, in plain words, computed from :class:`LoaderStats`.

Fractions of known clocks decide, so the verdict holds for any number of workers:

* **stall**: the consumer's wait in ``next()`` over its wall time; the part of it spent after the
  awaited batch had left its worker is the **transfer**'s;
* **starved**: the read pipelines' time blocked on their oldest group (the packed queue empty
  while reads were in flight) over their lifetime;
* **full**: the pipelines' time with every submitted group built and waiting to be handed out
  (the I/O threads idle until the consumer takes more) over their lifetime.

The rule: a consumer that waits less than :data:`STALL_OK` of its time is the bottleneck itself.
Otherwise the loader is: the transfer from the workers when it holds at least
:data:`TRANSFER_SHARE` of the stall; reading or packing (whichever took more I/O-thread time)
when the pipelines starved for at least :data:`STARVED_SHARE` of the consumer's stall share;
else the per-step work of handing batches over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenloom.loader.observe.stats import LoaderStats

__all__ = ["STALL_OK", "STARVED_SHARE", "TRANSFER_SHARE", "Verdict", "bottleneck"]

STALL_OK = 0.05
"""A consumer waiting for data less than this share of its time is not held back by the loader
(what a training run can ignore: a few percent of step time)."""
STARVED_SHARE = 0.5
"""Pipelines starved at least this share of the consumer's stall share explain the stall."""
TRANSFER_SHARE = 0.5
"""A stall mostly spent on batches already sent is the transfer's."""


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The bottleneck and the sentence that says so."""

    stage: str
    """``consumer``, ``read``, ``pack``, ``transfer``, ``handover``, ``loader`` (stalls, no
    gauge to say where), ``none`` (no clear one) or ``unknown``."""
    text: str
    stall: float | None = None
    """The consumer's wait over its wall time (``None``: no consumer clock)."""
    starved: float | None = None
    """Pipeline time starved over pipeline time (``None``: no pipeline gauge)."""
    full: float | None = None
    """Pipeline time full over pipeline time."""


def bottleneck(stats: LoaderStats, elapsed: float | None = None) -> Verdict:
    """Judge ``stats``; ``elapsed`` is the consumer's wall time where the stats have none
    (their own excludes start-up, so it is preferred)."""
    wall = stats.wall_seconds or elapsed or 0.0
    stall = min(stats.wait_seconds / wall, 1.0) if wall > 0 else None
    life = stats.pipeline_seconds
    starved = min(stats.starved_seconds / life, 1.0) if life > 0 else None
    full = min(stats.full_seconds / life, 1.0) if life > 0 else None
    known = {"stall": stall, "starved": starved, "full": full}
    if stats.steps == 0:
        return Verdict(stage="unknown", text="no batches delivered yet", **known)
    if stall is None and starved is None:
        return Verdict(stage="unknown", text="no timings to judge the loader by", **known)
    waited = f"the consumer waited for data {stall:.0%} of the time" if stall is not None else ""
    was_full = f"the packed queue was full {full:.0%} of the time" if full is not None else ""

    if (stall is not None and stall < STALL_OK) or (
        stall is None and full is not None and full >= 0.5
    ):
        why = "; ".join(p for p in (was_full, waited) if p)
        return Verdict(stage="consumer", text=f"the consumer is the bottleneck: {why}", **known)

    per_step = 1e3 * stats.wait_seconds / max(stats.steps, 1)
    if stall is not None and stats.transfer_seconds >= TRANSFER_SHARE * stats.wait_seconds:
        share = stats.transfer_seconds / stats.wait_seconds
        text = (
            f"moving batches from the workers is the bottleneck: {waited} ({per_step:.2f} ms "
            f"per step), {share:.0%} of it after the batch had left its worker"
        )
        if full is not None:
            text += f"; {was_full}"
        return Verdict(stage="transfer", text=text, **known)
    io_bound = starved is not None and (
        starved >= STARVED_SHARE * stall if stall is not None else starved >= 0.5
    )
    if io_bound:
        n = max(stats.steps, 1)
        fetch, pack = 1e3 * stats.read_seconds / n, 1e3 * stats.pack_seconds / n
        stage, word = ("read", "reading") if fetch >= pack else ("pack", "packing")
        text = (
            f"{word} is the bottleneck: the packed queue was empty {starved:.0%} of the time "
            f"while reads were in flight (fetch {fetch:.2f} ms vs pack {pack:.2f} ms per step)"
        )
        if waited:
            text += f"; {waited}"
        return Verdict(stage=stage, text=text + "; more workers or io_threads would help", **known)
    if stall is not None and starved is None:
        text = f"the loader is the bottleneck: {waited} (no queue gauges to name the stage)"
        return Verdict(stage="loader", text=text, **known)
    if stall is not None:
        text = (
            f"handing batches over is the bottleneck: {waited} ({per_step:.2f} ms per step) "
            f"while the packed queue was empty only {starved:.0%} and full {full:.0%} of the "
            "time (the per-step work between the packed queue and the consumer)"
        )
        return Verdict(stage="handover", text=text, **known)
    return Verdict(
        stage="none",
        text=f"no clear bottleneck: the packed queue was empty {starved:.0%} and full "
        f"{full:.0%} of the time",
        **known,
    )
