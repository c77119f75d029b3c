"""Named SQL slices of a table (``--loss-slice NAME=SQL``), resolved once to row membership.

A slice is a name and a filter over the table's columns (``code=source = 'python_stdlib'``). The
trainer reports the loss of the tokens whose document is in the slice (:mod:`.provenance_loss`);
the batch says which table ``id`` each token comes from, so all a step needs is "is id ``i`` in
slice ``k``" for a few hundred ids. :func:`resolve_slices` answers it with one scan of the ``id``
column per slice at setup (the row selection of :func:`~tokenloom.rows.read.scan_selection`),
kept in whichever form is smaller:

* a bitmap over ids (``max_id / 8`` bytes: 2.2 MB at 17.5M rows, whatever the slice holds), or
* the selection's own bit-packed sorted ids (:class:`~tokenloom.loader.plan.compact.CompactInts`,
  tested by binary search), smaller for a slice of few rows or sparse ids.

Pure numpy and Lance; no torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from tokenloom.errors import TokenloomError

__all__ = [
    "SliceError",
    "SliceMembership",
    "parse_loss_slice",
    "parse_loss_slices",
    "membership_of",
    "resolve_slices",
    "check_slices",
]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


class SliceError(TokenloomError):
    """A loss slice is malformed, or its filter does not work on the table."""


def parse_loss_slice(text: str) -> tuple[str, str]:
    """``"NAME=SQL"`` as ``(name, sql)`` (split at the first ``=``: the SQL may hold more).

    Raises:
        SliceError: no ``=``, a name that is not a short identifier, an empty or malformed
            filter (unbalanced parentheses, a comment, a ``;``).
    """
    from tokenloom.table.filters import FilterError, check_structure

    if not isinstance(text, str) or "=" not in text:
        raise SliceError(
            f"loss slice {text!r} is not NAME=SQL; e.g. \"code=source = 'python_stdlib'\""
        )
    name, sql = text.split("=", 1)
    name = name.strip()
    if not _NAME.fullmatch(name):
        raise SliceError(
            f"loss slice name {name!r} must be letters, digits, '_', '.' or '-' (not starting "
            f"with a digit, at most 64), e.g. \"code=source = 'python_stdlib'\""
        )
    if not sql.strip():
        raise SliceError(f"loss slice {name!r} has an empty filter; give NAME=SQL")
    try:
        sql = check_structure(sql)
    except FilterError as exc:
        raise SliceError(f"loss slice {name!r}: {exc}") from None
    return name, sql


def parse_loss_slices(values: Iterable[str | tuple[str, str] | list[str]]) -> tuple:
    """Several slices (``"NAME=SQL"`` strings or ``(name, sql)`` pairs) as a tuple of pairs.

    Raises:
        SliceError: a malformed slice, or a name given twice.
    """
    out: list[tuple[str, str]] = []
    for value in values or ():
        if isinstance(value, str):
            pair = parse_loss_slice(value)
        else:
            name, sql = value
            pair = parse_loss_slice(f"{name}={sql}")
        if any(pair[0] == seen for seen, _ in out):
            raise SliceError(f"loss slice name {pair[0]!r} is given twice; name each slice once")
        out.append(pair)
    return tuple(out)


@dataclass(frozen=True, kw_only=True, eq=False)
class SliceMembership:
    """Which table ids a slice holds (see the module docstring for the two forms)."""

    name: str
    sql: str
    rows: int
    """Rows of the table version in the slice."""
    bits: np.ndarray | None = None
    """``(max_id // 8 + 1,)`` uint8, bit ``i & 7`` of byte ``i >> 3`` set for id ``i``."""
    ids: object | None = None
    """Else: the sorted ids (:class:`~tokenloom.loader.plan.compact.CompactInts`)."""

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        if self.bits is not None:
            return int(self.bits.nbytes)
        return int(getattr(self.ids, "nbytes", 0))

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """``(n,)`` bool: whether each of ``ids`` (int64 table ids) is in the slice."""
        q = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = np.zeros(q.shape[0], dtype=bool)
        if not self.rows or not q.size:
            return out
        if self.bits is not None:
            inside = (q >= 0) & (q < self.bits.shape[0] * 8)
            p = q[inside]
            out[inside] = ((self.bits[p >> 3] >> (p & 7).astype(np.uint8)) & 1).astype(bool)
            return out
        col = self.ids
        pos = np.asarray(col.searchsorted(q))  # type: ignore[union-attr]
        found = pos < self.rows
        out[found] = np.asarray(col[pos[found]]) == q[found]  # type: ignore[index]
        return out


def membership_of(name: str, sql: str, ids: object) -> SliceMembership:
    """The smaller form for ``ids`` (a sorted :class:`CompactInts` of table ids)."""
    n = len(ids)  # type: ignore[arg-type]
    if not n:
        return SliceMembership(name=name, sql=sql, rows=0, ids=ids)
    lo, hi = int(ids.min()), int(ids.max())  # type: ignore[attr-defined]
    bitmap_bytes = hi // 8 + 1
    if lo < 0 or bitmap_bytes > int(ids.nbytes):  # type: ignore[attr-defined]
        return SliceMembership(name=name, sql=sql, rows=n, ids=ids)
    member = np.zeros(hi + 1, dtype=bool)  # one byte per id while building, then one bit
    for _, block in ids.blocks():  # type: ignore[attr-defined]
        member[np.asarray(block, dtype=np.int64)] = True
    bits = np.packbits(member, bitorder="little")  # id i: bit i & 7 of byte i >> 3
    return SliceMembership(name=name, sql=sql, rows=n, bits=bits)


def _open(table: str, version: int | None, storage_options: Mapping[str, str] | None):  # noqa: ANN202
    import lance

    return lance.dataset(
        table, version=version, storage_options=dict(storage_options) if storage_options else None
    )


def check_slices(
    table: str,
    slices: Iterable[tuple[str, str]],
    *,
    version: int | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> None:
    """Plan each slice's filter on the table without reading rows.

    Raises:
        SliceError: a filter that is not valid SQL on the table's columns, naming the slice.
    """
    from tokenloom.table.filters import FilterError, validate_filter

    slices = tuple(slices)
    if not slices:
        return
    ds = _open(table, version, storage_options)
    for name, sql in slices:
        try:
            validate_filter(ds, sql)
        except FilterError as exc:
            raise SliceError(f"loss slice {name!r}: {exc}") from None


def resolve_slices(
    table: str,
    slices: Iterable[tuple[str, str]],
    *,
    version: int | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> list[SliceMembership]:
    """Each slice's membership over the table ``id`` (one scan of ``id`` per slice).

    Raises:
        SliceError: a filter that does not work on the table, naming the slice.
    """
    from tokenloom.rows.read import scan_selection

    slices = tuple(slices)
    if not slices:
        return []
    ds = _open(table, version, storage_options)
    out = []
    for name, sql in slices:
        try:
            selection = scan_selection(ds, filter=sql, columns=["id"])
        except TokenloomError as exc:
            raise SliceError(f"loss slice {name!r}: {exc}") from None
        out.append(membership_of(name, sql, selection.row_ids))
    return out
