"""Images for tokenloom: the bundled image+text set, Pillow decode to patch tokens, packing of
(image, prompt, response) samples under a token budget (:class:`ImageTextSpec` →
:class:`ImageTextDataset`, :class:`ImageTextLoader`), and a tiny VLM. Importing this package
imports neither Pillow, Lance nor torch."""

from __future__ import annotations

from tokenloom.vision.packing import POLICIES, PackPlan, pack_block, plan_blocks, plan_padding
from tokenloom.vision.patches import PatchGrid, grid_for, image_tokens
from tokenloom.vision.spec import ImageTextSpec

_LAZY = {
    "ImageTextDataset": "iterable",
    "ImageTextStream": "dataset",
    "ImageTextError": "dataset",
    "ImageTextLoader": "loader",
}


def __getattr__(name: str):  # noqa: ANN202 - Lance/torch only when these are asked for
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"tokenloom.vision.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'tokenloom.vision' has no attribute {name!r}")


__all__ = [
    "POLICIES",
    "ImageTextDataset",
    "ImageTextError",
    "ImageTextLoader",
    "ImageTextStream",
    "ImageTextSpec",
    "PackPlan",
    "PatchGrid",
    "grid_for",
    "image_tokens",
    "pack_block",
    "plan_blocks",
    "plan_padding",
]
