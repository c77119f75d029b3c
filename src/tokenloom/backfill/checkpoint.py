"""Checkpoints: one Arrow IPC file per finished work unit, written atomically.

Layout (default: beside a local table, ``<table>.backfill/``)::

    <root>/<column>-<udf fingerprint>/job.json            what the job is and its current plan
    <root>/<column>-<udf fingerprint>/units/<unit>.arrow  ids + output columns of one unit

A result is written to a temporary name and renamed, so a killed worker or driver leaves either a
complete result or none. Before a result is reused it is opened and its row count checked; a
vanished or unreadable file is simply computed again.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from tokenloom.backfill.plan import Unit

__all__ = ["JobStore", "JobStatus", "default_checkpoint_root", "list_jobs"]


def default_checkpoint_root(table_uri: str) -> str:
    """Where a table's backfill checkpoints live: derived from the table's URI, never the
    current directory.

    ``<table>.backfill`` beside a local table. Checkpoints need a local file system (atomic
    renames, memory maps), so for an object-store table they go to the user's cache,
    ``$XDG_CACHE_HOME/tokenloom/backfill/<scheme>_<bucket>_<path>-<hash of the URI>``.
    """
    if "://" in table_uri:
        import hashlib
        import re

        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", table_uri.rstrip("/")).strip("_")[-80:]
        digest = hashlib.sha256(table_uri.rstrip("/").encode()).hexdigest()[:12]
        return os.path.join(os.path.expanduser(cache), "tokenloom", "backfill", f"{slug}-{digest}")
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
    """The checkpoint directory of one (column, UDF fingerprint) job."""

    def __init__(self, root: str, column: str, fingerprint: str) -> None:
        self.dir = os.path.join(root, f"{column}-{fingerprint}")
        self.units_dir = os.path.join(self.dir, "units")
        os.makedirs(self.units_dir, exist_ok=True)

    def path(self, unit: Unit) -> str:
        return os.path.join(self.units_dir, unit.name + ".arrow")

    # -- results ------------------------------------------------------------------------------

    def has(self, unit: Unit) -> bool:
        """Whether a complete, readable result for ``unit`` exists."""
        try:
            with pa.memory_map(self.path(unit)) as source:
                reader = ipc.open_file(source)
                meta = reader.schema.metadata or {}
                return int(meta.get(b"tokenloom.rows", b"-1")) == sum(
                    reader.get_batch(i).num_rows for i in range(reader.num_record_batches)
                )
        except (OSError, pa.ArrowInvalid, ValueError):
            return False

    def write(self, unit: Unit, table: pa.Table) -> str:
        """Write one unit's result atomically and return its path."""
        final = self.path(unit)
        tmp = f"{final}.{uuid.uuid4().hex}.tmp"
        schema = table.schema.with_metadata({"tokenloom.rows": str(table.num_rows)})
        with pa.OSFile(tmp, "wb") as sink, ipc.new_file(sink, schema) as writer:
            writer.write_table(table.replace_schema_metadata(schema.metadata))
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        return final

    def read(self, unit: Unit) -> pa.Table:
        with pa.memory_map(self.path(unit)) as source:
            return ipc.open_file(source).read_all()

    def discard(self, unit: Unit) -> None:
        try:
            os.unlink(self.path(unit))
        except FileNotFoundError:
            pass

    # -- the job record -----------------------------------------------------------------------

    def save_job(self, **fields: Any) -> None:
        """Merge ``fields`` into ``job.json`` (atomically)."""
        record = self.load_job()
        record.update(fields)
        tmp = os.path.join(self.dir, f"job.json.{uuid.uuid4().hex}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=2, sort_keys=True)
        os.replace(tmp, os.path.join(self.dir, "job.json"))

    def load_job(self) -> dict[str, Any]:
        try:
            with open(os.path.join(self.dir, "job.json"), encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return {}

    def save_plan(self, units: Sequence[Unit]) -> None:
        self.save_job(plan=[[u.name, u.rows] for u in units])

    def status(self) -> JobStatus:
        job = self.load_job()
        plan = job.get("plan", [])
        done = [
            (name, rows)
            for name, rows in plan
            if os.path.exists(os.path.join(self.units_dir, name + ".arrow"))
        ]
        return JobStatus(
            column=job.get("column", ""),
            udf=job.get("udf", {}),
            state=job.get("state", "running"),
            units_total=len(plan),
            units_done=len(plan) if job.get("state") == "committed" else len(done),
            rows_total=sum(r for _, r in plan),
            rows_done=sum(r for _, r in plan)
            if job.get("state") == "committed"
            else sum(r for _, r in done),
            version=job.get("version"),
            error=job.get("error", ""),
        )

    def clear_results(self) -> None:
        """Delete the unit results (after a commit they are no longer needed)."""
        shutil.rmtree(self.units_dir, ignore_errors=True)
        os.makedirs(self.units_dir, exist_ok=True)


def list_jobs(root: str) -> list[JobStatus]:
    """Every job under a checkpoint root, newest first."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in sorted(os.listdir(root)):
        if not os.path.exists(os.path.join(root, name, "job.json")):
            continue
        column, _, fp = name.rpartition("-")
        out.append(JobStore(root, column, fp).status())
    return out
