"""A run directory on disk, and the one resolver of ``RUN`` or ``RUN/step-N``.

::

    RUN/
      last.json          the latest checkpoint's record (RunRecord); names it by its step
      step-N/            one checkpoint, N = global optimizer step
        state.pt         weights, optimizer, RNG, fed counts, loss history (tensors, plain values)
        record.json      its RunRecord (the same summary as last.json had when it was written)

A checkpoint is written as a hidden temporary directory and renamed to ``step-N`` once its files
are on disk; ``last.json`` is switched after that, and older step directories are deleted (renamed
away first) only then, so a process killed at any moment leaves the previous checkpoint loadable.
Which steps survive is :mod:`tokenloom.train.retention`'s rule. Runs written before this layout
hold ``RUN/last.pt`` (one file) beside ``last.json``; they still load.

Pure: no torch.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from tokenloom.errors import TokenloomError

__all__ = [
    "LAST_RECORD",
    "LEGACY_STATE",
    "STATE_FILE",
    "RECORD_FILE",
    "KEPT_MARKER",
    "CheckpointNotFoundError",
    "Checkpoint",
    "step_name",
    "parse_step",
    "list_steps",
    "kept_steps",
    "last_step",
    "resolve_checkpoint",
    "rewind_point",
]

LAST_RECORD = "last.json"
LEGACY_STATE = "last.pt"
"""The single-file checkpoint of runs written before step directories."""
STATE_FILE = "state.pt"
RECORD_FILE = "record.json"
KEPT_MARKER = "KEPT"
"""In a checkpoint written for ``--keep-every``: it is never deleted by a later save, whatever
the options of later invocations."""
_STEP = re.compile(r"step-(\d+)")


class CheckpointNotFoundError(TokenloomError):
    """``RUN`` holds no run, or ``RUN/step-N`` names a step the run did not keep."""


def step_name(step: int) -> str:
    """The directory name of the checkpoint at global step ``step``."""
    return f"step-{step}"


def parse_step(name: str) -> int | None:
    """``N`` of a ``step-N`` directory name, else ``None``."""
    m = _STEP.fullmatch(name)
    return int(m.group(1)) if m else None


def kept_steps(run: str | os.PathLike[str]) -> set[int]:
    """The steps of ``run``'s checkpoints marked as kept for good (:data:`KEPT_MARKER`)."""
    return {
        s for s in list_steps(run) if os.path.exists(os.path.join(run, step_name(s), KEPT_MARKER))
    }


def list_steps(run: str | os.PathLike[str]) -> list[int]:
    """The steps of the checkpoint directories in ``run``, ascending (temporaries excluded)."""
    try:
        names = os.listdir(run)
    except (FileNotFoundError, NotADirectoryError):
        return []
    steps = [parse_step(n) for n in names]
    return sorted(
        s
        for s, n in zip(steps, names, strict=True)
        if s is not None and os.path.isdir(os.path.join(run, n))
    )


@dataclass(frozen=True)
class Checkpoint:
    """Where one checkpoint lives."""

    run: str
    """The run directory (``--out`` of ``tokenloom train``)."""
    path: str
    """The checkpoint directory ``RUN/step-N`` (``RUN`` itself for a legacy run)."""
    step: int
    """Its global optimizer step."""
    latest: bool
    """Named as ``RUN`` (the run's latest checkpoint), not as ``RUN/step-N``."""
    legacy: bool = False
    """A run written before step directories (``RUN/last.pt`` beside ``RUN/last.json``)."""

    @property
    def record_path(self) -> str:
        """The JSON record of this checkpoint."""
        if self.legacy:
            return os.path.join(self.run, LAST_RECORD)
        return os.path.join(self.path, RECORD_FILE)

    @property
    def state_path(self) -> str:
        """The tensors and plain values of this checkpoint."""
        return os.path.join(self.path, LEGACY_STATE if self.legacy else STATE_FILE)


def _steps_line(run: str) -> str:
    steps = list_steps(run)
    if not steps:
        return f"{run} keeps no step checkpoint"
    return f"{run} keeps " + ", ".join(step_name(s) for s in steps)


def last_step(run: str | os.PathLike[str]) -> int | None:
    """The step ``RUN/last.json`` names (``None``: no readable record there)."""
    try:
        with open(os.path.join(run, LAST_RECORD), encoding="utf-8") as fh:
            step = json.load(fh).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def resolve_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint ``path`` names: a run directory (its latest checkpoint) or ``RUN/step-N``.

    The one resolver behind every command that reads a trained model (``sample``, ``trace``,
    ``verify --run``, ``export``, ``train --init-from``).

    Raises:
        CheckpointNotFoundError: ``path`` is not a run directory, or names a step the run does
            not hold (the message lists the steps it holds).
    """
    given = os.fspath(path)
    text = os.path.abspath(given)
    if os.path.basename(text) in (STATE_FILE, RECORD_FILE, LAST_RECORD, LEGACY_STATE):
        text = os.path.dirname(text)  # a file of a checkpoint names its checkpoint
    step = parse_step(os.path.basename(text))
    if step is not None:
        run = os.path.dirname(text)
        text = os.path.join(run, step_name(step))  # step-0450 is step-450
        if os.path.isfile(os.path.join(text, RECORD_FILE)):
            return Checkpoint(run=run, path=text, step=step, latest=False)
        if not os.path.isfile(os.path.join(run, LAST_RECORD)):
            raise CheckpointNotFoundError(
                f"{given!r}: {run} is not a run directory (no {LAST_RECORD}); pass RUN or "
                "RUN/step-N, RUN being the --out directory of a `tokenloom train` run"
            )
        raise CheckpointNotFoundError(
            f"{given!r}: no checkpoint at step {step}; {_steps_line(run)} (keep more with "
            "`tokenloom train --keep-every N` or --keep-last K)"
        )
    if not os.path.isfile(os.path.join(text, LAST_RECORD)):
        what = "does not exist" if not os.path.exists(text) else f"holds no {LAST_RECORD}"
        raise CheckpointNotFoundError(
            f"{given!r} {what}; pass the --out directory of a `tokenloom train` run that has "
            "written a checkpoint, or RUN/step-N"
        )
    last = last_step(text)
    if last is not None and os.path.isdir(os.path.join(text, step_name(last))):
        return Checkpoint(
            run=text, path=os.path.join(text, step_name(last)), step=last, latest=True
        )
    if os.path.isfile(os.path.join(text, LEGACY_STATE)):
        return Checkpoint(run=text, path=text, step=last or 0, latest=True, legacy=True)
    raise CheckpointNotFoundError(
        f"{os.path.join(text, LAST_RECORD)} names step {last} but {text} holds no "
        f"{step_name(last) if last is not None else 'checkpoint'}; {_steps_line(text)}: pass "
        "RUN/step-N to read one of them"
    )


def rewind_point(out: str | os.PathLike[str]) -> Checkpoint | None:
    """The kept checkpoint ``out`` names when it is ``RUN/step-N`` (a ``--resume`` from it
    rewinds the run to step ``N``), else ``None`` (a run directory).

    Raises:
        CheckpointNotFoundError: ``RUN/step-N`` names a step the run does not keep (listing
            those it keeps).
    """
    if parse_step(os.path.basename(os.path.abspath(out))) is None:
        return None
    return resolve_checkpoint(out)
