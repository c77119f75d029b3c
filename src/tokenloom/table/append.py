"""Append rows whose ids are assigned at commit time, safely under concurrent writers.

Rows are staged as uncommitted data files holding every base column but ``id``. At commit the
latest version is read, its id high-water mark (:data:`NEXT_ID_KEY`, in the table metadata)
gives the first id, and one small ``id`` file per staged fragment is written. The commit is a
Lance ``Merge`` of that version's fragments plus the new ones, with the table metadata's mark
advanced: Lance refuses a ``Merge`` when anything else committed since the version it was planned
on (another ingest, a backfill, a delete, a compaction), so two writers can never both claim one
id range. The loser re-reads the new version, rewrites only its ``id`` files (8 bytes a row) when
the base moved, and commits again. The identity of the table is thus its own metadata, whatever
name (path, ``file://``, symlink, object-store URI) each writer used.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import lance
import pyarrow as pa

from tokenloom.errors import TableError
from tokenloom.table.core import NEXT_ID_KEY, Table, is_local
from tokenloom.table.meta import with_table_metadata
from tokenloom.table.schema import BASE_SCHEMA

__all__ = ["StagedRows", "CONTENT_SCHEMA", "with_new_fields", "is_conflict"]

#: The base columns written while rows stream in (``id`` comes at commit).
CONTENT_SCHEMA = pa.schema([f for f in BASE_SCHEMA if f.name != "id"])


def is_conflict(exc: BaseException) -> bool:
    """Whether a Lance commit failed because another writer committed first (retryable)."""
    if type(exc).__name__ == "CommitConflictError":
        return True
    text = str(exc).lower()
    return "conflict" in text or "retryable" in text or "preempted" in text


def with_new_fields(table: Table, fields: pa.Schema) -> Any:
    """The Lance schema of ``table`` plus ``fields`` (those it lacks), existing ids unchanged.

    Lance numbers the fields of an Arrow schema depth-first from 0; when the table's own ids are
    exactly that numbering (no column was ever dropped), the extended schema keeps every existing
    field's id and description byte for byte and the new fields take the next ids. This is
    checked, not assumed.

    Raises:
        TableError: the table's field ids are not the plain numbering (a column was dropped).
    """
    from lance.schema import LanceSchema

    current = table.dataset.lance_schema
    arrow = table.dataset.schema
    for f in fields:
        if f.name in arrow.names and arrow.field(f.name).type != f.type:
            raise TableError(
                f"column {f.name!r} of {table.uri} became {arrow.field(f.name).type} (another "
                f"writer) while this ingest staged it as {f.type}; ingest again"
            )
    missing = [f for f in fields if f.name not in arrow.names]
    if not missing:
        return current
    extended = LanceSchema.from_pyarrow(pa.schema(list(arrow) + missing, metadata=arrow.metadata))
    old_protos = current.__reduce__()[1][1:]
    new_protos = extended.__reduce__()[1][1:]
    if tuple(new_protos[: len(old_protos)]) != tuple(old_protos):
        raise TableError(
            f"cannot add the typed column(s) {', '.join(f.name for f in missing)} to {table.uri} "
            "in the ingest commit: its field ids are not Lance's plain numbering (a column was "
            "dropped); declare them first with `ds.add_columns(pa.schema([...]))` and ingest again"
        )
    return extended


@dataclass
class _Staged:
    content: Any  # lance.fragment.DataFile
    rows: int
    id_file: Any = None
    extra_name: str = ""  # the typed columns' file (ids resolved at commit)


class StagedRows:
    """Rows staged as uncommitted data files of one table; ids are given at :meth:`commit`.

    Args:
        table: The table the rows go to (it must exist: its storage version and field ids are
            read from it).
        rows_per_fragment: Rows per staged fragment (the unit of later parallel backfills).
        on_new_file: Called with each data file's name (relative to ``data/``) *before* it is
            created, so a journal can clean up after a killed run.
        staging: A local folder to write files in before moving each, complete, into ``data/``
            (so a killed writer's temporary files stay out of the table); local tables only.
        extra: Typed columns staged after the content columns (nullable; blob-encoded fields
            carry Lance's blob metadata). They are written to a second file per fragment and
            added to the table's schema by the commit when it lacks them.
    """

    def __init__(
        self,
        table: Table,
        *,
        extra: pa.Schema | None = None,
        rows_per_fragment: int = 131072,
        on_new_file: Callable[[str], None] | None = None,
        staging: str | None = None,
    ) -> None:
        self.table = table
        self._staging = staging if is_local(table.uri) else None
        self.uri = table.uri
        self._storage_options = table.storage_options or None
        ds = table.dataset
        self._version = ds.data_storage_version
        major, minor = (int(x) for x in self._version.split(".")[:2])
        self._file_version = (major, minor)
        ids = {f.name(): f.id() for f in ds.lance_schema.fields()}
        self._content_fields = [ids[f.name] for f in CONTENT_SCHEMA]
        self._id_field = ids["id"]
        self._extra = extra if extra is not None and len(extra) else None
        # Lance's 2.2 files encode a blob column as a descriptor struct this writer does not
        # build; the 2.1 file format stores the bytes out of line itself (readable in any table).
        blob = self._extra is not None and any(
            (f.metadata or {}).get(b"lance-encoding:blob") == b"true" for f in self._extra
        )
        self._extra_version = "2.1" if blob else self._version
        self._extra_writer: Any = None
        self._extra_name = ""
        self._rows_per_fragment = rows_per_fragment
        self._on_new_file = on_new_file or (lambda name: None)
        self._staged: list[_Staged] = []
        self._writer: Any = None
        self._writer_name = ""
        self._writer_rows = 0
        self._id_base: int | None = None
        self._created: list[str] = []
        self.rows = 0

    # -- staging ------------------------------------------------------------------------------

    def write(self, batch: pa.RecordBatch) -> None:
        """Stage a batch of :data:`CONTENT_SCHEMA` rows."""
        start = 0
        while start < batch.num_rows:
            if self._writer is None:
                self._open_writer()
            take = min(batch.num_rows - start, self._rows_per_fragment - self._writer_rows)
            part = batch.slice(start, take)
            if self._extra is not None:
                n = len(CONTENT_SCHEMA)
                self._extra_writer.write_batch(
                    pa.record_batch(part.columns[n:], schema=self._extra)
                )
                part = pa.record_batch(part.columns[:n], schema=CONTENT_SCHEMA)
            self._writer.write_batch(part)
            self._writer_rows += take
            self.rows += take
            start += take
            if self._writer_rows >= self._rows_per_fragment:
                self._close_writer()

    def _new_name(self) -> str:
        name = f"{uuid.uuid4().hex}.lance"
        self._on_new_file(name)
        self._created.append(name)
        return name

    def _path(self, name: str) -> str:
        return f"{self.uri.rstrip('/')}/data/{name}"

    def _write_path(self, name: str) -> str:
        return os.path.join(self._staging, name) if self._staging else self._path(name)

    def _place(self, name: str) -> None:
        """Move a complete file from the staging folder into ``data/``."""
        if self._staging:
            os.makedirs(os.path.dirname(self._path(name)), exist_ok=True)  # a new table has none
            os.rename(os.path.join(self._staging, name), self._path(name))

    def _open_writer(self) -> None:
        from lance.file import LanceFileWriter

        self._writer_name = self._new_name()
        self._writer = LanceFileWriter(
            self._write_path(self._writer_name),
            CONTENT_SCHEMA,
            version=self._version,
            storage_options=self._storage_options,
        )
        if self._extra is not None:
            self._extra_name = self._new_name()
            self._extra_writer = LanceFileWriter(
                self._write_path(self._extra_name),
                self._extra,
                version=self._extra_version,
                storage_options=self._storage_options,
            )
        self._writer_rows = 0

    def _close_writer(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._place(self._writer_name)
        staged = _Staged(
            content=self._data_file(self._writer_name, self._content_fields),
            rows=self._writer_rows,
        )
        if self._extra_writer is not None:
            self._extra_writer.close()
            self._place(self._extra_name)
            staged.extra_name = self._extra_name
            self._extra_writer = None
        self._staged.append(staged)
        self._writer = None

    def _data_file(self, name: str, fields: list[int], version: str | None = None) -> Any:
        from lance.fragment import DataFile

        major, minor = (int(x) for x in (version or self._version).split(".")[:2])
        size = os.path.getsize(self._path(name)) if is_local(self.uri) else None
        return DataFile(
            name,
            fields=list(fields),
            column_indices=list(range(len(fields))),
            file_major_version=major,
            file_minor_version=minor,
            file_size_bytes=size,
        )

    def files(self) -> list[str]:
        """Names (under ``data/``) of every file this writer created."""
        return list(self._created)

    def discard(self) -> None:
        """Delete every file this writer created (call only when nothing was committed)."""
        for writer in (self._writer, self._extra_writer):
            if writer is not None:
                try:
                    writer.close()
                except Exception:  # noqa: BLE001, S110 - it is deleted below anyway
                    pass
        self._writer = self._extra_writer = None
        if is_local(self.uri):
            for name in self._created:
                _unlink(self._path(name))
                if self._staging:
                    _unlink(os.path.join(self._staging, name))
        self._staged, self._created = [], []

    # -- committing ---------------------------------------------------------------------------

    def _write_ids(self, base: int) -> None:
        """(Re)write each staged fragment's ``id`` file for ids starting at ``base``."""
        from lance.file import LanceFileWriter

        schema = pa.schema([BASE_SCHEMA.field("id").remove_metadata()])  # table keys: schema only
        start = base
        for staged in self._staged:
            old = staged.id_file
            name = self._new_name()
            writer = LanceFileWriter(
                self._path(name),
                schema,
                version=self._version,
                storage_options=self._storage_options,
            )
            ids = pa.array(range(start, start + staged.rows), type=pa.int64())
            writer.write_batch(pa.record_batch([ids], schema=schema))
            writer.close()
            staged.id_file = self._data_file(name, [self._id_field])
            start += staged.rows
            if old is not None and is_local(self.uri):
                _unlink(self._path(old.path))
                self._created.remove(old.path)
        self._id_base = base

    def commit(
        self,
        *,
        op: str,
        message: str,
        properties: Mapping[str, Any] | None = None,
        metadata: Callable[[dict[str, str]], Mapping[str, str]] | None = None,
        max_attempts: int = 30,
    ) -> tuple[Table, int]:
        """Commit every staged row as one new version, assigning ids ``first..first+rows-1``.

        Args:
            op, message, properties: As for :meth:`Table.commit`; ``tokenloom.first_id`` and
                :data:`NEXT_ID_KEY` are added.
            metadata: Given the latest table metadata, returns more keys to set in it (read
                again on every attempt, so it can extend lists other writers extended).
            max_attempts: Commits tried, each on the then-latest version, before giving up.

        Returns:
            The committed table and the first id.

        Raises:
            TableError: when every attempt lost a race (the staged files stay for a rerun's
                cleanup).
        """
        self._close_writer()
        if not self._staged:
            raise TableError("nothing was staged; there is nothing to commit")
        delay = 0.05
        for attempt in range(1, max_attempts + 1):
            latest = Table.open(self.uri, storage_options=self._storage_options)
            base = latest.next_id()
            if base != self._id_base:
                self._write_ids(base)
            updates = {NEXT_ID_KEY: str(base + self.rows)}
            if metadata is not None:
                updates.update(metadata(latest.metadata()))
            fragments = [f.metadata for f in latest.dataset.get_fragments()]
            from lance.fragment import FragmentMetadata

            schema = None
            extra_ids: list[int] = []
            if self._extra is not None:
                schema = with_new_fields(latest, self._extra)
                ids = {f.name(): f.id() for f in schema.fields()}
                extra_ids = [ids[f.name] for f in self._extra]
            for s in self._staged:
                files = [s.id_file, s.content]
                if s.extra_name:
                    files.append(self._data_file(s.extra_name, extra_ids, self._extra_version))
                fragments.append(FragmentMetadata(id=0, files=files, physical_rows=s.rows))
            props = {**(properties or {}), NEXT_ID_KEY: str(base + self.rows)}
            props["tokenloom.first_id"] = str(base)
            try:
                committed = latest.commit(
                    lance.LanceOperation.Merge(
                        fragments,
                        with_table_metadata(
                            schema if schema is not None else latest.dataset.lance_schema,
                            updates,
                        ),
                    ),
                    op=op,
                    message=message,
                    properties=props,
                    read_version=latest.version,
                )
            except Exception as exc:  # noqa: BLE001 - only commit races are retried
                if not is_conflict(exc) or attempt == max_attempts:
                    if is_conflict(exc):
                        raise TableError(
                            f"{self.uri} kept changing under this commit ({attempt} attempts, "
                            f"last: {exc}); rerun: files already ingested are skipped"
                        ) from exc
                    raise
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 2.0)
                continue
            return committed, base
        raise AssertionError("unreachable")  # pragma: no cover


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
