"""``tokenloom gc``: find, and on request delete, what killed or failed runs left behind.

* **orphan** — a file under the table's ``data/`` or ``_deletions/`` that no version of the
  table references (a writer killed between writing its files and committing them). Every
  version in ``_versions/`` is kept, so a file any of them reads is never touched; removing old
  versions is Lance's ``cleanup_old_versions``, not this, and it keeps every tagged version
  (the versions training runs pinned, :mod:`tokenloom.table.tags`) with all its files. gc
  never touches ``_refs/`` (the tags) nor ``_versions/``;
* **backfill** leftovers — stale job directories, unit results, temporary and lock files
  (:mod:`tokenloom.backfill.hygiene`);
* **checkpoint** temporaries — ``*.tmp-<pid>`` files of interrupted checkpoint writes in a runs
  directory (``--runs``), whose process is gone.

Safety against writers running at the same time: gc holds the table's ingest lock and every
backfill job's lock while it lists and deletes orphans (waiting at most ``lock_timeout`` seconds,
naming the holder), and a file modified after gc started is never an orphan (a writer that
started since has not committed yet).

On an object store (``s3://...``) orphans are listed and deleted through the store's API. It
keeps no writer journals and no file locks, so only the backfill jobs run from this machine
are waited for (their locks live in its cache) and only the age rule protects the files of
other running writers: pass ``min_age`` longer than any ingest or backfill takes to commit.
Backfill leftovers under an object-store checkpoint root are not collected yet.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from tokenloom.errors import TableError
from tokenloom.table.core import Table, normalize_uri
from tokenloom.table.journal import live_files, referenced_files
from tokenloom.table.locks import FileLock
from tokenloom.table.storage import is_remote, join
from tokenloom.table.tags import table_pins

__all__ = ["GcItem", "GcReport", "collect_garbage", "orphan_files", "referenced_files"]

_CHECKPOINT_TMP = re.compile(r"\.tmp-(\d+)$")
_SCANNED = ("data", "_deletions")


@dataclass(frozen=True, kw_only=True)
class GcItem:
    """One thing left behind that gc can remove."""

    kind: str
    """``orphan``, ``checkpoint``, or a backfill kind (``job``, ``results``, ``temporary``,
    ``lock``, ``lookup``)."""
    path: str
    bytes: int
    reason: str
    lock: str | None = None
    """A lock to hold while removing it (``None``: nothing guards it)."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "bytes": self.bytes, "reason": self.reason}


@dataclass(kw_only=True)
class GcReport:
    """What gc found and, unless it was a dry run, removed."""

    table: str
    dry_run: bool
    items: list[GcItem] = field(default_factory=list)
    versions_kept: int = 0
    pins: list[dict[str, Any]] = field(default_factory=list)
    """The table's tags (versions pinned by runs), all kept with every file they read."""

    @property
    def bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "dry_run": self.dry_run,
            "versions_kept": self.versions_kept,
            "pins": self.pins,
            "bytes": self.bytes,
            "items": [i.to_json() for i in self.items],
        }


def _remote_files(uri: str, sub: str, storage_options: Mapping[str, str] | None):  # noqa: ANN202
    """``(uri, path relative to the table, bytes, mtime)`` of every object under ``uri/sub``."""
    from pyarrow import fs as pafs

    from tokenloom.table.storage import filesystem

    fs, top = filesystem(join(uri, sub), storage_options)
    infos = fs.get_file_info(pafs.FileSelector(top, recursive=True, allow_not_found=True))
    for info in sorted(infos, key=lambda i: i.path):
        if info.type != pafs.FileType.File:
            continue
        rel = f"{sub}/{info.path[len(top) :].lstrip('/')}"
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        yield join(uri, rel), os.path.normpath(rel), int(info.size or 0), mtime


def orphan_files(
    uri: str,
    table: Table,
    *,
    before: float,
    storage_options: Mapping[str, str] | None = None,
) -> tuple[list[GcItem], int]:
    """Files under ``data/`` and ``_deletions/`` that no version references and no running
    writer has listed in its journal, older than ``before`` (a Unix time); and the number of
    versions kept. An object-store table is listed with ``storage_options``."""
    referenced = referenced_files(table) | live_files(uri)
    versions = len(table.dataset.versions())
    out = []
    if is_remote(uri):
        for sub in _SCANNED:
            for path, rel, size, mtime in _remote_files(uri, sub, storage_options):
                if rel in referenced or mtime >= before:
                    continue
                why = f"referenced by none of the {versions} versions"
                out.append(GcItem(kind="orphan", path=path, bytes=size, reason=why))
        return out, versions
    for sub in _SCANNED:
        top = os.path.join(uri, sub)
        for dirpath, _dirs, files in os.walk(top):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                rel = os.path.normpath(os.path.relpath(path, uri))
                if rel in referenced:
                    continue
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                if st.st_mtime >= before:
                    continue  # a writer that started after gc may commit it yet
                why = f"referenced by none of the {versions} versions"
                out.append(GcItem(kind="orphan", path=path, bytes=st.st_size, reason=why))
    return out, versions


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def stale_checkpoint_files(runs: str, *, before: float) -> list[GcItem]:
    """``*.tmp-<pid>`` files under ``runs`` whose writing process is gone."""
    if not os.path.isdir(runs):
        raise TableError(f"--runs {runs!r} is not a directory")
    out = []
    for dirpath, _dirs, files in os.walk(runs):
        for name in sorted(files):
            found = _CHECKPOINT_TMP.search(name)
            if not found or not _pid_gone(int(found.group(1))):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if st.st_mtime < before:
                why = f"an interrupted write of process {found.group(1)}"
                out.append(GcItem(kind="checkpoint", path=path, bytes=st.st_size, reason=why))
    return out


@contextmanager
def _writers_locked(
    uri: str, root: str, timeout: float | None, storage_options: Mapping[str, str] | None
) -> Iterator[None]:
    """Hold every backfill job lock of the table (running ingests are protected by their
    journals instead: see :func:`~tokenloom.table.journal.live_files`). The jobs of an
    object-store table are locked in this machine's cache, where a running job holds them."""
    from tokenloom.backfill.hygiene import LOCK_NAME

    with ExitStack() as stack:
        if is_remote(root):
            from tokenloom.backfill.engine import _local_lock_dir
            from tokenloom.table.storage import list_names

            for name in list_names(root, storage_options):
                path = os.path.join(_local_lock_dir(join(root, name)), LOCK_NAME)
                if name != "_results" and os.path.exists(path):  # no file: no job ran here
                    lock = FileLock(path, what=f"backfill job {name}", keep_file=True)
                    stack.callback(lock.acquire(timeout).release)
        elif os.path.isdir(root):
            for name in sorted(os.listdir(root)):
                job = os.path.join(root, name)
                if os.path.isdir(job) and name != "_results":
                    path = os.path.join(job, LOCK_NAME)  # a dead run's lock file is reported,
                    lock = FileLock(
                        path, what=f"backfill job {name}", keep_file=os.path.exists(path)
                    )
                    stack.callback(lock.acquire(timeout).release)  # not removed, on a dry run
        yield


def _remove(items: Iterable[GcItem], storage_options: Mapping[str, str] | None = None) -> None:
    from tokenloom.backfill.hygiene import remove_path
    from tokenloom.table.storage import delete

    for item in items:
        if is_remote(item.path):
            delete(item.path, storage_options)
        else:
            remove_path(item.path)


def collect_garbage(
    table: str | os.PathLike[str],
    *,
    runs: str | None = None,
    delete: bool = False,
    lock_timeout: float | None = 0,
    min_age: float = 0.0,
    checkpoint_dir: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> GcReport:
    """Find (and with ``delete=True`` remove) what runs on ``table`` left behind.

    Args:
        table: The table: a local directory or an object-store URI (see the module docstring
            for what protects running writers there).
        runs: A training runs directory to clear of stale ``*.tmp-<pid>`` checkpoint files.
        delete: Remove what was found; otherwise only report it (a dry run).
        lock_timeout: Seconds to wait for a running ingest or backfill of this table
            (``None``: as long as it takes); the error names the holder.
        min_age: Only files at least this many seconds old (for writers tokenloom does not
            know about, which take no lock).
        checkpoint_dir: The backfill checkpoint root (default: the table's).
        storage_options: Object-store options (with the ``AWS_*`` environment).

    Raises:
        LockTimeoutError: when a writer kept its lock past ``lock_timeout``.
    """
    from tokenloom.backfill.checkpoint import default_checkpoint_root
    from tokenloom.backfill.hygiene import remove_items, stale_backfill_items

    started = time.time()
    uri = normalize_uri(table)
    handle = Table.open(uri, storage_options=storage_options)
    so = handle.storage_options or None
    root = checkpoint_dir or default_checkpoint_root(uri)
    before = started - max(0.0, min_age)
    report = GcReport(table=uri, dry_run=not delete)
    report.pins = [p.to_json() for p in table_pins(handle)]
    with _writers_locked(uri, root, lock_timeout, so):
        orphans, report.versions_kept = orphan_files(
            uri, handle.checkout(), before=before, storage_options=so
        )
        if delete:
            _remove(orphans, so)
    report.items += orphans
    if not is_remote(root):  # TODO(s3-hygiene): stale job prefixes on object stores
        backfill = stale_backfill_items(root, handle.checkout().schema())
        if delete:
            backfill = remove_items(backfill)
        report.items += backfill
    if runs is not None:
        stale = stale_checkpoint_files(runs, before=before)
        if delete:
            _remove(stale)
        report.items += stale
    return report
