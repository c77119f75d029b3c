"""Adopt a Lance dataset in place: add the columns a tokenloom table has beyond the user's
(``id``, ``source``, ``n_chars``, ``meta``) without rewriting any existing data file.

What a tokenloom table needs, and what an in-place adoption does about each:

- **stable row ids** (the loader reads rows by ``_rowid``): Lance can only enable them when a
  dataset is created, so a dataset without them cannot be adopted in place (copy it instead);
- **a ``text`` column of type large_string**: a column of another name is renamed (a metadata-only
  commit); a column of another type would be rewritten to convert it, so it cannot be adopted in
  place (copy it instead);
- **``id``** (int64, dense over the physical rows in fragment order, never reused), **``source``**
  (``--source NAME``, or the ``--source-field`` column's value, else the dataset's folder name),
  **``n_chars``** and **``meta``** (``{}``: the user's other columns stay columns): written by
  one ``Merge`` commit, one new data file per fragment holding only these columns; the id
  field's metadata carries the schema version and the id high-water mark (:mod:`.meta`);
- **no bad text**: rows whose text is null, empty or whitespace, not UTF-8 or larger than the
  size limit are counted by reason, listed in the rejects file and deleted by one more commit
  (Lance writes deletion files; the data files stay as they are, and the rows stay readable in
  the earlier versions).

Every requirement is checked before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenloom.errors import TableError
from tokenloom.table.core import NEXT_ID_KEY, Table
from tokenloom.table.schema import BASE_SCHEMA, SCHEMA_VERSION, SCHEMA_VERSION_KEY

__all__ = ["InPlaceResult", "adopt_in_place", "in_place_problems"]

ADDED = ("id", "source", "n_chars", "meta")
"""The base columns an in-place adoption adds."""


@dataclass(kw_only=True)
class InPlaceResult:
    """What an in-place adoption did."""

    version: int
    """The table's version after the adoption (the last of its commits)."""
    rows: int
    """Rows kept (the dataset's live rows less the rejected ones)."""
    next_id: int
    """The id high-water mark: the dataset's physical rows."""
    versions: list[int] = field(default_factory=list)
    """Every version the adoption committed (rename, columns, deletion of rejected rows)."""
    bytes_added: int = 0
    """Size of the new data files (the added columns only)."""


def in_place_problems(
    ds: lance.LanceDataset, *, text_field: str, source_field: str | None
) -> list[str]:
    """Why ``ds`` cannot be adopted in place (empty: it can), each reason a sentence."""
    problems = []
    names = ds.schema.names
    if all(f.name in names and ds.schema.field(f.name).type == f.type for f in BASE_SCHEMA):
        return ["it is already a tokenloom table (open it with `tokenloom info --table ...`)"]
    if not ds.get_fragments():
        return ["it holds no rows (no data fragment), so there is nothing to adopt"]
    if not ds.has_stable_row_ids:
        problems.append(
            "it was created without stable row ids, which the loader reads rows by and which "
            "Lance can only enable when a dataset is created"
        )
    if text_field not in names:
        problems.append(f"it has no top-level column {text_field!r} (--text-field)")
    else:
        kind = ds.schema.field(text_field).type
        if kind != pa.large_string():
            problems.append(
                f"its text column {text_field!r} is {kind}, not large_string, and converting it "
                "would rewrite every text data file"
            )
    if text_field != "text" and "text" in names:
        problems.append("it already has a column named 'text' besides --text-field")
    taken = [c for c in ADDED if c in names and c != source_field]
    if taken:
        problems.append(
            f"it already has column(s) {', '.join(map(repr, taken))}, which tokenloom adds"
        )
    if source_field is not None and source_field not in names:
        problems.append(f"it has no column {source_field!r} (--source-field)")
    elif source_field is not None and not _names_a_source(ds.schema.field(source_field).type):
        kind = ds.schema.field(source_field).type
        problems.append(f"its --source-field column {source_field!r} is {kind}, not text")
    elif source_field == "source":  # kept as the table's own source column: must be complete
        kind = ds.schema.field("source").type
        missing = (
            ds.count_rows(filter="source IS NULL OR source = ''") if kind == pa.string() else 0
        )
        if kind != pa.string() or missing:
            problems.append(
                f"its 'source' column (kept as tokenloom's) must be a string with a value on "
                f"every row; it is {kind} with {missing} null or empty value(s)"
            )
    return problems


def _names_a_source(kind: pa.DataType) -> bool:
    """Whether a column of type ``kind`` can name a source (text, or an integer code)."""
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)


def adopt_in_place(
    uri: str,
    *,
    text_field: str = "text",
    source: str,
    source_field: str | None = None,
    check_row: Callable[[object], tuple[str, str] | None],
    on_reject: Callable[[int, str, str, object], None],
) -> InPlaceResult:
    """Make the local Lance dataset at ``uri`` a tokenloom table (see the module docstring).

    Args:
        uri: The dataset (a local path).
        text_field: The column holding the text (renamed ``text``).
        source: The source name of a row whose ``source_field`` gives none.
        source_field: A string column naming each row's source (kept as it is when it is
            ``source`` itself).
        check_row: A text cell -> ``None`` when it is a document, else ``(reason, detail)``.
        on_reject: Called with ``(id, reason, detail, value)`` for each rejected row.

    Raises:
        TableError: The dataset cannot be adopted in place (every reason named).
    """
    ds = lance.dataset(uri)
    problems = in_place_problems(ds, text_field=text_field, source_field=source_field)
    if problems:
        raise TableError(f"{uri} cannot be adopted in place: " + "; ".join(problems))
    fragments = sorted(ds.get_fragments(), key=lambda f: f.fragment_id)
    bases, total = {}, 0
    for frag in fragments:
        bases[frag.fragment_id] = total
        total += frag.physical_rows
    bad = _bad_rows(ds, text_field, bases, check_row, on_reject)
    versions = []
    if text_field != "text":
        ds.alter_columns({"path": text_field, "name": "text"})
        ds = lance.dataset(uri)
        versions.append(int(ds.version))
    keep_source = source_field == "source"
    out_schema = _output_schema(total, keep_source=keep_source)
    new_frags, schema, nbytes = [], None, 0
    read = ["text", "_rowaddr"] + ([source_field] if source_field and not keep_source else [])
    for frag in sorted(ds.get_fragments(), key=lambda f: f.fragment_id):
        func = _columns_func(bases[frag.fragment_id], out_schema, source, source_field)
        meta, schema = frag.merge_columns(func, columns=read)
        nbytes += sum(df.file_size_bytes or 0 for df in meta.files[len(frag.metadata.files) :])
        new_frags.append(meta)
    handle = Table(uri, ds)
    committed = handle.commit(
        lance.LanceOperation.Merge(new_frags, schema),
        op="adopt",
        message=f"adopt {uri} in place: add {', '.join(out_schema.names)}",
        properties={
            "tokenloom.columns": out_schema.names,
            "tokenloom.rows": str(total),
            "tokenloom.rejected": str(len(bad)),
        },
        read_version=ds.version,
    )
    versions.append(committed.version)
    if bad:
        for start in range(0, len(bad), 10000):  # one predicate of bounded size per commit
            chunk = bad[start : start + 10000]
            committed.dataset.delete(f"id IN ({', '.join(map(str, chunk))})")
        versions.append(int(lance.dataset(uri).version))
    adopted = Table.open(uri)
    return InPlaceResult(
        version=adopted.version,
        rows=adopted.count_rows(),
        next_id=total,
        versions=versions,
        bytes_added=nbytes,
    )


def _bad_rows(
    ds: lance.LanceDataset,
    text_field: str,
    bases: dict[int, int],
    check_row: Callable[[object], tuple[str, str] | None],
    on_reject: Callable[[int, str, str, object], None],
) -> list[int]:
    """The ids (physical positions) of the live rows whose text is not a document."""
    from tokenloom.ingest.readers import cell_values

    bad = []
    scanner = ds.scanner(columns=[text_field], with_row_address=True, batch_size=4096)
    for batch in scanner.to_batches():
        addr = batch.column("_rowaddr").to_numpy()  # (fragment id << 32) | offset, uint64
        frags = (addr >> np.uint64(32)).astype(np.int64)
        offsets = (addr & np.uint64(0xFFFFFFFF)).astype(np.int64)
        ids = np.array([bases[int(f)] for f in frags], dtype=np.int64) + offsets
        for rid, value in zip(ids.tolist(), cell_values(batch.column(text_field)), strict=True):
            problem = check_row(value)
            if problem is not None:
                bad.append(rid)
                on_reject(rid, problem[0], problem[1], value)
    return bad


def _output_schema(next_id: int, *, keep_source: bool) -> pa.Schema:
    id_meta = {SCHEMA_VERSION_KEY: SCHEMA_VERSION, NEXT_ID_KEY: str(next_id)}
    fields = [BASE_SCHEMA.field("id").with_metadata(id_meta)]
    if not keep_source:
        fields.append(BASE_SCHEMA.field("source"))
    fields += [BASE_SCHEMA.field("n_chars"), BASE_SCHEMA.field("meta")]
    return pa.schema(fields)


def _columns_func(base: int, schema: pa.Schema, source: str, source_field: str | None):  # noqa: ANN202
    """The ``merge_columns`` function of one fragment: a row's id is the fragment's base plus
    the row's offset in it (read from ``_rowaddr``: Lance calls the function once more on a
    probe batch, so a running count would be wrong)."""

    def func(batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        addr = batch.column("_rowaddr").to_numpy()
        ids = pa.array(base + (addr & np.uint64(0xFFFFFFFF)).astype(np.int64))
        n_chars = pc.fill_null(pc.utf8_length(batch.column("text")), 0).cast(pa.int64())
        columns = [ids]
        if "source" in schema.names:
            if source_field is None:
                columns.append(pa.array([source] * n, type=pa.string()))
            else:
                given = pc.cast(batch.column(source_field), pa.string())
                usable = pc.and_(pc.is_valid(given), pc.greater(pc.utf8_length(given), 0))
                columns.append(pc.if_else(pc.fill_null(usable, False), given, source))
        columns += [n_chars, pa.array(["{}"] * n, type=pa.string())]
        return pa.record_batch(columns, schema=schema)

    return func
