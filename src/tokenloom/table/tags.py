"""Table versions pinned by training runs, as Lance tags.

A run tags the table version it trains on, so that neither ``tokenloom gc`` nor Lance's
``cleanup_old_versions`` removes it (Lance keeps every tagged version and its files; gc keeps
every version). The tag's name comes from the run directory and the version,
``tokenloom-run-<name>-<hash>-v<version>`` (``<name>``: the directory's base name reduced to
the characters Lance allows, ``<hash>``: 8 hex digits of the absolute path), so a resumed run
finds its own tag again; the tag's metadata names the run directory that holds it
(:data:`RUN_KEY`). A tag of that name held by another directory is refused, never taken over.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tokenloom.errors import TableError
from tokenloom.table.core import Table, normalize_uri

__all__ = [
    "RUN_KEY",
    "Pin",
    "TagHeldError",
    "pin_version",
    "release_run",
    "run_tag",
    "table_pins",
]

RUN_KEY = "tokenloom.run"
"""Tag metadata key: the run directory (absolute) that holds the tag."""
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
_MAX_NAME = 40


class TagHeldError(TableError):
    """The tag a run would take is held by another run (or was made by hand)."""


@dataclass(frozen=True, kw_only=True)
class Pin:
    """One tag on a table: the version it keeps and the run that holds it."""

    table: str
    tag: str
    version: int
    run: str | None
    """The run directory holding it; ``None``: a tag tokenloom did not make."""

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "tag": self.tag, "version": self.version, "run": self.run}


def run_tag(run: str | os.PathLike[str], version: int) -> str:
    """The tag name of run directory ``run`` on table version ``version`` (stable, and valid
    under Lance's rules: ASCII letters, digits, ``-`` and ``_``; no dots)."""
    path = os.path.abspath(os.fspath(run)) if "://" not in os.fspath(run) else os.fspath(run)
    base = os.path.basename(path.rstrip("/")) or "run"
    name = _NAME_CHARS.sub("-", base).strip("-_")[:_MAX_NAME] or "run"
    digest = hashlib.sha256(path.encode("utf-8")).hexdigest()[:8]
    return f"tokenloom-run-{name}-{digest}-v{int(version)}"


def _holder(meta: Mapping[str, Any]) -> str | None:
    return (meta.get("metadata") or {}).get(RUN_KEY)


def table_pins(table: Table) -> list[Pin]:
    """Every tag of ``table`` with the version it keeps and its run, by version then name."""
    pins = [
        Pin(table=table.uri, tag=name, version=int(meta["version"]), run=_holder(meta))
        for name, meta in table.dataset.tags.list().items()
    ]
    return sorted(pins, key=lambda p: (p.version, p.tag))


def _open(uri: str, storage_options: Mapping[str, str] | None) -> Table:
    return Table.open(normalize_uri(uri), storage_options=storage_options)


def pin_version(
    uri: str,
    version: int,
    run: str,
    *,
    fresh: bool = False,
    storage_options: Mapping[str, str] | None = None,
) -> Pin:
    """Tag ``version`` of ``uri`` for run directory ``run`` (idempotent: a tag it holds already
    is kept as it is).

    Args:
        uri: The table.
        version: The version the run trains on.
        run: The run directory (absolute), written in the tag's metadata.
        fresh: A new run in ``run`` (replacing one there): the tags an earlier run in the same
            directory held on this table are released first.
        storage_options: Object-store options.

    Raises:
        TagHeldError: A tag of that name exists and another run holds it, or it keeps
            another version.
    """
    table = _open(uri, storage_options)
    tags = table.dataset.tags
    name = run_tag(run, version)
    if fresh:
        for pin in table_pins(table):
            if pin.run == run and pin.tag != name:
                tags.delete(pin.tag)
    existing = tags.list().get(name)
    if existing is None:
        try:
            tags.create(name, int(version))
        except ValueError:  # made at the same moment by another process: judged below
            existing = tags.list().get(name)
            if existing is None:
                raise
    if existing is not None:
        holder = _holder(existing)
        if int(existing["version"]) != int(version) or holder not in (None, run):
            who = f"run {holder}" if holder else "no tokenloom run (a tag made by hand)"
            fix = (
                f"release it with `tokenloom runs rm {holder}`"
                if holder
                else "delete that tag (Lance's `dataset.tags.delete`)"
            )
            raise TagHeldError(
                f"table {table.uri}: tag {name!r} keeps version {existing['version']} for "
                f"{who}; this run ({run}) needs it on version {version}. {fix[0].upper()}"
                f"{fix[1:]}, or train into another --out"
            )
        if holder == run:
            return Pin(table=table.uri, tag=name, version=int(version), run=run)
    # a tag whose metadata is not written yet (a run killed in between) is this run's: the
    # name holds a hash of this run's path
    tags.replace_metadata(name, {RUN_KEY: run})
    return Pin(table=table.uri, tag=name, version=int(version), run=run)


def _run_gone(holder: str) -> bool:
    """The directory named by a tag's holder holds no run any more (moved or deleted)."""
    return "://" not in holder and not os.path.isfile(os.path.join(holder, "last.json"))


def release_run(
    uri: str,
    run: str,
    *,
    tags: Iterable[str] = (),
    storage_options: Mapping[str, str] | None = None,
) -> tuple[list[Pin], list[Pin]]:
    """Delete the tags of ``uri`` that run directory ``run`` holds: those whose metadata names
    it, and those of ``tags`` (its record's) held by a directory with no run any more (a run
    moved since). Returns ``(released, kept)``: ``kept`` are tags of ``tags`` another run holds.
    """
    table = _open(uri, storage_options)
    named = set(tags)
    released, kept = [], []
    for pin in table_pins(table):
        mine = pin.run == run or (pin.tag in named and (pin.run is None or _run_gone(pin.run)))
        if mine:
            table.dataset.tags.delete(pin.tag)
            released.append(pin)
        elif pin.tag in named:
            kept.append(pin)
    return released, kept
