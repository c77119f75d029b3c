"""Checkpoints: one file written atomically, holding everything an exact resume needs."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state"]


def rng_state() -> dict:
    """Every random number generator the run touches."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str, payload: dict) -> None:
    """Write a checkpoint atomically (temporary file, fsync, rename): a run killed at any
    moment leaves either the previous checkpoint or the new one, never a torn file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        torch.save(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str) -> dict:
    """Read a checkpoint onto the CPU."""
    return torch.load(path, map_location="cpu", weights_only=False)
