"""``tokenloom quarantine``: record the rows a range of training steps fed, to leave them out."""

from __future__ import annotations

import json

import click

from tokenloom.cli.options import json_option, run_record, storage_options_option

__all__ = ["command"]


@click.command(
    "quarantine",
    epilog="""\b
Examples:
  tokenloom quarantine --checkpoint runs/tiny --steps 120:140 --name spike-120
  tokenloom train --table corpus.lance --out runs/tiny --resume --exclude spike-120
  tokenloom train --table corpus.lance --out runs/tiny/step-100 --resume --exclude spike-120""",
)
@click.option(
    "--checkpoint",
    "--run",
    "checkpoint",
    required=True,
    metavar="RUN",
    help="The run's --out directory (its latest checkpoint) or RUN/step-N.",
)
@click.option(
    "--steps",
    "steps",
    required=True,
    metavar="A:B",
    help="Optimizer steps A..B (1-based, inclusive; a single step: A).",
)
@click.option(
    "--name",
    "quarantine_name",
    default=None,
    help="The quarantine's name under the table [default: <run name>-steps-A-B].",
)
@storage_options_option
@json_option
def command(
    checkpoint: str,
    steps: str,
    quarantine_name: str | None,
    storage_options: dict,
    as_json: bool,
) -> None:
    """Record the rows that steps A..B of a run fed (recomputed as `tokenloom trace` does) under
    the table's URI (_tokenloom/quarantine/NAME.lance), with the run, the steps and the counts.

    `tokenloom train --resume --exclude NAME` then leaves exactly those rows out of the rest of
    the run (from its latest checkpoint, or from a kept RUN/step-N to rewind).
    """
    from tokenloom.search.quarantine import (
        QuarantineError,
        check_name,
        parse_step_range,
        record_quarantine,
    )
    from tokenloom.search.trace import open_run

    name = quarantine_name
    if name is not None:
        try:
            check_name(name)
        except QuarantineError as exc:
            raise click.BadParameter(str(exc), param_hint="'--name'") from None
    run_record(checkpoint, option="--checkpoint")  # no run there: exit 2, as export and sample
    run = open_run(checkpoint, storage_options=storage_options)
    try:
        first, last = parse_step_range(steps, run.steps_done)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--steps'") from None
    q = record_quarantine(run, first, last, name=name, storage_options=storage_options)
    summary = q.summary()
    if as_json:
        click.echo(json.dumps({**summary, "row_ids": q.row_ids.tolist()}, indent=1))
        return
    shown = ", ".join(map(str, q.row_ids[:20].tolist()))
    more = f", ... ({len(q.row_ids) - 20:,} more)" if len(q.row_ids) > 20 else ""
    click.echo(
        f"quarantine {q.name!r}: steps {first}..{last} of {q.run} fed {len(q.row_ids):,} rows "
        f"({q.stretches:,} stretches, {q.tokens:,} tokens) of table version {q.table_version}"
    )
    click.echo(f"rows: {shown}{more}")
    click.echo(f"written to {summary['uri']}")
    click.echo(f"leave them out: tokenloom train --out {q.run} --resume --exclude {q.name}")
