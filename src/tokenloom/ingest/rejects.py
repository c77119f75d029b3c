"""Rejected input: the reasons, one record per rejection, and the log that counts them.

Every record ingest cannot turn into a row ends up here with where it came from (file, line and
byte offset, or row index) and why, so nothing is lost silently and every drop is inspectable.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import IO, Any

__all__ = ["Note", "Reason", "Reject", "RejectLog", "excerpt_of", "printable"]


class Reason:
    """The reasons a record is rejected (the values are what the rejects file and counts use)."""

    INVALID_JSON = "invalid_json"
    """A JSONL line that does not parse as JSON."""
    NOT_AN_OBJECT = "not_an_object"
    """A JSONL line that parses, but to a list/number/string instead of an object."""
    MISSING_TEXT = "missing_text_field"
    """The record (or the whole Parquet file) has no text field."""
    NULL_TEXT = "null_text"
    """The text field is null."""
    NON_STRING_TEXT = "non_string_text"
    """The text field is a number, list, object or bytes instead of a string."""
    INVALID_UTF8 = "invalid_utf8"
    """The bytes are not valid UTF-8 (use ``errors="replace"`` to keep such documents)."""
    INVALID_UNICODE = "invalid_unicode"
    """The text holds lone surrogates (e.g. a JSON ``"\\ud800"`` escape), not encodable as UTF-8."""
    EMPTY_TEXT = "empty_text"
    """The text is empty or whitespace only."""
    BINARY_FILE = "binary_file"
    """A file in a text directory that holds NUL bytes."""
    UNREADABLE_FILE = "unreadable_file"
    """An input that does not exist or cannot be opened/read (permissions, I/O error)."""
    READ_ERROR = "read_error"
    """A file that broke while being read (truncated/corrupt gzip, zstd or Parquet); the records
    before the break are kept."""
    TOO_LARGE = "too_large"
    """A record larger than ``max_doc_bytes``."""
    UNSUPPORTED_FORMAT = "unsupported_format"
    """An input whose kind tokenloom does not read: an unknown extension, or not a regular file
    (a device, named pipe or socket; never opened)."""
    DUPLICATE_TEXT_FIELD = "duplicate_text_field"
    """A Parquet file with several columns named like the text field (which one is meant is
    unknowable); every row of the file is counted."""
    SYMLINK_OUTSIDE_ROOT = "symlink_outside_root"
    """A symlink inside an input directory pointing outside it (``--follow-symlinks`` allows)."""
    SYMLINK_LOOP = "symlink_loop"
    """A symlink that loops, or a directory reached a second time through a symlink."""
    MISSING_SPLIT = "missing_split"
    """``--split`` names a split the Hugging Face dataset folder does not have."""
    BAD_COLUMN_VALUE = "bad_column_value"
    """A field promoted to a typed column (``--columns``) whose value does not convert."""


class Note:
    """Things done to records that were *kept* (counted apart from rejections)."""

    REPLACED_INVALID_UTF8 = "replaced_invalid_utf8"
    """``--errors replace`` kept a record whose bytes were not UTF-8 (any field), with U+FFFD."""
    REPLACED_INVALID_UNICODE = "replaced_invalid_unicode"
    """``--errors replace`` kept a record holding lone surrogates (any field), with U+FFFD."""
    NONFINITE_NUMBER = "nonfinite_number"
    """``NaN``/``Infinity`` (or a float overflowing to it) in metadata, kept as a JSON string."""
    BIG_INTEGER = "big_integer"
    """An integer of more than 4000 digits in metadata, kept as a JSON string of its digits."""
    ESCAPED_FILE_NAME = "escaped_file_name"
    """A file name that is not UTF-8: kept, with ``\\xNN`` escapes in ``_file`` and ``source``."""
    PROVENANCE_RENAMED = "provenance_renamed"
    """The record has a field of its own named like ingest's provenance (``_file``, ``_line``,
    ``_row``, ``_split``): the record's value is kept, ingest's goes under the name with one more
    leading ``_`` (``__file``; see :func:`tokenloom.ingest.readers.add_provenance`)."""
    CHECKSUM_MISMATCH = "checksum_mismatch"
    """A gzip member or zstd frame whose trailer/checksum is wrong; its decoded records were
    kept (each is still validated as JSON)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Reject:
    """One rejected record (or a whole rejected file when ``count`` > 1)."""

    file: str
    """The input file."""
    reason: str
    """One of the :class:`Reason` values."""
    detail: str = ""
    """A human explanation (the parser's message, the bad type, the size...)."""
    line: int | None = None
    """1-based line number in a JSONL file."""
    offset: int | None = None
    """Byte offset of the record in the (uncompressed) file."""
    row: int | None = None
    """0-based row index in a Parquet file."""
    count: int = 1
    """How many records this rejection stands for (a Parquet file without the text column)."""
    excerpt: str = ""
    """The first bytes of the raw record, for a look without opening the file."""

    @property
    def kept(self) -> bool:
        """True for a :class:`Note` on a kept record, not a rejection."""
        return self.reason in _NOTES

    def to_json(self) -> dict[str, Any]:
        """The JSON object written to the rejects file (unset locators left out)."""
        out: dict[str, Any] = {"file": printable(self.file), "reason": self.reason}
        for key in ("line", "offset", "row"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.count != 1:
            out["count"] = self.count
        if self.detail:
            out["detail"] = printable(self.detail)
        if self.excerpt:
            out["excerpt"] = printable(self.excerpt)
        return out


_NOTES = frozenset(v for k, v in vars(Note).items() if k.isupper())


def excerpt_of(raw: bytes | bytearray | str, limit: int = 160) -> str:
    """A short printable excerpt of a raw record."""
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw[:limit]).decode("utf-8", errors="backslashreplace")
    return printable(raw[:limit])


def printable(text: str) -> str:
    """``text`` made encodable as UTF-8: undecodable bytes of a file name (surrogate escapes) and
    lone surrogates become ``\\xNN`` / ``\\udNNN`` escapes, everything else is unchanged."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    if _only_escapes(text):
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _only_escapes(text: str) -> bool:
    """Whether every surrogate in ``text`` is a surrogate escape of one byte (U+DC80-U+DCFF)."""
    return all(not 0xD800 <= ord(c) <= 0xDFFF or 0xDC80 <= ord(c) <= 0xDCFF for c in text)


class RejectLog:
    """Counts rejections (and notes on kept records) by reason and writes them, one JSON object
    per line, to ``path``; a note carries ``"kept": true``.

    The file is created on the first entry only; :attr:`path` stays ``None`` until then.
    """

    def __init__(self, path: str) -> None:
        self._target = path
        self._fh: IO[str] | None = None
        self.counts: Counter[str] = Counter()
        self.notes: Counter[str] = Counter()

    @property
    def path(self) -> str | None:
        """Where entries were written, or ``None`` when there were none."""
        return self._target if self._fh is not None else None

    @property
    def total(self) -> int:
        """Records rejected so far."""
        return sum(self.counts.values())

    def add(self, reject: Reject) -> None:
        """Record one rejection."""
        self._write(reject.to_json())
        self.counts[reject.reason] += reject.count

    def note(self, note: Reject) -> None:
        """Record something done to a kept record (``note.reason`` is a :class:`Note` value)."""
        self._write({**note.to_json(), "kept": True})
        self.notes[note.reason] += note.count

    def _write(self, obj: dict[str, Any]) -> None:
        if self._fh is None:
            os.makedirs(os.path.dirname(self._target) or ".", exist_ok=True)
            self._fh = open(self._target, "w", encoding="utf-8")  # noqa: SIM115
        self._fh.write(json.dumps(obj, ensure_ascii=False) + "\n")

    def close(self) -> None:
        """Flush and close the file."""
        if self._fh is not None:
            self._fh.close()

    def __enter__(self) -> RejectLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
