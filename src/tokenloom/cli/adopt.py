"""``tokenloom adopt``: an existing Lance dataset or LanceDB table under tokenloom, its text
written at most once."""

from __future__ import annotations

import click

from tokenloom.cli.options import (
    emit_json,
    json_option,
    optional_table_option,
    storage_options_option,
)

__all__ = ["command"]


@click.command(
    "adopt",
    epilog="""\b
Two ways:
  copy (default)  a new table --table DST is written from SRC, the text once (ingest reads
                  SRC like a Parquet file; SRC is only read). The other columns go to meta,
                  or to typed columns with --columns.
  --in-place      SRC itself becomes the table: id, source, n_chars and meta are added as
                  new columns by one Merge commit; no existing data file is rewritten (a
                  text column of another name is renamed, metadata only). Possible only
                  when SRC was created with stable row ids (Lance enables them only at
                  creation: lance.write_dataset(..., enable_stable_row_ids=True)) and keeps
                  its text as large_string; otherwise adopt names what is missing, and the
                  copy is the way.
Bad rows (null, empty or whitespace text, invalid UTF-8, oversized) are counted by reason
and listed in a rejects file, as ingest does; in place they are deleted (deletion files;
the rows stay readable in the earlier versions). Exit status: 0 adopted, 1 the dataset
cannot be adopted as asked (the reason named), 2 usage error.

\b
Examples:
  tokenloom adopt db/docs.lance --table corpus.lance --text-field content
  tokenloom adopt db/docs.lance --table corpus.lance --source-field origin --columns lang
  tokenloom adopt docs.lance --in-place --source web""",
)
@click.argument("src", type=click.Path(path_type=str))
@optional_table_option("The new tokenloom table (a copy); with --in-place, omitted or SRC itself.")
@storage_options_option
@click.option("--in-place", is_flag=True, help="Add tokenloom's columns to SRC itself (see below).")
@click.option(
    "--text-field", default="text", show_default=True, help="SRC's column holding the text."
)
@click.option("--source", default=None, help="Source name for every row.")
@click.option(
    "--source-field",
    default=None,
    metavar="COLUMN",
    help="SRC's column naming each row's source [default: 'source' when SRC has it; rows "
    "without a value take --source, else SRC's folder name].",
)
@click.option(
    "--columns",
    default=None,
    metavar="NAME:TYPE,...",
    help="Copy: keep these SRC columns as typed columns instead of in meta (as ingest).",
)
@click.option(
    "--errors",
    type=click.Choice(["strict", "replace"]),
    default="strict",
    show_default=True,
    help="Copy: invalid UTF-8 rejects the row, or keeps it with U+FFFD (in place: rejected).",
)
@click.option(
    "--rejects",
    "rejects_path",
    default=None,
    metavar="FILE",
    help="Write rejections here [default: <table>.rejects/ingest-<time>.jsonl].",
)
@json_option
def command(
    src: str,
    table: str | None,
    storage_options: dict,
    in_place: bool,
    text_field: str,
    source: str | None,
    source_field: str | None,
    columns: str | None,
    errors: str,
    rejects_path: str | None,
    as_json: bool,
) -> None:
    """Bring the Lance dataset SRC (a LanceDB table's folder too) under tokenloom."""
    from tokenloom.ingest.adopt import adopt
    from tokenloom.ingest.inputs import is_lance_dataset
    from tokenloom.table.core import normalize_uri

    if "://" in src and not src.startswith("file://"):
        raise click.BadParameter(
            f"{src!r} is not a local folder; adopt reads a Lance dataset on local disk (copy it "
            "down first, or read an object-store table where it is)",
            param_hint="'SRC'",
        )
    if not is_lance_dataset(normalize_uri(src)):
        raise click.BadParameter(
            f"{src!r} is not the folder of a Lance dataset (no _versions inside); `tokenloom "
            "ingest` reads JSONL, Parquet and text files",
            param_hint="'SRC'",
        )
    if in_place and table is not None and normalize_uri(table) != normalize_uri(src):
        raise click.UsageError(
            f"--in-place makes SRC itself the table; drop --table {table}, or drop --in-place "
            "to copy SRC into it"
        )
    if not in_place and table is None:
        raise click.UsageError(
            f"--table is required to copy SRC (`tokenloom adopt {src} --table NEW.lance`); "
            "pass --in-place to adopt SRC itself"
        )
    if not in_place and normalize_uri(table) == normalize_uri(src):
        raise click.UsageError(
            f"--table {table} is SRC itself; pass --in-place to adopt it in place, or a new "
            "--table path to copy it"
        )
    if in_place and storage_options:
        raise click.UsageError("--in-place adopts a local dataset; --storage-options is for a copy")
    if in_place and columns is not None:
        raise click.UsageError("--columns applies to a copy; in place every column stays one")
    if source is not None and source_field is not None and in_place:
        raise click.UsageError("give --source or --source-field with --in-place, not both")
    if source_field is not None:
        import lance

        names = lance.dataset(normalize_uri(src)).schema.names
        if source_field not in names:
            raise click.BadParameter(
                f"SRC has no column {source_field!r}; its columns: {', '.join(names)}",
                param_hint="'--source-field'",
            )
    result = adopt(
        src,
        table,
        in_place=in_place,
        text_field=text_field,
        source=source,
        source_field=source_field,
        columns=columns,
        errors=errors,
        rejects_path=rejects_path,
        storage_options=storage_options,
    )
    if as_json:
        emit_json(result.to_json())
        return
    rejected = sum(result.rejected.values())
    if result.mode == "in_place":
        click.echo(
            f"adopted {result.source} in place as version {result.version} (commits "
            f"{', '.join(map(str, result.versions))}): {result.rows:,} rows, {rejected:,} "
            f"rejected; added id, source, n_chars, meta ({result.bytes_added:,} bytes of new "
            "files; no existing data file rewritten)"
        )
    elif result.version is None:
        click.echo(f"nothing new for {result.table}: {result.source} was adopted before")
    else:
        click.echo(
            f"adopted {result.source} as {result.table} version {result.version} (a copy, text "
            f"written once): {result.rows:,} rows, {rejected:,} rejected"
        )
    for reason, count in result.rejected.items():
        click.echo(f"  {reason:<20} {count:>10,}")
    if result.rejects_path:
        click.echo(f"every rejection is listed in {result.rejects_path}")
