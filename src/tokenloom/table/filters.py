"""User filters (SQL ``WHERE`` conditions) checked against a table before any work is done.

Lance parses a filter as ``SELECT 1 FROM t WHERE <filter>`` and stops at the end of the first
complete condition: ``id > 3 garbage``, ``id > 3) foo`` and ``id > 3 LIMIT 2`` all run as
``id > 3`` without a word. Type errors (``text > 3``) surface only when the scan is planned, deep
inside a command, as a message with Rust source paths in it.

:func:`validate_filter` closes both holes in one place, with Lance's own parser and planner:

1. a small lexer (quotes aware) checks that the parentheses balance, that there is one statement
   and that there is no comment: ``id < 10 -- AND id > 5`` reads as ``id < 10`` (a ``--`` comment
   runs to the end of the line, a command line has one line), so a comment is refused, never
   dropped; ``--`` and ``/*`` inside a quoted string are text. The result composes
   (``(a) AND (b)``) safely;
2. the filter is planned wrapped as ``(\\n<filter>\\n)`` on a zero-row scan. With balanced
   parentheses, the outer one can only close at the end, so a parser that stops early finds the
   leftover text where it expects ``)`` and fails: trailing text is an error, never ignored;
3. Lance's error is turned into one line that names the filter, the column and the rule.

Every command that takes ``--filter`` / ``--where`` calls it first; the CLI runs
:func:`check_structure` (it needs no table) as the option is parsed, so a malformed filter is a
usage error (exit 2) naming the option.
"""

from __future__ import annotations

import re
from typing import Any

from tokenloom.errors import TokenloomError

__all__ = ["FilterError", "and_filters", "check_structure", "validate_filter"]

_INTERNAL_COLUMNS = ("_rowid", "_rowaddr", "_rowoffset")


class FilterError(TokenloomError):
    """A filter is not one valid condition on the table's columns."""


def _fail(sql: str, reason: str) -> FilterError:
    shown = " ".join(sql.split())
    return FilterError(f"invalid filter {shown!r}: {reason}")


def check_structure(sql: str) -> str:
    """``sql`` stripped of outer whitespace, after checking its structure (no table needed).

    Raises:
        FilterError: on unbalanced parentheses, an unterminated string or identifier, a comment
            (``--`` or ``/* */`` outside quotes: it hides the text after it), or a ``;`` (a
            filter is one condition, not statements).
    """
    depth_open: list[int] = []  # positions of the ( not yet closed
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"`":  # a string or a quoted identifier; a doubled quote escapes itself
            j = i + 1
            while True:
                k = sql.find(ch, j)
                if k < 0:
                    what = "string" if ch == "'" else "quoted name"
                    raise _fail(sql, f"the {what} opened at character {i + 1} is never closed")
                if k + 1 < n and sql[k + 1] == ch:
                    j = k + 2
                    continue
                break
            i = k + 1
        elif sql.startswith("--", i) or sql.startswith("/*", i):
            mark = sql[i : i + 2]
            raise _fail(
                sql,
                f"comments are not allowed: the {mark!r} at character {i + 1} would hide the "
                "text after it from the condition; remove the comment (quote the text if it "
                "is a value, e.g. 'a--b')",
            )
        else:
            if ch == "(":
                depth_open.append(i)
            elif ch == ")":
                if not depth_open:
                    raise _fail(
                        sql,
                        f"unbalanced parentheses: the ')' at character {i + 1} closes nothing",
                    )
                depth_open.pop()
            elif ch == ";":
                raise _fail(sql, f"a filter is one condition; remove the ';' at character {i + 1}")
            i += 1
    if depth_open:
        at = depth_open[-1] + 1
        raise _fail(sql, f"unbalanced parentheses: the '(' at character {at} is never closed")
    return sql.strip()


def validate_filter(dataset: Any, sql: str | None) -> str | None:
    """Check ``sql`` as a filter on ``dataset`` and return it ready to use.

    Args:
        dataset: A ``lance.LanceDataset`` (the version the filter will run on).
        sql: The user's filter, or ``None`` for every row.

    Returns:
        ``None`` for ``None``; else the filter, stripped of outer whitespace.

    Raises:
        FilterError: one line naming the filter and what is wrong (an unknown column, a syntax
            error, a comment, text after the condition, a type mismatch, not a condition).
    """
    if sql is None:
        return None
    from tokenloom.table.core import Table

    if isinstance(dataset, Table):
        dataset = dataset.dataset
    if not isinstance(sql, str):
        raise FilterError(f"a filter must be SQL text, not {type(sql).__name__}")
    if not sql.strip():
        raise _fail(sql, "it is empty; omit the option to select every row")
    clean = check_structure(sql)
    wrapped = f"(\n{clean}\n)"
    try:
        scanner = dataset.scanner(columns=[], filter=wrapped, limit=0, with_row_id=True)
        scanner.explain_plan()  # plans the filter: types and functions are resolved here
    except (ValueError, OSError, RuntimeError, TypeError) as exc:
        raise _fail(sql, _reason(str(exc), wrapped, dataset)) from None
    return clean


def and_filters(dataset: Any, *filters: str | None) -> str | None:
    """Validate each filter on its own, then join them with ``AND``.

    Each part is checked before joining: ``(a) AND (b)`` built from unchecked text could balance
    a stray parenthesis of one part with another's (``x) OR (TRUE``) and select other rows.

    Returns:
        ``None`` when every part is ``None``; the one part; else ``(a) AND (b) ...``.
    """
    parts = [validate_filter(dataset, f) for f in filters if f is not None]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return " AND ".join(f"({p})" for p in parts)


_PATH = re.compile(r",?\s*(?:/|[A-Za-z]:\\)\S*\.rs:\d+(?::\d+)?")
_NO_FIELD = re.compile(r"No field named ([^\s.]+(?:\.[^\s.]+)*)\.\s+Valid fields")
_AT = r"(?: at Line: \d+, Column: \d+)?"
_PARSER = re.compile(r"sql parser error: Expected: (.*?), found: (.*?)" + _AT + r"\)\s*$")
_TOKENIZER = re.compile(r"\((Unterminated [^)]*?|Unexpected [^)]*?)" + _AT + r"\)")


_NOISE = [
    re.compile(r"Error resolving filter expression <filter>:\s*"),
    re.compile(r"Error optimizing sql filter: <filter> \(|\)\s*$"),
    re.compile(r"Error parsing function:\s*"),
    re.compile(r"Error during planning:\s*"),
    re.compile(r"LanceError\(\w+\):\s*"),
]


def _columns(dataset: Any) -> str:
    try:
        names = list(dataset.schema.names)
    except Exception:  # noqa: BLE001 - only for the message
        return ""
    return f" (columns: {', '.join(names)})"


def _reason(message: str, wrapped: str, dataset: Any) -> str:
    """Lance's error as one readable line: no Rust paths, no wrapped filter, the column named."""
    text = _PATH.sub("", message)
    found = _NO_FIELD.search(text)
    if found:
        name = found.group(1).strip("\"'`")
        return f"the table has no column {name!r}{_columns(dataset)}"
    parsed = _PARSER.search(text)
    if parsed:
        expected, got = parsed.group(1), parsed.group(2)
        if got == "EOF":
            got = "the end of the filter"
        elif got == ")":  # the user's, or the one closing the wrapper at the end
            got = "')' or the end of the filter"
        else:
            got = repr(got)
        if expected == ")":  # the parser had a complete condition and more text followed
            return f"syntax error: unexpected {got} after a complete condition"
        return f"syntax error: expected {expected}, found {got}"
    tokenizing = _TOKENIZER.search(text)
    if tokenizing:
        return f"syntax error: {tokenizing.group(1).lower()}"
    if "does not return a boolean" in text:
        return "it is not a true/false condition (e.g. `n_tokens > 0`, `NOT is_dup`)"
    text = text.replace(wrapped, "<filter>").replace("Invalid user input: ", "")
    for noise in _NOISE:
        text = noise.sub("", text)
    text = " ".join(text.split()).rstrip(",")
    if "could not convert to literal" in text or "coerce" in text or "Cast error" in text:
        return f"type mismatch: {text}"
    return text or "Lance rejected it"
