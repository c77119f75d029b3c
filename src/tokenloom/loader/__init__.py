"""The training loader: a pure epoch plan, materialised by reading and packing.

The pure modules (``shuffle``, ``plan``, ``spans``, ``pack``, ``state``) take and return numpy
arrays and never import Lance or torch; importing this package stays cheap.
"""

from __future__ import annotations

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
from tokenloom.loader.shuffle import PERMUTATION_ALGORITHM, epoch_permutation, epoch_rng
from tokenloom.loader.spans import Spans, block_spans
from tokenloom.loader.state import (
    LoaderState,
    LoaderStateError,
    ResumeMismatchError,
    check_fingerprint,
    plan_fingerprint,
)

__all__ = [
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
]
