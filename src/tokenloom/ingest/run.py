"""The ingest job: input files in, one new table version out.

Rows are streamed into uncommitted Lance data files in bounded batches and committed at the end
as **one** version, ids assigned at commit time from the table's own high-water mark (see
:mod:`tokenloom.table.append`), so concurrent ingests under any name for the table never share
an id and one that loses a commit race retries on the new version. The content fingerprint of
every file read is kept in a side file the committed version lists, so a rerun skips it even
after ``cleanup_old_versions``. A killed run leaves the table as it was; its files are deleted by
the next run (see :mod:`tokenloom.table.journal`).

Every record seen ends up in exactly one of: a row, a counted rejection, a skipped file.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tokenloom.errors import IngestError
from tokenloom.ingest.bigtext import is_text_array
from tokenloom.ingest.columns import arrow_field, parse_columns, resolve_columns
from tokenloom.ingest.inputs import (
    InputFile,
    NotRegularFile,
    discover,
    fingerprint_bytes,
    fingerprint_file,
    fingerprint_lance,
    open_regular,
)
from tokenloom.ingest.readers import ReadOptions, Tally, read_input
from tokenloom.ingest.rejects import Note, Reason, Reject, RejectLog, printable
from tokenloom.table import Table, normalize_uri
from tokenloom.table.append import CONTENT_SCHEMA, StagedRows
from tokenloom.table.core import is_local
from tokenloom.table.journal import SIDE_DIR, RunJournal, clean_orphans
from tokenloom.table.sidefiles import read_side_table, write_side_table
from tokenloom.table.storage import filesystem, is_remote, join, resolve_storage_options

__all__ = [
    "IngestResult",
    "FileReport",
    "ingest",
    "ingested_fingerprints",
    "FILES_KEY",
    "INGEST_FILES_KEY",
]

#: Transaction property of older versions: JSON list of ``[fingerprint, path, rows]``.
FILES_KEY = "tokenloom.files"
#: Schema metadata: JSON list of the side files (one per ingest) listing the files read.
INGEST_FILES_KEY = "tokenloom.ingest_files"

_BATCH_ROWS = 8192
_BATCH_BYTES = 64 << 20  # Python strings held before they become one Arrow batch
_ROWS_PER_FRAGMENT = 131072  # modest fragments: the unit of parallel backfill work
_LOG_SCHEMA = pa.schema(
    [
        pa.field("fingerprint", pa.string()),
        pa.field("path", pa.string()),
        pa.field("rows", pa.int64()),
        pa.field("records", pa.int64()),
    ]
)


@dataclass(kw_only=True)
class FileReport:
    """What happened to one input file."""

    path: str
    fingerprint: str = ""
    records: int = 0
    """Records seen in the file (for a skipped file: as counted when it was ingested)."""
    rows: int = 0
    rejected: int = 0
    skipped: bool = False
    """True when the file was ingested before (same fingerprint) and ``force`` was off."""


@dataclass(kw_only=True)
class IngestResult:
    """The outcome of one ingest run: ``rows_written + Σ rejected + skipped == records_seen``."""

    table: str
    rows_written: int
    rejected: dict[str, int]
    version: int | None
    """The new table version, or ``None`` when nothing was committed."""
    rejects_path: str | None
    records_seen: int = 0
    """Records met: JSONL lines (not blank), Parquet rows, text files, unreadable inputs, and the
    records of skipped files."""
    skipped: int = 0
    """Records of files skipped because they were ingested before."""
    notes: dict[str, int] = field(default_factory=dict)
    """Kept records (or files) something was done to, by :class:`Note` reason."""
    first_id: int | None = None
    last_id: int | None = None
    bytes_read: int = 0
    seconds: float = 0.0
    orphans_removed: int = 0
    """Files of killed earlier runs deleted by this one."""
    files: list[FileReport] = field(default_factory=list)

    @property
    def skipped_files(self) -> list[str]:
        """Files skipped because they were ingested before."""
        return [f.path for f in self.files if f.skipped]

    @property
    def balanced(self) -> bool:
        """Whether every record seen is accounted for (always true unless tokenloom has a bug)."""
        return self.rows_written + sum(self.rejected.values()) + self.skipped == self.records_seen

    def to_json(self) -> dict:
        """The ``--json`` document."""
        out = {
            "rows_written": self.rows_written,
            "rejected": dict(self.rejected),
            "skipped": self.skipped,
            "records_seen": self.records_seen,
            "notes": dict(self.notes),
            "version": self.version,
            "rejects_path": self.rejects_path,
        }
        extra = asdict(self)
        for key in ("table", "first_id", "last_id", "bytes_read", "seconds", "orphans_removed"):
            out[key] = extra[key]
        out["files"] = [{**f, "path": printable(f["path"])} for f in extra["files"]]
        out["skipped_files"] = [printable(p) for p in self.skipped_files]
        return out


def ingested_fingerprints(table: Table) -> dict[str, int]:
    """Fingerprint -> records of every file an earlier ingest committed to ``table``.

    Read from the side files the latest version lists (they survive ``cleanup_old_versions``)
    and from the transaction properties of versions written before those existed.
    """
    seen: dict[str, int] = {}
    for info in table.versions():
        if info.operation != "ingest" or FILES_KEY not in info.properties:
            continue
        for fp, _path, rows in json.loads(info.properties[FILES_KEY]):
            seen.setdefault(fp, int(rows))
    for rel in json.loads(table.metadata().get(INGEST_FILES_KEY, "[]")):
        try:
            log = read_side_table(table, rel)
        except (OSError, ValueError, RuntimeError) as exc:
            raise IngestError(
                f"the list of files ingested into {table.uri} is unreadable ({rel}: {exc}); "
                "pass --force to ingest without checking for files ingested before"
            ) from exc
        for fp, records in zip(
            log["fingerprint"].to_pylist(), log["records"].to_pylist(), strict=True
        ):
            seen.setdefault(fp, int(records))
    return seen


def default_rejects_path(table_uri: str) -> str:
    """``<table>.rejects/ingest-<UTC time>-<pid>.jsonl`` beside a local table;
    ``<table>/_tokenloom/rejects/ingest-<UTC time>-<pid>.jsonl`` inside an object-store table
    (under the table's own URI, where its credentials reach)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    name = f"ingest-{stamp}-{os.getpid()}.jsonl"
    if is_remote(table_uri):
        return join(table_uri, SIDE_DIR, "rejects", name)
    return table_uri.rstrip("/") + f".rejects/{name}"


class _Batcher:
    """Collects documents and emits Arrow record batches of the content columns (then the
    typed columns, if any).

    A big document whose text is already an Arrow array (:mod:`tokenloom.ingest.bigtext`) is a
    batch of its own: its text goes to the writer as it is, never copied into a larger column.
    """

    def __init__(self, extra: pa.Schema | None = None) -> None:
        self.rows = 0
        self.extra = extra if extra is not None else pa.schema([])
        self.schema = pa.schema(list(CONTENT_SCHEMA) + list(self.extra))
        self.texts: list[str] = []
        self.sources: list[str] = []
        self.metas: list[str] = []
        self.typed: list[tuple] = []
        self.nbytes = 0

    def add(self, text: Any, source: str, meta: str, typed: tuple = ()) -> list[pa.RecordBatch]:
        """Add one document; returns the batches that are ready (often none)."""
        if is_text_array(text):
            ready = [b for b in (self.flush(),) if b is not None]
            self.rows += 1
            return [*ready, self._batch(text, [source], [meta], [typed])]
        self.texts.append(text)
        self.sources.append(source)
        self.metas.append(meta)
        self.typed.append(typed)
        # The memory the strings take (up to 4 bytes a character), not their length: a batch of
        # texts above U+FFFF must not hold four times the bytes the cap means.
        self.nbytes += sys.getsizeof(text) + sum(len(v) for v in typed if isinstance(v, bytes))
        if len(self.texts) >= _BATCH_ROWS or self.nbytes >= _BATCH_BYTES:
            return [self.flush()]  # type: ignore[list-item]  # not empty here
        return []

    def flush(self) -> pa.RecordBatch | None:
        """The documents collected so far as one batch (``None`` when there are none)."""
        if not self.texts:
            return None
        texts = pa.array(self.texts, type=pa.large_string())
        batch = self._batch(texts, self.sources, self.metas, self.typed)
        self.rows += len(self.texts)
        self.texts, self.sources, self.metas, self.typed = [], [], [], []
        self.nbytes = 0
        return batch

    def _batch(
        self, texts: pa.Array, sources: list[str], metas: list[str], typed: list[tuple]
    ) -> pa.RecordBatch:
        n_chars = pc.utf8_length(texts).cast(pa.int64())
        columns = [texts, pa.array(sources, type=pa.string()), n_chars, pa.array(metas)]
        for j, typed_field in enumerate(self.extra):
            columns.append(pa.array([t[j] for t in typed], type=typed_field.type))
        return pa.record_batch(columns, schema=self.schema)


def ingest(
    paths: Sequence[str | os.PathLike[str]],
    table: str | os.PathLike[str],
    *,
    source: str | None = None,
    source_field: str = "source",
    text_field: str = "text",
    errors: str = "strict",
    glob: str = "**/*.txt",
    force: bool = False,
    max_doc_bytes: int = 512 << 20,
    rejects_path: str | None = None,
    progress: bool | None = None,
    follow_symlinks: bool = False,
    storage_options: Mapping[str, str] | None = None,
    columns: str | Sequence[str] | None = None,
    split: str | None = None,
) -> IngestResult:
    """Ingest files into a tokenloom table as one new version.

    Args:
        paths: JSONL (also .gz/.zst), Parquet, Arrow IPC, .txt files, directories of text files,
            Hugging Face dataset folders (``hf://DIR``, or a ``save_to_disk`` folder) and Lance
            datasets (a LanceDB table's folder; read at its latest version, never written).
        table: Table URI; created (with stable row ids) when absent.
        source: Source name for every row (default: the record's ``source_field``, else the
            file stem).
        source_field: The field (key or column) naming a record's source.
        text_field: Key/column holding the text.
        errors: ``"strict"`` rejects invalid UTF-8 / lone surrogates in any field, ``"replace"``
            keeps the record with U+FFFD.
        glob: Pattern selecting text files inside directories.
        force: Ingest files even when their content fingerprint was ingested before.
        max_doc_bytes: Records larger than this are rejected as ``too_large`` (never held).
        rejects_path: Where to write rejections (JSONL); default beside the table.
        progress: Show a progress bar on stderr (default: when stderr is a terminal).
        follow_symlinks: Follow symlinks inside directories that point outside them.
        storage_options: Object-store options for the table and for ``s3://``-style inputs
            (the ``AWS_*`` environment fills the rest).
        columns: Fields stored as typed columns instead of in ``meta``, e.g.
            ``"score:float,lang:string,image:binary"`` (see :mod:`tokenloom.ingest.columns`);
            a Parquet file's binary columns are always typed columns.
        split: The split taken from Hugging Face dataset folders (default: every split; see
            :mod:`tokenloom.ingest.hf`).

    Returns:
        What was written, rejected and skipped, and the new version.

    Raises:
        IngestError: when no row could be read from any input (rejections are still written),
            or ``source`` is not valid UTF-8.
    """
    started = time.perf_counter()
    uri = normalize_uri(table)
    if source is not None and printable(source) != source:
        raise IngestError(
            f"--source {printable(source)!r} is not valid UTF-8 text; pass a UTF-8 source name"
        )
    declared = parse_columns(columns)
    so = resolve_storage_options(uri, storage_options) or None
    files, path_rejects = discover(
        paths,
        glob=glob,
        follow_symlinks=follow_symlinks,
        storage_options=storage_options,
        split=split,
    )
    existing = (
        Table.open(uri, storage_options=so) if Table.exists(uri, storage_options=so) else None
    )
    typed = resolve_columns(
        declared,
        _parquet_schemas(files),
        text_field=text_field,
        table_schema=existing.schema() if existing is not None else None,
    )
    opts = ReadOptions(
        text_field=text_field,
        source=source,
        source_field=source_field,
        errors=errors,
        max_doc_bytes=max_doc_bytes,
        columns=typed,
    )
    orphans = clean_orphans(uri) if existing is not None else []
    seen = ingested_fingerprints(existing) if existing is not None and not force else {}
    target = rejects_path or default_rejects_path(uri)
    local_log = target if is_local(target) else _local_twin(target)
    log = RejectLog(local_log)
    try:
        result = _run(uri, existing, files, path_rejects, opts, seen, log, progress, len(paths), so)
    finally:
        log.close()
    result.orphans_removed = len(orphans)
    result.rejects_path = _publish(log.path, target, so)
    result.seconds = time.perf_counter() - started
    if result.version is None and result.rows_written == 0:
        if not (result.files and all(r.skipped for r in result.files)):
            raise IngestError(_nothing_read_message(len(paths), result))
    return result


def _run(
    uri: str,
    existing: Table | None,
    files: list[InputFile],
    path_rejects: list[Reject],
    opts: ReadOptions,
    seen: dict[str, int],
    log: RejectLog,
    progress: bool | None,
    n_paths: int,
    storage_options: Mapping[str, str] | None = None,
) -> IngestResult:
    from tokenloom.progress import progress as show_progress

    reports: list[FileReport] = []
    total_bytes = sum(_size(f) for f in files)
    bar = show_progress(
        "ingest", total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, show=progress
    )
    extra = pa.schema([arrow_field(c) for c in opts.columns]) if opts.columns else None
    batcher = _Batcher(extra)
    journal: RunJournal | None = None
    writer: StagedRows | None = None
    side_file = None
    records = 0
    try:
        for rej in path_rejects:
            log.add(rej)
            records += rej.count
        for inp in files:
            for batch in _ingest_file(inp, opts, seen, log, reports, batcher, bar.update):
                if writer is None:
                    journal, writer = _start_writing(uri, existing, extra, storage_options)
                writer.write(batch)
        last = batcher.flush()
        if last is not None:
            if writer is None:
                journal, writer = _start_writing(uri, existing, extra, storage_options)
            writer.write(last)
        records += sum(r.records for r in reports)
        result = IngestResult(
            table=uri,
            rows_written=batcher.rows,
            rejected=dict(sorted(log.counts.items())),
            notes=dict(sorted(log.notes.items())),
            version=None,
            rejects_path=None,
            records_seen=records,
            skipped=sum(r.records for r in reports if r.skipped),
            bytes_read=total_bytes,
            files=reports,
        )
        if writer is None:
            return result
        assert journal is not None
        read = [r for r in reports if not r.skipped and r.fingerprint]
        listing = pa.table(
            [
                [r.fingerprint for r in read],
                [printable(r.path) for r in read],
                [r.rows for r in read],
                [r.records for r in read],
            ],
            schema=_LOG_SCHEMA,
        )
        side_file = write_side_table(
            writer.table, "ingests", listing, on_new_file=journal.add, staging=journal.staging
        )

        def metadata(latest: dict[str, str]) -> dict[str, str]:
            listed = json.loads(latest.get(INGEST_FILES_KEY, "[]"))
            return {INGEST_FILES_KEY: json.dumps([*listed, side_file])}

        committed, first_id = writer.commit(
            op="ingest",
            message=f"ingest {writer.rows} rows from {len(reports)} files",
            properties={
                "tokenloom.rejected": result.rejected,
                "tokenloom.rows": str(writer.rows),
                "tokenloom.records_seen": str(records),
                "tokenloom.files_read": str(len(read)),
            },
            metadata=metadata,
        )
        result.version = committed.version
        result.first_id, result.last_id = first_id, first_id + writer.rows - 1
        return result
    except BaseException:
        if writer is not None:
            writer.discard()
        if side_file is not None and is_local(uri):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(uri, side_file))
        raise
    finally:
        bar.close()
        if journal is not None:
            journal.close()


def _parquet_schemas(files: list[InputFile]) -> Iterator[tuple[str, pa.Schema]]:
    """``(file name, Arrow schema)`` of each readable Parquet or Arrow IPC input (footers or
    stream headers only; unreadable ones are rejected later by the reader)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for inp in files:
        if inp.kind == "lance":
            import lance

            try:
                yield lance.dataset(inp.path, version=inp.version).schema
            except Exception:  # noqa: BLE001, S112 - the reader rejects it with the reason
                continue
        if inp.kind not in ("parquet", "arrow"):
            continue
        try:
            with open_regular(inp.path, inp.storage_options) as fh:
                if inp.kind == "parquet":
                    yield inp.relpath, pq.ParquetFile(fh).schema_arrow
                    continue
                try:
                    yield inp.relpath, pa.ipc.open_stream(fh).schema
                except pa.ArrowInvalid:
                    fh.seek(0)
                    yield inp.relpath, pa.ipc.open_file(fh).schema
        except Exception:  # noqa: BLE001, S112 - the reader rejects it with the reason
            continue


def _start_writing(
    uri: str,
    existing: Table | None,
    extra: pa.Schema | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> tuple[RunJournal, StagedRows]:
    """Create the table when needed (only once there is a row to write) and a staged writer."""
    if existing is not None:
        table = existing
    else:
        table = Table.create(uri, exist_ok=True, storage_options=storage_options)
    journal = RunJournal(uri)
    writer = StagedRows(
        table,
        extra=extra,
        rows_per_fragment=_ROWS_PER_FRAGMENT,
        on_new_file=lambda name: journal.add(f"data/{name}"),
        staging=journal.staging,
    )
    return journal, writer


def _ingest_file(
    inp: InputFile,
    opts: ReadOptions,
    seen: dict[str, int],
    log: RejectLog,
    reports: list[FileReport],
    batcher: _Batcher,
    advance,
) -> Iterator[pa.RecordBatch]:
    report = FileReport(path=inp.path)
    reports.append(report)
    data: bytes | None = None
    try:
        if inp.kind == "text":
            with open_regular(inp.path, inp.storage_options) as fh:
                data = fh.read(opts.max_doc_bytes + 1)  # bounded, whatever the size claims
            if len(data) > opts.max_doc_bytes:
                size = max(_size(inp), len(data))
                report.records = 1
                _reject(
                    log,
                    report,
                    Reject(
                        file=inp.path,
                        reason=Reason.TOO_LARGE,
                        detail=f"{size} bytes > max_doc_bytes {opts.max_doc_bytes}",
                    ),
                )
                advance(size)
                return
            report.fingerprint = fingerprint_bytes(data)
        elif inp.kind == "lance":
            report.fingerprint = fingerprint_lance(inp)
        else:
            report.fingerprint = fingerprint_file(inp.path, storage_options=inp.storage_options)
    except OSError as exc:
        report.records = 1
        reason = Reason.UNSUPPORTED_FORMAT if isinstance(exc, NotRegularFile) else None
        detail = str(exc) if isinstance(exc, NotRegularFile) else (exc.strerror or str(exc))
        _reject(
            log,
            report,
            Reject(file=inp.path, reason=reason or Reason.UNREADABLE_FILE, detail=detail),
        )
        return
    if report.fingerprint in seen:
        report.skipped = True
        report.records = seen[report.fingerprint]
        advance(_size(inp))
        return
    if inp.escaped_name:
        log.note(Reject(file=inp.path, reason=Note.ESCAPED_FILE_NAME, detail=inp.relpath))
    tally = Tally()
    for item in read_input(inp, opts, advance, tally, data):
        if isinstance(item, Reject):
            if item.kept:
                log.note(item)
            else:
                _reject(log, report, item)
            continue
        report.rows += 1
        yield from batcher.add(*item)
    report.records = tally.records


def _reject(log: RejectLog, report: FileReport, rej: Reject) -> None:
    log.add(rej)
    report.rejected += rej.count


def _size(inp: InputFile) -> int:
    if inp.size >= 0:
        return inp.size
    try:
        return os.path.getsize(inp.path)
    except OSError:
        return 0


def _local_twin(remote: str) -> str:
    """A local file that collects the rejects of a remote table until they are uploaded."""
    folder = tempfile.mkdtemp(prefix="tokenloom-rejects-")
    return os.path.join(folder, remote.rstrip("/").rsplit("/", 1)[-1])


def _publish(
    written: str | None, target: str, storage_options: Mapping[str, str] | None = None
) -> str | None:
    """Put the rejects file where it belongs (uploads it for an object-store table)."""
    if written is None or written == target:
        return written
    try:
        fs, path = filesystem(target, storage_options)
        with open(written, "rb") as src, fs.open_output_stream(path, compression=None) as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    except Exception:  # noqa: BLE001 - the rejects stay readable locally, and we say where
        return written
    os.unlink(written)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(written))  # the twin's private temporary folder
    return target


def _nothing_read_message(n_paths: int, result: IngestResult) -> str:
    counts = ", ".join(f"{k}={v}" for k, v in result.rejected.items()) or "no records found"
    where = f"; every rejection is listed in {result.rejects_path}" if result.rejects_path else ""
    return (
        f"nothing could be ingested from {n_paths} input path(s) ({counts}){where}. "
        "Check the paths, --text-field and --glob"
    )
