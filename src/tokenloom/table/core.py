"""Create, open and commit to a tokenloom table — the only module that writes to Lance.

A table is one Lance dataset with stable row ids. Every tokenloom stage commits exactly one new
version and records what it did in that version's transaction properties, so ``tokenloom info``
can tell every version's origin without a side log.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc

from tokenloom.errors import TableError, TableNotFoundError
from tokenloom.table.schema import BASE_SCHEMA, OP_KEY, validate_base_schema
from tokenloom.table.storage import check_uri, resolve_storage_options

__all__ = ["Table", "VersionInfo", "normalize_uri", "is_local", "NEXT_ID_KEY"]

#: Table metadata (:mod:`tokenloom.table.meta`; on older tables, a transaction property): the
#: smallest id no row has ever had, the id high-water mark. Kept in the schema so every later
#: version carries it, whatever operation made it, and ``cleanup_old_versions`` cannot forget it.
NEXT_ID_KEY = "tokenloom.next_id"


def normalize_uri(uri: str | os.PathLike[str]) -> str:
    """Return an absolute local path (``file://`` URIs included), or an object-store URI.

    Raises:
        StorageError: A malformed URI (:func:`~tokenloom.table.storage.check_uri`).
    """
    text = check_uri(uri)
    if text.startswith("file://"):
        from urllib.parse import unquote, urlparse

        text = unquote(urlparse(text).path)
    if "://" in text:
        return text
    return os.path.abspath(os.path.expanduser(text))


def is_local(uri: str) -> bool:
    """Whether a normalised URI is a local path."""
    return "://" not in uri


@dataclass(frozen=True, kw_only=True)
class VersionInfo:
    """One table version and what created it."""

    version: int
    """The Lance version number."""
    timestamp: _dt.datetime
    """When the version was committed (UTC, as Lance records it)."""
    operation: str
    """The tokenloom operation (``create``, ``ingest``, ...) or the Lance operation name."""
    message: str = ""
    """The commit message, a one-line human summary."""
    properties: Mapping[str, str] = field(default_factory=dict)
    """Every transaction property tokenloom recorded (``tokenloom.*`` keys)."""
    num_rows: int = 0
    """Rows visible in this version."""
    total_bytes: int = 0
    """Size of every file this version references (data, deletions, indexes)."""


COMMIT_TOKEN_KEY = "tokenloom.commit_token"
"""A unique token per commit: after an ambiguous failure it tells whether the commit landed."""
_COMMIT_TRIES = 6


def _is_conflict(exc: BaseException) -> bool:
    if type(exc).__name__ == "CommitConflictError":
        return True
    text = str(exc).lower()
    return "conflict" in text or "retryable" in text or "preempted" in text


class Table:
    """A handle on a tokenloom table at ``uri``, optionally pinned to one version.

    Use :meth:`create` or :meth:`open`; the constructor is internal.
    """

    def __init__(
        self,
        uri: str,
        dataset: lance.LanceDataset,
        *,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        self.uri = uri
        self._ds = dataset
        self.storage_options = resolve_storage_options(uri, storage_options)

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        uri: str | os.PathLike[str],
        *,
        exist_ok: bool = False,
        storage_options: Mapping[str, str] | None = None,
    ) -> Table:
        """Create an empty table (version 1) with stable row ids and the base schema.

        Args:
            uri: A local path or an object-store URI Lance accepts.
            exist_ok: Return the existing table instead of failing when one is there.
            storage_options: Passed to Lance for object stores.

        Raises:
            TableError: if a dataset already exists and ``exist_ok`` is false.
        """
        norm = normalize_uri(uri)
        if "://" in norm:  # an object store's conditional put lets one creator win
            return cls._create(norm, exist_ok=exist_ok, storage_options=storage_options)
        from tokenloom.table.locks import FileLock

        # Two first writers (concurrent ingests) would both commit a `create`, Lance retrying the
        # second as an overwrite of what the first has written by then: one creates, under a
        # lock in the table's own directory; the other then finds the table.
        lock = FileLock(os.path.join(norm, "_tokenloom", "create.lock"), what=f"creating {norm}")
        with lock.acquire(on_wait=None):
            return cls._create(norm, exist_ok=exist_ok, storage_options=storage_options)

    @classmethod
    def _create(
        cls, norm: str, *, exist_ok: bool, storage_options: Mapping[str, str] | None
    ) -> Table:
        if cls.exists(norm, storage_options=storage_options):
            if exist_ok:
                return cls.open(norm, storage_options=storage_options)
            raise TableError(f"a table already exists at {norm}; open it instead of creating it")
        try:
            ds = lance.write_dataset(
                BASE_SCHEMA.empty_table(),
                norm,
                mode="create",
                enable_stable_row_ids=True,
                storage_options=resolve_storage_options(norm, storage_options) or None,
                commit_message="create tokenloom table",
                transaction_properties={OP_KEY: "create", NEXT_ID_KEY: "0"},
            )
        except (OSError, ValueError, RuntimeError):
            # Another writer created it first (a concurrent ingest): that table is ours too.
            if exist_ok and cls.exists(norm, storage_options=storage_options):
                return cls.open(norm, storage_options=storage_options)
            raise
        return cls(norm, ds, storage_options=storage_options)

    @classmethod
    def open(
        cls,
        uri: str | os.PathLike[str],
        *,
        version: int | None = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> Table:
        """Open an existing table, at its latest version unless ``version`` pins one.

        Raises:
            TableNotFoundError: if nothing is at ``uri``.
            TableError: if ``version`` does not exist or the dataset lacks the base columns.
        """
        norm = cls.require(uri, storage_options=storage_options)
        try:
            ds = lance.dataset(
                norm,
                version=version,
                storage_options=resolve_storage_options(norm, storage_options) or None,
            )
        except (ValueError, OSError, RuntimeError) as exc:
            raise TableError(f"cannot open {norm} at version {version}: {exc}") from exc
        validate_base_schema(ds.schema, norm)
        return cls(norm, ds, storage_options=storage_options)

    @classmethod
    def require(
        cls, uri: str | os.PathLike[str], *, storage_options: Mapping[str, str] | None = None
    ) -> str:
        """The normalised ``uri`` of a table that is there (nothing is opened: a command checks
        this before its heavy imports).

        Raises:
            TableNotFoundError: if nothing is at ``uri``.
        """
        norm = normalize_uri(uri)
        if not cls.exists(norm, storage_options=storage_options):
            raise TableNotFoundError(
                f"no tokenloom table at {norm}; create one with "
                f"`tokenloom ingest FILES --table {norm}`"
            )
        return norm

    @staticmethod
    def exists(uri: str, *, storage_options: Mapping[str, str] | None = None) -> bool:
        """Whether a Lance dataset exists at ``uri``.

        Raises:
            StoreUnreachableError: the object store did not answer (then nobody knows; a table
                that is there must not be taken for absent).
        """
        if "://" not in uri:
            return os.path.isdir(os.path.join(uri, "_versions"))
        try:
            lance.dataset(
                uri, storage_options=resolve_storage_options(uri, storage_options) or None
            )
        except (ValueError, OSError, RuntimeError) as exc:
            from tokenloom.table.outage import StoreUnreachableError, outage_message

            message = outage_message(exc, resolve_storage_options(uri, storage_options))
            if message is not None:
                raise StoreUnreachableError(message) from exc
            return False
        return True

    # -- reading ------------------------------------------------------------------------------

    @property
    def dataset(self) -> lance.LanceDataset:
        """The underlying Lance dataset at the version this handle is on."""
        return self._ds

    @property
    def version(self) -> int:
        """The version this handle reads."""
        return int(self._ds.version)

    @property
    def latest_version(self) -> int:
        """The newest committed version (may be newer than :attr:`version`)."""
        return int(self._ds.latest_version)

    def checkout(self, version: int | None = None) -> Table:
        """Return a handle on ``version`` (default: the latest)."""
        if version is None:
            ds = lance.dataset(self.uri, storage_options=self.storage_options or None)
        else:
            ds = self._ds.checkout_version(version)
        return Table(self.uri, ds, storage_options=self.storage_options)

    def count_rows(self, filter: str | None = None) -> int:
        """Rows in this version, optionally under a SQL filter."""
        return int(self._ds.count_rows(filter=filter))

    def rows_per_source(self) -> dict[str, int]:
        """Row count per ``source`` value, largest first."""
        counts: dict[str, int] = {}
        for batch in self._ds.to_batches(columns=["source"], batch_size=65536):
            vc = pc.value_counts(batch.column(0))
            for item in vc.to_pylist():
                counts[item["values"]] = counts.get(item["values"], 0) + item["counts"]
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def transaction_properties(self, version: int) -> dict[str, str]:
        """The properties recorded by the commit that created ``version`` ({} when unknown)."""
        try:
            txn = self._ds.read_transaction(version)
        except (ValueError, OSError, RuntimeError):
            return {}
        return dict(txn.transaction_properties or {}) if txn is not None else {}

    def versions(self) -> list[VersionInfo]:
        """Every readable version, oldest first, with what created it."""
        out = []
        for v in self._ds.versions():
            number = int(v["version"])
            props = self.transaction_properties(number)
            op = props.get(OP_KEY)
            if op is None:
                op = self._lance_operation_name(number)
            meta = v.get("metadata") or {}
            out.append(
                VersionInfo(
                    version=number,
                    timestamp=v["timestamp"],
                    operation=op,
                    message=props.get("__lance_commit_message", ""),
                    properties={k: val for k, val in props.items() if k.startswith("tokenloom.")},
                    num_rows=int(meta.get("total_rows", 0)),
                    total_bytes=int(meta.get("total_files_size", 0)),
                )
            )
        return out

    def _lance_operation_name(self, version: int) -> str:
        try:
            txn = self._ds.read_transaction(version)
        except (ValueError, OSError, RuntimeError):
            return "unknown"
        if txn is None:
            return "unknown"
        return type(txn.operation).__name__.lower()

    def metadata(self) -> dict[str, str]:
        """The table metadata of this version (``tokenloom.*`` keys among others), wherever
        it is kept (:func:`~tokenloom.table.meta.table_metadata`)."""
        from tokenloom.table.meta import table_metadata

        return table_metadata(self._ds.schema)

    def next_id(self) -> int:
        """The smallest id never used by any row of any version (as of this handle's version).

        The high-water mark in the table metadata is authoritative (it survives deletes of the
        newest rows and the cleanup of old versions); tables written before it existed fall
        back on the transaction properties; the stored ids are a floor in every case.
        """
        recorded = self.metadata().get(NEXT_ID_KEY)
        if recorded is None:
            recorded = "0"
            for v in reversed(self._ds.versions()):
                if int(v["version"]) > self.version:
                    continue
                props = self.transaction_properties(int(v["version"]))
                if NEXT_ID_KEY in props:
                    recorded = props[NEXT_ID_KEY]
                    break
        stored = 0
        if self._ds.count_rows() > 0:
            max_id = pc.max(self._ds.to_table(columns=["id"]).column("id")).as_py()
            stored = int(max_id) + 1
        return max(int(recorded), stored)

    # -- writing ------------------------------------------------------------------------------

    def commit(
        self,
        operation: lance.LanceOperation.BaseOperation,
        *,
        op: str,
        message: str,
        properties: Mapping[str, Any] | None = None,
        read_version: int | None = None,
    ) -> Table:
        """Commit one Lance operation as one new version and return a handle on it.

        Args:
            operation: The Lance operation (Append, Merge, ...).
            op: The tokenloom operation name recorded for ``tokenloom info``.
            message: A one-line summary recorded as the commit message.
            properties: Extra ``tokenloom.*`` properties; non-string values are JSON-encoded.
            read_version: The version the operation was planned on (default: this handle's).
        """
        import uuid

        props = {OP_KEY: op, "__lance_commit_message": message, COMMIT_TOKEN_KEY: uuid.uuid4().hex}
        for key, value in (properties or {}).items():
            props[key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        base = self.version if read_version is None else read_version
        txn = lance.Transaction(
            read_version=base, operation=operation, transaction_properties=props
        )
        so = self.storage_options or None
        for attempt in range(1, _COMMIT_TRIES + 1):
            try:
                ds = lance.LanceDataset.commit(self.uri, txn, storage_options=so)
                return Table(self.uri, ds, storage_options=self.storage_options)
            except Exception as exc:
                # On an object store a commit can fail *after* the server stored it (a reset
                # connection, a lost response): look for our token before trying again, so a
                # commit is neither lost nor made twice. Conflicts are the caller's to handle.
                if is_local(self.uri) or _is_conflict(exc) or attempt == _COMMIT_TRIES:
                    raise
                landed = self._find_commit(props[COMMIT_TOKEN_KEY], base)
                if landed is not None:
                    return landed
                import time

                time.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _find_commit(self, token: str, after: int) -> Table | None:
        """The version whose commit carries ``token`` (made after ``after``), if any."""
        try:
            latest = self.checkout()
        except Exception:  # noqa: BLE001 - the store is still failing: not found (yet)
            return None
        for v in range(after + 1, latest.latest_version + 1):
            if latest.transaction_properties(v).get(COMMIT_TOKEN_KEY) == token:
                return latest.checkout(v)
        return None

    def schema(self) -> pa.Schema:
        """The Arrow schema of this version."""
        return self._ds.schema

    def __repr__(self) -> str:
        return f"Table({self.uri!r}, version={self.version})"
