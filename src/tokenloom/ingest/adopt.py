"""``tokenloom adopt``: bring an existing Lance dataset (a LanceDB table's folder too) under
tokenloom, writing its text at most once.

Two ways, chosen by the caller:

- **copy** (the default): the dataset is read as an ingest input (:func:`~tokenloom.ingest.ingest`
  reads a Lance folder like a Parquet file) into a new table, the text written once; bad rows are
  rejected, counted and listed exactly as ingest does, the other columns kept in ``meta`` (or as
  typed columns with ``columns``), the dataset itself left untouched;
- **in place**: the missing columns are added to the dataset itself by one ``Merge`` commit
  (:mod:`tokenloom.table.adopt`), no existing data file rewritten; possible only when the dataset
  was created with stable row ids and keeps its text as large_string (every unmet requirement is
  named, with the copy to run instead).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tokenloom.errors import IngestError
from tokenloom.ingest.inputs import is_lance_dataset
from tokenloom.ingest.readers import ReadOptions, check_text
from tokenloom.ingest.rejects import Reason, Reject, RejectLog, excerpt_of
from tokenloom.ingest.run import IngestResult, default_rejects_path, ingest
from tokenloom.table.core import normalize_uri

__all__ = ["AdoptError", "AdoptResult", "adopt"]


class AdoptError(IngestError):
    """The dataset cannot be adopted as asked (not a Lance dataset, or not in place)."""


@dataclass(kw_only=True)
class AdoptResult:
    """What an adoption did."""

    mode: str
    """``"copy"`` or ``"in_place"``."""
    source: str
    """The adopted dataset."""
    table: str
    """The tokenloom table (the dataset itself in place)."""
    version: int | None
    """The table's version after the adoption (``None``: a copy had nothing new to write)."""
    rows: int
    """Rows the table holds from the dataset."""
    rejected: dict[str, int] = field(default_factory=dict)
    """Rows set aside, by reason."""
    rejects_path: str | None = None
    """Where each rejected row is listed."""
    versions: list[int] = field(default_factory=list)
    """In place: every version the adoption committed."""
    bytes_added: int = 0
    """In place: size of the new data files (the added columns only)."""
    ingest: IngestResult | None = None
    """A copy: the ingest's own report."""

    def to_json(self) -> dict:
        """The ``--json`` document."""
        out = {k: getattr(self, k) for k in ("mode", "source", "table", "version", "rows")}
        out.update(rejected=self.rejected, rejects_path=self.rejects_path)
        if self.mode == "in_place":
            out.update(versions=self.versions, bytes_added=self.bytes_added)
        elif self.ingest is not None:
            out["ingest"] = self.ingest.to_json()
        return out


def adopt(
    src: str | os.PathLike[str],
    table: str | os.PathLike[str] | None = None,
    *,
    in_place: bool = False,
    text_field: str = "text",
    source: str | None = None,
    source_field: str | None = None,
    columns: str | None = None,
    errors: str = "strict",
    max_doc_bytes: int = 512 << 20,
    rejects_path: str | None = None,
    progress: bool | None = None,
    storage_options: dict[str, str] | None = None,
) -> AdoptResult:
    """Adopt the local Lance dataset ``src``: copy it into the new table ``table``, or with
    ``in_place`` make ``src`` itself a tokenloom table (see the module docstring). The other
    arguments are :func:`~tokenloom.ingest.ingest`'s (``storage_options``: for a copy into an
    object-store ``table``; ``src`` is a local folder).

    Raises:
        AdoptError: ``src`` is not a Lance dataset, the target is wrong for the mode, or an
            in-place adoption is impossible (each unmet requirement named).
        IngestError: A copy could read no row.
    """
    uri = normalize_uri(src)
    if not is_lance_dataset(uri):
        raise AdoptError(
            f"{uri} is not a Lance dataset (no _versions folder); adopt takes the folder of a "
            "Lance dataset or LanceDB table, e.g. `tokenloom adopt db/docs.lance --table "
            "corpus.lance`; `tokenloom ingest` reads JSONL, Parquet and text files"
        )
    if in_place:
        if table is not None and normalize_uri(table) != uri:
            raise AdoptError(
                f"an in-place adoption makes {uri} itself the table; drop --table "
                f"{normalize_uri(table)} (or drop --in-place to copy into it)"
            )
        return _in_place(uri, text_field, source, source_field, max_doc_bytes, rejects_path)
    if table is None:
        raise AdoptError(f"name the new table: `tokenloom adopt {uri} --table NEW.lance`")
    if normalize_uri(table) == uri:
        raise AdoptError(
            f"--table {uri} is the dataset itself; pass --in-place to adopt it in place, or a "
            "new --table path to copy it"
        )
    result = ingest(
        [uri],
        table,
        source=source,
        source_field=source_field or "source",
        text_field=text_field,
        errors=errors,
        max_doc_bytes=max_doc_bytes,
        rejects_path=rejects_path,
        progress=progress,
        columns=columns,
        storage_options=storage_options,
    )
    return AdoptResult(
        mode="copy",
        source=uri,
        table=result.table,
        version=result.version,
        rows=result.rows_written,
        rejected=result.rejected,
        rejects_path=result.rejects_path,
        ingest=result,
    )


def _in_place(
    uri: str,
    text_field: str,
    source: str | None,
    source_field: str | None,
    max_doc_bytes: int,
    rejects_path: str | None,
) -> AdoptResult:
    import lance

    from tokenloom.errors import TableError
    from tokenloom.table.adopt import adopt_in_place

    if source is not None and source_field is not None:
        raise AdoptError("give --source NAME or --source-field COLUMN, not both")
    if source_field is None and source is None and "source" in lance.dataset(uri).schema.names:
        source_field = "source"  # the dataset's own source column, as ingest reads it
    name = os.path.basename(uri.rstrip(os.sep)).split(".", 1)[0] or "lance"
    opts = ReadOptions(text_field=text_field, max_doc_bytes=max_doc_bytes)

    def check_row(value: object) -> tuple[str, str] | None:
        if isinstance(value, bytes):  # a cell that is not UTF-8 (readers.cell_values)
            return Reason.INVALID_UTF8, "not valid UTF-8; an in-place adoption cannot repair it"
        if isinstance(value, str) and len(value) > max_doc_bytes // 4:
            size = len(value.encode("utf-8", errors="surrogatepass"))
            if size > max_doc_bytes:
                return Reason.TOO_LARGE, f"{size} bytes"
        text, reason, detail = check_text(value, opts)
        return None if text is not None else (reason, detail)

    target = rejects_path or default_rejects_path(uri)
    with RejectLog(target) as log:

        def on_reject(rid: int, reason: str, detail: str, value: object) -> None:
            excerpt = excerpt_of(value) if isinstance(value, str | bytes) else repr(value)[:160]
            log.add(Reject(file=uri, reason=reason, row=rid, detail=detail, excerpt=excerpt))

        try:
            done = adopt_in_place(
                uri,
                text_field=text_field,
                source=source or name,
                source_field=source_field,
                check_row=check_row,
                on_reject=on_reject,
            )
        except TableError as exc:
            raise AdoptError(
                f"{exc}. Copy it instead, writing the text once: `tokenloom adopt {uri} "
                f"--table NEW.lance --text-field {text_field}`"
            ) from exc
    return AdoptResult(
        mode="in_place",
        source=uri,
        table=uri,
        version=done.version,
        rows=done.rows,
        rejected=dict(sorted(log.counts.items())),
        rejects_path=log.path,
        versions=done.versions,
        bytes_added=done.bytes_added,
    )
