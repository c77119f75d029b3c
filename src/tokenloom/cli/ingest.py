"""``tokenloom ingest``: raw files into the table as one new version."""

from __future__ import annotations

import click

from tokenloom.cli.options import (
    emit_json,
    json_option,
    mib_to_bytes,
    storage_options_option,
    table_option,
)

__all__ = ["command"]


@click.command(
    "ingest",
    epilog="""\b
Examples:
  tokenloom ingest corpus/*.jsonl --table corpus.lance
  tokenloom ingest dump.jsonl.zst --table corpus.lance --source web --text-field content
  tokenloom ingest books/ --glob '**/*.txt' --table corpus.lance --source books
  tokenloom ingest data.parquet --table corpus.lance --errors replace --json
  tokenloom ingest crawl.jsonl --table corpus.lance --text-field doc.text
  tokenloom ingest hf://downloads/wikitext --table corpus.lance --split train
  tokenloom ingest saved/ --table corpus.lance     # a folder datasets.save_to_disk wrote
  tokenloom ingest s3://raw/dump.jsonl.zst --table s3://bucket/corpus.lance \
      --storage-options aws_endpoint=http://127.0.0.1:8333
  tokenloom ingest caps.parquet --table img.lance --columns score:float,lang:string,image:blob

\b
Bad records (broken JSON, missing/null/non-string text, invalid UTF-8, empty
documents, binary, unreadable or special files, oversized records) are skipped,
counted by reason and listed in a rejects file; valid records are never lost
with them. Files ingested before (same content fingerprint) are skipped unless
--force. Exit status: 0 when the run completed (even with rejections), 1 when
nothing could be ingested, 2 on a usage error.""",
)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@table_option
@storage_options_option
@click.option(
    "--source",
    default=None,
    help="Source name for every row [default: the record's "
    "'source' field, else the file stem or directory name].",
)
@click.option(
    "--text-field",
    default="text",
    show_default=True,
    help="JSON key or Parquet column holding the document text; a dotted path (doc.text) "
    "reaches into nested objects and structs.",
)
@click.option(
    "--split",
    default=None,
    metavar="NAME",
    help="Hugging Face dataset folders (hf://DIR, or a save_to_disk folder): read only this "
    "split [default: every split, named in meta._split].",
)
@click.option(
    "--glob",
    "glob_",
    default="**/*.txt",
    show_default=True,
    help="Files taken from directory inputs, one document per file.",
)
@click.option(
    "--errors",
    type=click.Choice(["strict", "replace"]),
    default="strict",
    show_default=True,
    help="Invalid UTF-8: reject the record, or keep it with U+FFFD.",
)
@click.option(
    "--force", is_flag=True, help="Ingest files even if their content was ingested before."
)
@click.option(
    "--max-doc-mb",
    "max_doc_bytes",
    type=click.FloatRange(min=0, min_open=True),
    callback=mib_to_bytes,
    default=512,
    show_default=True,
    help="Reject records larger than this many MiB.",
)
@click.option(
    "--follow-symlinks",
    is_flag=True,
    help="Inside directories, also follow symlinks that point outside them.",
)
@click.option(
    "--columns",
    default=None,
    metavar="NAME:TYPE,...",
    help="Store these record fields as typed, filterable columns instead of in meta; TYPE is "
    "int, float, string, bool, binary or blob (Lance blob encoding, read lazily); a name "
    "without a type takes its Parquet type. Parquet binary columns are always blob columns.",
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
    paths: tuple[str, ...],
    table: str,
    storage_options: dict,
    source: str | None,
    text_field: str,
    split: str | None,
    glob_: str,
    errors: str,
    force: bool,
    max_doc_bytes: int,
    follow_symlinks: bool,
    columns: str | None,
    rejects_path: str | None,
    as_json: bool,
) -> None:
    """Ingest JSONL (.gz/.zst), Parquet, text directories and HF dataset folders into a table."""
    from tokenloom.ingest import ingest
    from tokenloom.ingest.rejects import printable

    if source is not None and printable(source) != source:
        raise click.BadParameter(
            f"{printable(source)!r} is not valid UTF-8; pass a UTF-8 source name",
            param_hint="--source",
        )

    result = ingest(
        paths,
        table,
        source=source,
        text_field=text_field,
        errors=errors,
        glob=glob_,
        force=force,
        max_doc_bytes=max_doc_bytes,
        rejects_path=rejects_path,
        follow_symlinks=follow_symlinks,
        storage_options=storage_options,
        columns=columns,
        split=split,
    )
    if as_json:
        emit_json(result.to_json())
        return
    for path in result.skipped_files:
        click.echo(
            f"skipped {printable(path)}: already ingested (same content); --force to ingest again"
        )
    seen = (
        f"seen {result.records_seen:,} records = {result.rows_written:,} written + "
        f"{sum(result.rejected.values()):,} rejected + {result.skipped:,} skipped"
    )
    if result.version is None:
        click.echo(f"nothing new for {result.table} ({seen})")
        return
    mb = result.bytes_read / 1e6
    click.echo(
        f"wrote {result.rows_written:,} rows (ids {result.first_id}..{result.last_id}) to "
        f"{result.table} as version {result.version}  [{mb:,.1f} MB in {result.seconds:.1f} s, "
        f"{mb / max(result.seconds, 1e-9):,.1f} MB/s]"
    )
    if result.rejected:
        total = sum(result.rejected.values())
        click.echo(f"rejected {total:,} records:")
        for reason, count in result.rejected.items():
            click.echo(f"  {reason:<20} {count:>10,}")
    else:
        click.echo("rejected 0 records")
    if result.notes:
        click.echo("kept, with a note:")
        for reason, count in result.notes.items():
            click.echo(f"  {reason:<20} {count:>10,}")
    if result.rejects_path:
        click.echo(f"every rejection and note is listed in {result.rejects_path}")
    click.echo(seen)
