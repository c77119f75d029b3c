"""One run directory over its life: never two runs in one directory, resume checks, a stop
requested by a signal, and the parent run a stage transition starts from."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

from tokenloom.loader.spec import LoaderSpec
from tokenloom.train.checkpoint import load_checkpoint, remove_stale_temporaries
from tokenloom.train.config import MODEL_KEYS, SCHEDULE_KEYS, TrainConfig, TrainError
from tokenloom.train.dist import Dist
from tokenloom.train.lineage import lineage_pools
from tokenloom.train.model import GPT
from tokenloom.train.record import read_record

__all__ = [
    "check_resume",
    "prepare_out",
    "Interrupted",
    "StopRequest",
    "parent_run",
    "load_weights",
]


def check_resume(cfg: TrainConfig, saved: dict, reschedule: bool) -> None:
    for key in MODEL_KEYS:
        if saved.get(key) != getattr(cfg, key):
            raise TrainError(
                f"the checkpoint was trained with {key}={saved.get(key)!r}, not "
                f"{getattr(cfg, key)!r}; resume with the same {key} or start a new --out"
            )
    if reschedule:
        return
    for key in SCHEDULE_KEYS:
        if key in saved and saved[key] != getattr(cfg, key):
            raise TrainError(
                f"the checkpoint's schedule has {key}={saved[key]!r} but this resume asks for "
                f"{getattr(cfg, key)!r}; drop the option to continue the same schedule, or pass "
                "--reschedule to change it knowingly"
            )


def prepare_out(cfg: TrainConfig, resume: bool, overwrite: bool, dist: Dist) -> None:
    """Refuse to mix two runs in one directory; clean what a killed save left."""
    ckpt = os.path.join(cfg.out, "last.pt")
    exists = os.path.exists(ckpt) or os.path.exists(os.path.join(cfg.out, "last.json"))
    if resume and not os.path.exists(ckpt):
        raise TrainError(
            f"--resume: no checkpoint in {cfg.out} (no last.pt); start the run without --resume"
        )
    if not resume and exists and not overwrite:
        raise TrainError(
            f"{cfg.out} already holds a run; continue it with `tokenloom train --out {cfg.out} "
            "--resume`, pick another --out, or pass --overwrite to replace it"
        )
    if dist.is_main:
        os.makedirs(cfg.out, exist_ok=True)
        remove_stale_temporaries(cfg.out)
        if overwrite and not resume:
            for name in ("last.pt", "last.json"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(cfg.out, name))
    dist.barrier()


class Interrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM arrived before the first step of this invocation: nothing to checkpoint,
    so the run ends at once (``signum`` says which signal)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class StopRequest:
    """SIGINT/SIGTERM set a flag; the loop checkpoints at the next step boundary and ends.

    Until the loop :meth:`defer` s them (while the plan, the model and the loader start, which
    can take long and has nothing to checkpoint yet) a signal raises :class:`Interrupted` at
    once, so the first SIGTERM always ends a run promptly.
    """

    def __init__(self) -> None:
        self.requested = False
        self.signal = 0
        self.deferred = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def defer(self) -> None:
        """From now on a first signal only sets the flag (the loop stops at a step boundary)."""
        self.deferred = True

    def _handle(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        if not self.deferred:  # nothing to checkpoint yet: stop now
            raise Interrupted(signum)
        if self.requested:  # a second signal: stop now
            raise KeyboardInterrupt
        self.requested, self.signal = True, signum

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def parent_run(cfg: TrainConfig, loader: LoaderSpec) -> tuple[dict | None, dict | None]:
    """``(state, parent)`` of ``cfg.init_from`` (weights to start from, and the new record's
    ``parent`` entry): a tokenloom run directory or a ``transformers`` GPT-2 folder
    (:mod:`tokenloom.train.hf`). The caller checks the tokenizer against the new run's column."""
    if cfg.init_from is None:
        return None, None
    from tokenloom.train.hf import is_hf_folder, read_hf_folder

    if is_hf_folder(cfg.init_from):  # a transformers GPT-2 folder (its tokenizer checked later)
        if cfg.keep_optimizer:
            raise TrainError(
                f"--keep-optimizer: --init-from {cfg.init_from} is a transformers folder, which "
                "holds no optimizer state; drop --keep-optimizer"
            )
        weights, parent = read_hf_folder(cfg.init_from, model=cfg.model)
        return {"model": weights}, parent
    record = read_record(cfg.init_from)
    state = load_checkpoint(os.path.join(cfg.init_from, "last.pt"))
    if record.config.get("model") != cfg.model:
        raise TrainError(
            f"--init-from {cfg.init_from} holds a {record.config.get('model')!r} model, not "
            f"{cfg.model!r}; pass --model {record.config.get('model')}"
        )
    return state, {
        "out": record.out,
        "step": record.step,
        "loader": record.loader.to_dict(),
        "tokenizer": record.tokenizer,
        "carried": lineage_pools(record),  # the lineage's counts, kept if the parent goes
    }


def load_weights(model: GPT, weights: dict) -> None:
    """Load weights into ``model``, growing or keeping the position table when the block length
    differs (a stage transition to longer blocks keeps the learned positions it has)."""
    weights = dict(weights)
    old = weights["wpe.weight"]
    new = model.wpe.weight
    if old.shape != new.shape:
        grown = new.detach().clone()
        n = min(old.shape[0], new.shape[0])
        grown[:n] = old[:n]
        weights["wpe.weight"] = grown
    model.load_state_dict(weights)
