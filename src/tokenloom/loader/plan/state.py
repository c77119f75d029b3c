"""The loader's resume state: a versioned cursor plus a fingerprint of the plan's inputs.

Because the epoch is a pure function of its inputs (★3), resuming needs only ``(epoch, step)`` and
the assurance that the inputs did not change. :func:`plan_fingerprint` hashes those inputs; the
state also keeps them by name so that a mismatch is reported as *which* input changed, from what to
what, and how to override it (:func:`check_fingerprint`). The world size and the number of workers
are deliberately *not* inputs: the global stream does not depend on them.

Suggested input names (any JSON value is accepted): ``table_version``, ``filter``,
``token_column``, ``tokenizer``, ``seq_len``, ``seed``, ``global_batch``, ``eos_id``, ``pad_id``,
``lookahead``, ``drop_last``, ``permutation``
(:data:`~tokenloom.loader.plan.shuffle.PERMUTATION_ALGORITHM`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenloom.errors import TokenloomError

__all__ = [
    "STATE_VERSION",
    "DATA_KEYS",
    "LoaderStateError",
    "ResumeMismatchError",
    "LoaderState",
    "plan_fingerprint",
    "check_fingerprint",
]

STATE_VERSION = 1
"""Version of :meth:`LoaderState.to_dict`'s layout; bumped on any incompatible change."""

DATA_KEYS = frozenset(
    {"table_version", "table_identity", "filter", "token_column", "tokenizer", "changes"}
)
"""Inputs that select *which data* is read; ``allow_data_change=True`` lets these differ."""

_OVERRIDE = {"table_version": "version"}  # input name -> loader argument, where they differ
_WHAT = {
    "table_version": "table version",
    "token_column": "token column",
    "order_by": "curriculum order (--order-by)",
    "order_jitter": "order jitter (--order-jitter)",
}
_NEWER = frozenset({"table_identity"})
"""Inputs later releases added: a state saved without them is not refused for that alone."""


class LoaderStateError(TokenloomError):
    """A saved loader state cannot be read (unknown version, missing or malformed fields)."""


class ResumeMismatchError(LoaderStateError):
    """The plan's inputs changed since the checkpoint, so resuming would read another stream."""

    def __init__(self, message: str, changes: Mapping[str, tuple[Any, Any]]) -> None:
        super().__init__(message)
        self.changes = dict(changes)
        """``{input: (saved value, current value)}`` for every input that differs."""


def _canonical(inputs: Mapping[str, Any]) -> str:
    try:
        return json.dumps(
            dict(inputs), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise LoaderStateError(
            f"fingerprint inputs must be JSON values (str, int, float, bool, None, lists, dicts); "
            f"{exc}"
        ) from exc


def plan_fingerprint(**inputs: Any) -> str:
    """Fingerprint of the plan's inputs: sha256 hex of their canonical JSON (sorted keys).

    Args:
        **inputs: The named inputs (table version, filter, token column, tokenizer identity,
            seq_len, seed, packing options, ...), each a JSON value.

    Returns:
        64 lowercase hex characters; equal inputs (in any keyword order) give equal fingerprints.

    Raises:
        LoaderStateError: An input is not a JSON value (or is NaN/infinite).
    """
    return hashlib.sha256(_canonical(inputs).encode("ascii")).hexdigest()


def _describe(key: str, old: Any, new: Any) -> str:
    what = _WHAT.get(key, key)
    arg = _OVERRIDE.get(key, key)
    if key == "table_identity":
        return (
            f"checkpoint was taken on table {old} but the table at this URI is now {new}: it was "
            "deleted and built again (same path and version numbers, other data), so the cursor "
            "would continue another stream; start a new run, or pass `allow_data_change=True` "
            "(--allow-data-change) to continue knowingly"
        )
    if key == "table_version":
        head = f"checkpoint was taken on table version {old} but the loader reads version {new}"
    else:
        head = f"checkpoint was taken with {what} {old!r} but the loader uses {new!r}"
    fix = f"pass `{arg}={old!r}` to resume exactly"
    if key in DATA_KEYS:
        return f"{head}; {fix}, or `allow_data_change=True`"
    return f"{head}; {fix} (a different {what} makes a different stream, so the cursor is void)"


_FIRST = {"table_version": 0, "table_identity": 1, "filter": 2, "token_column": 3, "tokenizer": 4}
"""Order of the reported changes: what selects the data first (the version most of all: every
other data input may follow from it), then the others by name."""


def _differs(saved: Mapping[str, Any], current: Mapping[str, Any], key: str) -> bool:
    if key not in saved or key not in current:
        return key in saved or key in current
    return _canonical({"v": saved[key]}) != _canonical({"v": current[key]})


def check_fingerprint(
    saved: Mapping[str, Any], current: Mapping[str, Any], *, allow_data_change: bool = False
) -> None:
    """Refuse to resume when the plan's inputs changed, naming each changed input.

    Args:
        saved: The named inputs stored with the checkpoint.
        current: The named inputs of the loader being resumed.
        allow_data_change: Let the inputs in :data:`DATA_KEYS` differ (continue the cursor on
            other data, knowingly); the others must still match.

    Raises:
        ResumeMismatchError: An input differs, or is present on one side only. The message has one
            line per changed input with the saved and current values and the override, the
            table version first; a changed version explains the other data files, so the table
            is said to be rebuilt only when its files differ at the same version.
            ``.changes`` maps each to ``(saved, current)`` (``None`` where absent).
    """
    changes: dict[str, tuple[Any, Any]] = {}
    lines: list[str] = []
    version_changed = _differs(saved, current, "table_version")
    for key in sorted(set(saved) | set(current), key=lambda k: (_FIRST.get(k, len(_FIRST)), k)):
        if allow_data_change and key in DATA_KEYS:
            continue
        if key in _NEWER and key not in saved:
            continue
        if key == "table_identity" and version_changed:
            # another version has other data files: the identity can only tell a rebuilt table
            # apart at the same version, so the version change is the whole story
            if _differs(saved, current, key):
                changes[key] = (saved.get(key), current.get(key))
            continue
        if key not in current:
            changes[key] = (saved[key], None)
            lines.append(
                f"checkpoint was taken with {key}={saved[key]!r} but the loader does not set "
                f"{key}; pass `{_OVERRIDE.get(key, key)}={saved[key]!r}` to resume exactly"
            )
        elif key not in saved:
            changes[key] = (None, current[key])
            lines.append(
                f"the loader sets {key}={current[key]!r} but the checkpoint has no {key}; "
                f"drop it to resume exactly"
            )
        elif _canonical({"v": saved[key]}) != _canonical({"v": current[key]}):
            changes[key] = (saved[key], current[key])
            lines.append(_describe(key, saved[key], current[key]))
    if changes:
        raise ResumeMismatchError("\n".join(lines), changes)


@dataclass(frozen=True, kw_only=True, slots=True)
class LoaderState:
    """Where a loader is in its stream: ``step`` global steps of epoch ``epoch`` consumed."""

    epoch: int
    """Epoch in progress (0-based)."""
    step: int
    """Global steps of that epoch already consumed (the next step to deliver)."""
    fingerprint: str
    """:func:`plan_fingerprint` of :attr:`inputs`."""
    inputs: Mapping[str, Any] = field(default_factory=dict)
    """The named plan inputs, kept so a mismatch can name what changed."""
    version: int = STATE_VERSION
    """Layout version of this state."""

    @classmethod
    def create(cls, *, epoch: int, step: int, inputs: Mapping[str, Any]) -> LoaderState:
        """A state at ``(epoch, step)`` for a plan built from ``inputs`` (fingerprint computed)."""
        return cls(epoch=epoch, step=step, fingerprint=plan_fingerprint(**inputs), inputs=inputs)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; :meth:`from_dict` reads it back."""
        return {
            "version": self.version,
            "epoch": self.epoch,
            "step": self.step,
            "fingerprint": self.fingerprint,
            "inputs": json.loads(_canonical(self.inputs)),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LoaderState:
        """Read a state written by :meth:`to_dict`, checking its version and fields.

        Raises:
            LoaderStateError: Another layout version, a missing or mistyped field, or inputs that
                do not match the stored fingerprint.
        """
        version = data.get("version")
        if type(version) is not int or version != STATE_VERSION:
            raise LoaderStateError(
                f"loader state has version {version!r} but this tokenloom reads version "
                f"{STATE_VERSION}; resume with the tokenloom release that wrote it"
            )
        for key, kind in (("epoch", int), ("step", int), ("fingerprint", str), ("inputs", dict)):
            value = data.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise LoaderStateError(
                    f"loader state field {key!r} must be {kind.__name__}, got {value!r}"
                )
        if data["epoch"] < 0 or data["step"] < 0:
            raise LoaderStateError(
                f"loader state epoch and step must be >= 0, got {data['epoch']}, {data['step']}"
            )
        if plan_fingerprint(**data["inputs"]) != data["fingerprint"]:
            raise LoaderStateError(
                "loader state inputs do not match its fingerprint; "
                "the state was edited or corrupted"
            )
        return cls(
            epoch=data["epoch"],
            step=data["step"],
            fingerprint=data["fingerprint"],
            inputs=dict(data["inputs"]),
            version=version,
        )

    def check(self, current: Mapping[str, Any], *, allow_data_change: bool = False) -> None:
        """:func:`check_fingerprint` of this state's inputs against ``current``."""
        if plan_fingerprint(**current) == self.fingerprint:
            return
        check_fingerprint(self.inputs, current, allow_data_change=allow_data_change)
