"""``tokenloom gc``: list (dry run) or delete what killed runs left behind beside a table."""

from __future__ import annotations

import click

from tokenloom.cli.options import (
    emit_json,
    existing_dir,
    json_option,
    storage_options_option,
    table_option,
)

__all__ = ["command"]


@click.command(
    "gc",
    epilog="""\b
Examples:
  tokenloom gc --table corpus.lance                    # dry run: what would go, and its size
  tokenloom gc --table corpus.lance --yes              # delete it
  tokenloom gc --table corpus.lance --runs runs/ --yes --lock-timeout 60

\b
Removes: data and deletion files no version of the table references (a writer
killed before its commit), stale backfill job directories, unit results, temporary
and lock files, and with --runs stale *.tmp-<pid> checkpoint files. A file any
version references is never touched; old versions stay (Lance's
cleanup_old_versions removes those, except the versions runs pinned with a
tag; `tokenloom info` lists them, `tokenloom runs rm` releases them).
A running ingest or backfill of the table
is waited for (its pid, host and start are shown) up to --lock-timeout seconds.
On an object store (s3://...) nothing records running writers: pass a
--min-age longer than any ingest or backfill of the table takes.""",
)
@table_option
@storage_options_option
@click.option(
    "--runs",
    default=None,
    metavar="DIR",
    type=existing_dir,
    help="Also remove stale checkpoint temporaries (*.tmp-<pid>) under this runs directory.",
)
@click.option("--yes", "--delete", "delete", is_flag=True, help="Delete; without it, a dry run.")
@click.option(
    "--lock-timeout",
    type=click.FloatRange(min=0),
    default=0,
    show_default=True,
    metavar="SECONDS",
    help="Wait this long for a running ingest or backfill of the table.",
)
@click.option(
    "--min-age",
    type=click.FloatRange(min=0),
    default=0,
    show_default=True,
    metavar="SECONDS",
    help="Only files at least this old (for writers outside tokenloom, which take no lock).",
)
@json_option
def command(
    table: str,
    storage_options: dict,
    runs: str | None,
    delete: bool,
    lock_timeout: float,
    min_age: float,
    as_json: bool,
) -> None:
    """Find and delete orphan data files, stale backfill jobs, locks and temporaries."""
    from tokenloom.table.gc import collect_garbage

    report = collect_garbage(
        table, runs=runs, delete=delete, lock_timeout=lock_timeout, min_age=min_age,
        storage_options=storage_options,
    )  # fmt: skip
    if as_json:
        emit_json(report.to_json())
        return
    mode = "deleted" if delete else "would delete"
    pinned = sorted({p["version"] for p in report.pins})
    held = f" ({len(pinned)} pinned by tags: v{', v'.join(map(str, pinned))})" if pinned else ""
    click.echo(
        f"gc {report.table}: {report.versions_kept} versions kept{held}, every file they read kept"
    )
    for item in report.items:
        click.echo(f"  {mode} {item.kind:<10} {item.bytes:>12,} B  {item.path}  ({item.reason})")
    size = f"{len(report.items)} item(s), {report.bytes:,} bytes ({report.bytes / 1e6:,.2f} MB)"
    if not report.items:
        click.echo("nothing to delete")
    elif delete:
        click.echo(f"deleted {size}")
    else:
        click.echo(f"would delete {size}; run again with --yes to delete")
