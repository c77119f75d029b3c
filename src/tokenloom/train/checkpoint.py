"""Checkpoints: one file written atomically, holding everything an exact resume needs.

``last.pt`` holds tensors and plain values only (dicts, lists, numbers, strings), so it loads with
``torch.load(weights_only=True)``: a checkpoint file can never run code. The random states of
Python and numpy are stored as lists for the same reason. The run's readable record is
``last.json`` (:mod:`tokenloom.train.record`).
"""

from __future__ import annotations

import glob
import os
import pickle
import random
from typing import Any

import numpy as np
import torch

from tokenloom.errors import TokenloomError

__all__ = [
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "rng_state",
    "set_rng_state",
    "load_run_model",
    "remove_stale_temporaries",
]


class CheckpointError(TokenloomError):
    """A checkpoint file is missing, torn, or holds something other than plain state."""


def rng_state() -> dict:
    """Every random number generator the run touches, as tensors and plain values."""
    version, keys, gauss = random.getstate()
    name, np_keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(keys), gauss],
        "numpy": [name, np_keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
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


def remove_stale_temporaries(out: str) -> list[str]:
    """Delete ``*.tmp-PID`` files in ``out`` whose writer process is gone (a killed save)."""
    removed = []
    for path in glob.glob(os.path.join(glob.escape(out), "*.tmp-*")):
        pid = path.rsplit(".tmp-", 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            os.remove(path)
            removed.append(path)
    return removed


def load_checkpoint(path: str) -> dict:
    """Read a checkpoint onto the CPU, with ``weights_only=True`` (no code runs).

    Raises:
        CheckpointError: The file is missing, torn, or holds anything but tensors and plain
            values (e.g. a pickled object: refused, never executed).
    """
    if not os.path.exists(path):
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"{path} is not a tokenloom checkpoint that loads safely (tensors and plain values "
            f"only): {first[:300]}"
        ) from exc
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a tokenloom checkpoint (no model state)")
    return state


def load_run_model(run: str, *, device: str = "cpu") -> tuple[Any, Any]:
    """The trained model of a run directory and its record.

    Returns:
        ``(model, record)``: a :class:`~tokenloom.train.model.GPT` in eval mode on ``device``,
        and the :class:`~tokenloom.train.record.RunRecord`.
    """
    from tokenloom.train.model import GPT, PRESETS, GPTConfig
    from tokenloom.train.record import read_record

    record = read_record(run)
    state = load_checkpoint(os.path.join(os.fspath(run), "last.pt"))
    weights = state["model"]
    cfg = GPTConfig(
        **PRESETS[record.config["model"]],
        vocab_size=int(weights["wte.weight"].shape[0]),
        block_size=int(weights["wpe.weight"].shape[0]),
    )
    model = GPT(cfg)
    model.load_state_dict(weights)
    return model.to(device).eval(), record
