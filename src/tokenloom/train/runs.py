"""One run directory over its life: never two runs in one directory, resume checks, a stop
requested by a signal, and the parent run a stage transition starts from."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from tokenloom.train.checkpoint import (
    discard_checkpoint,
    load_checkpoint,
    remove_stale_temporaries,
)
from tokenloom.train.config import MODEL_KEYS, SCHEDULE_KEYS, TrainConfig, TrainError
from tokenloom.train.dist import Dist
from tokenloom.train.layout import (
    LAST_RECORD,
    LEGACY_STATE,
    CheckpointNotFoundError,
    last_step,
    list_steps,
    resolve_checkpoint,
    step_name,
)
from tokenloom.train.lineage import lineage_pools
from tokenloom.train.model import GPT

__all__ = [
    "check_resume",
    "prepare_out",
    "run_out",
    "Interrupted",
    "StopRequest",
    "Parent",
    "parent_run",
    "load_weights",
    "rewind_run",
]


def check_resume(cfg: TrainConfig, saved: dict, reschedule: bool) -> None:
    """Refuse a resume whose model options differ from the checkpoint's ``saved`` options, or
    (without ``reschedule``) whose learning-rate schedule does."""
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


def rewind_run(run: str, step: int) -> str | None:
    """Make the kept ``RUN/step-N`` (``N = step``) the run's latest checkpoint: the checkpoints
    after it move, whole, to ``RUN/rewound-M-to-N/`` (``M``: the latest; nothing is deleted)
    and ``last.json`` names step ``N``. Returns that folder (``None``: nothing was after ``N``).

    Killed midway, it leaves either the old latest named (run it again) or the rewind done.
    """
    from tokenloom.train.record import read_record, write_record

    point = resolve_checkpoint(os.path.join(run, step_name(step)))
    later = [s for s in list_steps(run) if s > step]
    dest = None
    if later:
        dest = os.path.join(run, f"rewound-{max(later)}-to-{step}")
        os.makedirs(dest, exist_ok=True)
        for s in later:  # moved before last.json names N: a kill leaves nothing deleted
            os.rename(os.path.join(run, step_name(s)), os.path.join(dest, step_name(s)))
    write_record(replace(read_record(point.record_path), out=os.path.abspath(run)))
    return dest


def prepare_out(cfg: TrainConfig, resume: bool, overwrite: bool, dist: Dist) -> None:
    """Refuse to mix two runs in one directory; clean what a killed save left."""
    out = cfg.out
    exists = os.path.exists(os.path.join(out, LAST_RECORD)) or bool(list_steps(out))
    exists = exists or os.path.exists(os.path.join(out, LEGACY_STATE))
    if resume:
        try:
            resolve_checkpoint(out)
        except CheckpointNotFoundError as exc:
            raise TrainError(
                f"--resume: no checkpoint to continue in {out} ({exc}); start the run without "
                "--resume"
            ) from None
    if not resume and exists and not overwrite:
        raise TrainError(
            f"{out} already holds a run; continue it with `tokenloom train --out {out} "
            "--resume`, pick another --out, or pass --overwrite to replace it"
        )
    if dist.is_main:
        os.makedirs(out, exist_ok=True)
        remove_stale_temporaries(out)
        if overwrite and not resume:
            _release_pins(out, cfg.storage_options)
            for name in (LEGACY_STATE, LAST_RECORD):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(out, name))
            for step in list_steps(out):
                discard_checkpoint(os.path.join(out, step_name(step)))
        if resume:  # a save killed after its rename, before last.json named it: redone
            last = last_step(out)
            for step in list_steps(out):
                if last is not None and step > last:
                    discard_checkpoint(os.path.join(out, step_name(step)))
    dist.barrier()


@contextlib.contextmanager
def run_out(cfg: TrainConfig, resume: bool, overwrite: bool, dist: Dist) -> Iterator[None]:
    """:func:`prepare_out`, for the body of a run: the folders of ``cfg.out`` it made are removed
    again when the run fails while they are still empty (a refused run leaves no empty ``--out``
    behind, so the rerun needs no flag). A folder that was there before is never removed, nor
    one holding anything."""
    made = []  # the folders of out that do not exist yet, deepest first
    path = os.path.abspath(cfg.out)
    while not os.path.lexists(path):
        made.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    try:
        prepare_out(cfg, resume, overwrite, dist)
        yield
    except BaseException:
        if dist.is_main:
            for folder in made:
                try:
                    os.rmdir(folder)  # only an empty folder goes
                except OSError:
                    break
        raise


def _release_pins(out: str, storage_options: Any) -> None:
    """The versions the replaced run pinned, on every table it read (another table than the new
    run's too): released before its record goes, as `tokenloom runs rm` would."""
    from tokenloom.errors import TokenloomError
    from tokenloom.train.catalog import remove_run

    if not os.path.isfile(os.path.join(out, LAST_RECORD)):
        return
    # an unreadable record or a table out of reach: the run is replaced anyway; `tokenloom gc`
    # lists tags whose holder holds no run any more
    with contextlib.suppress(TokenloomError, OSError):
        remove_run(out, storage_options=storage_options)


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


@dataclass(frozen=True)
class Parent:
    """What a stage transition (``--init-from``) starts from."""

    weights: dict[str, Any]
    """Model weights in tokenloom's layout."""
    optimizer: dict[str, Any] | None
    """The parent's optimizer state (``None`` for a ``transformers`` folder)."""
    entry: dict[str, Any]
    """The new record's ``parent``: ``out``, ``step``, ``loader``, ``tokenizer`` (a tokenloom
    run) or ``format: hf`` with the folder's provenance."""

    @property
    def is_hf(self) -> bool:
        """A ``transformers`` folder (its tokenizer is checked against the column)."""
        return self.entry.get("format") == "hf"


def parent_run(cfg: TrainConfig) -> Parent | None:
    """The checkpoint ``cfg.init_from`` names: ``RUN``, ``RUN/step-N`` (one resolver:
    :func:`~tokenloom.train.layout.resolve_checkpoint`) or a ``transformers`` GPT-2 folder
    (:mod:`tokenloom.train.hf`). The caller checks the tokenizer against the new run's column."""
    if cfg.init_from is None:
        return None
    from tokenloom.train.hf import is_hf_folder, read_hf_folder

    if is_hf_folder(cfg.init_from):  # a transformers GPT-2 folder (its tokenizer checked later)
        if cfg.keep_optimizer:
            raise TrainError(
                f"--keep-optimizer: --init-from {cfg.init_from} is a transformers folder, which "
                "holds no optimizer state; drop --keep-optimizer"
            )
        weights, entry = read_hf_folder(cfg.init_from, model=cfg.model)
        return Parent(weights=weights, optimizer=None, entry=entry)
    state = load_checkpoint(cfg.init_from)
    record = state.record
    if record.config.get("model") != cfg.model:
        raise TrainError(
            f"--init-from {cfg.init_from} holds a {record.config.get('model')!r} model, not "
            f"{cfg.model!r}; pass --model {record.config.get('model')}"
        )
    entry = {
        "out": record.out,
        "step": record.step,
        "loader": record.loader.to_dict(),
        "tokenizer": record.tokenizer,
        "carried": lineage_pools(record),  # the lineage's counts, kept if the parent goes
    }
    return Parent(weights=state.model, optimizer=state.optimizer, entry=entry)


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
