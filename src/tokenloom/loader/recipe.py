"""Data recipes: the packing policy and long-document policy as one frozen config, and dispatch.

A :class:`Recipe` picks the epoch planner; every planner answers the same three questions, so the
loader needs no other branch:

* ``plan.num_blocks`` (and ``seq_len``, ``padding_positions``, ``num_tokens``),
* :func:`recipe_spans` ``(plan, blocks) -> Spans`` for :func:`~tokenloom.loader.pack.pack_blocks`,
* :func:`block_range_counts` ``(plan, lo, hi)``: tokens / EOS / filled positions of a block range,
  from which :func:`recipe_epoch_steps` derives the epoch's steps, padding and dropped tokens.

========================  ==========================================================
``packing`` / long docs   planner
========================  ==========================================================
concat / split            :func:`~tokenloom.loader.plan.plan_epoch` (the default)
concat / window           :func:`~tokenloom.loader.window.plan_windowed_epoch`
bestfit / split, window   :func:`~tokenloom.loader.bestfit.plan_bestfit`
========================  ==========================================================

:class:`~tokenloom.loader.mixture.MixturePlan` offers the same surface for token-quota mixtures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenloom.loader.bestfit import BESTFIT_ALGORITHM, LONG_DOC_POLICIES, BestFitPlan, plan_bestfit
from tokenloom.loader.plan import (
    EpochPlan,
    EpochSteps,
    PlanError,
    _check_topology,
    epoch_steps,
    plan_epoch,
    stream_counts,
)
from tokenloom.loader.spans import Spans, block_spans
from tokenloom.loader.window import WindowedPlan, check_window, plan_windowed_epoch

__all__ = [
    "PACKINGS",
    "Recipe",
    "BlockCounts",
    "plan_recipe_epoch",
    "recipe_spans",
    "block_range_counts",
    "recipe_epoch_steps",
]

PACKINGS = ("concat", "bestfit")
"""``concat``: documents end to end, cut at block ends; ``bestfit``: whole documents per block."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    """How documents become blocks. The default is the loader's original concat packing."""

    packing: str = "concat"
    """``"concat"`` (no padding but the epoch's last block) or ``"bestfit"`` (no document that
    fits a block is cut; the rest of each block is padding)."""
    fit_window: int = 1024
    """Best-fit only: documents of the visiting order packed together (1 = one per block)."""
    long_docs: str = "split"
    """``"split"``: long documents are cut at block ends; ``"window"``: into overlapping windows."""
    window: int | None = None
    """``long_docs="window"``: most positions per window ``W`` (``None``: the block length)."""
    overlap: int = 0
    """``long_docs="window"``: context tokens ``O`` repeated at the start of later windows."""

    def __post_init__(self) -> None:
        if self.packing not in PACKINGS:
            raise PlanError(f"packing must be one of {PACKINGS}, got {self.packing!r}")
        if self.long_docs not in LONG_DOC_POLICIES:
            raise PlanError(f"long_docs must be one of {LONG_DOC_POLICIES}, got {self.long_docs!r}")
        fw = self.fit_window
        if isinstance(fw, bool) or not isinstance(fw, int | np.integer) or fw < 1:
            raise PlanError(f"fit_window must be an integer >= 1, got {fw!r}")
        if self.long_docs == "split":
            if self.window is not None or self.overlap:
                raise PlanError(
                    f"window={self.window!r}, overlap={self.overlap!r} apply to "
                    "long_docs='window' only; pass long_docs='window' or drop them"
                )
        else:
            check_window(2**62 if self.window is None else self.window, self.overlap)

    @property
    def is_default(self) -> bool:
        """Whether this is plain concat packing (the plan of :func:`plan_epoch`)."""
        return self.packing == "concat" and self.long_docs == "split"

    def fingerprint_inputs(self) -> dict[str, Any]:
        """Entries to merge into the loader's plan inputs: ``{}`` for the default recipe (so old
        checkpoints stay resumable), else ``{"recipe": {...}}`` with every option that shapes the
        stream and the planner's algorithm identity."""
        if self.is_default:
            return {}
        out: dict[str, Any] = {"packing": self.packing, "long_docs": self.long_docs}
        if self.packing == "bestfit":
            out["fit_window"] = int(self.fit_window)
            out["algorithm"] = BESTFIT_ALGORITHM
        if self.long_docs == "window":
            out["window"] = None if self.window is None else int(self.window)
            out["overlap"] = int(self.overlap)
        return {"recipe": out}


RecipePlan = EpochPlan | WindowedPlan | BestFitPlan


def plan_recipe_epoch(
    row_ids: np.ndarray,
    n_tokens: np.ndarray,
    *,
    seed: int,
    epoch: int,
    seq_len: int,
    recipe: Recipe,
    cut_points: Mapping[int, np.ndarray] | None = None,
) -> RecipePlan:
    """Plan one epoch with the recipe's planner (see the module table).

    Args:
        row_ids: ``(n,)`` strictly ascending table ids of the selected rows.
        n_tokens: ``(n,)`` their token counts.
        seed: The job's seed.
        epoch: The epoch.
        seq_len: ``L``.
        recipe: The :class:`Recipe`.
        cut_points: Optional window boundary hook (``long_docs="window"`` only).

    Returns:
        An :class:`EpochPlan`, :class:`WindowedPlan` or :class:`BestFitPlan`.
    """
    common = {"seed": seed, "epoch": epoch, "seq_len": seq_len}
    if recipe.packing == "bestfit":
        return plan_bestfit(
            row_ids,
            n_tokens,
            fit_window=recipe.fit_window,
            long_docs=recipe.long_docs,
            window=recipe.window,
            overlap=recipe.overlap,
            cut_points=cut_points,
            **common,
        )
    if recipe.long_docs == "window":
        return plan_windowed_epoch(
            row_ids,
            n_tokens,
            window=seq_len if recipe.window is None else recipe.window,
            overlap=recipe.overlap,
            cut_points=cut_points,
            **common,
        )
    return plan_epoch(row_ids, n_tokens, **common)


def recipe_spans(plan: Any, blocks: np.ndarray) -> Spans:
    """The stretches of ``blocks`` for any plan (:func:`block_spans` for an :class:`EpochPlan`,
    else the plan's own ``spans``)."""
    if isinstance(plan, EpochPlan):
        return block_spans(plan, blocks)
    return plan.spans(blocks)  # type: ignore[no-any-return]


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockCounts:
    """What a range of blocks holds."""

    tokens: int
    """Real token positions (repeated context included)."""
    eos: int
    """EOS positions."""
    filled: int
    """``tokens + eos``; the rest of the range is padding."""


def block_range_counts(plan: Any, lo: int, hi: int) -> BlockCounts:
    """Tokens, EOS and filled positions in blocks ``[lo, hi)`` (clipped to the epoch).

    O(log V) for stream plans, O(pieces in range) for best-fit, per pool pass for mixtures.
    """
    lo = min(max(int(lo), 0), plan.num_blocks)
    hi = min(max(int(hi), lo), plan.num_blocks)
    L = plan.seq_len
    if isinstance(plan, EpochPlan):
        tokens, eos = stream_counts(plan, lo * L, hi * L)
        return BlockCounts(tokens=tokens, eos=eos, filled=tokens + eos)
    if isinstance(plan, WindowedPlan):
        a, b = min(lo * L, plan.stream_len), min(hi * L, plan.stream_len)
        d = plan.docs
        eos_at = plan.starts[1:][d.has_eos] - 1  # ascending stream positions of the EOS
        eos = int(np.searchsorted(eos_at, b) - np.searchsorted(eos_at, a))
        return BlockCounts(tokens=b - a - eos, eos=eos, filled=b - a)
    if isinstance(plan, BestFitPlan):
        pieces = plan.block_pieces[plan.block_ptr[lo] : plan.block_ptr[hi]]
        d = plan.docs
        tokens = int((d.tok_end[pieces] - d.tok_start[pieces]).sum())
        eos = int(d.has_eos[pieces].sum())
        return BlockCounts(tokens=tokens, eos=eos, filled=tokens + eos)
    return plan.counts(lo, hi)  # type: ignore[no-any-return]


def recipe_epoch_steps(
    plan: Any, *, batch_size: int, world_size: int, drop_last: bool
) -> EpochSteps:
    """:func:`~tokenloom.loader.plan.epoch_steps` for any plan (identical for an EpochPlan).

    ``padding_positions`` counts every padding position delivered: inside blocks (best-fit
    tails, the last block) and the whole padding blocks completing the last step.
    """
    if isinstance(plan, EpochPlan):
        return epoch_steps(plan, batch_size=batch_size, world_size=world_size, drop_last=drop_last)
    _check_topology(batch_size, world_size)
    g = batch_size * world_size
    n, L = plan.num_blocks, plan.seq_len
    if drop_last:
        steps = n // g
        kept = steps * g
        dropped = block_range_counts(plan, kept, n)
        inside = plan.padding_positions - ((n - kept) * L - dropped.filled)  # kept blocks' padding
        return EpochSteps(
            steps=steps,
            global_batch=g,
            padding_blocks=0,
            padding_positions=inside,
            dropped_blocks=n - kept,
            dropped_tokens=dropped.tokens,
            dropped_eos=dropped.eos,
        )
    steps = -(-n // g)
    pad_blocks = steps * g - n
    return EpochSteps(
        steps=steps,
        global_batch=g,
        padding_blocks=pad_blocks,
        padding_positions=plan.padding_positions + pad_blocks * L,
        dropped_blocks=0,
        dropped_tokens=0,
        dropped_eos=0,
    )
