"""Readers: one input file in, a stream of documents and rejections out.

Each reader yields either a ``(text, source, meta_json)`` tuple or a :class:`Reject`. They stream
(a JSONL file is read line by line, Parquet by row batch), so memory stays bounded by the largest
single record, and a broken record never stops the records after it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from tokenloom.ingest.inputs import InputFile
from tokenloom.ingest.rejects import Reason, Reject, excerpt_of

__all__ = ["ReadOptions", "Doc", "read_input", "check_text"]

Doc = tuple[str, str, str]
"""A document: (text, source, meta as JSON text)."""

Progress = Callable[[int], None]

_SURROGATES = re.compile("[\ud800-\udfff]")
_NUL_PROBE = 1 << 16


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How records are read and validated."""

    text_field: str = "text"
    """Field (JSONL key or Parquet column) holding the document text."""
    source: str | None = None
    """Source name forced on every row; default: the record's ``source`` field, else the file
    stem (or the directory name for text directories)."""
    errors: str = "strict"
    """``"strict"`` rejects invalid UTF-8 / lone surrogates; ``"replace"`` keeps the document with
    U+FFFD in place of the bad bytes."""
    max_doc_bytes: int = 512 << 20
    """Records larger than this are rejected as ``too_large`` (a record is a JSONL line, a Parquet
    cell or a text file)."""

    def __post_init__(self) -> None:
        if self.errors not in ("strict", "replace"):
            raise ValueError(f"errors must be 'strict' or 'replace', not {self.errors!r}")
        if self.max_doc_bytes <= 0:
            raise ValueError(f"max_doc_bytes must be positive, not {self.max_doc_bytes}")


def check_text(value: Any, opts: ReadOptions) -> tuple[str | None, str, str]:
    """Validate a text value.

    Returns:
        ``(text, "", "")`` when valid (with surrogates replaced under ``errors="replace"``), else
        ``(None, reason, detail)``.
    """
    if value is None:
        return None, Reason.NULL_TEXT, ""
    if not isinstance(value, str):
        return None, Reason.NON_STRING_TEXT, f"text is {type(value).__name__}"
    if not value or value.isspace():
        return None, Reason.EMPTY_TEXT, f"{len(value)} whitespace characters"
    return value, "", ""


def _fix_surrogates(text: str, opts: ReadOptions) -> tuple[str | None, str]:
    """Return the text encodable as UTF-8, or (None, detail) under strict errors."""
    match = _SURROGATES.search(text)
    if match is None:
        return text, ""
    if opts.errors == "replace":
        return _SURROGATES.sub("\ufffd", text), ""
    return None, f"lone surrogate U+{ord(match.group()):04X} at character {match.start()}"


def _meta_json(meta: dict[str, Any], *, check: bool = True) -> str:
    text = json.dumps(meta, ensure_ascii=False, sort_keys=True, default=str)
    if check and _SURROGATES.search(text):
        text = json.dumps(meta, ensure_ascii=True, sort_keys=True, default=str)
    return text


class TruncatedInput(Exception):
    """A compressed stream ended before its end marker (the file is cut or corrupt)."""


def _decompressed_chunks(raw: BinaryIO, compression: str, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Decompress a gzip (multi-member) or zstd (multi-frame) file chunk by chunk.

    Unlike ``gzip.GzipFile``, every byte that can be decoded is yielded before a truncation is
    reported, so the records before a break are never lost.

    Raises:
        TruncatedInput: after the last decodable chunk, when the stream is cut short.
        zlib.error / zstandard.ZstdError: on corrupt data.
    """
    if compression == ".gz":
        import zlib

        def new() -> Any:
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
    else:
        import zstandard

        def new() -> Any:
            return zstandard.ZstdDecompressor().decompressobj()

    dec = new()
    pending = b""
    while True:
        data = pending or raw.read(chunk)
        pending = b""
        if not data:
            break
        out = dec.decompress(data)
        if out:
            yield out
        if dec.eof:
            pending = dec.unused_data
            dec = new()
            if not pending:
                # Possibly the end: a new member/frame starts only if more bytes follow.
                pending = raw.read(chunk)
                if not pending:
                    return
    if not dec.eof:
        raise TruncatedInput("compressed stream ended before its end marker (truncated file)")


def _lines(raw: BinaryIO, compression: str) -> Iterator[bytes]:
    """Lines (with their newline) of a plain or compressed file, streaming."""
    if not compression:
        yield from raw
        return
    parts: list[bytes] = []
    for chunk in _decompressed_chunks(raw, compression):
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                if start < len(chunk):
                    parts.append(chunk[start:])
                break
            parts.append(chunk[start : end + 1])
            yield b"".join(parts)
            parts = []
            start = end + 1
    if parts:
        yield b"".join(parts)


def read_jsonl(inp: InputFile, opts: ReadOptions, progress: Progress) -> Iterator[Doc | Reject]:
    """Read a JSONL file (optionally .gz/.zst), one JSON object per line."""
    try:
        raw = open(inp.path, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        yield Reject(file=inp.path, reason=Reason.UNREADABLE_FILE, detail=str(exc))
        return
    field = opts.text_field
    line_no = 0
    offset = 0
    last_pos = 0
    lines = _lines(raw, inp.compression)
    try:
        while True:
            try:
                line = next(lines, None)
            except Exception as exc:  # truncated/corrupt stream: zlib.error, ZstdError, OSError
                yield _read_error(inp, exc, line_no + 1, offset)
                return
            if line is None:
                break
            line_no += 1
            start = offset
            offset += len(line)
            if line_no % 1024 == 0:
                pos = raw.tell()
                progress(pos - last_pos)
                last_pos = pos
            item = _parse_line(line, inp, opts, field, line_no, start)
            if item is not None:
                yield item
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
    line: bytes, inp: InputFile, opts: ReadOptions, field: str, line_no: int, start: int
) -> Doc | Reject | None:
    def reject(reason: str, detail: str, at: int = 0) -> Reject:
        return Reject(
            file=inp.path,
            reason=reason,
            line=line_no,
            offset=start + at,
            detail=detail,
            excerpt=excerpt_of(line),
        )

    if len(line) > opts.max_doc_bytes:
        return reject(Reason.TOO_LARGE, f"{len(line)} bytes > max_doc_bytes {opts.max_doc_bytes}")
    if not line.strip():
        return None  # a blank line is not a record
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
    try:
        obj = json.loads(decoded)
    except (json.JSONDecodeError, RecursionError) as exc:
        return reject(Reason.INVALID_JSON, str(exc)[:200])
    if not isinstance(obj, dict):
        return reject(Reason.NOT_AN_OBJECT, f"line is a JSON {type(obj).__name__}")
    if field not in obj:
        keys = ", ".join(sorted(obj)[:8])
        return reject(Reason.MISSING_TEXT, f"no {field!r} key (keys: {keys}); pass --text-field")
    text, reason, detail = check_text(obj.pop(field), opts)
    # Valid UTF-8 decodes to a str without surrogates; only a \\uD8xx-\\uDFxx escape makes one.
    escaped = b"\\ud" in line or b"\\uD" in line
    if text is not None and escaped:
        text, detail = _fix_surrogates(text, opts)
        reason = Reason.INVALID_UNICODE
    if text is None:
        return reject(reason, detail)
    source = opts.source
    if source is None:
        rec_source = obj.pop("source", None)
        source = rec_source if isinstance(rec_source, str) and rec_source else inp.default_source
        if rec_source is not None and source is not rec_source:
            obj["source"] = rec_source  # keep an unusable source value in meta, not lost
    obj["_file"] = inp.relpath
    obj["_line"] = line_no
    return text, source, _meta_json(obj, check=escaped)


def read_parquet(inp: InputFile, opts: ReadOptions, progress: Progress) -> Iterator[Doc | Reject]:
    """Read a Parquet file by row batches; the text column may be string or binary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(inp.path)
    except (OSError, pa.ArrowException) as exc:
        yield Reject(file=inp.path, reason=Reason.UNREADABLE_FILE, detail=str(exc)[:300])
        return
    n_rows = pf.metadata.num_rows
    field = opts.text_field
    if field not in pf.schema_arrow.names:
        yield Reject(
            file=inp.path,
            reason=Reason.MISSING_TEXT,
            count=max(n_rows, 1),
            detail=f"no {field!r} column (columns: {', '.join(pf.schema_arrow.names[:8])}); "
            "pass --text-field",
        )
        return
    size = _file_size(inp.path)
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=2048):
            columns = batch.schema.names
            texts = batch.column(field)
            is_binary = pa.types.is_binary(texts.type) or pa.types.is_large_binary(texts.type)
            values = texts.to_pylist() if is_binary else _strings_or_bytes(texts)
            others = {name: batch.column(name).to_pylist() for name in columns if name != field}
            for i, value in enumerate(values):
                item = _parquet_row(value, inp, opts, row + i, others, i)
                if item is not None:
                    yield item
            row += batch.num_rows
            progress(int(size * batch.num_rows / max(n_rows, 1)))
    except (OSError, pa.ArrowException) as exc:
        yield Reject(
            file=inp.path,
            reason=Reason.READ_ERROR,
            row=row,
            detail=f"{type(exc).__name__}: {str(exc)[:200]}; rows before this point were kept",
        )


def _strings_or_bytes(arr: Any) -> list[Any]:
    """Python values of a string column; invalid UTF-8 cells come back as bytes."""
    import pyarrow as pa

    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        return arr.to_pylist()
    try:
        arr.validate(full=True)
        return arr.to_pylist()
    except pa.ArrowInvalid:
        binary = arr.cast(pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary())
        return binary.to_pylist()


def _parquet_row(
    value: Any, inp: InputFile, opts: ReadOptions, row: int, others: dict[str, list[Any]], i: int
) -> Doc | Reject:
    if isinstance(value, bytes):
        if len(value) > opts.max_doc_bytes:
            return _row_reject(inp, row, Reason.TOO_LARGE, f"{len(value)} bytes", value)
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            if opts.errors == "strict":
                return _row_reject(inp, row, Reason.INVALID_UTF8, exc.reason, value)
            value = value.decode("utf-8", errors="replace")
    elif isinstance(value, str) and len(value) > opts.max_doc_bytes // 4:
        nbytes = len(value.encode("utf-8", errors="surrogatepass"))
        if nbytes > opts.max_doc_bytes:
            return _row_reject(inp, row, Reason.TOO_LARGE, f"{nbytes} bytes", value)
    text, reason, detail = check_text(value, opts)
    if text is not None:
        text, detail = _fix_surrogates(text, opts)
        reason = Reason.INVALID_UNICODE
    if text is None:
        return _row_reject(inp, row, reason, detail, value)
    meta = {name: col[i] for name, col in others.items() if name != "source"}
    source = opts.source
    if source is None:
        rec_source = others["source"][i] if "source" in others else None
        source = rec_source if isinstance(rec_source, str) and rec_source else inp.default_source
    meta["_file"] = inp.relpath
    meta["_row"] = row
    return text, source, _meta_json(meta)


def _row_reject(inp: InputFile, row: int, reason: str, detail: str, value: Any) -> Reject:
    excerpt = excerpt_of(value) if isinstance(value, (bytes, str)) else repr(value)[:160]
    return Reject(file=inp.path, reason=reason, row=row, detail=detail, excerpt=excerpt)


def read_text_file(
    inp: InputFile, opts: ReadOptions, data: bytes, progress: Progress
) -> Iterator[Doc | Reject]:
    """One document from the bytes of one text file (already read, to fingerprint them)."""
    progress(len(data))
    if b"\x00" in data[:_NUL_PROBE] or (len(data) > _NUL_PROBE and b"\x00" in data):
        yield Reject(
            file=inp.path,
            reason=Reason.BINARY_FILE,
            offset=data.index(b"\x00"),
            detail="NUL byte found; not a text file",
            excerpt=excerpt_of(data),
        )
        return
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
    checked, reason, detail = check_text(text, opts)
    if checked is None:
        yield Reject(file=inp.path, reason=reason, offset=0, detail=detail)
        return
    source = opts.source or inp.default_source
    yield checked, source, _meta_json({"_file": inp.relpath})


def _file_size(path: str) -> int:
    import os

    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def read_input(
    inp: InputFile, opts: ReadOptions, progress: Progress, data: bytes | None = None
) -> Iterator[Doc | Reject]:
    """Dispatch to the reader of ``inp.kind``. ``data`` holds a text file's bytes."""
    if inp.kind == "jsonl":
        return read_jsonl(inp, opts, progress)
    if inp.kind == "parquet":
        return read_parquet(inp, opts, progress)
    if inp.kind == "text":
        assert data is not None, "text files are read (and fingerprinted) by the caller"
        return read_text_file(inp, opts, data, progress)
    raise ValueError(f"unknown input kind {inp.kind!r}")
