"""Images for tokenloom: the bundled image+text set, Pillow decode to patch tokens, packing of
(image, prompt, response) samples under a token budget, and a tiny VLM. Importing this package
imports neither Pillow, Lance nor torch."""

from __future__ import annotations

from tokenloom.vision.packing import POLICIES, PackPlan, pack_block, plan_blocks, plan_padding
from tokenloom.vision.patches import PatchGrid, grid_for, image_tokens

__all__ = [
    "POLICIES",
    "PackPlan",
    "PatchGrid",
    "grid_for",
    "image_tokens",
    "pack_block",
    "plan_blocks",
    "plan_padding",
]
