"""Cleaning up after killed writers: one journal per running ingest, and the cleaner.

A writer of a local table creates ``_tokenloom/runs/<id>.journal``, holds an exclusive lock on
it for its whole life (the kernel drops the lock when the process dies, however it dies) and
writes into it the name of every file it is about to create, *before* creating it. The next run
tries the lock of every journal it finds: getting it means the writer is gone, so each file it
listed that **no version** of the table references is deleted, then the journal. Files of live
runs, files of other writers (a backfill's checkpointed units are not in any journal) and files of
any version are never touched.

Object-store tables have no file locks: there the journal is not kept and nothing is cleaned.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from typing import IO

from tokenloom.table.core import Table, is_local
from tokenloom.table.meta import table_metadata

__all__ = [
    "RunJournal",
    "clean_orphans",
    "live_files",
    "referenced_files",
    "RUNS_DIR",
    "SIDE_DIR",
]

SIDE_DIR = "_tokenloom"
"""tokenloom's own files inside a table directory (Lance leaves them alone)."""
RUNS_DIR = f"{SIDE_DIR}/runs"


class RunJournal:
    """The journal of one running writer (a no-op for object-store tables)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._fh: IO[str] | None = None
        self.path = ""
        self.staging: str | None = None
        """A private folder where files are written before they are moved into place (a
        writer's temporary files then never land among the table's; local tables only)."""
        if not is_local(uri):
            return  # TODO(ingest-orphans): a lease object with a heartbeat for object stores
        import fcntl

        runs = os.path.join(uri, RUNS_DIR)
        os.makedirs(runs, exist_ok=True)
        run_id = uuid.uuid4().hex
        tmp = os.path.join(runs, f".{run_id}.tmp")
        fh = open(tmp, "a", encoding="utf-8")  # noqa: SIM115 - held for the run's life
        fcntl.flock(fh, fcntl.LOCK_EX)
        # Locked before it gets the name cleaners look at, so none can take it for a dead run's.
        self.path = os.path.join(runs, f"{run_id}.journal")
        os.rename(tmp, self.path)
        self._fh = fh
        self.staging = os.path.join(runs, f"{run_id}.staging")
        os.makedirs(self.staging)

    def add(self, relpath: str) -> None:
        """Record a file (path relative to the table) before it is created."""
        if self._fh is not None:
            self._fh.write(json.dumps(relpath) + "\n")
            self._fh.flush()

    def close(self) -> None:
        """Forget the journal: everything it listed is committed or already deleted."""
        if self._fh is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
        self._fh.close()  # releases the lock
        self._fh = None


def referenced_files(table: Table) -> set[str]:
    """Paths (relative to the table, normalised) of every data and deletion file any version
    references, and of every side file any version's table metadata lists (under
    ``tokenloom.*_files`` keys). The one answer to "may this file go?" (cleaners and ``gc``)."""
    refs: set[str] = set()
    ds = table.dataset
    for info in ds.versions():
        version = ds.checkout_version(int(info["version"]))
        for frag in version.get_fragments():
            meta = frag.metadata
            refs.update(os.path.normpath(f"data/{f.path}") for f in meta.files)
            if meta.deletion_file is not None:
                refs.add(os.path.normpath(meta.deletion_file.path(frag.fragment_id)))
        for key, value in table_metadata(version.schema).items():
            if key.startswith("tokenloom.") and key.endswith("_files"):
                with contextlib.suppress(ValueError):
                    refs.update(json.loads(value))
    return refs


def live_files(uri: str) -> set[str]:
    """Paths (relative, normalised) that running writers have listed in their journals: files
    they may still commit, which no cleaner may delete however old they are."""
    if not is_local(uri):
        return set()
    import fcntl

    runs = os.path.join(uri, RUNS_DIR)
    try:
        names = sorted(n for n in os.listdir(runs) if n.endswith(".journal"))
    except FileNotFoundError:
        return set()
    out: set[str] = set()
    for name in names:
        try:
            fh = open(os.path.join(runs, name), encoding="utf-8")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            continue
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
                continue  # nobody holds it: a dead writer's journal (clean_orphans' business)
            except OSError:
                pass  # a live writer
            for line in fh:
                with contextlib.suppress(ValueError):
                    rel = json.loads(line)
                    if isinstance(rel, str):
                        out.add(os.path.normpath(rel))
    return out


def clean_orphans(uri: str) -> list[str]:
    """Delete the unreferenced files of writers that died; return their paths (relative).

    Safe to run while other writers work: a live writer holds its journal's lock.
    """
    if not is_local(uri):
        return []
    import fcntl

    runs = os.path.join(uri, RUNS_DIR)
    try:
        names = sorted(n for n in os.listdir(runs) if n.endswith(".journal"))
    except FileNotFoundError:
        return []
    deleted: list[str] = []
    refs: set[str] | None = None
    for name in names:
        path = os.path.join(runs, name)
        try:
            fh = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            continue  # another cleaner, or its writer finishing
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its writer is alive
            if not os.path.exists(path):
                continue  # finished or cleaned while we waited for the lock
            listed = []
            for line in fh:
                with contextlib.suppress(ValueError):
                    listed.append(json.loads(line))
            if refs is None:
                refs = referenced_files(Table.open(uri))  # after the lock: sees its last commit
            for rel in listed:
                if not isinstance(rel, str) or rel in refs or ".." in rel.split("/"):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(uri, rel))
                    deleted.append(rel)
            staging = path.removesuffix(".journal") + ".staging"
            if os.path.isdir(staging):
                deleted += [f"{RUNS_DIR}/{name}.staging/{n}" for n in os.listdir(staging)]
                shutil.rmtree(staging, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return deleted
