"""``tokenloom info``: rows, versions, columns with bytes on disk, rows per source."""

from __future__ import annotations

import click

from tokenloom.cli.options import (
    emit_json,
    json_option,
    storage_options_option,
    table_option,
    version_option,
)

__all__ = ["command", "format_info", "format_pins", "format_versions"]


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f} MB" if n >= 10_000 else f"{n:,} B"


def format_info(info) -> str:  # noqa: ANN001 - TableInfo
    """The human-readable summary of a :class:`tokenloom.table.TableInfo`."""
    lines = [
        f"table    {info.uri}",
        f"version  {info.version}    rows {info.rows:,}    fragments {info.fragments}    "
        f"data files {info.data_files} ({_mb(info.data_file_bytes)})",
        "",
        "columns",
    ]
    missing = []
    for col in info.columns:
        rows = f"{col.rows_computed:,}/{info.rows:,} rows"
        lines.append(f"  {col.name:<16} {col.type:<28} {_mb(col.bytes):>14}  {rows}")
        if col.rows_computed < info.rows:
            missing.append(col.name)
    lines.append(
        f"  {'(file overhead)':<16} {'footers, metadata, alignment':<28} "
        f"{_mb(info.overhead_bytes):>14}"
    )
    if missing:
        lines.append(
            f"  not computed for every row: {', '.join(missing)}; "
            f"run `tokenloom refresh --table {info.uri}`"
        )
    lines += ["", "versions (bytes added)"]
    lines += format_versions(info.versions)
    lines += ["", "versions pinned (Lance tags; gc and Lance's cleanup keep them)"]
    lines += format_pins(info.pins)
    lines += ["", "rows per source"]
    for source, count in info.rows_per_source.items():
        lines.append(f"  {source:<24} {count:>10,}")
    return "\n".join(lines)


def format_pins(pins: list[dict]) -> list[str]:
    """One line per tag: the version it keeps and the run holding it."""
    if not pins:
        return ["  none (no run holds a version; `tokenloom train` tags the one it trains on)"]
    lines = []
    for p in pins:
        who = f"run {p['run']}" if p["run"] else "a tag no tokenloom run made"
        lines.append(f"  {p['version']:>4}  {who}  ({p['tag']})")
    return lines


def format_versions(versions) -> list[str]:  # noqa: ANN001 - list[VersionInfo]
    """One line per version: number, time, operation, rows, bytes added, message."""
    lines, prev = [], 0
    for v in versions:
        when = v.timestamp.strftime("%Y-%m-%d %H:%M:%S")
        added = v.total_bytes - prev
        prev = v.total_bytes
        lines.append(
            f"  {v.version:>4}  {when}  {v.operation:<9} {v.num_rows:>9,} rows "
            f"{'+' if added >= 0 else '-'}{_mb(abs(added)):>11}  {v.message}"
        )
    return lines


@click.command(
    "info",
    epilog="""\b
Examples:
  tokenloom info --table corpus.lance
  tokenloom info --table corpus.lance --version 2 --json""",
)
@table_option
@storage_options_option
@version_option("Describe this version instead of the latest.")
@json_option
def command(table: str, storage_options: dict, table_version: int | None, as_json: bool) -> None:
    """Summarise a table: rows, versions and what made them, column sizes and how many rows
    each column is computed for, sources."""
    from tokenloom.table import Table, table_info

    opened = Table.open(table, version=table_version, storage_options=storage_options)
    info = table_info(opened)
    if as_json:
        emit_json(info.to_json())
    else:
        click.echo(format_info(info))
