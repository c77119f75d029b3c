"""The training loader: a pure epoch plan, materialised by reading and packing.

Every option lives in one :class:`LoaderSpec`; a :class:`Planner` resolves it against the table
(stored counts only); every epoch planner returns a :class:`BlockPlan`, and :class:`EpochView` lays
out a global step once for the dataset, the ledger, ``trace`` and ``verify``.

The modules sit on three floors, each importing only from the floors below it (checked by
``tests/loader/test_layering.py``):

* ``plan/``: the pure plan (spec, shuffle, epoch plan, spans, pack, view, state and the data
  recipes ``window``, ``bestfit``, ``mixture``, ``recipe``): numpy arrays in and out, never Lance,
  torch, files or shared memory;
* ``observe/``: counters, queue gauges, the bottleneck verdict and the ledger;
* ``pipeline/``: the planner against the table, reading, fetching, worker processes, shared-memory
  slots and the torch dataset.

Importing this package stays cheap: what needs Lance or torch is loaded when first asked for.
"""

from __future__ import annotations

from tokenloom.loader.observe.ledger import Ledger, LedgerCounter, PoolLedger, ledger
from tokenloom.loader.plan.bestfit import (
    BESTFIT_ALGORITHM,
    BestFitPlan,
    bestfit_spans,
    padding_by_window,
    plan_bestfit,
)
from tokenloom.loader.plan.epoch import (
    EpochPlan,
    EpochSteps,
    PlanError,
    epoch_steps,
    plan_epoch,
    step_blocks,
    steps_in_epoch,
    stream_counts,
)
from tokenloom.loader.plan.mixture import (
    MIXTURE_ALGORITHM,
    MixturePlan,
    Pool,
    PoolReport,
    mixture_block_source,
    mixture_spans,
    plan_mixture,
    window_share_deviation,
)
from tokenloom.loader.plan.pack import (
    IGNORE_INDEX,
    PackedArrays,
    naive_pack,
    pack_blocks,
    token_ranges,
)
from tokenloom.loader.plan.recipe import BlockCounts, Recipe, plan_recipe_epoch
from tokenloom.loader.plan.shuffle import PERMUTATION_ALGORITHM, epoch_permutation, epoch_rng
from tokenloom.loader.plan.spans import Spans, block_spans
from tokenloom.loader.plan.spec import GroupSpec, LoaderSpec, PoolSpec
from tokenloom.loader.plan.state import (
    LoaderState,
    LoaderStateError,
    ResumeMismatchError,
    check_fingerprint,
    plan_fingerprint,
)
from tokenloom.loader.plan.view import BlockPlan, EpochView, StepCounts, StepLayout
from tokenloom.loader.plan.window import (
    VirtualDocs,
    WindowedPlan,
    plan_windowed_epoch,
    windowed_spans,
)

_LAZY = {
    "PackedDataset": "pipeline.dataloader",
    "DataLoader": "pipeline.dataloader",
    "LoaderStats": "observe.stats",
    "Planner": "pipeline.planner",  # imports Lance
    "EmptyEpochError": "pipeline.planner",
    "PlanStore": "pipeline.planstore",
}


def __getattr__(name: str):  # noqa: ANN202 - torch is imported only when these are asked for
    if name in _LAZY:
        import importlib

        from tokenloom.errors import require

        if _LAZY[name] in ("pipeline.dataset", "pipeline.dataloader"):
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
    "GroupSpec",
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
