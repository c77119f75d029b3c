"""The models in the loop of ``bench rows``: every loader feeds the same model, from the same
initial weights, the same number of training steps.

* ``image``: ResNet-18 (10 classes, the label a sample's index mod 10) on small inputs
  (:data:`SIDE` x :data:`SIDE` RGB) so that a CPU step stays short. torchvision's ``resnet18`` is
  used when torchvision imports; otherwise :class:`ResNet18`, the same architecture (He et al.
  2015: a 7x7 stem, max-pool, four stages of two basic blocks, 64-128-256-512 channels, average
  pool, linear) built from ``torch.nn`` here. Which one ran is reported (``model_impl``).
* ``image-text``: a tiny CLIP-style dual encoder (:class:`TinyClip`): a small conv net for the
  image and a byte-embedding mean-pool for the text, each projected to :data:`EMBED`
  dimensions, trained with the symmetric contrastive loss over the batch.

torch is imported by this module: it is only imported inside a case's process.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["SIDE", "TEXT_LEN", "EMBED", "ResNet18", "TinyClip", "build_step"]

SIDE = 32
"""Image side the decode resizes to (CIFAR-sized: a CPU training step stays short)."""
TEXT_LEN = 64
"""Bytes of prompt + response kept per sample (padded with 0)."""
EMBED = 128
"""Width of the dual encoder's shared embedding."""


class _Basic(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.down(x))


class ResNet18(nn.Module):
    """ResNet-18 (torchvision's layout) for ``(B, 3, H, W)`` float images."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [_Basic(cin, cout, stride), _Basic(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layers(self.stem(x))  # (B, 512, h, w)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


def resnet18(num_classes: int = 10) -> tuple[nn.Module, str]:
    """torchvision's ``resnet18`` when it imports, else :class:`ResNet18`; and which one."""
    try:
        from torchvision.models import resnet18 as tv_resnet18

        return tv_resnet18(num_classes=num_classes), "torchvision.models.resnet18"
    except Exception:  # noqa: BLE001 - missing, or built for another torch (fails on import)
        return ResNet18(num_classes), "ResNet-18 built from torch.nn (torchvision not importable)"


class TinyClip(nn.Module):
    """A CLIP-style dual encoder: images ``(B, 3, H, W)`` and byte texts ``(B, T)`` to unit
    vectors of :data:`EMBED` dimensions, compared with a learned temperature."""

    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2, 1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, 2, 1),
            nn.ReLU(),
            nn.Conv2d(64, 128, 3, 2, 1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(128, EMBED),
        )
        self.embed = nn.Embedding(256, 128, padding_idx=0)
        self.text = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, EMBED))
        self.scale = nn.Parameter(torch.tensor(np.log(1 / 0.07), dtype=torch.float32))

    def forward(self, images: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
        """The symmetric InfoNCE loss of the batch (matching pairs on the diagonal)."""
        img = F.normalize(self.image(images), dim=-1)  # (B, E)
        mask = (texts != 0).unsqueeze(-1).float()  # (B, T, 1)
        pooled = (self.embed(texts) * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B, 128)
        txt = F.normalize(self.text(pooled), dim=-1)  # (B, E)
        logits = self.scale.exp() * img @ txt.T  # (B, B)
        target = torch.arange(len(logits))
        return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def build_step(workload: str) -> tuple[Callable[[dict], float], str]:
    """A training step for ``workload`` (fresh weights, seed 0) and the model's name.

    The step takes a batch ``{"sample": (B,), "image": (B, 3, S, S) uint8, "text": (B, T)}``
    (numpy) and returns the loss.
    """
    torch.manual_seed(0)  # the same initial weights for every loader
    if workload == "image":
        net, name = resnet18(10)
    else:
        net, name = TinyClip(), "tiny CLIP-style dual encoder"
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)

    def step(batch: dict) -> float:
        images = torch.from_numpy(np.ascontiguousarray(batch["image"])).float().div_(255.0)
        if workload == "image":
            labels = torch.from_numpy(np.asarray(batch["sample"]) % 10).long()
            loss = F.cross_entropy(net(images), labels)
        else:
            loss = net(images, torch.from_numpy(np.asarray(batch["text"])).long())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step, name
