"""``tokenloom backfill``: add a column computed by a UDF; show the progress of backfill jobs."""

from __future__ import annotations

import json

import click

from tokenloom.cli.options import (
    emit_json,
    filter_option,
    json_option,
    storage_options_option,
    table_option,
    workers_option,
)

__all__ = ["command"]


@click.group(
    "backfill",
    epilog="""\b
Examples:
  tokenloom backfill run --table corpus.lance --udf tokenloom.backfill.builtin:n_words
  tokenloom backfill run --table corpus.lance --udf mypkg.udfs:score --workers 4 \\
      --where "NOT is_dup"
  tokenloom backfill status --table corpus.lance
  tokenloom refresh --table corpus.lance      # after an append: every column's new rows""",
)
def command() -> None:
    """Add columns computed by UDFs — parallel, checkpointed, resumable, rewriting nothing."""


@command.command(
    "run",
    epilog="""\b
Examples:
  tokenloom backfill run --table corpus.lance --udf mypkg.udfs:n_words --workers 4
  tokenloom backfill run --table corpus.lance --udf mypkg.udfs:Tokenize --arg spec=gpt2
  tokenloom backfill run --table corpus.lance --udf mypkg.udfs:score --where "source = 'wiki_en'"
  tokenloom backfill run --table corpus.lance --udf mypkg.udfs:embed --executor ray
  tokenloom backfill run --table s3://bucket/corpus.lance --udf mypkg.udfs:embed \\
      --executor ray --ray-address 10.0.0.1:6379 --num-gpus 1 --resources '{"a100": 1}'

\b
Killed? Run the same command again: finished work units are reused and the
column is committed once. After new rows are ingested, the same command
computes the column for the new rows only.""",
)
@table_option
@storage_options_option
@click.option(
    "--udf",
    "udf_ref",
    required=True,
    metavar="MODULE:NAME",
    help="The UDF, as an import path (a function or class decorated with @udf).",
)
@click.option(
    "--column",
    "name",
    default=None,
    help="Name of the new column [default: the UDF's output name].",
)
@click.option(
    "--arg",
    "args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Constructor argument of a class UDF (VALUE parsed as JSON, else text).",
)
@workers_option
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Spawned local processes, or Ray tasks.",
)
@click.option("--ray-address", default=None, help="An existing Ray cluster [default: local].")
@click.option(
    "--num-cpus",
    type=click.FloatRange(min=0),
    default=None,
    help="Ray: CPUs each work unit reserves [default: the UDF's, else 1].",
)
@click.option(
    "--num-gpus",
    type=click.FloatRange(min=0),
    default=None,
    help="Ray: GPUs each work unit needs [default: the UDF's].",
)
@click.option(
    "--memory",
    type=click.IntRange(min=0),
    default=None,
    metavar="BYTES",
    help="Ray: memory each work unit reserves [default: the UDF's].",
)
@click.option(
    "--resources",
    "custom_resources",
    default=None,
    metavar="JSON",
    callback=lambda _ctx, _param, value: _custom_resources(value),
    help="""Ray: custom resources each work unit needs, e.g. '{"a100": 1}' [default: the UDF's].""",
)
@filter_option("Compute only these rows; others null.")
@click.option(
    "--unit-rows",
    type=click.IntRange(min=1),
    default=16384,
    show_default=True,
    help="Rows per checkpointed work unit.",
)
@click.option(
    "--lock-timeout",
    type=click.FloatRange(min=0),
    default=600,
    show_default=True,
    metavar="SECONDS",
    help="Wait this long while another process runs the same backfill (who holds it is shown).",
)
@json_option
def run(
    table: str,
    storage_options: dict,
    udf_ref: str,
    name: str | None,
    args: tuple[str, ...],
    workers: int | None,
    executor: str,
    ray_address: str | None,
    num_cpus: float | None,
    num_gpus: float | None,
    memory: int | None,
    custom_resources: dict[str, float] | None,
    filter: str | None,
    unit_rows: int,
    lock_timeout: float,
    as_json: bool,
) -> None:
    """Compute a UDF for every row lacking it and commit the column as one new version."""
    from tokenloom.backfill import add_column, load_udf
    from tokenloom.table import Table
    from tokenloom.table.names import validate_column_name

    if name is not None:
        validate_column_name(name, what="--column")  # before the UDF is even imported
    kwargs = {}
    for item in args:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--arg")
        try:
            kwargs[key] = json.loads(value)
        except ValueError:
            kwargs[key] = value
    udf = load_udf(udf_ref, **kwargs).with_resources(
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        memory=memory,
        resources=custom_resources,
    )
    result = add_column(
        Table.open(table, storage_options=storage_options),
        name,
        udf,
        workers=workers,
        executor=executor,
        where=filter,
        unit_rows=unit_rows,
        ray_address=ray_address,
        lock_timeout=lock_timeout,
    )
    if as_json:
        emit_json(result.to_json())
    elif result.version is None:
        click.echo(f"{', '.join(result.columns)}: every row already has it; nothing to do")
    else:
        click.echo(
            f"added {', '.join(result.columns)} for {result.rows:,} rows as version "
            f"{result.version} ({result.units} units, {result.units_reused} reused from an "
            f"earlier run, {result.bytes_added / 1e6:,.2f} MB added, {result.seconds:.1f} s"
            + (f", on {len(result.nodes)} Ray node(s))" if executor == "ray" else ")")
        )


def _custom_resources(text: str | None) -> dict[str, float] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(
            f"expected a JSON object like '{{\"a100\": 1}}', got {text!r} ({exc})",
            param_hint="--resources",
        ) from None
    if not isinstance(value, dict):
        raise click.BadParameter(
            f"expected a JSON object like '{{\"a100\": 1}}', got {text!r}",
            param_hint="--resources",
        )
    return value


@command.command(
    "status",
    epilog="""\b
Examples:
  tokenloom backfill status --table corpus.lance
  tokenloom backfill status --table corpus.lance --json""",
)
@table_option
@storage_options_option
@json_option
def status(table: str, storage_options: dict, as_json: bool) -> None:
    """Show each backfill job of a table: state and done/remaining work units."""
    from tokenloom.backfill import default_checkpoint_root, list_jobs
    from tokenloom.table import normalize_uri
    from tokenloom.table.storage import resolve_storage_options

    uri = normalize_uri(table)
    so = resolve_storage_options(uri, storage_options)
    jobs = list_jobs(default_checkpoint_root(uri), storage_options=so)
    if as_json:
        emit_json([j.to_json() for j in jobs])
        return
    if not jobs:
        click.echo("no backfill jobs")
        return
    for j in jobs:
        udf = f"{j.udf.get('name')} v{j.udf.get('version')}"
        line = (
            f"{j.column:<24} {udf:<28} {j.state:<10} units {j.units_done}/{j.units_total} "
            f"({j.units_remaining} remaining)  rows {j.rows_done:,}/{j.rows_total:,}"
        )
        if j.version is not None:
            line += f"  -> version {j.version}"
        click.echo(line)
        if j.error:
            click.echo(f"    error: {j.error}")
