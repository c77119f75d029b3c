"""What backfills leave behind when killed, found and removed: stale job directories, temporary
files, unheld lock files, curation lookup files of dead processes.

Each job (one column, one UDF fingerprint) is guarded by a :class:`~tokenloom.table.locks.FileLock`
at ``<job>/lock`` for the whole run. Anything of a job is removed only while holding that lock,
so a running backfill is never touched; a job whose lock is held is skipped. Every backfill
cleans the others' leftovers when it starts (:func:`clean_stale`); ``tokenloom gc`` reports and
removes the same items (:func:`stale_backfill_items`).

Stale means:

* **job** — a job directory whose results can never be committed: every column it computes is
  in the table, made by another UDF (a different fingerprint), or the directory holds no
  ``job.json`` at all;
* **results** — unit results of a job whose column was committed (they are kept only until the
  commit);
* **temporary** — ``*.tmp`` files of interrupted atomic writes;
* **lock** — a lock file nobody holds (its holder died);
* **lookup** — a curation lookup file (``_results/<name>-v<V>-<pid>.arrow``) whose process is gone.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from typing import Any

from tokenloom.table.gc import GcItem
from tokenloom.table.locks import FileLock, LockTimeoutError, is_held

__all__ = ["LOCK_NAME", "clean_stale", "job_lock", "remove_items", "stale_backfill_items"]

LOCK_NAME = "lock"
"""The lock file inside each job directory."""
UDF_META_KEY = b"tokenloom.udf"


def job_lock(job_dir: str, what: str) -> FileLock:
    """The lock guarding the job directory ``job_dir``."""
    return FileLock(os.path.join(job_dir, LOCK_NAME), what=what)


def _size(path: str) -> int:
    if os.path.isdir(path) and not os.path.islink(path):
        total = 0
        for dirpath, _dirs, files in os.walk(path):
            for name in files:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_size
                except OSError:
                    pass
        return total
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _fingerprints(schema: Any) -> dict[str, str]:
    """Column -> fingerprint of the UDF that made it (columns made by a backfill only)."""
    out = {}
    for field in schema:
        raw = (field.metadata or {}).get(UDF_META_KEY)
        if raw is None:
            continue
        try:
            out[field.name] = json.loads(raw).get("fingerprint", "")
        except ValueError:
            continue
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _job_items(job_dir: str, made_by: dict[str, str]) -> list[GcItem]:
    lock = os.path.join(job_dir, LOCK_NAME)
    name = os.path.basename(job_dir)
    columns_part, _, fingerprint = name.rpartition("-")
    columns = [c for c in columns_part.split("+") if c]
    try:
        with open(os.path.join(job_dir, "job.json"), encoding="utf-8") as fh:
            job = json.load(fh)
    except (OSError, ValueError):
        job = None
    made = [made_by.get(c) for c in columns]
    if job is None:
        return [
            GcItem(kind="job", path=job_dir, bytes=_size(job_dir), reason="no job.json", lock=lock)
        ]
    if columns and all(m is not None and m != fingerprint for m in made):
        return [
            GcItem(
                kind="job",
                path=job_dir,
                bytes=_size(job_dir),
                reason=f"{'+'.join(columns)} was committed by another UDF version",
                lock=lock,
            )
        ]
    out = []
    units_dir = os.path.join(job_dir, "units")
    # Only an explicit "committed": a later incremental run of the same job (after an append)
    # sets "running", and its finished units are what a rerun resumes from.
    committed = job.get("state") == "committed"
    for dirpath, _dirs, files in os.walk(job_dir):
        for fname in sorted(files):
            path = os.path.join(dirpath, fname)
            if fname.endswith(".tmp"):
                reason = "an interrupted write"
                out.append(
                    GcItem(kind="temporary", path=path, bytes=_size(path), reason=reason, lock=lock)
                )
            elif committed and dirpath == units_dir and fname.endswith(".arrow"):
                out.append(
                    GcItem(
                        kind="results",
                        path=path,
                        bytes=_size(path),
                        reason="the column was committed",
                        lock=lock,
                    )
                )
    if os.path.exists(lock):
        out.append(
            GcItem(kind="lock", path=lock, bytes=_size(lock), reason="nobody holds it", lock=lock)
        )
    return out


def _lookup_items(results_dir: str) -> list[GcItem]:
    out = []
    try:
        names = sorted(os.listdir(results_dir))
    except OSError:
        return out
    for fname in names:
        path = os.path.join(results_dir, fname)
        # Lookups are ``name-v<version>-<pid>.arrow``; a near-dedup run's band partitions are a
        # folder ``near-v<version>-<pid>``: both are stale once that process is gone.
        stem, _, ext = fname.rpartition(".")
        if os.path.isdir(path):
            stem, ext = fname, "arrow"
        pid_text = stem.rpartition("-")[2]
        if ext != "arrow" or not pid_text.isdigit() or _pid_alive(int(pid_text)):
            continue
        out.append(
            GcItem(
                kind="lookup", path=path, bytes=_size(path), reason=f"process {pid_text} is gone"
            )
        )
    return out


def stale_backfill_items(root: str, schema: Any, *, skip: Iterable[str] = ()) -> list[GcItem]:
    """Everything stale under the checkpoint root ``root`` of a table with ``schema``.

    Jobs whose lock is held right now (a running backfill) are left out.

    Args:
        root: The table's checkpoint root (:func:`tokenloom.backfill.default_checkpoint_root`).
        schema: The table's latest Arrow schema (its fields tell which UDF made each column).
        skip: Job directories to leave out (the caller's own job).
    """
    if not os.path.isdir(root):
        return []
    made_by = _fingerprints(schema)
    skipped = {os.path.abspath(s) for s in skip}
    out: list[GcItem] = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name == "_results":
            out += _lookup_items(path)
        elif os.path.isdir(path) and os.path.abspath(path) not in skipped:
            if is_held(os.path.join(path, LOCK_NAME)):
                continue  # a backfill is running there
            out += _job_items(path, made_by)
    return out


def remove_path(path: str) -> None:
    """Delete a file or a directory tree (a link is unlinked, never followed); gone is fine."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def remove_items(items: Iterable[GcItem]) -> list[GcItem]:
    """Remove ``items``, each under its job's lock; returns those removed (held ones are not)."""
    removed = []
    held: dict[str, FileLock | None] = {}
    try:
        for item in items:
            if item.lock is not None and item.lock not in held:
                lock = job_lock(os.path.dirname(item.lock), "tokenloom cleanup")
                try:
                    held[item.lock] = lock.acquire(0, on_wait=None)
                except LockTimeoutError:
                    held[item.lock] = None  # a backfill took it meanwhile: leave its job alone
            if item.lock is not None and held[item.lock] is None:
                continue
            if item.kind == "lock":
                removed.append(item)  # released (and so removed) below
                continue
            remove_path(item.path)
            removed.append(item)
    finally:
        for lock in held.values():
            if lock is not None:
                lock.release()
    return removed


def clean_stale(root: str, schema: Any, *, own_dir: str) -> list[GcItem]:
    """Remove other jobs' leftovers and this job's temporary files (its lock must be held).

    Called by :func:`tokenloom.backfill.add_column` when it starts.
    """
    items = stale_backfill_items(root, schema, skip=[own_dir])
    removed = remove_items(items)
    for dirpath, _dirs, files in os.walk(own_dir):
        for fname in files:
            if fname.endswith(".tmp"):  # our workers have not started: these are a dead run's
                path = os.path.join(dirpath, fname)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                removed.append(
                    GcItem(kind="temporary", path=path, bytes=0, reason="an interrupted write")
                )
    return removed
