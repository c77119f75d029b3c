"""Images as patches: the token cost is known from width and height alone."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from tokenloom.vision.images import CORRUPT_JPEG
from tokenloom.vision.patches import (
    ImageTransform,
    PatchGrid,
    decode_image,
    grid_for,
    image_tokens,
    patchify,
)


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    arr = (np.arange(w * h * 3) % 251).astype(np.uint8).reshape(h, w, 3)
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def test_token_cost_from_size_matches_the_decoded_grid():
    grid = PatchGrid(patch=8, max_side=32)
    sizes = [(512, 512), (451, 300), (300, 451), (10, 500), (33, 31), (1, 1), (64, 20)]
    cost = image_tokens([w for w, _ in sizes], [h for _, h in sizes], grid)
    for (w, h), c in zip(sizes, cost.tolist(), strict=True):
        rows, cols = grid_for(w, h, grid)
        assert rows * cols == c and max(rows, cols) == 4
        pixels = decode_image(_png(w, h), grid)
        assert pixels.shape == (rows * 8, cols * 8, 3)
        assert patchify(pixels, 8).shape == (c, 8 * 8 * 3)


def test_patchify_is_raster_order():
    px = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    p = patchify(px, 2)
    assert p.shape == (6, 12)
    back = ((p[1] + 1) * 127.5).round().astype(np.uint8).reshape(2, 2, 3)
    assert np.array_equal(back, px[0:2, 2:4])


def test_transform_raises_on_bytes_that_are_not_an_image():
    t = ImageTransform(PatchGrid(patch=8, max_side=16))
    ok = t(pa.record_batch({"image": pa.array([_png(20, 10)], pa.large_binary()), "k": [1]}))
    assert ok["n_image_tokens"].tolist() == [2] and ok["k"] == [1]
    with pytest.raises(Exception, match="cannot identify"):
        t(pa.record_batch({"image": pa.array([CORRUPT_JPEG], pa.large_binary())}))
