"""Field values of a record made safe to store: ``meta`` strictly valid JSON, every string UTF-8.

JSON lines may hold ``NaN``/``Infinity``, integers too long for Python's int/str conversion,
``\\ud800``-style lone surrogates and nesting deep enough to exhaust the stack; Arrow columns may
hold NaN, bytes, dates and decimals. Here each value is either kept in a documented form (counted
as a :class:`~tokenloom.ingest.rejects.Note`) or the record is refused with a reason.
"""

from __future__ import annotations

import base64
import json
import math
import re
from typing import Any

from tokenloom.ingest.rejects import Note, Reason

__all__ = ["BadValue", "BigInt", "load_json", "clean_string", "meta_json"]

_SURROGATES = re.compile("[\ud800-\udfff]")
_MAX_DIGITS = 4000  # below Python's default int/str conversion limit (4300 digits)


class BadValue(Exception):
    """A value the record cannot be stored with: ``reason`` is a :class:`Reason` value."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class BigInt(str):
    """The digits of a JSON integer too long to convert (kept as a JSON string)."""


def load_json(text: str, notes: set[str]) -> Any:
    """``json.loads`` that never raises on long integers: they become :class:`BigInt` strings
    (noted as ``big_integer``).

    Raises:
        BadValue: ``invalid_json`` for unparsable or too deeply nested input.
    """

    def parse_int(digits: str) -> int | str:
        if len(digits) > _MAX_DIGITS:
            notes.add(Note.BIG_INTEGER)
            return BigInt(digits)
        return int(digits)

    try:
        return json.loads(text, parse_int=parse_int)
    except (json.JSONDecodeError, ValueError) as exc:
        raise BadValue(Reason.INVALID_JSON, str(exc)[:200]) from exc
    except RecursionError as exc:
        raise BadValue(Reason.INVALID_JSON, "nested too deeply to parse") from exc


def clean_string(value: str, errors: str, where: str, notes: set[str]) -> str:
    """``value`` without lone surrogates: replaced by U+FFFD (noted) or refused (strict).

    Raises:
        BadValue: ``invalid_unicode`` naming ``where`` under ``errors="strict"``.
    """
    match = _SURROGATES.search(value)
    if match is None:
        return value
    if errors == "replace":
        notes.add(Note.REPLACED_INVALID_UNICODE)
        return _SURROGATES.sub("\ufffd", value)
    raise BadValue(
        Reason.INVALID_UNICODE,
        f"lone surrogate U+{ord(match.group()):04X} at character {match.start()} of {where}; "
        "--errors replace keeps it",
    )


def meta_json(meta: dict[str, Any], errors: str, notes: set[str]) -> str:
    """The metadata as strictly valid JSON text (RFC 8259: no NaN, no lone surrogates).

    Fast path: one ``json.dumps``; only a record that needs it is walked and repaired.

    Raises:
        BadValue: ``invalid_unicode`` (strict) or ``invalid_json`` (nested too deeply).
    """
    try:
        text = json.dumps(
            meta, ensure_ascii=False, sort_keys=True, allow_nan=False, default=_default
        )
        if _SURROGATES.search(text) is None:
            return text
    except ValueError:
        pass  # NaN/Infinity somewhere
    except RecursionError as exc:
        raise BadValue(Reason.INVALID_JSON, "metadata nested too deeply") from exc
    fixed = _repair(meta, errors, notes)
    try:
        return json.dumps(
            fixed, ensure_ascii=False, sort_keys=True, allow_nan=False, default=_default
        )
    except RecursionError as exc:  # pragma: no cover - _repair already bounds the depth
        raise BadValue(Reason.INVALID_JSON, "metadata nested too deeply") from exc


def _default(value: Any) -> Any:
    """JSON form of what json cannot write: bytes as ``{"$base64": ...}`` (never a Python repr;
    promote a binary field to a typed column with ``--columns NAME:binary``), the rest as text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$base64": base64.b64encode(bytes(value)).decode("ascii")}
    return str(value)


def _repair(value: Any, errors: str, notes: set[str], where: str = "metadata") -> Any:
    """A copy of ``value`` with every string clean, NaN/Infinity and big ints as strings.

    Iterative (explicit stack), so depth is no danger here; the output depth equals the input's.
    """
    root: list[Any] = [None]
    stack: list[tuple[Any, list[Any] | dict[str, Any], Any, str]] = [(value, root, 0, where)]
    while stack:
        item, parent, slot, path = stack.pop()
        if isinstance(item, BigInt):
            out: Any = str(item)
        elif isinstance(item, str):
            out = clean_string(item, errors, path, notes)
        elif isinstance(item, float) and not math.isfinite(item):
            notes.add(Note.NONFINITE_NUMBER)
            out = "NaN" if math.isnan(item) else ("Infinity" if item > 0 else "-Infinity")
        elif isinstance(item, dict):
            out = {}
            for key, child in item.items():
                name = clean_string(key if isinstance(key, str) else str(key), errors, path, notes)
                stack.append((child, out, name, f"{path}.{name}"))
        elif isinstance(item, (list, tuple)):
            out = [None] * len(item)
            for i, child in enumerate(item):
                stack.append((child, out, i, f"{path}[{i}]"))
        elif item is None or isinstance(item, (bool, int, float)):
            out = item
        elif isinstance(item, bytes | bytearray | memoryview):
            out = _default(item)
        else:  # dates, decimals...: their text form
            out = clean_string(str(item), errors, path, notes)
        parent[slot] = out
    return root[0]
