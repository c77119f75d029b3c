"""Images as patch tokens: decode with Pillow, resize to a patch grid, cut into patches.

An image of ``width x height`` pixels is resized (aspect kept) so its longer side is
``max_side`` pixels and each side is a whole number of ``patch``-pixel patches; it then costs
exactly ``grid_h * grid_w`` tokens. :func:`image_tokens` computes that cost from the stored
width and height alone, so a packer can plan blocks without decoding a single image.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenloom.errors import require

__all__ = ["PatchGrid", "grid_for", "image_tokens", "decode_image", "patchify", "ImageTransform"]


@dataclass(frozen=True, kw_only=True)
class PatchGrid:
    """How images become patches."""

    patch: int = 16
    """Patch side, pixels."""
    max_side: int = 64
    """Longest side after resizing, pixels (a multiple of ``patch``)."""

    def __post_init__(self) -> None:
        if self.patch < 1 or self.max_side < self.patch or self.max_side % self.patch:
            raise ValueError(
                f"max_side {self.max_side} must be a positive multiple of patch {self.patch}"
            )

    @property
    def patch_dim(self) -> int:
        """Values per patch (``patch * patch * 3``)."""
        return self.patch * self.patch * 3


def grid_for(width: int, height: int, grid: PatchGrid) -> tuple[int, int]:
    """``(rows, cols)`` of patches for an image (at least 1 x 1; 0 x 0 for a 0-sized one)."""
    if width <= 0 or height <= 0:
        return 0, 0
    per_side = grid.max_side // grid.patch
    longer = max(width, height)
    # floor(x + 0.5), as image_tokens computes it (not round(): that rounds half to even)
    rows = max(1, math.floor(height * per_side / longer + 0.5))
    cols = max(1, math.floor(width * per_side / longer + 0.5))
    return rows, cols


def image_tokens(width: Any, height: Any, grid: PatchGrid) -> np.ndarray:
    """``(n,)`` int64 tokens each image costs (vectorised :func:`grid_for`)."""
    w = np.asarray(width, dtype=np.float64)
    h = np.asarray(height, dtype=np.float64)
    per_side = grid.max_side // grid.patch
    longer = np.maximum(np.maximum(w, h), 1)
    rows = np.maximum(1, np.floor(h * per_side / longer + 0.5))
    cols = np.maximum(1, np.floor(w * per_side / longer + 0.5))
    out = (rows * cols).astype(np.int64)
    out[(w <= 0) | (h <= 0)] = 0
    return out


def decode_image(data: bytes, grid: PatchGrid) -> np.ndarray:
    """``(rows*patch, cols*patch, 3)`` uint8 pixels of an encoded image, resized to its grid.

    Raises:
        OSError / PIL.UnidentifiedImageError / ValueError: the bytes are not a decodable image.
    """
    pil = require("PIL.Image", extra="vision", package="pillow")
    with pil.open(io.BytesIO(data)) as im:  # type: ignore[attr-defined]
        im = im.convert("RGB")
        rows, cols = grid_for(im.width, im.height, grid)
        im = im.resize((cols * grid.patch, rows * grid.patch), pil.BILINEAR)  # type: ignore[attr-defined]
        return np.asarray(im, dtype=np.uint8)


def patchify(pixels: np.ndarray, patch: int) -> np.ndarray:
    """``(rows*cols, patch*patch*3)`` float32 patches in raster order, values in ``[-1, 1]``."""
    h, w, c = pixels.shape
    rows, cols = h // patch, w // patch
    x = pixels.reshape(rows, patch, cols, patch, c).transpose(0, 2, 1, 3, 4)
    return (x.reshape(rows * cols, patch * patch * c).astype(np.float32) / 127.5) - 1.0


class ImageTransform:
    """A row-loader transform: decode ``column`` and cut it into patches.

    Output per row: ``patches`` (an ``(n_i, patch_dim)`` array; a list over rows, since counts
    differ) and ``n_image_tokens``; every other input column is passed through as Python values.
    A row whose bytes do not decode raises (``on_error="skip"`` leaves it out, counted by the
    decoder's exception class, e.g. ``UnidentifiedImageError``).
    """

    def __init__(self, grid: PatchGrid | None = None, column: str = "image") -> None:
        self.grid = grid or PatchGrid()
        self.column = column

    def __call__(self, batch: Any) -> dict[str, Any]:
        patches = [
            patchify(decode_image(data, self.grid), self.grid.patch)
            for data in batch.column(self.column).to_pylist()
        ]
        out: dict[str, Any] = {
            "patches": patches,
            "n_image_tokens": np.array([len(p) for p in patches], dtype=np.int64),
        }
        for name in batch.schema.names:
            if name != self.column:
                out[name] = batch.column(name).to_pylist()
        return out
