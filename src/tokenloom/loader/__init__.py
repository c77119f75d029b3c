"""The training loader: a pure epoch plan, materialised by reading and packing.

Every option lives in one :class:`LoaderSpec`; a :class:`Planner` resolves it against the table
(stored counts only); every epoch planner returns a :class:`BlockPlan`, and :class:`EpochView` lays
out a global step once for the dataset, the ledger, ``trace`` and ``verify``. The pure modules
(``spec``, ``shuffle``, ``plan``, ``spans``, ``pack``, ``view``, ``state``, and the data recipes
``window``, ``bestfit``, ``mixture``, ``recipe``) take and return numpy arrays and never import
Lance or torch; importing this package stays cheap.
"""

from __future__ import annotations

from tokenloom.loader.bestfit import (
    BESTFIT_ALGORITHM,
    BestFitPlan,
    bestfit_spans,
    padding_by_window,
    plan_bestfit,
)
from tokenloom.loader.ledger import Ledger, LedgerCounter, PoolLedger, ledger
from tokenloom.loader.mixture import (
    MIXTURE_ALGORITHM,
    MixturePlan,
    Pool,
    PoolReport,
    mixture_block_source,
    mixture_spans,
    plan_mixture,
    window_share_deviation,
)
from tokenloom.loader.pack import IGNORE_INDEX, PackedArrays, naive_pack, pack_blocks, token_ranges
from tokenloom.loader.plan import (
    EpochPlan,
    EpochSteps,
    PlanError,
    epoch_steps,
    plan_epoch,
    step_blocks,
    steps_in_epoch,
    stream_counts,
)
from tokenloom.loader.recipe import BlockCounts, Recipe, plan_recipe_epoch
from tokenloom.loader.shuffle import PERMUTATION_ALGORITHM, epoch_permutation, epoch_rng
from tokenloom.loader.spans import Spans, block_spans
from tokenloom.loader.spec import LoaderSpec, PoolSpec
from tokenloom.loader.state import (
    LoaderState,
    LoaderStateError,
    ResumeMismatchError,
    check_fingerprint,
    plan_fingerprint,
)
from tokenloom.loader.view import BlockPlan, EpochView, StepCounts, StepLayout
from tokenloom.loader.window import VirtualDocs, WindowedPlan, plan_windowed_epoch, windowed_spans

_LAZY = {
    "PackedDataset": "dataloader",
    "DataLoader": "dataloader",
    "LoaderStats": "stats",
    "Planner": "planner",  # imports Lance
    "EmptyEpochError": "planner",
    "PlanStore": "planstore",
}


def __getattr__(name: str):  # noqa: ANN202 - torch is imported only when these are asked for
    if name in _LAZY:
        import importlib

        from tokenloom.errors import require

        if _LAZY[name] in ("dataset", "dataloader"):
            require("torch", extra="train")
        return getattr(importlib.import_module(f"tokenloom.loader.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'tokenloom.loader' has no attribute {name!r}")


__all__ = [
    "DataLoader",
    "LoaderStats",
    "PackedDataset",
    # one spec, one plan interface, one step layout
    "LoaderSpec",
    "PoolSpec",
    "Planner",
    "EmptyEpochError",
    "PlanStore",
    "BlockPlan",
    "EpochView",
    "StepLayout",
    "StepCounts",
    "Ledger",
    "LedgerCounter",
    "PoolLedger",
    "ledger",
    "IGNORE_INDEX",
    "PERMUTATION_ALGORITHM",
    "EpochPlan",
    "EpochSteps",
    "LoaderState",
    "LoaderStateError",
    "PackedArrays",
    "PlanError",
    "ResumeMismatchError",
    "Spans",
    "block_spans",
    "check_fingerprint",
    "epoch_permutation",
    "epoch_rng",
    "epoch_steps",
    "naive_pack",
    "pack_blocks",
    "plan_epoch",
    "plan_fingerprint",
    "step_blocks",
    "steps_in_epoch",
    "stream_counts",
    "token_ranges",
    # data recipes
    "BESTFIT_ALGORITHM",
    "MIXTURE_ALGORITHM",
    "BestFitPlan",
    "BlockCounts",
    "MixturePlan",
    "Pool",
    "PoolReport",
    "Recipe",
    "VirtualDocs",
    "WindowedPlan",
    "bestfit_spans",
    "mixture_block_source",
    "mixture_spans",
    "padding_by_window",
    "plan_bestfit",
    "plan_mixture",
    "plan_recipe_epoch",
    "plan_windowed_epoch",
    "window_share_deviation",
    "windowed_spans",
]
