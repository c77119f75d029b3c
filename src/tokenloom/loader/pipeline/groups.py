"""Grouped rows from the table: the :class:`~tokenloom.loader.plan.files.Files` layout of a
selection (one scan of its key, order and name columns), and the reader of a group's tokens.

:func:`scan_files` reads the small columns a :class:`~tokenloom.loader.plan.spec.GroupSpec`
names for the selected rows (the text too with ``order="imports"``), sorts them by key, order and
``id`` at once, orders Python files by their imports, and encodes each file's marker with the
token column's tokenizer (one batch). :class:`GroupReader` reads ranges of groups: the files'
tokens through the table's :class:`~tokenloom.loader.pipeline.read.TokenReader` (its fetches and
long-document cache), the prefixes from the layout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenloom.loader.pipeline.inputs import PlanInputs, compact_inputs
from tokenloom.loader.pipeline.read import LoaderError, TokenReader
from tokenloom.loader.pipeline.take import take
from tokenloom.loader.plan.files import Files, import_order, ragged
from tokenloom.loader.plan.pack import TokenSource
from tokenloom.loader.plan.spec import IMPORTS, GroupSpec

__all__ = ["scan_files", "group_inputs", "GroupReader", "bos_id"]


def bos_id(tokenizer: dict, column: str) -> int:
    """The BOS id the token column's tokenizer defines.

    Raises:
        LoaderError: It defines none.
    """
    bos = tokenizer.get("bos_id")
    if bos is None:
        name = tokenizer.get("name") or "no tokenizer"
        raise LoaderError(
            f"--bos: the tokenizer of column {column!r} ({name}) defines no BOS token; drop "
            "--bos, or tokenize with a tokenizer that has one (a bos_token in its "
            "tokenizer_config.json)"
        )
    return int(bos)


def _columns(ds: Any, group: GroupSpec) -> list[str]:
    wanted = ["id"]
    for c in (group.key, None if group.order == IMPORTS else group.order, group.name_column):
        if c is not None and c not in wanted:
            wanted.append(c)
    wanted += [c for c in group.marker_columns() if c not in wanted]
    if group.order == IMPORTS:
        wanted.append("text")
    missing = [c for c in wanted if c not in ds.schema.names]
    if missing:
        raise LoaderError(
            f"grouping needs column(s) {', '.join(map(repr, missing))}, which the table does not "
            f"hold (columns: {', '.join(ds.schema.names)}); fields kept in meta become columns "
            "with `tokenloom ingest --columns NAME:TYPE,...`"
        )
    return wanted


def scan_files(ds: Any, inputs: PlanInputs, group: GroupSpec, column: str) -> Files:
    """The selection's rows as groups (see the module docstring).

    Raises:
        LoaderError: A column is missing, a key is null, ``bos`` without a BOS id, or the marker
            cannot be encoded (no loadable tokenizer recorded).
    """
    row_ids = np.asarray(inputs.row_ids, dtype=np.int64)
    table = take(ds, np.asarray(inputs.rowids), _columns(ds, group))
    ids = table.column("id").to_numpy().astype(np.int64, copy=False)
    at = np.searchsorted(row_ids, ids)
    if group.key is not None:
        nulls = table.column(group.key).null_count
        if nulls:
            raise LoaderError(
                f"{nulls:,} selected rows have no {group.key!r} (null) to group them by; select "
                f'the others with --filter "{group.key} IS NOT NULL"'
            )
        keys: list[tuple[str, str, str]] = [(group.key, "ascending", "at_end")]
        if group.order is not None and group.order != IMPORTS:
            keys.append((group.order, "ascending", "at_end"))  # nulls last, then by id
        keys.append(("id", "ascending", "at_end"))
        order = pc.sort_indices(table, sort_keys=keys).to_numpy().astype(np.int64)
        codes = pc.dictionary_encode(table.column(group.key)).combine_chunks().indices
        codes = codes.to_numpy()[order]
        cut = np.flatnonzero(codes[1:] != codes[:-1]) + 1
        gptr = np.concatenate([[0], cut, [len(order)]]).astype(np.int64)
    else:
        order = np.argsort(ids, kind="stable")
        gptr = np.arange(len(order) + 1, dtype=np.int64)
    if group.order == IMPORTS:
        names = table.column(group.name_column).to_pylist()
        texts = table.column("text")
        sizes = np.diff(gptr)
        for g in np.flatnonzero(sizes > 1).tolist():
            lo, hi = int(gptr[g]), int(gptr[g + 1])
            members = order[lo:hi]
            paths = [str(names[i]) for i in members.tolist()]
            body = texts.take(pa.array(members)).to_pylist()
            order[lo:hi] = members[import_order(paths, body)]
    n_tokens = np.asarray(inputs.n_tokens, dtype=np.int64)[at[order]]
    prefixes: list[np.ndarray] = [np.zeros(0, np.int64)] * len(order)
    if group.marker is not None:
        prefixes = _markers(table, order, group, inputs.tokenizer, column)
    if group.bos:
        bos = bos_id(inputs.tokenizer, column)
        for m in gptr[:-1][np.diff(gptr) > 0].tolist():
            prefixes[m] = np.concatenate([[bos], prefixes[m]]).astype(np.int64)
    lens = np.array([len(p) for p in prefixes], dtype=np.int64)
    pptr = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lens, out=pptr[1:])
    prefix = np.concatenate(prefixes) if prefixes else np.zeros(0, np.int64)
    return Files(
        rows=ids[order],
        at=at[order],
        gptr=gptr,
        n_tokens=n_tokens,
        pptr=pptr,
        prefix=prefix.astype(np.int64),
        bos=bos_id(inputs.tokenizer, column) if group.bos else None,
    )


def _markers(
    table: pa.Table, order: np.ndarray, group: GroupSpec, tokenizer: dict, column: str
) -> list[np.ndarray]:
    """Each row's marker ids (rows in ``order``), encoded in one batch."""
    from tokenloom.tokenize.registry import load_tokenizer

    name = tokenizer.get("name")
    if not name:
        raise LoaderError(
            f"--file-marker: the column {column!r} records no tokenizer to encode the marker "
            "with; tokenize it with `tokenloom tokenize --tokenizer SPEC`"
        )
    try:
        tok = load_tokenizer(name)
    except Exception as exc:  # noqa: BLE001 - any failure to load is the user's setup
        raise LoaderError(
            f"--file-marker: the column's tokenizer {name!r} cannot be loaded here ({exc})"
        ) from None
    cols = {c: table.column(c).to_pylist() for c in group.marker_columns()}
    names = table.column(group.name_column).to_pylist()
    texts = []
    for i in order.tolist():
        values = {c: ("" if v[i] is None else v[i]) for c, v in cols.items()}
        values["name"] = "" if names[i] is None else names[i]
        texts.append(group.marker.format(**values))  # type: ignore[union-attr]
    encoded = tok.encode_batch(texts)
    flat = encoded.values.to_numpy(zero_copy_only=False).astype(np.int64)
    offs = encoded.offsets.to_numpy().astype(np.int64)
    return [flat[offs[k] : offs[k + 1]] for k in range(len(texts))]


def group_inputs(files: Files, rows: PlanInputs) -> PlanInputs:
    """The plan's inputs over groups: ids ``0..G-1``, counts the groups' lengths (files and
    prefixes); the stable row ids stand for the group ids (the :class:`GroupReader` reads
    them)."""
    ids = files.group_ids
    return PlanInputs(
        version=rows.version,
        **compact_inputs(ids, files.lengths, ids.astype(np.uint64)),
        null_rows=rows.null_rows,
        tokenizer=rows.tokenizer,
        filter_nulls=rows.filter_nulls,
        filter_null_columns=rows.filter_null_columns,
    )


class GroupReader:
    """Reads ranges of groups (the plan's rows when grouped): the files' tokens through
    ``reader``, the prefixes from ``files``. Everything else is ``reader``'s."""

    def __init__(self, reader: TokenReader, files: Files, rows: PlanInputs) -> None:
        self.base = reader
        self.files = files
        self.rows = rows

    def __getattr__(self, name: str) -> Any:
        if name in ("base", "files", "rows"):
            raise AttributeError(name)
        return getattr(self.base, name)

    def _rowids(self, members: np.ndarray) -> np.ndarray:
        return self.rows.rowids[self.files.at[members]]

    def fetch(self, rowids: np.ndarray, **kw: Any) -> Any:
        """Fetch the files of the groups ``rowids`` (group ids)."""
        g = np.unique(np.asarray(rowids, dtype=np.int64))
        f = self.files
        count = f.gptr[g + 1] - f.gptr[g]
        members = ragged(f.gptr[g], count)
        return self.base.fetch(self._rowids(members), **kw)

    def locate(
        self,
        rowids: np.ndarray,
        starts: np.ndarray,
        stops: np.ndarray,
        doc_len: np.ndarray,
        fetched: Any = None,
    ) -> tuple[TokenSource, np.ndarray, None, tuple[int, int, float]]:
        """:meth:`TokenReader.locate` of group ranges (``rowids``: group ids)."""
        del doc_len  # a group's length is the layout's
        starts = np.asarray(starts, dtype=np.int64)
        stops = np.asarray(stops, dtype=np.int64)
        pieces = self.files.unfold(np.asarray(rowids, dtype=np.int64), starts, stops)
        sel = np.flatnonzero(pieces.kind == 0)
        members = pieces.member[sel]
        source, foffs, _, read = self.base.locate(
            self._rowids(members),
            pieces.lo[sel],
            pieces.hi[sel],
            self.files.n_tokens[members],
            fetched,
        )
        ftoks = source.gather(foffs)
        offsets = np.zeros(len(starts) + 1, dtype=np.int64)
        np.cumsum(stops - starts, out=offsets[1:])
        out = self.files.fill(pieces, offsets, ftoks, foffs)
        return TokenSource(values=out, at=offsets[:-1].copy()), offsets, None, read

    def read_masked(self, *args: Any, **kw: Any) -> tuple[Any, ...]:
        source, offsets, masked, read = self.locate(*args, **kw)
        return source.gather(offsets), offsets, masked, read

    def read_ranges(self, *args: Any, **kw: Any) -> tuple[Any, ...]:
        tokens, offsets, _, read = self.read_masked(*args, **kw)
        return tokens, offsets, read
