"""Data recipes: the packing policy and long-document policy as one frozen config, and dispatch.

A :class:`Recipe` picks the epoch planner. Every planner returns a plan with the same surface (the
:class:`~tokenloom.loader.view.BlockPlan` protocol): ``num_blocks``, ``seq_len``, ``num_tokens``,
``padding_positions``, ``spans(blocks)``, ``counts(lo, hi)`` and ``block_pools(blocks)``, so the
loader needs no other branch.

========================  ==========================================================
``packing`` / long docs   planner
========================  ==========================================================
concat / split            :func:`~tokenloom.loader.plan.plan_epoch` (the default)
concat / window           :func:`~tokenloom.loader.window.plan_windowed_epoch`
best_fit / split, window  :func:`~tokenloom.loader.bestfit.plan_bestfit`
========================  ==========================================================

:class:`~tokenloom.loader.mixture.MixturePlan` offers the same surface for token-quota mixtures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenloom.loader.bestfit import BESTFIT_ALGORITHM, LONG_DOC_POLICIES, BestFitPlan, plan_bestfit
from tokenloom.loader.plan import BlockCounts, EpochPlan, PlanError, plan_epoch
from tokenloom.loader.window import WindowedPlan, check_window, plan_windowed_epoch

__all__ = ["PACKINGS", "Recipe", "BlockCounts", "RecipePlan", "plan_recipe_epoch"]

PACKINGS = ("concat", "best_fit")
"""``concat``: documents end to end, cut at block ends; ``bestfit``: whole documents per block."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    """How documents become blocks. The default is the loader's original concat packing."""

    packing: str = "concat"
    """``"concat"`` (no padding but the epoch's last block) or ``"best_fit"`` (no document that
    fits a block is cut; the rest of each block is padding)."""
    fit_window: int = 1024
    """Best-fit only: documents of the visiting order packed together (1 = one per block)."""
    long_docs: str = "split"
    """``"split"``: long documents are cut at block ends; ``"window"``: into overlapping windows."""
    window: int | None = None
    """``long_docs="window"``: most positions per window ``W`` (``None``: the block length)."""
    overlap: int = 0
    """``long_docs="window"``: context tokens ``O`` repeated at the start of later windows."""
    cut_column: str | None = None
    """``long_docs="window"``: a column of token offsets where a window may end (``cut_points``,
    from ``tokenloom tokenize --boundaries``); windows then end at the latest cut point within
    their last eighth."""

    def __post_init__(self) -> None:
        if self.packing not in PACKINGS:
            hint = "; it is spelled 'best_fit'" if self.packing == "bestfit" else ""
            raise PlanError(f"packing must be one of {PACKINGS}, got {self.packing!r}{hint}")
        if self.long_docs not in LONG_DOC_POLICIES:
            raise PlanError(f"long_docs must be one of {LONG_DOC_POLICIES}, got {self.long_docs!r}")
        fw = self.fit_window
        if isinstance(fw, bool) or not isinstance(fw, int | np.integer) or fw < 1:
            raise PlanError(f"fit_window must be an integer >= 1, got {fw!r}")
        if self.long_docs == "split":
            if self.window is not None or self.overlap or self.cut_column:
                raise PlanError(
                    f"window={self.window!r}, overlap={self.overlap!r}, "
                    f"cut_column={self.cut_column!r} apply to long_docs='window' only; pass "
                    "long_docs='window' or drop them"
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
        if self.packing == "best_fit":
            out["fit_window"] = int(self.fit_window)
            out["algorithm"] = BESTFIT_ALGORITHM
        if self.long_docs == "window":
            out["window"] = None if self.window is None else int(self.window)
            out["overlap"] = int(self.overlap)
        return {"recipe": out}


RecipePlan = EpochPlan | WindowedPlan | BestFitPlan
"""What :func:`plan_recipe_epoch` returns."""


def plan_recipe_epoch(
    row_ids: np.ndarray,
    n_tokens: np.ndarray,
    *,
    seed: int,
    epoch: int,
    seq_len: int,
    recipe: Recipe,
    cut_points: Mapping[int, np.ndarray] | None = None,
    store: Any = None,
    order: np.ndarray | None = None,
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
        store: Optional :class:`~tokenloom.loader.planstore.PlanStore` sharing the visiting
            order between the processes of a node.
        order: Optional explicit visiting order instead of the seeded one (positions of the
            non-empty rows of ``n_tokens``, each once; :func:`~tokenloom.loader.plan.plan_epoch`).

    Returns:
        An :class:`EpochPlan`, :class:`WindowedPlan` or :class:`BestFitPlan`.
    """
    common = {"seed": seed, "epoch": epoch, "seq_len": seq_len, "store": store, "order": order}
    if recipe.packing == "best_fit":
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
