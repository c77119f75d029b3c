"""``tokenloom refresh``: compute every derived column for the rows it lacks (after an append)."""

from __future__ import annotations

import click

from tokenloom.cli.options import (
    emit_json,
    json_option,
    storage_options_option,
    table_option,
    workers_option,
)

__all__ = ["command"]


@click.command(
    "refresh",
    epilog="""\b
Examples:
  tokenloom ingest more/*.jsonl --table corpus.lance   # new rows: derived columns null
  tokenloom info --table corpus.lance                  # rows each column is computed for
  tokenloom refresh --table corpus.lance               # dedup, score, tokenize... the new rows
  tokenloom refresh --table corpus.lance --workers 0 --json

\b
Each column a backfill added records the UDF that made it; refresh runs
that job again, computing only the rows the column lacks. Exit status 1
when a column is left that no recorded UDF can fill (it is named).""",
)
@table_option
@storage_options_option
@workers_option
@json_option
def command(table: str, storage_options: dict, workers: int | None, as_json: bool) -> None:
    """Bring every derived column (dedup flags, quality, token ids, embeddings, your UDFs) up to
    date with the rows appended since it was computed, each with its recorded UDF."""
    from tokenloom.refresh import RefreshError, refresh_table

    res = refresh_table(table, workers=workers, storage_options=storage_options)
    if as_json:
        emit_json(res.to_json())
    else:
        if not res.steps:
            click.echo(f"every derived column covers all {res.rows:,} rows; nothing to do")
        for step in res.steps:
            versions = ", ".join(map(str, step.versions)) or "none"
            click.echo(
                f"{step.job}: {', '.join(step.columns)} for {step.rows_missing:,} rows "
                f"-> versions {versions} ({step.seconds:.1f} s)"
            )
        click.echo(f"table version {res.version}, {res.rows:,} rows")
    if res.not_refreshable:
        cols = ", ".join(f"{c} ({n:,} rows)" for c, n in res.not_refreshable.items())
        raise RefreshError(
            f"not computed for every row and no recorded UDF can fill them: {cols}; rerun the "
            "command that made them, e.g. `tokenloom backfill run --table "
            f"{table} --udf module:name`"
        )
