"""Checkpoints: one typed run state (:class:`RunState`), one writer and one reader.

A checkpoint is a directory ``RUN/step-N`` (:mod:`tokenloom.train.layout`) holding ``state.pt``
(tensors and plain values only, so it loads with ``torch.load(weights_only=True)``: a checkpoint
file can never run code; the random states of Python and numpy are stored as lists for that
reason) and ``record.json``, the readable :class:`~tokenloom.train.record.RunRecord`. The record
is also written as ``RUN/last.json``, which names the latest checkpoint; both come from the same
:class:`RunState` in :func:`save_checkpoint`, the only writer. :func:`load_checkpoint` is the only
reader (``RUN``, ``RUN/step-N``, or a run written before step directories, ``RUN/last.pt``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pickle
import random
import shutil
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tokenloom.errors import TokenloomError
from tokenloom.train.layout import (
    KEPT_MARKER,
    LEGACY_STATE,
    RECORD_FILE,
    STATE_FILE,
    kept_steps,
    list_steps,
    resolve_checkpoint,
    step_name,
)
from tokenloom.train.record import RunRecord, read_record, write_record
from tokenloom.train.retention import best_step, steps_to_keep

__all__ = [
    "STATE_FORMAT",
    "CheckpointError",
    "RunState",
    "save_checkpoint",
    "load_checkpoint",
    "rng_state",
    "set_rng_state",
    "load_run_model",
    "remove_stale_temporaries",
    "discard_checkpoint",
]


STATE_FORMAT = 3
"""Layout version of ``state.pt`` (runs before step directories wrote ``last.pt``, unversioned)."""


class CheckpointError(TokenloomError):
    """A checkpoint file is missing, torn, or holds something other than plain state."""


@dataclass(frozen=True, kw_only=True)
class RunState:
    """Everything an exact resume needs, as of one optimizer step."""

    record: RunRecord
    """The readable part: step, loader spec and cursor, options, tokenizer, topology, losses,
    per-pool fed counts, parent (also ``last.json``)."""
    model: dict[str, Any]
    """The model's ``state_dict`` (on the CPU once read)."""
    optimizer: dict[str, Any]
    """The AdamW ``state_dict`` (moments, step counts, the learning rate of the last step)."""
    rng: dict[str, Any]
    """Every random generator's state (:func:`rng_state`)."""
    fed: dict[str, Any] | None = None
    """What all ranks were fed so far, per pool: ``{"counts": Tensor, "seen": [Tensor]}``
    (the ledger's counters, continued on rank 0 by a resume)."""
    history: dict[str, list] = field(default_factory=dict)
    """``{"train": [(step, loss)], "val": [(step, loss)], "topology": [...]}`` across resumes."""

    @property
    def step(self) -> int:
        """Optimizer steps done."""
        return self.record.step

    @property
    def config(self) -> dict[str, Any]:
        """The options the run was trained with (:meth:`TrainConfig.options`)."""
        return self.record.config

    def payload(self) -> dict[str, Any]:
        """What ``state.pt`` holds (the record is beside it, in ``record.json``)."""
        return {
            "format": STATE_FORMAT,
            "step": self.step,
            "model": self.model,
            "optimizer": self.optimizer,
            "rng": self.rng,
            "fed": self.fed,
            "history": self.history,
        }


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


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: str, write: Any) -> None:
    with open(path, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())


def discard_checkpoint(path: str) -> None:
    """Delete a checkpoint directory; renamed away first, so a kill midway never leaves a torn
    directory under a checkpoint's name (the hidden rest goes at the next start)."""
    trash = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.trash-{os.getpid()}")
    shutil.rmtree(trash, ignore_errors=True)
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def save_checkpoint(
    state: RunState,
    *,
    keep_every: int | None = None,
    keep_last: int = 1,
    keep_best: bool = False,
) -> str:
    """Write ``state`` as ``RUN/step-N``, switch ``RUN/last.json`` to it, then delete the step
    checkpoints no rule keeps (:func:`~tokenloom.train.retention.steps_to_keep`; a checkpoint
    written for ``keep_every`` is marked and never deleted, even by a resume with other rules).

    Atomic at every moment: the files go to a hidden temporary directory (fsynced), which is
    renamed to ``step-N``; ``last.json`` (the commit point) is replaced by rename after that, and
    older checkpoints are deleted only then. A process killed anywhere leaves the previous
    checkpoint whole and named by ``last.json``.

    Returns:
        The checkpoint directory written.
    """
    run = state.record.out
    os.makedirs(run, exist_ok=True)
    name = step_name(state.step)
    final = os.path.join(run, name)
    tmp = os.path.join(run, f".{name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp)
    _write_synced(os.path.join(tmp, STATE_FILE), lambda fh: torch.save(state.payload(), fh))
    text = json.dumps(state.record.to_dict(), indent=1).encode()
    _write_synced(os.path.join(tmp, RECORD_FILE), lambda fh: fh.write(text))
    if keep_every and state.step % keep_every == 0:  # immutable: no later save deletes it
        note = f"kept by --keep-every {keep_every}\n".encode()
        _write_synced(os.path.join(tmp, KEPT_MARKER), lambda fh: fh.write(note))
    _fsync_dir(tmp)
    if os.path.exists(final):  # left by a save killed before last.json named it: redone now
        discard_checkpoint(final)
    os.rename(tmp, final)
    _fsync_dir(run)
    write_record(state.record)  # last.json: from here on the new checkpoint is the run's
    _fsync_dir(run)
    best = best_step(state.history.get("val", ())) if keep_best else None
    keep = steps_to_keep(
        list_steps(run), latest=state.step, keep_every=keep_every, keep_last=keep_last, best=best
    )
    keep |= {s for s in kept_steps(run) if s <= state.step}  # kept by an earlier --keep-every
    for step in list_steps(run):
        if step not in keep:
            discard_checkpoint(os.path.join(run, step_name(step)))
    legacy = os.path.join(run, LEGACY_STATE)  # a run continued from the single-file layout
    with contextlib.suppress(FileNotFoundError):
        os.remove(legacy)
    return final


def remove_stale_temporaries(out: str) -> list[str]:
    """Delete what a killed save left in ``out``: ``*.tmp-PID`` files and hidden ``.tmp-PID`` /
    ``.trash-PID`` directories whose writer process is gone."""
    removed = []
    patterns = ("*.tmp-*", ".*.tmp-*", ".*.trash-*")
    where = glob.escape(out)
    for path in sorted({p for pat in patterns for p in glob.glob(os.path.join(where, pat))}):
        pid = path.rsplit("-", 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)
            removed.append(path)
    return removed


def _torch_load(path: str) -> dict:
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


def load_checkpoint(path: str | os.PathLike[str]) -> RunState:
    """Read the checkpoint ``path`` names onto the CPU, with ``weights_only=True`` (no code runs):
    ``RUN`` (its latest), ``RUN/step-N``, or ``RUN/last.pt`` of a run written before step
    directories.

    Raises:
        CheckpointNotFoundError: No such run or step (the message lists the steps kept).
        CheckpointError: The file is torn, of another layout, or holds anything but tensors and
            plain values (e.g. a pickled object: refused, never executed).
        RecordError: The checkpoint's record cannot be read.
    """
    where = resolve_checkpoint(path)
    record = read_record(where.record_path)
    payload = _torch_load(where.state_path)
    if where.legacy:
        if payload.get("step") != record.step:  # last.pt and last.json are written one by one
            raise CheckpointError(
                f"{where.state_path} holds step {payload.get('step')} but its last.json step "
                f"{record.step} (a save of the older single-file layout was interrupted); "
                "retrain it, or resume it with the tokenloom release that wrote it"
            )
    elif payload.get("format") != STATE_FORMAT or payload.get("step") != record.step:
        raise CheckpointError(
            f"{where.state_path} has layout {payload.get('format')} at step "
            f"{payload.get('step')}, this tokenloom reads layout {STATE_FORMAT} and its record "
            f"says step {record.step}; write it again with this release (`tokenloom train`)"
        )
    return RunState(
        record=record,
        model=payload["model"],
        optimizer=payload["optimizer"],
        rng=payload["rng"],
        fed=payload.get("fed"),
        history=payload.get("history") or {"train": [], "val": []},
    )


def load_run_model(run: str | os.PathLike[str], *, device: str = "cpu") -> tuple[Any, Any]:
    """The trained model of a checkpoint (``RUN`` or ``RUN/step-N``) and its record.

    Returns:
        ``(model, record)``: a :class:`~tokenloom.train.model.GPT` in eval mode on ``device``,
        and the :class:`~tokenloom.train.record.RunRecord`.
    """
    from tokenloom.train.model import GPT, PRESETS, GPTConfig

    state = load_checkpoint(run)
    weights = state.model
    cfg = GPTConfig(
        **PRESETS[state.config["model"]],
        vocab_size=int(weights["wte.weight"].shape[0]),
        block_size=int(weights["wpe.weight"].shape[0]),
    )
    model = GPT(cfg)
    model.load_state_dict(weights)
    return model.to(device).eval(), state.record
