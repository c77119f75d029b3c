"""Checkpoints: one Arrow IPC file per finished work unit, written atomically.

Layout (default: beside a local table, ``<table>.backfill/``; inside an object-store table,
``<table>/_tokenloom/backfill/``)::

    <root>/<column>-<udf fingerprint>/job.json            what the job is and its current plan
    <root>/<column>-<udf fingerprint>/units/<unit>.arrow  ids + output columns of one unit

A result is written to a temporary name and renamed, so a killed worker or driver leaves either a
complete result or none (on an object store a result is one PUT: the object is there whole or
not at all). Before a result is reused it is opened and its row count checked; a
vanished or unreadable file is simply computed again.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from tokenloom.backfill.plan import Unit
from tokenloom.table.storage import (
    delete_tree,
    is_remote,
    join,
    list_names,
    read_bytes,
    write_bytes,
)

__all__ = ["JobStore", "JobStatus", "default_checkpoint_root", "list_jobs"]


def default_checkpoint_root(table_uri: str) -> str:
    """Where a table's backfill checkpoints live: derived from the table's URI, never the
    current directory.

    ``<table>.backfill`` beside a local table; ``<table>/_tokenloom/backfill`` inside an
    object-store table, so that workers on machines without a shared disk (a Ray cluster) read
    and write the same unit results through the store.
    """
    if is_remote(table_uri):
        return join(table_uri, "_tokenloom", "backfill")
    return os.path.abspath(os.path.expanduser(table_uri.rstrip("/"))) + ".backfill"


@dataclass(frozen=True, kw_only=True)
class JobStatus:
    """Progress of one backfill job."""

    column: str
    udf: dict[str, Any]
    state: str
    """``running``, ``failed`` or ``committed``."""
    units_total: int
    units_done: int
    rows_total: int
    rows_done: int
    version: int | None
    """The version committed, once committed."""
    error: str = ""

    @property
    def units_remaining(self) -> int:
        return self.units_total - self.units_done

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["units_remaining"] = self.units_remaining
        return out


class JobStore:
    """The checkpoint directory (or object-store prefix) of one (column, UDF fingerprint) job."""

    def __init__(
        self,
        root: str,
        column: str,
        fingerprint: str,
        *,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        self.remote = is_remote(root)
        self.storage_options = dict(storage_options or {}) or None
        self.dir = join(root, f"{column}-{fingerprint}")
        self.units_dir = join(self.dir, "units")
        if not self.remote:
            os.makedirs(self.units_dir, exist_ok=True)

    def path(self, unit: Unit) -> str:
        return join(self.units_dir, unit.name + ".arrow")

    # -- results ------------------------------------------------------------------------------

    def has(self, unit: Unit) -> bool:
        """Whether a complete, readable result for ``unit`` exists."""
        try:
            if self.remote:
                from tokenloom.table.storage import filesystem

                fs, path = filesystem(self.path(unit), self.storage_options)
                with fs.open_input_file(path) as source:
                    return _complete(ipc.open_file(source))
            with pa.memory_map(self.path(unit)) as source:
                return _complete(ipc.open_file(source))
        except (OSError, pa.ArrowInvalid, ValueError):
            return False

    def write(self, unit: Unit, table: pa.Table) -> str:
        """Write one unit's result atomically and return its path."""
        final = self.path(unit)
        schema = table.schema.with_metadata({"tokenloom.rows": str(table.num_rows)})
        if self.remote:
            sink = pa.BufferOutputStream()
            with ipc.new_file(sink, schema) as writer:
                writer.write_table(table.replace_schema_metadata(schema.metadata))
            write_bytes(final, sink.getvalue().to_pybytes(), self.storage_options)
            return final
        tmp = f"{final}.{uuid.uuid4().hex}.tmp"
        with pa.OSFile(tmp, "wb") as sink, ipc.new_file(sink, schema) as writer:
            writer.write_table(table.replace_schema_metadata(schema.metadata))
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        return final

    def read(self, unit: Unit) -> pa.Table:
        if self.remote:
            data = read_bytes(self.path(unit), self.storage_options)
            return ipc.open_file(pa.BufferReader(data)).read_all()
        with pa.memory_map(self.path(unit)) as source:
            return ipc.open_file(source).read_all()

    def discard(self, unit: Unit) -> None:
        if self.remote:
            from tokenloom.table.storage import delete

            delete(self.path(unit), self.storage_options)
            return
        try:
            os.unlink(self.path(unit))
        except FileNotFoundError:
            pass

    # -- the job record -----------------------------------------------------------------------

    def save_job(self, **fields: Any) -> None:
        """Merge ``fields`` into ``job.json`` (atomically)."""
        record = self.load_job()
        record.update(fields)
        text = json.dumps(record, indent=2, sort_keys=True).encode()
        write_bytes(join(self.dir, "job.json"), text, self.storage_options)

    def load_job(self) -> dict[str, Any]:
        try:
            return json.loads(read_bytes(join(self.dir, "job.json"), self.storage_options))
        except (OSError, ValueError):
            return {}

    def save_plan(self, units: Sequence[Unit]) -> None:
        self.save_job(plan=[[u.name, u.rows] for u in units])

    def status(self) -> JobStatus:
        job = self.load_job()
        plan = job.get("plan", [])
        present = set(list_names(self.units_dir, self.storage_options))
        done = [(name, rows) for name, rows in plan if name + ".arrow" in present]
        committed = job.get("state") == "committed"
        return JobStatus(
            column=job.get("column", ""),
            udf=job.get("udf", {}),
            state=job.get("state", "running"),
            units_total=len(plan),
            units_done=len(plan) if committed else len(done),
            rows_total=sum(r for _, r in plan),
            rows_done=sum(r for _, r in plan) if committed else sum(r for _, r in done),
            version=job.get("version"),
            error=job.get("error", ""),
        )

    def clear_results(self) -> None:
        """Delete the unit results (after a commit they are no longer needed)."""
        if self.remote:
            delete_tree(self.units_dir, self.storage_options)
            return
        shutil.rmtree(self.units_dir, ignore_errors=True)
        os.makedirs(self.units_dir, exist_ok=True)


def _complete(reader: ipc.RecordBatchFileReader) -> bool:
    meta = reader.schema.metadata or {}
    return int(meta.get(b"tokenloom.rows", b"-1")) == sum(
        reader.get_batch(i).num_rows for i in range(reader.num_record_batches)
    )


def list_jobs(root: str, *, storage_options: Mapping[str, str] | None = None) -> list[JobStatus]:
    """Every job under a checkpoint root, newest first."""
    if not is_remote(root) and not os.path.isdir(root):
        return []
    out = []
    for name in list_names(root, storage_options):
        if not _has_job(root, name, storage_options):
            continue
        column, _, fp = name.rpartition("-")
        out.append(JobStore(root, column, fp, storage_options=storage_options).status())
    return out


def _has_job(root: str, name: str, storage_options: Mapping[str, str] | None) -> bool:
    from tokenloom.table.storage import exists

    return exists(join(root, name, "job.json"), storage_options)
