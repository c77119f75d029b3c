"""Model FLOPs utilisation (MFU): achieved model FLOPs over the accelerator's dense peak.

FLOPs per token follow the PaLM appendix (as nanoGPT does): ``6 N`` for the weights (forward and
backward) plus ``12 L H Q T`` for attention scores, with ``N`` the parameters without the position
embedding. Document masking skips part of the attention work; MFU still counts it, by convention.
"""

from __future__ import annotations

import torch

__all__ = [
    "SLOW_VOCAB_SHARE",
    "flops_per_token",
    "peak_flops",
    "peak_flops_named",
    "mfu",
    "vocab_share",
    "vocab_for_share",
]

SLOW_VOCAB_SHARE = 0.5
"""Above this share of the parameters in the token embedding (tied with the LM head), the
vocabulary, not the transformer, is what a training step mostly computes: ``train`` warns."""

# Dense bf16 peak per device (datasheet figures, no sparsity), matched on the device name.
_PEAK_BF16 = (
    ("H200", 989e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("GH200", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("4090", 165e12),
    ("3090", 71e12),
    ("V100", 125e12),
    ("T4", 65e12),
)


def flops_per_token(model: torch.nn.Module, seq_len: int) -> float:
    """Training FLOPs per token of a :class:`~tokenloom.train.model.GPT` at block length T."""
    cfg = model.cfg
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return 6 * n + 12 * cfg.n_layer * cfg.n_embd * seq_len


def peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak in FLOP/s, or ``None`` when unknown (e.g. CPU)."""
    if device.type != "cuda":
        return None
    return peak_flops_named(torch.cuda.get_device_name(device))


def peak_flops_named(name: str) -> float | None:
    """Dense bf16 peak in FLOP/s of a device by its name (e.g. ``"NVIDIA H100 80GB HBM3"``)."""
    for key, value in _PEAK_BF16:
        if key in name:
            return value
    return None


def mfu(tokens_per_second: float, per_token: float, peak: float | None) -> float | None:
    """Fraction of peak achieved (``None`` without a known peak)."""
    if not peak:
        return None
    return tokens_per_second * per_token / peak


def vocab_share(model: torch.nn.Module) -> float:
    """Share of a :class:`~tokenloom.train.model.GPT`'s parameters in its token embedding (the
    LM head is tied to it: the same ``V x C`` matrix, used twice per step)."""
    return model.wte.weight.numel() / sum(p.numel() for p in model.parameters())


def vocab_for_share(model: torch.nn.Module, share: float = 0.25) -> int:
    """The largest power-of-two vocabulary (at least 512) whose embedding would be at most
    ``share`` of the model's parameters, the rest of the model unchanged."""
    rest = sum(p.numel() for p in model.parameters()) - model.wte.weight.numel()
    limit = share * rest / ((1 - share) * model.cfg.n_embd)
    size = 512
    while size * 2 <= limit:
        size *= 2
    return size
