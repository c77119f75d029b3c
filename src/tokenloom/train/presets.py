"""The model sizes ``--model`` names (pure: the CLI lists them without importing torch)."""

from __future__ import annotations

__all__ = ["PRESETS"]

PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 4, "n_head": 4, "n_embd": 128},  # trains usefully on 2 CPU cores
    "small": {"n_layer": 12, "n_head": 12, "n_embd": 768},  # GPT-2 124M
    "medium": {"n_layer": 24, "n_head": 16, "n_embd": 1024},  # GPT-2 350M
}
"""Layers, heads and width of each model size; the vocabulary and block length come from the
data."""
