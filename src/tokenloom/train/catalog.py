"""The runs under a directory, their lineage, and removing one (``tokenloom runs``).

A run is a directory holding a record (``last.json``). :func:`find_runs` looks a few levels down
for them and links each to the run it started from (``--init-from``), so the lineage reads
parent → child. :func:`remove_run` releases the table versions a run pinned and, on request,
deletes its directory. Pure of torch.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tokenloom.errors import TokenloomError
from tokenloom.train.lineage import lineage_pools, own_pools, spent_tokens
from tokenloom.train.phases import run_phases
from tokenloom.train.record import RecordError, RunRecord, read_record, write_record

__all__ = ["RunEntry", "RunsReport", "Removal", "find_runs", "remove_run"]

SEARCH_DEPTH = 4
"""How many directory levels below the searched directory a run may sit."""
_SKIP = ("tensorboard", "__pycache__", "node_modules")


@dataclass(kw_only=True)
class RunEntry:
    """One run found: what it trained on, what it spent and where it came from."""

    path: str
    """The run directory as found (absolute)."""
    record: RunRecord
    parent: str | None
    """The directory of the run it started from (as recorded), if any."""
    children: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        r = self.record
        own = own_pools(r)
        total = lineage_pools(r)
        pinned = [p for p in r.pins if p.get("version") == r.loader.version]
        return {
            "run": self.path,
            "parent": self.parent,
            "parent_step": (r.parent or {}).get("step"),
            "children": list(self.children),
            "model": r.config.get("model"),
            "step": r.step,
            "steps": r.config.get("steps"),
            "table": r.loader.table,
            "table_version": r.loader.version,
            "pinned": bool(pinned),
            "pins": list(r.pins),
            "spec": r.loader.describe(),
            "filter": r.loader.filter,
            "token_column": getattr(r.loader, "token_column", None),  # none: an image+text run
            "train_loss": r.train_loss,
            "val_loss": r.val_loss,
            "total_budget_tokens": r.config.get("total_budget_tokens"),
            "tokens": spent_tokens(own),
            "pools": own,
            "lineage_tokens": spent_tokens(total),
            "lineage_pools": total,
            "compute": r.compute,
            "phases": run_phases(r),
            "data_versions": r.data_versions,
        }


@dataclass(kw_only=True)
class RunsReport:
    """Every run under a directory, and the records that could not be read."""

    root: str
    runs: list[RunEntry]
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    """``(path, why)`` of ``last.json`` files that are no readable run record."""

    def roots(self) -> list[RunEntry]:
        """Runs whose parent is not among the runs found (lineage heads), in path order."""
        known = {e.path for e in self.runs}
        return [e for e in self.runs if e.parent not in known]

    def by_path(self) -> dict[str, RunEntry]:
        return {e.path: e for e in self.runs}

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "runs": [e.to_json() for e in self.runs],
            "unreadable": [{"path": p, "error": why} for p, why in self.unreadable],
        }


def _record_dirs(root: str, depth: int) -> list[str]:
    found = []
    for dirpath, dirs, files in os.walk(root):
        level = os.path.relpath(dirpath, root).count(os.sep) + (dirpath != root)
        if "last.json" in files:
            found.append(dirpath)
            dirs[:] = []  # a run's own folders (metrics, tensorboard) hold no other run
            continue
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and not d.endswith(".lance") and d not in _SKIP
        )
        if level >= depth:
            dirs[:] = []
    return sorted(found)


def find_runs(root: str | os.PathLike[str] = ".", *, depth: int = SEARCH_DEPTH) -> RunsReport:
    """The runs (directories with a ``last.json``) under ``root``, at most ``depth`` levels
    down, each linked to its parent and children.

    Raises:
        TokenloomError: ``root`` is not a directory.
    """
    top = os.path.abspath(os.fspath(root))
    if not os.path.isdir(top):
        raise TokenloomError(f"{root!r} is not a directory; pass the directory holding runs")
    report = RunsReport(root=top, runs=[])
    for path in _record_dirs(top, depth):
        try:
            record = read_record(path)
        except RecordError as exc:
            report.unreadable.append((path, str(exc)))
            continue
        parent = (record.parent or {}).get("out")
        report.runs.append(RunEntry(path=path, record=record, parent=parent))
    # a run moved since its child started is still found under its recorded directory
    alias = {e.record.out: e.path for e in report.runs}
    alias.update({e.path: e.path for e in report.runs})
    by_path = report.by_path()
    for entry in report.runs:
        if entry.parent is not None and entry.parent in alias:
            entry.parent = alias[entry.parent]
            by_path[entry.parent].children.append(entry.path)
    return report


@dataclass(kw_only=True)
class Removal:
    """What ``tokenloom runs rm`` did."""

    run: str
    released: list[dict[str, Any]] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)
    """Tags in the run's record that another run holds (left alone)."""
    missing_tables: list[dict[str, str]] = field(default_factory=list)
    """Tables of the record that are gone (nothing left to release there)."""
    deleted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "released": self.released,
            "kept": self.kept,
            "missing_tables": self.missing_tables,
            "deleted": self.deleted,
        }


def remove_run(
    run: str | os.PathLike[str],
    *,
    delete: bool = False,
    storage_options: Mapping[str, str] | None = None,
) -> Removal:
    """Release the Lance tags the run in ``run`` holds on every table it pinned and, with
    ``delete``, remove the directory.

    Raises:
        RecordError: ``run`` holds no readable record.
    """
    from tokenloom.errors import TableError, TableNotFoundError
    from tokenloom.table.storage import is_remote
    from tokenloom.table.tags import release_run

    path = os.path.abspath(os.fspath(run))
    record = read_record(path)
    out = Removal(run=path)
    tables: dict[str, list[str]] = {}
    for pin in record.pins:
        tables.setdefault(str(pin["table"]), []).append(str(pin["tag"]))
    tables.setdefault(record.loader.table, [])
    for table, tags in tables.items():
        try:
            released, kept = release_run(table, path, tags=tags, storage_options=storage_options)
        except TableNotFoundError as exc:
            if is_remote(table):  # absent, or out of reach without the right credentials
                raise TableError(
                    f"{exc}; pass the table's --storage-options (or the AWS_* environment) to "
                    f"release the versions {path} pinned there"
                ) from exc
            out.missing_tables.append({"table": table, "error": str(exc)})
            continue
        out.released += [p.to_json() for p in released]
        out.kept += [p.to_json() for p in kept]
    gone = {p["tag"] for p in out.released}
    if delete:
        shutil.rmtree(path)
        out.deleted = True
    elif gone:  # the record says what the run still holds (a resume pins its version again)
        pins = [p for p in record.pins if p.get("tag") not in gone]
        write_record(replace(record, out=path, pins=pins))
    return out
