"""Run ``tokenloom`` with a mixture laid out the way an earlier release did: one schedule over
global blocks, steps taking every S-th block (``interleave``), so a step can draw every block
from one pool when the epoch's step count is a multiple of the schedule's period. Used to prove
that ``verify`` fails such a run: ``python -m tests.verify.single_pool verify --table ...``."""

from __future__ import annotations

import sys

import tokenloom.loader.pipeline.planner as planner
from tokenloom.cli.main import main
from tokenloom.loader.plan.mixture import MixturePlan, plan_mixture


def per_block_mixture(*args, **kwargs):
    kwargs["global_batch"] = 1
    kwargs["block_order"] = "sequential"
    return plan_mixture(*args, **kwargs)


def install() -> None:
    """Patch the planner: one pool sequence over blocks, cut into steps by the view's order."""
    planner.plan_mixture = per_block_mixture
    MixturePlan.lays_out_steps = False
    MixturePlan.global_batch = None  # type: ignore[assignment,misc]


if __name__ == "__main__":
    install()
    sys.exit(main(sys.argv[1:]))
