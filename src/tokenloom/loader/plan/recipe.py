"""Data recipes: the packing policy and long-document policy as one frozen config, and dispatch.

A :class:`Recipe` picks the epoch planner. Every planner returns a plan with the same surface (the
:class:`~tokenloom.loader.plan.view.BlockPlan` protocol): ``num_blocks``, ``seq_len``,
``num_tokens``, ``padding_positions``, ``spans(blocks)``, ``counts(lo, hi)`` and
``block_pools(blocks)``, so the loader needs no other branch.

========================  ==========================================================
``packing`` / long docs   planner
========================  ==========================================================
concat / split            :func:`~tokenloom.loader.plan.epoch.plan_epoch` (the default)
concat / window, units    :func:`~tokenloom.loader.plan.window.plan_windowed_epoch`
best_fit / any            :func:`~tokenloom.loader.plan.bestfit.plan_bestfit`
========================  ==========================================================

:class:`~tokenloom.loader.plan.mixture.MixturePlan` offers the same surface for token-quota
mixtures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenloom.loader.plan.bestfit import (
    BESTFIT_ALGORITHM,
    LONG_DOC_POLICIES,
    BestFitPlan,
    plan_bestfit,
)
from tokenloom.loader.plan.epoch import BlockCounts, EpochPlan, PlanError, plan_epoch
from tokenloom.loader.plan.window import (
    WindowedPlan,
    WindowTable,
    check_window,
    plan_windowed_epoch,
    window_table,
)

__all__ = ["PACKINGS", "LONG_DOCS", "Recipe", "BlockCounts", "RecipePlan", "plan_recipe_epoch"]

PACKINGS = ("concat", "best_fit")
"""``concat``: documents end to end, cut at block ends; ``bestfit``: whole documents per block."""

LONG_DOCS = (*LONG_DOC_POLICIES, "units")
"""``split``, ``window``, and ``units``: windows that keep a section whole when it fits."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    """How documents become blocks. The default is the loader's original concat packing."""

    packing: str = "concat"
    """``"concat"`` (no padding but the epoch's last block) or ``"best_fit"`` (no document that
    fits a block is cut; the rest of each block is padding)."""
    fit_window: int = 1024
    """Best-fit only: documents of the visiting order packed together (1 = one per block)."""
    long_docs: str = "split"
    """``"split"``: long documents are cut at block ends; ``"window"``: into overlapping windows;
    ``"units"``: windows that end at a section boundary (a unit's end: a heading, a top-level
    ``def``/``class``) whenever one leaves the window a new token, so no unit of at most
    ``W - O`` positions is ever cut (the first at most ``W``); a longer unit falls back to
    windows. Needs a ranked ``cut_column``."""
    window: int | None = None
    """``long_docs="window"``: most positions per window ``W`` (``None``: the block length)."""
    overlap: int = 0
    """``long_docs="window"``: context tokens ``O`` repeated at the start of later windows."""
    cut_column: str | None = None
    """``long_docs="window"``: a column of token offsets where a window may end (``cut_points``,
    from ``tokenloom tokenize --boundaries``); windows then end at the latest cut point within
    their last eighth; a ranked column (``cut_structure``, from ``tokenloom tokenize
    --structure``) ends them at the strongest boundary within their last quarter."""
    overlap_loss: bool = False
    """Windows only: train the overlap's tokens again in each later window (the context keeps
    its loss) instead of context only (the default: every target trained once per epoch)."""

    def __post_init__(self) -> None:
        if self.packing not in PACKINGS:
            hint = "; it is spelled 'best_fit'" if self.packing == "bestfit" else ""
            raise PlanError(f"packing must be one of {PACKINGS}, got {self.packing!r}{hint}")
        if self.long_docs not in LONG_DOCS:
            raise PlanError(f"long_docs must be one of {LONG_DOCS}, got {self.long_docs!r}")
        fw = self.fit_window
        if isinstance(fw, bool) or not isinstance(fw, int | np.integer) or fw < 1:
            raise PlanError(f"fit_window must be an integer >= 1, got {fw!r}")
        if self.long_docs == "split":
            if self.window is not None or self.overlap or self.cut_column or self.overlap_loss:
                raise PlanError(
                    f"window={self.window!r}, overlap={self.overlap!r}, "
                    f"cut_column={self.cut_column!r}, overlap_loss={self.overlap_loss!r} apply "
                    "to long_docs='window' only (or 'units'); pass long_docs='window' or drop them"
                )
        else:
            check_window(2**62 if self.window is None else self.window, self.overlap)
        if self.long_docs == "units" and not self.cut_column:
            raise PlanError(
                "long_docs='units' needs a ranked cut column: add it with `tokenloom tokenize "
                "--table TABLE --tokenizer SPEC --structure` and pass cut_column='cut_structure'"
            )
        if not isinstance(self.overlap_loss, bool):
            raise PlanError(f"overlap_loss must be True or False, got {self.overlap_loss!r}")
        if self.overlap_loss and not self.overlap:
            raise PlanError(
                "overlap_loss=True keeps loss on the overlap, and overlap=0 has none; pass "
                "overlap >= 1 or drop overlap_loss"
            )

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
        if self.windows:
            out["window"] = None if self.window is None else int(self.window)
            out["overlap"] = int(self.overlap)
        if self.overlap_loss:  # left out when off, so older fingerprints stay equal
            out["overlap_loss"] = True
        return {"recipe": out}

    @property
    def windows(self) -> bool:
        """Whether long documents are cut into windows (``long_docs`` ``window`` or ``units``)."""
        return self.long_docs != "split"


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
    ordering: Any = None,
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
        store: Optional :class:`~tokenloom.loader.pipeline.planstore.PlanStore` sharing the visiting
            order between the processes of a node.
        ordering: Optional :class:`~tokenloom.loader.plan.order.Ordering`: visit the rows in its
            curriculum order instead of the uniform permutation (every recipe).
        order: Optional explicit visiting order instead of the seeded one (positions of the
            non-empty rows of ``n_tokens``, each once;
            :func:`~tokenloom.loader.plan.epoch.plan_epoch`).

    Returns:
        An :class:`EpochPlan`, :class:`WindowedPlan` or :class:`BestFitPlan`.
    """
    common = {
        "seed": seed,
        "epoch": epoch,
        "seq_len": seq_len,
        "store": store,
        "ordering": ordering,
        "order": order,
    }
    long_docs = recipe.long_docs
    if long_docs == "units":  # windows that end at unit edges: cut here unless the caller did
        if not isinstance(cut_points, WindowTable):
            cut_points = window_table(
                row_ids,
                n_tokens,
                window=seq_len if recipe.window is None else recipe.window,
                overlap=recipe.overlap,
                cut_points=cut_points,
                units=True,
            )
        long_docs = "window"
    if recipe.packing == "best_fit":
        return plan_bestfit(
            row_ids,
            n_tokens,
            fit_window=recipe.fit_window,
            long_docs=long_docs,
            window=recipe.window,
            overlap=recipe.overlap,
            cut_points=cut_points,
            **common,
        )
    if long_docs == "window":
        return plan_windowed_epoch(
            row_ids,
            n_tokens,
            window=seq_len if recipe.window is None else recipe.window,
            overlap=recipe.overlap,
            cut_points=cut_points,
            **common,
        )
    return plan_epoch(row_ids, n_tokens, **common)
