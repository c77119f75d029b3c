"""``tokenloom doc-loss``: each row's mean token loss under a trained run, as a new column."""

from __future__ import annotations

import click

from tokenloom.cli.options import (
    emit_json,
    filter_option,
    json_option,
    run_record,
    storage_options_option,
    table_option,
    workers_option,
)

__all__ = ["commands"]


@click.command(
    "doc-loss",
    epilog="""\b
Examples:
  tokenloom doc-loss --table corpus.lance --checkpoint runs/tiny --column loss_tiny
  tokenloom doc-loss --table corpus.lance --checkpoint runs/tiny --column loss_tiny \\
      --filter "source = 'wiki'" --workers 4 --json
  tokenloom stats --table corpus.lance --filter "loss_tiny > 6"
  tokenloom search --table corpus.lance "def main" --where "loss_tiny > 6" --limit 5

\b
Each row's mean next-token loss under the run's model, as training computes it
(attention inside the document, the last token predicting EOS; documents longer
than the model's context in consecutive windows, the mean over all targets).
A backfill: parallel, resumable (a killed run keeps its finished units), one new
table version; rows outside --filter and empty documents get null.""",
)
@table_option
@storage_options_option
@click.option(
    "--checkpoint", "--run", "checkpoint", required=True, metavar="RUN",
    help="The run's --out directory (its last checkpoint).",
)  # fmt: skip
@click.option("--column", required=True, help="Name of the new float column.")
@filter_option("Compute only these rows; others null.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Documents (or windows of long ones) per forward pass.",
)
@workers_option
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Spawned local processes, or Ray tasks.",
)
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="Where each worker runs the model: cpu, cuda, cuda:1, ... (auto: a GPU if visible).",
)
@click.option(
    "--unit-rows",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="Rows per checkpointed work unit.",
)
@json_option
def doc_loss(
    table: str,
    storage_options: dict,
    checkpoint: str,
    column: str,
    filter: str | None,
    batch_size: int,
    workers: int | None,
    executor: str,
    device: str,
    unit_rows: int,
    as_json: bool,
) -> None:
    """Add each row's mean token loss under a trained run as a float column."""
    from tokenloom.errors import require
    from tokenloom.table.names import ColumnNameError, validate_column_name

    try:
        validate_column_name(column, what="--column")
    except ColumnNameError as exc:
        raise click.BadParameter(str(exc), param_hint="--column") from None
    run_record(checkpoint, option="--checkpoint")  # no run there: exit 2, as export and sample
    require("torch", extra="train")  # after the checks: a usage error costs no torch import
    from tokenloom.train.config import TrainError
    from tokenloom.train.dist import resolve_device

    try:
        device = str(resolve_device(device))
    except TrainError as exc:
        raise click.BadParameter(str(exc), param_hint="--device") from None
    from tokenloom.train.docloss import doc_loss_table

    result = doc_loss_table(
        table,
        checkpoint,
        column,
        where=filter,
        batch_size=batch_size,
        workers=workers,
        executor=executor,
        device=device,
        unit_rows=unit_rows,
        storage_options=storage_options,
    )
    if as_json:
        emit_json(result.to_json())
    elif result.version is None:
        click.echo(f"{column}: every row already has it; nothing to do")
    else:
        click.echo(
            f"{column}: mean token loss of {result.rows:,} rows under {result.run} (step "
            f"{result.step}, windows of {result.window}) as version {result.version} "
            f"({result.units} units, {result.units_reused} reused from an earlier run, "
            f"{result.seconds:.1f} s); e.g. `tokenloom stats --table {table} --filter "
            f'"{column} > 6"`'
        )


commands = [doc_loss]
