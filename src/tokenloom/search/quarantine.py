"""Quarantine: the rows a range of training steps fed, recorded beside the table they came from.

After a loss spike, ``tokenloom quarantine --checkpoint RUN --steps A:B`` recomputes the rows
optimizer steps ``A..B`` held (:meth:`~tokenloom.search.trace.RunTrace.rows_fed`: the same plan
``tokenloom trace`` reads, no log of samples) and writes them, with the run, the steps and the
counts, to ``<table>/_tokenloom/quarantine/<NAME>.lance`` — one Lance file, so it works on every
store Lance does, and under the table's own URI so any run on that table can name it
(``tokenloom train --resume --exclude NAME``). Lance's cleanup and ``tokenloom gc`` leave
``_tokenloom/`` alone. A quarantine is never overwritten: a name is written once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa

from tokenloom.errors import TokenloomError

__all__ = [
    "QUARANTINE_DIR",
    "QuarantineError",
    "Quarantine",
    "quarantine_uri",
    "record_quarantine",
    "read_quarantine",
    "parse_step_range",
]

QUARANTINE_DIR = "_tokenloom/quarantine"
"""Where quarantines live inside a table's directory."""

_META_KEY = b"tokenloom.quarantine"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class QuarantineError(TokenloomError):
    """A quarantine cannot be written or read (exists already, missing, unreadable)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Quarantine:
    """Rows a run's steps fed, set aside (see the module docstring)."""

    name: str
    table: str
    """The table's URI (the quarantine lives under it)."""
    table_version: int
    """The version the run read those rows from."""
    run: str
    """The run directory (absolute) the steps belong to."""
    first_step: int
    last_step: int
    """Optimizer steps ``first_step..last_step`` (1-based, inclusive)."""
    row_ids: np.ndarray
    """``(n,)`` ascending unique table ids of the rows those steps held."""
    stretches: int
    """Stretches (a row's tokens in one block) those steps held."""
    tokens: int
    """Tokens of those stretches (repeated window context included)."""
    created: str
    """When it was recorded (UTC, ISO 8601)."""

    def summary(self) -> dict[str, Any]:
        """Everything but the row ids (what the run record and ``--json`` show)."""
        return {
            "name": self.name,
            "table": self.table,
            "table_version": self.table_version,
            "run": self.run,
            "steps": [self.first_step, self.last_step],
            "rows": int(len(self.row_ids)),
            "stretches": self.stretches,
            "tokens": self.tokens,
            "created": self.created,
            "uri": quarantine_uri(self.table, self.name),
        }


def check_name(name: str) -> str:
    """``name`` if it can name a quarantine file (letters, digits, ``.``, ``_``, ``-``).

    Raises:
        QuarantineError: Any other name.
    """
    if not _NAME.match(name or ""):
        raise QuarantineError(
            f"quarantine name {name!r} is not allowed: use letters, digits, '.', '_' and '-' "
            "(at most 128, starting with a letter or digit), e.g. --name spike-120-140"
        )
    return name


def quarantine_uri(table: str, name: str) -> str:
    """The file of quarantine ``name`` of the table at ``table``."""
    return f"{table.rstrip('/')}/{QUARANTINE_DIR}/{name}.lance"


def parse_step_range(text: str, steps_done: int) -> tuple[int, int]:
    """``"A:B"`` (or ``"A"``) → ``(A, B)``: 1-based inclusive optimizer steps within
    ``1..steps_done``.

    Raises:
        ValueError: Not of that form, empty, or outside the run; the message names the range.
    """
    what = f"the run has steps 1..{steps_done}; pass e.g. --steps {max(steps_done - 1, 1)}:"
    what += f"{steps_done}"
    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text or "")
    if m is None:
        raise ValueError(f"{text!r} is not a step range A:B (1-based, inclusive); {what}")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    if first > last:
        raise ValueError(f"{text!r} is empty: {first} > {last}; {what}")
    if first < 1 or last > steps_done:
        raise ValueError(f"{text!r} is outside the run: {what}")
    return first, last


def record_quarantine(
    trace: Any,
    first: int,
    last: int,
    *,
    name: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> Quarantine:
    """Compute the rows steps ``first..last`` of ``trace``'s run fed and write them under the
    run's table (:func:`quarantine_uri`).

    Args:
        trace: The run's :class:`~tokenloom.search.trace.RunTrace`.
        first, last: Optimizer steps (1-based, inclusive).
        name: The quarantine's name (default ``<run dir name>-steps-A-B``).
        storage_options: Object-store options of the table.

    Raises:
        QuarantineError: The name is taken or not allowed.
        TraceError: The steps are outside the run.
    """
    from tokenloom.table import Table
    from tokenloom.table.sidefiles import write_side_table
    from tokenloom.table.storage import exists

    handle = Table.open(trace.planner.uri, storage_options=storage_options)
    table = handle.uri
    run = trace.record.out
    name = check_name(name or f"{_base(run)}-steps-{first}-{last}")
    uri = quarantine_uri(table, name)
    if exists(uri, handle.storage_options or None):
        raise QuarantineError(
            f"quarantine {name!r} exists already ({uri}); pick another --name (a quarantine is "
            "never overwritten)"
        )
    rows, stretches, tokens = trace.rows_fed(first, last)
    q = Quarantine(
        name=name,
        table=table,
        table_version=trace.table_version,
        run=run,
        first_step=first,
        last_step=last,
        row_ids=rows,
        stretches=stretches,
        tokens=tokens,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    meta = {k: v for k, v in q.summary().items() if k != "uri"}
    data = pa.table({"row_id": pa.array(rows, pa.int64())}).replace_schema_metadata(
        {_META_KEY: json.dumps(meta).encode()}
    )
    write_side_table(handle, QUARANTINE_DIR.split("/", 1)[1], data, name=name)
    return q


def read_quarantine(
    table: str, name: str, *, storage_options: Mapping[str, str] | None = None
) -> Quarantine:
    """Quarantine ``name`` of the table at ``table``.

    Raises:
        QuarantineError: There is none by that name, or it cannot be read.
    """
    from tokenloom.table import Table
    from tokenloom.table.sidefiles import read_side_table
    from tokenloom.table.storage import exists

    handle = Table.open(table, storage_options=storage_options)
    uri = quarantine_uri(handle.uri, check_name(name))
    if not exists(uri, handle.storage_options or None):
        raise QuarantineError(
            f"no quarantine {name!r} under {table} ({uri}); record one with `tokenloom "
            "quarantine --checkpoint RUN --steps A:B --name NAME`"
        )
    try:
        data = read_side_table(handle, f"{QUARANTINE_DIR}/{name}.lance")
        meta = json.loads((data.schema.metadata or {})[_META_KEY])
        rows = data.column("row_id").to_numpy().astype(np.int64, copy=False)
        return Quarantine(
            name=str(meta["name"]),
            table=str(meta["table"]),
            table_version=int(meta["table_version"]),
            run=str(meta["run"]),
            first_step=int(meta["steps"][0]),
            last_step=int(meta["steps"][1]),
            row_ids=rows,
            stretches=int(meta["stretches"]),
            tokens=int(meta["tokens"]),
            created=str(meta["created"]),
        )
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise QuarantineError(f"quarantine {uri} cannot be read: {exc}") from exc


def _base(run: str) -> str:
    """A name-safe form of the run directory's name."""
    import os

    base = os.path.basename(os.path.normpath(run)) or "run"
    return re.sub(r"[^A-Za-z0-9._-]", "-", base).lstrip("._-") or "run"
