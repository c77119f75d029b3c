"""The models in the loop of ``bench rows``: the ResNet-18 built from torch.nn is the standard
architecture, the dual encoder's loss is defined, and a step trains on a decoded batch."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tokenloom.bench.rows_models import (  # noqa: E402
    SIDE,
    TEXT_LEN,
    ResNet18,
    TinyClip,
    build_step,
)


def test_resnet18_has_the_standard_shape():
    net = ResNet18(num_classes=10)
    # torchvision's resnet18: 11,689,512 parameters with 1,000 classes; 10 classes drop
    # 990 x (512 + 1) of them
    assert sum(p.numel() for p in net.parameters()) == 11_689_512 - 990 * 513
    assert net(torch.zeros(2, 3, SIDE, SIDE)).shape == (2, 10)


def test_tiny_clip_loss_and_steps():
    torch.manual_seed(0)
    loss = TinyClip()(torch.rand(4, 3, SIDE, SIDE), torch.randint(1, 256, (4, TEXT_LEN)))
    assert loss.ndim == 0 and torch.isfinite(loss)
    batch = {
        "sample": np.arange(4),
        "image": np.random.default_rng(0).integers(0, 255, (4, 3, SIDE, SIDE), dtype=np.uint8),
        "text": np.random.default_rng(1).integers(1, 256, (4, TEXT_LEN)),
    }
    for workload in ("image", "image-text"):
        step, name = build_step(workload)
        first = step(batch)
        assert np.isfinite(first) and name
        again, _ = build_step(workload)  # the same initial weights for every loader
        assert again(batch) == pytest.approx(first)
