"""The ingest job: input files in, one new table version out.

Rows are streamed into uncommitted Lance fragments in bounded batches and committed at the end as
**one** Append, together with the content fingerprint of every file read. A killed run therefore
leaves the table as it was (plus unreferenced files), and a rerun of an already-ingested file is
skipped because its fingerprint is in the table's history.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from tokenloom.errors import IngestError
from tokenloom.ingest.inputs import InputFile, discover, fingerprint_bytes, fingerprint_file
from tokenloom.ingest.readers import ReadOptions, read_input
from tokenloom.ingest.rejects import Reason, Reject, RejectLog
from tokenloom.table import BASE_SCHEMA, NEXT_ID_KEY, Table, normalize_uri

__all__ = ["IngestResult", "FileReport", "ingest", "ingested_fingerprints", "FILES_KEY"]

#: Transaction property: JSON list of ``[fingerprint, path, rows]`` of the files an ingest read.
FILES_KEY = "tokenloom.files"

_BATCH_ROWS = 8192
_BATCH_BYTES = 64 << 20
_ROWS_PER_FRAGMENT = 131072  # modest fragments: the unit of parallel backfill work


@dataclass(kw_only=True)
class FileReport:
    """What happened to one input file."""

    path: str
    fingerprint: str = ""
    rows: int = 0
    rejected: int = 0
    skipped: bool = False
    """True when the file was ingested before (same fingerprint) and ``force`` was off."""


@dataclass(kw_only=True)
class IngestResult:
    """The outcome of one ingest run."""

    table: str
    rows_written: int
    rejected: dict[str, int]
    version: int | None
    """The new table version, or ``None`` when nothing was committed."""
    rejects_path: str | None
    first_id: int | None = None
    last_id: int | None = None
    bytes_read: int = 0
    seconds: float = 0.0
    files: list[FileReport] = field(default_factory=list)

    @property
    def skipped_files(self) -> list[str]:
        """Files skipped because they were ingested before."""
        return [f.path for f in self.files if f.skipped]

    def to_json(self) -> dict:
        """The ``--json`` document."""
        out = {
            "rows_written": self.rows_written,
            "rejected": dict(self.rejected),
            "version": self.version,
            "rejects_path": self.rejects_path,
        }
        extra = asdict(self)
        for key in ("table", "first_id", "last_id", "bytes_read", "seconds", "files"):
            out[key] = extra[key]
        out["skipped_files"] = self.skipped_files
        return out


def ingested_fingerprints(table: Table) -> dict[str, int]:
    """Fingerprint -> version of every file an earlier ingest committed to ``table``."""
    seen: dict[str, int] = {}
    for info in table.versions():
        if info.operation != "ingest" or FILES_KEY not in info.properties:
            continue
        for fp, _path, _rows in json.loads(info.properties[FILES_KEY]):
            seen.setdefault(fp, info.version)
    return seen


def default_rejects_path(table_uri: str) -> str:
    """``<table>.rejects/ingest-<UTC time>.jsonl`` beside a local table, else under the cwd."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    name = f"ingest-{stamp}-{os.getpid()}.jsonl"
    if "://" in table_uri:
        return os.path.abspath(os.path.join("tokenloom-rejects", name))
    return table_uri.rstrip("/") + ".rejects/" + name


class _Batcher:
    """Collects documents and emits Arrow record batches with dense ids."""

    def __init__(self, next_id: int) -> None:
        self.next_id = next_id
        self.texts: list[str] = []
        self.sources: list[str] = []
        self.metas: list[str] = []
        self.nbytes = 0

    def add(self, text: str, source: str, meta: str) -> pa.RecordBatch | None:
        self.texts.append(text)
        self.sources.append(source)
        self.metas.append(meta)
        self.nbytes += len(text)
        if len(self.texts) >= _BATCH_ROWS or self.nbytes >= _BATCH_BYTES:
            return self.flush()
        return None

    def flush(self) -> pa.RecordBatch | None:
        if not self.texts:
            return None
        n = len(self.texts)
        ids = pa.array(range(self.next_id, self.next_id + n), type=pa.int64())
        texts = pa.array(self.texts, type=pa.large_string())
        n_chars = pc.utf8_length(texts).cast(pa.int64())
        batch = pa.record_batch(
            [
                ids,
                texts,
                pa.array(self.sources, type=pa.string()),
                n_chars,
                pa.array(self.metas, type=pa.string()),
            ],
            schema=BASE_SCHEMA,
        )
        self.next_id += n
        self.texts, self.sources, self.metas = [], [], []
        self.nbytes = 0
        return batch


def ingest(
    paths: Sequence[str | os.PathLike[str]],
    table: str | os.PathLike[str],
    *,
    source: str | None = None,
    text_field: str = "text",
    errors: str = "strict",
    glob: str = "**/*.txt",
    force: bool = False,
    max_doc_bytes: int = 512 << 20,
    rejects_path: str | None = None,
    progress: bool | None = None,
) -> IngestResult:
    """Ingest files into a tokenloom table as one new version.

    Args:
        paths: JSONL (also .gz/.zst), Parquet, .txt files and directories of text files.
        table: Table URI; created (with stable row ids) when absent.
        source: Source name for every row (default: the record's ``source``, else the file stem).
        text_field: Key/column holding the text.
        errors: ``"strict"`` rejects invalid UTF-8, ``"replace"`` keeps it with U+FFFD.
        glob: Pattern selecting text files inside directories.
        force: Ingest files even when their content fingerprint was ingested before.
        max_doc_bytes: Records larger than this are rejected as ``too_large``.
        rejects_path: Where to write rejections (JSONL); default beside the table.
        progress: Show a progress bar on stderr (default: when stderr is a terminal).

    Returns:
        What was written and rejected, and the new version.

    Raises:
        IngestError: when no row could be read from any input (rejections are still written).
    """
    started = time.perf_counter()
    uri = normalize_uri(table)
    opts = ReadOptions(
        text_field=text_field, source=source, errors=errors, max_doc_bytes=max_doc_bytes
    )
    files, path_rejects = discover(paths, glob=glob)
    with _ingest_lock(uri):
        return _ingest_locked(
            uri,
            files,
            path_rejects,
            opts,
            force=force,
            rejects_path=rejects_path,
            progress=progress,
            started=started,
            n_paths=len(paths),
        )


@contextlib.contextmanager
def _ingest_lock(uri: str) -> Iterator[None]:
    """Serialise ingests of one local table: ids are assigned from the version read.

    Object-store tables have no lock here; run one ingest at a time against them.
    """
    # TODO(ingest-concurrency): a conditional-put lock for object stores.
    if "://" in uri:
        yield
        return
    import fcntl

    parent, name = os.path.split(uri.rstrip("/"))
    os.makedirs(parent or ".", exist_ok=True)
    with open(os.path.join(parent, f".{name}.ingest-lock"), "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _ingest_locked(
    uri: str,
    files: list[InputFile],
    path_rejects: list[Reject],
    opts: ReadOptions,
    *,
    force: bool,
    rejects_path: str | None,
    progress: bool | None,
    started: float,
    n_paths: int,
) -> IngestResult:
    from tqdm import tqdm

    existing = Table.open(uri) if Table.exists(uri) else None
    seen = ingested_fingerprints(existing) if existing is not None and not force else {}
    start_id = existing.next_id() if existing is not None else 0
    log = RejectLog(rejects_path or default_rejects_path(uri))
    reports: list[FileReport] = []
    total_bytes = sum(_size(f.path) for f in files)
    bar = tqdm(
        total=total_bytes,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc="ingest",
        disable=None if progress is None else not progress,
        leave=False,
    )
    batcher = _Batcher(start_id)

    def batches() -> Iterator[pa.RecordBatch]:
        for rej in path_rejects:
            log.add(rej)
        for inp in files:
            yield from _ingest_file(inp, opts, seen, force, log, reports, batcher, bar.update)
        last = batcher.flush()
        if last is not None:
            yield last

    try:
        fragments = _write_fragments(uri, existing, batches())
    finally:
        bar.close()
        log.close()
    rows = batcher.next_id - start_id
    result = IngestResult(
        table=uri,
        rows_written=rows,
        rejected=dict(sorted(log.counts.items())),
        version=None,
        rejects_path=log.path,
        bytes_read=total_bytes,
        files=reports,
    )
    if rows == 0:
        result.seconds = time.perf_counter() - started
        if reports and all(r.skipped for r in reports):
            return result  # everything was ingested before: nothing to do, not an error
        raise IngestError(_nothing_read_message(n_paths, result))
    target = existing if existing is not None else Table.create(uri, exist_ok=True)
    props = {
        NEXT_ID_KEY: str(batcher.next_id),
        FILES_KEY: [[r.fingerprint, r.path, r.rows] for r in reports if r.rows and not r.skipped],
        "tokenloom.rejected": result.rejected,
        "tokenloom.rows": str(rows),
    }
    import lance

    committed = target.commit(
        lance.LanceOperation.Append(fragments),
        op="ingest",
        message=f"ingest {rows} rows from {len(reports)} files",
        properties=props,
        read_version=target.version,
    )
    result.version = committed.version
    result.first_id, result.last_id = start_id, batcher.next_id - 1
    result.seconds = time.perf_counter() - started
    return result


def _ingest_file(
    inp: InputFile,
    opts: ReadOptions,
    seen: dict[str, int],
    force: bool,
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
            size = os.path.getsize(inp.path)
            if size > opts.max_doc_bytes:
                _reject(
                    log,
                    report,
                    Reject(
                        file=inp.path,
                        reason=Reason.TOO_LARGE,
                        detail=f"{size} bytes > max_doc_bytes",
                    ),
                )
                advance(size)
                return
            with open(inp.path, "rb") as fh:
                data = fh.read()
            report.fingerprint = fingerprint_bytes(data)
        else:
            report.fingerprint = fingerprint_file(inp.path)
    except OSError as exc:
        _reject(log, report, Reject(file=inp.path, reason=Reason.UNREADABLE_FILE, detail=str(exc)))
        return
    if not force and report.fingerprint in seen:
        report.skipped = True
        advance(_size(inp.path))
        return
    seen[report.fingerprint] = -1  # the same content twice in one run is read once
    for item in read_input(inp, opts, advance, data):
        if isinstance(item, Reject):
            _reject(log, report, item)
            continue
        report.rows += 1
        batch = batcher.add(*item)
        if batch is not None:
            yield batch


def _reject(log: RejectLog, report: FileReport, rej: Reject) -> None:
    log.add(rej)
    report.rejected += rej.count


def _write_fragments(uri: str, existing: Table | None, batches: Iterator[pa.RecordBatch]) -> list:
    """Write batches as uncommitted fragments; nothing is visible until the commit."""
    from lance.fragment import write_fragments

    if existing is None:
        # Fragments must be written under the table's URI; create it empty first only when
        # there is something to write, so a run that reads nothing leaves no table behind.
        first = next(batches, None)
        if first is None:
            return []
        Table.create(uri, exist_ok=True)
        batches = _chain(first, batches)
    reader = pa.RecordBatchReader.from_batches(BASE_SCHEMA, batches)
    return write_fragments(reader, uri, schema=BASE_SCHEMA, max_rows_per_file=_ROWS_PER_FRAGMENT)


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _nothing_read_message(n_paths: int, result: IngestResult) -> str:
    counts = ", ".join(f"{k}={v}" for k, v in result.rejected.items()) or "no records found"
    where = f"; every rejection is listed in {result.rejects_path}" if result.rejects_path else ""
    return (
        f"nothing could be ingested from {n_paths} input path(s) ({counts}){where}. "
        "Check the paths, --text-field and --glob"
    )
