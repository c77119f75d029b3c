"""Names of new columns, checked before any work is done.

A column name ends up in SQL filters (``NOT is_dup``), in Lance field paths (where ``.`` means a
nested field) and in file names (a backfill's checkpoint directory is ``<column>-<udf>``), so it
must be a plain identifier: a name with ``/`` or ``..`` could write outside the checkpoint root,
one with ``-`` or a space needs quoting in every filter. Every command that creates a column calls
:func:`validate_column_name` first, and so does :func:`tokenloom.backfill.add_column`.
"""

from __future__ import annotations

import re

from tokenloom.errors import TokenloomError

__all__ = ["ColumnNameError", "MAX_COLUMN_NAME", "validate_column_name"]

MAX_COLUMN_NAME = 128
"""Longest accepted name (it is also a directory name, and file systems limit those)."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED_PREFIXES = ("__", "_row")
"""``__tokenloom_tmp_*`` is the backfill's temporary name; ``_rowid``, ``_rowaddr``,
``_rowoffset`` and ``_row_*_at_version`` are Lance's own pseudo-columns."""
_RESERVED = frozenset({"_distance", "_score", "_relevance_score"})
"""Columns Lance and LanceDB add to search results."""


class ColumnNameError(TokenloomError):
    """A name cannot be used for a new column."""


def validate_column_name(name: object, *, what: str = "column name") -> str:
    """Return ``name`` if it can name a new column; else raise, naming the rule.

    Accepted: letters, digits and ``_``, not starting with a digit, at most
    :data:`MAX_COLUMN_NAME` characters, none of Lance's reserved names.

    Args:
        name: The proposed name.
        what: How the name is called in the message (e.g. ``"--column"``).

    Raises:
        ColumnNameError: for an empty name, a path (``/``, ``\\``, ``..``), a dot, a dash, a
            space or any other character, a leading digit, a reserved or overlong name.
    """
    if not isinstance(name, str):
        raise ColumnNameError(f"{what} must be text, not {type(name).__name__}")
    rule = "use letters, digits and '_' (not starting with a digit), e.g. 'input_ids_bpe16k'"
    if not name:
        raise ColumnNameError(f"{what} is empty; {rule}")
    if len(name) > MAX_COLUMN_NAME:
        raise ColumnNameError(
            f"{what} {name[:40]!r}... has {len(name)} characters; at most {MAX_COLUMN_NAME}"
        )
    if not _IDENTIFIER.fullmatch(name):
        if "/" in name or "\\" in name or ".." in name:
            why = "it looks like a path"
        elif "." in name:
            why = "'.' separates nested fields in Lance"
        elif name[0].isdigit():
            why = "it starts with a digit"
        else:
            bad = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c == "_"))})
            why = f"it holds {', '.join(map(repr, bad))}"
        raise ColumnNameError(f"invalid {what} {name!r}: {why}; {rule}")
    if name.startswith(_RESERVED_PREFIXES) or name in _RESERVED:
        raise ColumnNameError(
            f"invalid {what} {name!r}: names starting with '__' or '_row', and "
            f"{', '.join(sorted(_RESERVED))}, are reserved by tokenloom and Lance"
        )
    return name
