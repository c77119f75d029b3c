"""Readers: one input file in, a stream of documents, rejections and notes out.

Each reader yields either a ``(text, source, meta_json)`` tuple or a :class:`Reject` (a note on
the document that follows when ``kept``). They stream — a JSONL file line by line with a bounded
``readline``, Parquet one row group at a time — so memory stays bounded by ``max_doc_bytes``, and
a broken record, page or row group never stops the records after it. Each reader also counts the
records it saw in a :class:`Tally`, independently of what became of them, so a run can check
``rows + rejected + skipped == records seen``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tokenloom.ingest.bigtext import (
    BIG_RECORD,
    PLACEHOLDER,
    is_text_array,
    split_big_json_line,
    text_array,
)
from tokenloom.ingest.columns import BadColumnValue, ColumnSpec, convert
from tokenloom.ingest.fieldpath import Missing, ParquetPath, drop_path, parquet_path, take_path
from tokenloom.ingest.inputs import InputFile, open_regular
from tokenloom.ingest.rejects import Note, Reason, Reject, excerpt_of
from tokenloom.ingest.streams import StreamError, open_lines
from tokenloom.ingest.values import BadValue, BigInt, clean_string, load_json, meta_json

__all__ = [
    "ReadOptions",
    "Doc",
    "Tally",
    "add_provenance",
    "read_input",
    "check_text",
    "cell_values",
]

Doc = tuple[Any, str, str, tuple]
"""A document: (text, source, meta as JSON text, values of the typed columns). The text is a
``str``, or for a record of :data:`~tokenloom.ingest.bigtext.BIG_RECORD` bytes or more a one-row
Arrow ``large_string`` array that never became a Python string."""

Progress = Callable[[int], None]

_NUL_PROBE = 1 << 16
_PARQUET_BATCH_ROWS = 2048
_PARQUET_BATCH_BYTES = 64 << 20  # a row group of large blobs is read a few rows at a time
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How records are read and validated."""

    text_field: str = "text"
    """Field (JSONL key or Parquet column) holding the document text; a dotted path
    (``doc.text``) reaches into nested objects and structs (:mod:`tokenloom.ingest.fieldpath`)."""
    source: str | None = None
    """Source name forced on every row; default: the record's ``source_field``, else the file
    stem (or the directory name for text directories)."""
    source_field: str = "source"
    """Field (JSONL key or column) whose string value is a record's source name."""
    errors: str = "strict"
    """``"strict"`` rejects invalid UTF-8 / lone surrogates in any field; ``"replace"`` keeps
    the record with U+FFFD in place of the bad bytes (noted)."""
    max_doc_bytes: int = 512 << 20
    """Records larger than this are rejected as ``too_large`` (a record is a JSONL line, a Parquet
    cell or a text file); they are skipped while reading, never held in memory."""
    columns: tuple[ColumnSpec, ...] = ()
    """Fields stored in typed columns instead of ``meta`` (kinds resolved), in column order."""

    def __post_init__(self) -> None:
        if self.errors not in ("strict", "replace"):
            raise ValueError(f"errors must be 'strict' or 'replace', not {self.errors!r}")
        if self.max_doc_bytes <= 0:
            raise ValueError(f"max_doc_bytes must be positive, not {self.max_doc_bytes}")


@dataclass
class Tally:
    """Records a reader saw in one file (a file-level rejection counts its ``count``)."""

    records: int = 0


def check_text(value: Any, opts: ReadOptions) -> tuple[str | None, str, str]:
    """Validate a text value's type and content (not its encoding).

    Returns:
        ``(text, "", "")`` when valid, else ``(None, reason, detail)``.
    """
    if value is None:
        return None, Reason.NULL_TEXT, ""
    if isinstance(value, BigInt):
        return None, Reason.NON_STRING_TEXT, f"text is an int of {len(value)} digits"
    if not isinstance(value, str):
        return None, Reason.NON_STRING_TEXT, f"text is {type(value).__name__}"
    if not value or value.isspace():
        return None, Reason.EMPTY_TEXT, f"{len(value)} whitespace characters"
    return value, "", ""


def _notes(inp: InputFile, notes: set[str], **where: Any) -> Iterator[Reject]:
    for note in sorted(notes):
        yield Reject(file=inp.path, reason=note, **where)


def read_jsonl(
    inp: InputFile, opts: ReadOptions, progress: Progress, tally: Tally
) -> Iterator[Doc | Reject]:
    """Read a JSONL file (optionally .gz/.zst), one JSON object per line."""
    try:
        raw = open_regular(inp.path, inp.storage_options)
    except OSError as exc:
        tally.records += 1
        yield Reject(file=inp.path, reason=Reason.UNREADABLE_FILE, detail=str(exc))
        return
    line_no = 0
    offset = 0
    last_pos = 0
    lines = open_lines(raw, inp.compression, opts.max_doc_bytes)
    it = iter(lines)
    try:
        while True:
            try:
                nxt = next(it, None)
            except (StreamError, OSError, EOFError) as exc:  # the stream broke (truncated/corrupt)
                tally.records += 1
                yield _read_error(inp, exc, line_no + 1, offset)
                break
            if nxt is None:
                break
            line, nbytes = nxt
            line_no += 1
            start = offset
            offset += nbytes
            if line_no % 1024 == 0:
                pos = raw.tell()
                progress(pos - last_pos)
                last_pos = pos
            if line_no == 1 and line is not None and line.startswith(_BOM):
                del line[: len(_BOM)]  # a BOM is not content
                start += len(_BOM)
            if line is not None and (not line or line.isspace()):
                continue  # a blank line is not a record (checked without a stripped copy)
            tally.records += 1
            notes: set[str] = set()
            item = _parse_line(line, nbytes, inp, opts, line_no, start, notes)
            nxt = line = None  # a big line is not held while its document is written
            if notes and not isinstance(item, Reject):
                yield from _notes(inp, notes, line=line_no, offset=start)
            yield item
        for problem in lines.problems:
            yield Reject(file=inp.path, reason=Note.CHECKSUM_MISMATCH, detail=problem)
        progress(raw.tell() - last_pos)
    finally:
        raw.close()


def _read_error(inp: InputFile, exc: BaseException, line: int, offset: int) -> Reject:
    return Reject(
        file=inp.path,
        reason=Reason.READ_ERROR,
        line=line,
        offset=offset,
        detail=f"{type(exc).__name__}: {exc}; records before this point were kept",
    )


def _parse_line(
    line: bytearray | None,
    nbytes: int,
    inp: InputFile,
    opts: ReadOptions,
    line_no: int,
    start: int,
    notes: set[str],
) -> Doc | Reject:
    if line is not None and len(line) >= BIG_RECORD:
        doc = _parse_big_line(line, inp, opts, line_no, start, notes)
        if doc is not None:
            return doc
        notes.clear()
    return _parse_record(line, nbytes, inp, opts, line_no, start, notes)


def _parse_big_line(
    line: bytearray, inp: InputFile, opts: ReadOptions, line_no: int, start: int, notes: set[str]
) -> Doc | None:
    """A big line's document with its text as an Arrow array (:mod:`tokenloom.ingest.bigtext`),
    or ``None``: then the ordinary path reads it (and gives any rejection its reason)."""
    cut = split_big_json_line(line)
    if cut is None:
        return None
    item = _parse_record(cut.skeleton, len(cut.skeleton), inp, opts, line_no, start, notes)
    if isinstance(item, Reject) or item[0] != PLACEHOLDER:
        return None  # a rejection, or the big string was not the text
    _, source, meta, typed = item
    held = (source, meta, *(v for v in typed if isinstance(v, str)))
    if any(PLACEHOLDER[1:] in v for v in held) or _blank(cut.text):
        return None
    return cut.text, source, meta, typed


def _blank(text: Any) -> bool:
    """Whether a one-row Arrow text is whitespace only (``str.isspace`` for the ordinary path)."""
    import pyarrow.compute as pc

    return bool(pc.utf8_is_space(text)[0].as_py())


def _parse_record(
    line: bytes | bytearray | None,
    nbytes: int,
    inp: InputFile,
    opts: ReadOptions,
    line_no: int,
    start: int,
    notes: set[str],
) -> Doc | Reject:
    def reject(reason: str, detail: str, at: int = 0) -> Reject:
        return Reject(
            file=inp.path,
            reason=reason,
            line=line_no,
            offset=start + at,
            detail=detail,
            excerpt=excerpt_of(line or b""),
        )

    if line is None:
        return reject(
            Reason.TOO_LARGE, f"{nbytes} bytes > max_doc_bytes {opts.max_doc_bytes}; not read"
        )
    try:
        decoded = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        if opts.errors == "strict":
            return reject(
                Reason.INVALID_UTF8,
                f"{exc.reason} at byte {exc.start} of the line; --errors replace keeps it",
                exc.start,
            )
        decoded = line.decode("utf-8", errors="replace")
        notes.add(Note.REPLACED_INVALID_UTF8)
    field = opts.text_field
    try:
        obj = load_json(decoded, notes)
        if not isinstance(obj, dict):
            return reject(Reason.NOT_AN_OBJECT, f"line is a JSON {type(obj).__name__}")
        value = take_path(obj, field)
        if isinstance(value, Missing):
            return reject(Reason.MISSING_TEXT, value.detail)
        text, reason, detail = check_text(value, opts)
        if text is None:
            return reject(reason, detail)
        text = clean_string(text, opts.errors, f"the {field!r} field", notes)
        source = opts.source
        if source is None:
            key = opts.source_field
            rec_source = obj.pop(key, None)
            if isinstance(rec_source, str) and rec_source and not isinstance(rec_source, BigInt):
                source = clean_string(rec_source, opts.errors, f"the {key!r} field", notes)
            else:
                source = inp.default_source
                if rec_source is not None:
                    obj[key] = rec_source  # keep an unusable source value in meta, not lost
        typed = tuple(_typed_value(obj.pop(c.name, None), c, opts, notes) for c in opts.columns)
        add_provenance(obj, notes, inp, _line=line_no)
        return text, source, meta_json(obj, opts.errors, notes), typed
    except BadValue as bad:
        return reject(bad.reason, bad.detail)


def add_provenance(meta: dict[str, Any], notes: set[str], inp: InputFile, **where: int) -> dict:
    """Add where a record came from to its ``meta``: ``_file`` (the input's relative path),
    ``where`` (``_line`` of a JSONL line, ``_row`` of a Parquet/Arrow row) and ``_split`` (a
    Hugging Face split). The same rule for every reader: the record's own fields win — a key the
    record already holds keeps the record's value, and ingest's goes under the key with one more
    leading ``_`` (``__file``, else ``___file``...), counted as a ``provenance_renamed`` note.

    Returns:
        ``meta`` (changed in place).
    """
    ours: dict[str, Any] = {"_file": inp.relpath, **where}
    if inp.split:
        ours["_split"] = inp.split
    for key, value in ours.items():
        name = key
        while name in meta:
            name = "_" + name
        if name != key:
            notes.add(Note.PROVENANCE_RENAMED)
        meta[name] = value
    return meta


def _typed_value(value: Any, column: ColumnSpec, opts: ReadOptions, notes: set[str]) -> Any:
    """A field's value converted to its typed column.

    Raises:
        BadValue: ``bad_column_value`` naming the field, or an encoding reason for strings.
    """
    assert column.kind is not None
    if isinstance(value, _BadCell):
        value = _meta_cell(value, column.name, opts, notes)
    if isinstance(value, BigInt):
        value = int(value) if column.kind == "float" else str(value)
    try:
        out = convert(value, column.kind, column.arrow)
    except BadColumnValue as exc:
        raise BadValue(Reason.BAD_COLUMN_VALUE, f"field {column.name!r}: {exc}") from None
    if isinstance(out, str):
        out = clean_string(out, opts.errors, f"field {column.name!r}", notes)
    return out


def read_parquet(
    inp: InputFile, opts: ReadOptions, progress: Progress, tally: Tally
) -> Iterator[Doc | Reject]:
    """Read a Parquet file one row group at a time; the text column may be string or binary.

    A row group that cannot be read (a corrupt page, a bad encoding) is rejected as
    ``read_error`` with its row count; every other row group is kept.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        fh = open_regular(inp.path, inp.storage_options)
    except OSError as exc:
        tally.records += 1
        yield Reject(file=inp.path, reason=Reason.UNREADABLE_FILE, detail=str(exc))
        return
    with fh:
        try:
            pf = pq.ParquetFile(fh)
            n_rows = pf.metadata.num_rows
            names = pf.schema_arrow.names
        except Exception as exc:  # noqa: BLE001 - any footer/schema failure: the file is unreadable
            tally.records += 1
            detail = f"{type(exc).__name__}: {str(exc)[:300]}"
            yield Reject(file=inp.path, reason=Reason.UNREADABLE_FILE, detail=detail)
            return
        path = parquet_path(names, pf.schema_arrow.types, opts.text_field)
        if not isinstance(path, ParquetPath):
            tally.records += max(n_rows, 1)
            reason = Reason.DUPLICATE_TEXT_FIELD if "rename" in path else Reason.MISSING_TEXT
            yield Reject(file=inp.path, reason=reason, count=max(n_rows, 1), detail=path)
            return
        tally.records += n_rows
        size = _file_size(fh)
        row = 0
        for group in range(pf.num_row_groups):
            group_rows = pf.metadata.row_group(group).num_rows
            done = 0
            batches = pf.iter_batches(
                batch_size=_batch_rows(pf.metadata.row_group(group)),
                row_groups=[group],
                use_threads=False,
            )
            while True:
                try:
                    batch = next(batches, None)
                except (OSError, pa.ArrowException, ValueError, TypeError, MemoryError) as exc:
                    yield Reject(
                        file=inp.path,
                        reason=Reason.READ_ERROR,
                        row=row + done,
                        count=max(group_rows - done, 1),
                        detail=f"row group {group}: {type(exc).__name__}: {str(exc)[:200]}; "
                        "the other row groups were kept",
                    )
                    break
                if batch is None:
                    break
                yield from _parquet_batch(batch, path, inp, opts, row + done)
                done += batch.num_rows
            row += group_rows
            progress(int(size * group_rows / max(n_rows, 1)))


def _batch_rows(group: Any) -> int:
    """Rows per batch read of a Parquet row group: up to 2048, fewer when its rows are large (by
    the group's uncompressed size), so a group of 50 MB blobs is not turned into Python bytes
    all at once."""
    per_row = group.total_byte_size / max(group.num_rows, 1)
    return int(max(1, min(_PARQUET_BATCH_ROWS, _PARQUET_BATCH_BYTES // max(per_row, 1))))


def read_arrow(
    inp: InputFile, opts: ReadOptions, progress: Progress, tally: Tally
) -> Iterator[Doc | Reject]:
    """Read an Arrow IPC file (the stream format ``datasets.save_to_disk`` writes, or the file
    format) one record batch at a time, as Parquet rows are read.

    A batch that cannot be read ends the file as ``read_error`` (a stream has no index to skip
    to); the rows before it are kept.
    """
    import pyarrow as pa

    try:
        fh = open_regular(inp.path, inp.storage_options)
    except OSError as exc:
        tally.records += 1
        yield Reject(file=inp.path, reason=Reason.UNREADABLE_FILE, detail=str(exc))
        return
    with fh:
        size = _file_size(fh)
        try:
            reader = pa.ipc.open_stream(fh)
        except pa.ArrowInvalid:
            try:
                fh.seek(0)
                reader = pa.ipc.open_file(fh)
            except Exception as exc:  # noqa: BLE001 - neither IPC format: the file is unreadable
                tally.records += 1
                detail = f"not an Arrow IPC stream or file: {type(exc).__name__}: {exc}"[:300]
                yield Reject(file=inp.path, reason=Reason.UNREADABLE_FILE, detail=detail)
                return
        except Exception as exc:  # noqa: BLE001 - a broken header
            tally.records += 1
            detail = f"{type(exc).__name__}: {str(exc)[:300]}"
            yield Reject(file=inp.path, reason=Reason.UNREADABLE_FILE, detail=detail)
            return
        schema = reader.schema
        path = parquet_path(schema.names, schema.types, opts.text_field)
        batches = (
            (reader.get_batch(i) for i in range(reader.num_record_batches))
            if isinstance(reader, pa.ipc.RecordBatchFileReader)
            else iter(reader)
        )
        row = 0
        while True:
            try:
                batch = next(batches, None)
            except (OSError, pa.ArrowException, ValueError) as exc:
                tally.records += 1
                yield Reject(
                    file=inp.path,
                    reason=Reason.READ_ERROR,
                    row=row,
                    detail=f"{type(exc).__name__}: {str(exc)[:200]}; rows before it were kept",
                )
                break
            if batch is None:
                break
            tally.records += batch.num_rows
            if not isinstance(path, ParquetPath):
                reason = Reason.DUPLICATE_TEXT_FIELD if "rename" in path else Reason.MISSING_TEXT
                yield Reject(
                    file=inp.path, reason=reason, row=row, count=batch.num_rows, detail=path
                )
            elif batch.num_rows:
                yield from _parquet_batch(batch, path, inp, opts, row)
            row += batch.num_rows
        progress(size)


def read_lance(
    inp: InputFile, opts: ReadOptions, progress: Progress, tally: Tally
) -> Iterator[Doc | Reject]:
    """Read a Lance dataset (a LanceDB table's folder too) at the version ``inp.version``, one
    batch at a time, as Parquet rows are read; ``row`` is the position in that version's scan
    order. The dataset is only read: nothing is written to it."""
    import lance

    try:
        ds = lance.dataset(inp.path, version=inp.version)
        schema = ds.schema
        n_rows = ds.count_rows()
    except Exception as exc:  # noqa: BLE001 - any open failure: the dataset is unreadable
        tally.records += 1
        detail = f"not a readable Lance dataset: {type(exc).__name__}: {str(exc)[:300]}"
        yield Reject(file=inp.path, reason=Reason.UNREADABLE_FILE, detail=detail)
        return
    path = parquet_path(schema.names, schema.types, opts.text_field)
    if not isinstance(path, ParquetPath):
        tally.records += max(n_rows, 1)
        reason = Reason.DUPLICATE_TEXT_FIELD if "rename" in path else Reason.MISSING_TEXT
        yield Reject(file=inp.path, reason=reason, count=max(n_rows, 1), detail=path)
        return
    tally.records += n_rows
    row = 0
    for batch in ds.to_batches(batch_size=2048):
        yield from _parquet_batch(batch, path, inp, opts, row)
        row += batch.num_rows
        progress(int(max(inp.size, 0) * batch.num_rows / max(n_rows, 1)))


class _BadCell(bytes):
    """A cell of a string column that is not valid UTF-8 (its raw bytes, maybe empty)."""


def cell_values(arr: Any) -> list[Any]:
    """Python values of an Arrow column; cells that are not valid UTF-8 become :class:`_BadCell`."""
    import pyarrow as pa

    try:
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            try:
                arr.validate(full=True)
            except pa.ArrowInvalid:
                binary = pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary()
                raw = arr.cast(binary).to_pylist()
                return [_cell(v) for v in raw]
        return arr.to_pylist()
    except Exception:  # noqa: BLE001 - an odd type or a nested invalid string: cell by cell
        out: list[Any] = []
        for i in range(len(arr)):
            try:
                out.append(arr[i].as_py())
            except Exception:  # noqa: BLE001
                out.append(_BadCell(b""))
        return out


def _text_values(arr: Any) -> list[Any]:
    """:func:`cell_values` of the text column, except that a valid UTF-8 cell of
    :data:`~tokenloom.ingest.bigtext.BIG_RECORD` bytes or more stays a one-row Arrow array (no
    Python string of it is ever made; see :mod:`tokenloom.ingest.bigtext`)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
            or pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):  # fmt: skip
        return cell_values(arr)
    big = pc.fill_null(pc.greater_equal(pc.binary_length(arr), BIG_RECORD), False)
    if not pc.any(big).as_py():
        return cell_values(arr)
    rest = iter(cell_values(arr.filter(pc.invert(big))))  # the small cells only: no big copy
    flags = big.to_pylist()
    values: list[Any] = [None if flag else next(rest) for flag in flags]
    for i in pc.indices_nonzero(big).to_pylist():
        cell = arr.slice(i, 1)
        wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
        offsets = np.frombuffer(cell.buffers()[1], dtype=np.int64 if wide else np.int32)
        start, end = int(offsets[cell.offset]), int(offsets[cell.offset + 1])
        view = text_array(cell.buffers()[2].slice(start, end - start))  # the cell's bytes, shared
        values[i] = view if view is not None else cell_values(cell)[0]  # not UTF-8: the ordinary
    return values


def _cell(value: bytes | None) -> Any:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return _BadCell(value)


def _parquet_batch(
    batch: Any, path: ParquetPath, inp: InputFile, opts: ReadOptions, first_row: int
) -> Iterator[Doc | Reject]:
    import pyarrow.compute as pc

    text_index = path.column
    if path.children:  # a struct's field; a null parent makes a null text
        values = _text_values(pc.struct_field(batch.column(text_index), list(path.children)))
    else:
        values = _text_values(batch.column(text_index))
    others: list[tuple[str, list[Any]]] = []
    seen: dict[str, int] = {}
    typed_names = {c.name for c in opts.columns}
    typed: dict[str, list[Any]] = {}
    for i, name in enumerate(batch.schema.names):
        if i == text_index and not path.children:
            continue
        if name in typed_names and name not in typed:
            typed[name] = cell_values(batch.column(i))
            continue
        seen[name] = seen.get(name, 0) + 1
        key = name if seen[name] == 1 else f"{name}#{seen[name]}"  # duplicate column names
        cells = cell_values(batch.column(i))
        if i == text_index:  # the struct holding the text: the rest of it goes to meta
            cells = [drop_path(cell, path.children) for cell in cells]
        others.append((key, cells))
    for i, value in enumerate(values):
        notes: set[str] = set()
        item = _parquet_row(value, inp, opts, first_row + i, others, typed, i, notes)
        if notes and not isinstance(item, Reject):
            yield from _notes(inp, notes, row=first_row + i)
        yield item


def _parquet_row(
    value: Any,
    inp: InputFile,
    opts: ReadOptions,
    row: int,
    others: list[tuple[str, list[Any]]],
    typed: dict[str, list[Any]],
    i: int,
    notes: set[str],
) -> Doc | Reject:
    import pyarrow.compute as pc

    if is_text_array(value):  # a big cell, kept in Arrow (valid UTF-8 already)
        nbytes = pc.binary_length(value)[0].as_py()
        if nbytes > opts.max_doc_bytes:
            return _row_reject(inp, row, Reason.TOO_LARGE, f"{nbytes} bytes", _head(value))
        if _blank(value):
            return _row_reject(inp, row, Reason.EMPTY_TEXT, "whitespace only", _head(value))
        return _parquet_meta(value, inp, opts, row, others, typed, i, notes)
    if isinstance(value, bytes):
        if len(value) > opts.max_doc_bytes:
            return _row_reject(inp, row, Reason.TOO_LARGE, f"{len(value)} bytes", value)
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            if opts.errors == "strict":
                return _row_reject(inp, row, Reason.INVALID_UTF8, exc.reason, value)
            value = value.decode("utf-8", errors="replace")
            notes.add(Note.REPLACED_INVALID_UTF8)
    elif isinstance(value, str) and len(value) > opts.max_doc_bytes // 4:
        nbytes = len(value.encode("utf-8", errors="surrogatepass"))
        if nbytes > opts.max_doc_bytes:
            return _row_reject(inp, row, Reason.TOO_LARGE, f"{nbytes} bytes", value)
    text, reason, detail = check_text(value, opts)
    if text is None:
        return _row_reject(inp, row, reason, detail, value)
    try:
        text = clean_string(text, opts.errors, f"column {opts.text_field!r}", notes)
    except BadValue as bad:
        return _row_reject(inp, row, bad.reason, bad.detail, value)
    return _parquet_meta(text, inp, opts, row, others, typed, i, notes)


def _head(text: Any) -> str:
    """The first characters of a one-row Arrow text (for an excerpt; the rest is not copied)."""
    import pyarrow.compute as pc

    return pc.utf8_slice_codeunits(text, 0, 160)[0].as_py()


def _parquet_meta(
    text: Any,
    inp: InputFile,
    opts: ReadOptions,
    row: int,
    others: list[tuple[str, list[Any]]],
    typed: dict[str, list[Any]],
    i: int,
    notes: set[str],
) -> Doc | Reject:
    """The document of a Parquet row whose text passed: source, meta and typed columns."""
    try:
        meta: dict[str, Any] = {}
        rec_source = None
        for name, column in others:
            cell = _meta_cell(column[i], name, opts, notes)
            if name == opts.source_field:
                rec_source = cell
            else:
                meta[name] = cell
        source = opts.source
        if source is None:
            if isinstance(rec_source, str) and rec_source:
                source = clean_string(
                    rec_source, opts.errors, f"column {opts.source_field!r}", notes
                )
            else:
                source = inp.default_source
        values = tuple(
            _typed_value(typed[c.name][i] if c.name in typed else None, c, opts, notes)
            for c in opts.columns
        )
        add_provenance(meta, notes, inp, _row=row)
        return text, source, meta_json(meta, opts.errors, notes), values
    except BadValue as bad:
        excerpt = text if isinstance(text, str) else _head(text)
        return _row_reject(inp, row, bad.reason, bad.detail, excerpt)


def _meta_cell(cell: Any, name: str, opts: ReadOptions, notes: set[str]) -> Any:
    if not isinstance(cell, _BadCell):
        return cell
    if opts.errors == "strict":
        raise BadValue(
            Reason.INVALID_UTF8, f"column {name!r} is not valid UTF-8; --errors replace keeps it"
        )
    notes.add(Note.REPLACED_INVALID_UTF8)
    return bytes(cell).decode("utf-8", errors="replace") if cell else None


def _row_reject(inp: InputFile, row: int, reason: str, detail: str, value: Any) -> Reject:
    excerpt = excerpt_of(value) if isinstance(value, (bytes, str)) else repr(value)[:160]
    return Reject(file=inp.path, reason=reason, row=row, detail=detail, excerpt=excerpt)


def read_text_file(
    inp: InputFile, opts: ReadOptions, data: bytes, progress: Progress, tally: Tally
) -> Iterator[Doc | Reject]:
    """One document from the bytes of one text file (already read, to fingerprint them)."""
    progress(len(data))
    tally.records += 1
    if b"\x00" in data[:_NUL_PROBE] or (len(data) > _NUL_PROBE and b"\x00" in data):
        yield Reject(
            file=inp.path,
            reason=Reason.BINARY_FILE,
            offset=data.index(b"\x00"),
            detail="NUL byte found; not a text file",
            excerpt=excerpt_of(data),
        )
        return
    notes: set[str] = set()
    checked: Any = None
    if len(data) >= BIG_RECORD:
        body = memoryview(data)[len(_BOM) :] if data.startswith(_BOM) else data
        big = text_array(body)  # a view of the file's bytes: no Python string, no copy
        if big is not None and not _blank(big):
            checked = big
    if checked is None:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            if opts.errors == "strict":
                yield Reject(
                    file=inp.path,
                    reason=Reason.INVALID_UTF8,
                    offset=exc.start,
                    detail=f"{exc.reason} at byte {exc.start}; --errors replace keeps it",
                    excerpt=excerpt_of(data),
                )
                return
            text = data.decode("utf-8-sig", errors="replace")
            notes.add(Note.REPLACED_INVALID_UTF8)
        checked, reason, detail = check_text(text, opts)
        if checked is None:
            yield Reject(file=inp.path, reason=reason, offset=0, detail=detail)
            return
    source = opts.source or inp.default_source
    try:
        meta = meta_json(add_provenance({}, notes, inp), opts.errors, notes)
    except BadValue as bad:  # pragma: no cover - relpath is made printable at discovery
        yield Reject(file=inp.path, reason=bad.reason, detail=bad.detail)
        return
    yield from _notes(inp, notes)
    yield checked, source, meta, (None,) * len(opts.columns)


def _file_size(fh: Any) -> int:
    import os

    try:
        return os.fstat(fh.fileno()).st_size
    except (OSError, AttributeError, ValueError):
        pass
    try:
        return int(getattr(fh, "raw", fh).size())  # an object-store input
    except (OSError, AttributeError, ValueError, TypeError):
        return 0


def read_input(
    inp: InputFile,
    opts: ReadOptions,
    progress: Progress,
    tally: Tally,
    data: bytes | None = None,
) -> Iterator[Doc | Reject]:
    """Dispatch to the reader of ``inp.kind``. ``data`` holds a text file's bytes."""
    if inp.kind == "jsonl":
        return read_jsonl(inp, opts, progress, tally)
    if inp.kind == "parquet":
        return read_parquet(inp, opts, progress, tally)
    if inp.kind == "arrow":
        return read_arrow(inp, opts, progress, tally)
    if inp.kind == "lance":
        return read_lance(inp, opts, progress, tally)
    if inp.kind == "text":
        assert data is not None, "text files are read (and fingerprinted) by the caller"
        return read_text_file(inp, opts, data, progress, tally)
    raise ValueError(f"unknown input kind {inp.kind!r}")
