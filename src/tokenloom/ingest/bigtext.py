"""Big texts go from a record's bytes to Arrow without becoming a Python string.

A Python ``str`` of a text holding one character above U+FFFF takes four bytes per character, and
each step of the ordinary path (decode the line, parse the JSON, build the Arrow column) makes
one more: a 60 MB document would peak near ten times its size. For a record above
:data:`BIG_RECORD` bytes the text is decoded straight into a one-row Arrow ``large_string`` array
(Arrow's JSON parser for a JSONL line, a zero-copy view for a text file or a Parquet cell), so
the record costs about its size twice (its bytes, then the column) plus what the Lance writer
holds of it; the rest of the record (source, metadata, typed columns) still takes the ordinary
path, on a *skeleton* of the line in which the text is a placeholder.

Anything unusual (invalid UTF-8, lone surrogates, several big strings, an empty text, a
rejection) falls back to the ordinary path, which owns the rules and the reasons: the fast path
only ever produces what the ordinary path would.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa

__all__ = [
    "BIG_RECORD",
    "PLACEHOLDER",
    "BigJsonLine",
    "is_text_array",
    "split_big_json_line",
    "text_array",
]

BIG_RECORD = 1 << 20
"""Records (JSONL lines, text files, Parquet text cells) at least this large take the Arrow path;
below it, the ordinary path's copies are a few MiB at most."""

_BIG_STRING = 64 << 10
"""A JSON string at least this long (raw bytes) is a candidate for the text."""

_PIECE = 1 << 20
"""Raw bytes of a big JSON string decoded at a time (the transient cost of decoding it)."""

_NONCE = os.urandom(8).hex()
PLACEHOLDER = f"\x00tokenloom-big-text-{_NONCE}"
"""What the text reads as in the skeleton (a NUL and a per-process nonce: no record holds it)."""
_PLACEHOLDER_JSON = b'"\\u0000tokenloom-big-text-' + _NONCE.encode() + b'"'


def is_text_array(value: Any) -> bool:
    """Whether a document's text is a one-row Arrow array (the big-text path) rather than a str."""
    return isinstance(value, pa.Array)


class BigJsonLine:
    """A JSONL line whose one big string value was cut out: ``skeleton`` (the line with the
    placeholder in its place) and ``text`` (its decoded value as a one-row Arrow array)."""

    __slots__ = ("skeleton", "text")

    def __init__(self, skeleton: bytes, text: pa.Array) -> None:
        self.skeleton = skeleton
        self.text = text


def split_big_json_line(line: bytearray) -> BigJsonLine | None:
    """Cut the one string value longer than 64 KiB out of a JSONL line and decode it with Arrow.

    ``line`` is borrowed: a few bytes around the string are overwritten while Arrow reads it in
    place, and put back before returning.

    Returns:
        ``None`` when the line does not have exactly one such string value, or Arrow will not
        decode it to valid UTF-8 (a lone surrogate, invalid bytes): the ordinary path decides.
    """
    span = _one_big_string(line)
    if span is None:
        return None
    start, end = span  # the string's quotes: line[start] and line[end - 1]
    if start < 4 or end >= len(line):
        return None  # not inside an object
    skeleton = bytes(line[:start]) + _PLACEHOLDER_JSON + bytes(line[end:])
    text = _decode_in_pieces(line, start, end)
    if text is None:
        text = _decode_in_place(line, start, end)
    if text is None:
        return None
    return BigJsonLine(skeleton, text)


def _one_big_string(line: bytearray) -> tuple[int, int] | None:
    """The span (quotes included) of the only JSON string *value* of at least 64 KiB in
    ``line``, found by walking its quotes (outside strings, JSON has none), or ``None``."""
    found: tuple[int, int] | None = None
    find = line.find
    pos = 0
    while True:
        opening = find(b'"', pos)
        if opening < 0:
            return found
        close = opening + 1
        while True:  # the closing quote: one not escaped by an odd run of backslashes
            close = find(b'"', close)
            if close < 0:
                return None  # an unterminated string: not valid JSON
            back = close - 1
            while line[back] == 0x5C:
                back -= 1
            if (close - 1 - back) % 2 == 0:
                break
            close += 1
        pos = close + 1
        if pos - opening >= _BIG_STRING and not _is_key(line, pos):
            if found is not None:
                return None  # two big strings: which one is the text is for the parser to say
            found = (opening, pos)


def _is_key(line: bytearray, after: int) -> bool:
    """Whether the string ending before ``after`` is an object key (a colon follows)."""
    n = len(line)
    while after < n and line[after] in b" \t\r\n":
        after += 1
    return after < n and line[after] == 0x3A


def _decode_in_pieces(line: bytearray, start: int, end: int) -> pa.Array | None:
    """The JSON string ``line[start:end]`` decoded piece by piece (at most :data:`_PIECE` raw
    bytes each, cut before an escape) into one growing buffer: the line plus the text at most.

    Returns ``None`` when no safe cut is found or a piece does not decode (the caller then
    decodes the string whole, or leaves the line to the ordinary path).
    """
    content_end = end - 1
    out = bytearray()
    pos = start + 1
    while pos < content_end:
        cut = content_end if content_end - pos <= _PIECE else _cut(line, pos, pos + _PIECE)
        if cut is None:
            return None
        piece = _decode_piece(b'{"":"' + line[pos:cut] + b'"}')
        if piece is None:
            return None
        out += piece
        pos = cut
    return text_array(out)


def _cut(line: bytearray, pos: int, limit: int) -> int | None:
    """A place in ``line[pos + 1 : limit]`` (inside a string's content) to cut it without
    splitting an escape, a surrogate pair or a UTF-8 sequence: the start of the last run of
    backslashes that does not begin a low surrogate, else ``limit`` moved off continuation
    bytes when the window holds no escape."""
    back = line.rfind(b"\\", pos + 1, limit)
    if back < 0:
        cut = limit
        while cut > pos + 1 and 0x80 <= line[cut] < 0xC0:
            cut -= 1
        return cut if cut > pos + 1 else None
    while back > pos:
        run = back
        while line[run - 1] == 0x5C:
            run -= 1
        if run <= pos:
            return None
        low = line[run + 1] == 0x75 and line[run + 2] in b"dD" and line[run + 3] in b"cdefCDEF"
        if not low:
            return run
        back = line.rfind(b"\\", pos + 1, run)
    return None


def _decode_piece(data: bytes) -> pa.Buffer | None:
    """The UTF-8 bytes of the one-field JSON object ``data``'s string, or ``None``."""
    import pyarrow.json as pj

    try:
        table = pj.read_json(
            pa.BufferReader(data),
            read_options=pj.ReadOptions(block_size=len(data) + 1, use_threads=False),
            parse_options=pj.ParseOptions(explicit_schema=pa.schema([("", pa.large_string())])),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != 1 or table.column(0).null_count:
        return None
    return table.column(0)[0].as_buffer()


def _decode_in_place(line: bytearray, start: int, end: int) -> pa.Array | None:
    """The JSON string ``line[start:end]`` decoded by Arrow's JSON parser, read in place as the
    one-field object ``{"":STRING}`` (written over the four bytes before it and the one after)."""
    import pyarrow.json as pj

    before, after = bytes(line[start - 4 : start]), line[end]
    line[start - 4 : start] = b'{"":'
    line[end] = 0x7D  # }
    try:
        buf = pa.py_buffer(memoryview(line)[start - 4 : end + 1])
        table = pj.read_json(
            pa.BufferReader(buf),
            read_options=pj.ReadOptions(block_size=len(buf) + 1, use_threads=False),
            parse_options=pj.ParseOptions(explicit_schema=pa.schema([("", pa.large_string())])),
        )
        del buf
        column = table.column(0)
        if table.num_rows != 1 or column.null_count or column.num_chunks != 1:
            return None
        array = column.chunk(0)
        array.validate(full=True)  # Arrow's parser passes invalid UTF-8 through
        return array
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OverflowError, ValueError):
        return None
    finally:
        line[start - 4 : start] = before
        line[end] = after


def text_array(data: Any) -> pa.Array | None:
    """A zero-copy one-row ``large_string`` array over ``data`` (an Arrow buffer, or anything
    with the buffer protocol), or ``None`` when it is not valid UTF-8 (the ordinary path says
    why)."""
    import numpy as np

    buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    offsets = pa.py_buffer(np.array([0, len(buf)], dtype=np.int64))
    array = pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, buf])
    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return array
