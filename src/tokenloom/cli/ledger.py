"""``tokenloom ledger``: what a run's steps hold, per pool, computed from the plan."""

from __future__ import annotations

from typing import Any

import click

from tokenloom.cli.options import (
    emit_json,
    json_option,
    loader_options,
    loader_spec,
    loader_table_option,
    run_changes,
    storage_options_option,
)

__all__ = ["command"]


@click.command(
    "ledger",
    epilog="""\b
Examples:
  tokenloom ledger --table corpus.lance --seq-len 1024 --global-batch-size 8
  tokenloom ledger --run runs/tiny --json                 # the loader a training run recorded
  tokenloom ledger --table corpus.lance --steps 1000 --packing best_fit --json
  tokenloom ledger --table corpus.lance --budget-tokens 20000000 --mixture mix.json

\b
mix.json: {"web": ["source LIKE 'wiki%'", 0.7],
           "code": ["source = 'python_stdlib'", 0.3, 2]}""",
)
@loader_table_option
@storage_options_option
@loader_options(epoch=True)
@click.option(
    "--steps",
    type=click.IntRange(min=0),
    default=None,
    help="Count the first N steps [default: the whole epoch].",
)
@json_option
def command(
    table: str | None,
    storage_options: dict,
    steps: int | None,
    epoch: int,
    as_json: bool,
    **loader: Any,
) -> None:
    """Per pool: body, separator, padding, loss and overlap positions, documents, passes (and
    the labels a --loss-mask-column masks).

    Computed from the plan alone (no token is read); a training run with the same options
    counts the same numbers from the batches it is fed.
    """
    from tokenloom.loader.observe.ledger import ledger
    from tokenloom.loader.pipeline.planner import Planner
    from tokenloom.train.record import read_record

    run = loader.get("run")
    record = read_record(run) if run is not None else None
    planner = Planner(
        loader_spec(table, loader), storage_options=storage_options, changes=run_changes(run)
    )
    led = ledger(planner, steps=steps, epoch=epoch)
    lineage = _lineage(run) if run is not None else None
    phases = _phases(planner, record) if record is not None else []
    if as_json:
        extra = {"lineage": lineage} if lineage else {}
        emit_json({**led.to_json(), **extra, **({"phases": phases} if phases else {})})
        return
    click.echo(f"epoch {led.epoch}, {led.steps:,} steps of {led.global_batch} x {led.seq_len}")
    if led.change is not None:
        c = led.change
        click.echo(
            f"latest data change of the epoch: {c['kind']} from its step {c['step'] + 1} "
            f"(v{c['version_before']} -> v{c['version_after']}): {c['dropped_by_change']:,} "
            "tokens of rows partly fed before it dropped by the change"
        )
    head = (
        f"  {'pool':<12} {'blocks':>9} {'body':>12} {'EOS':>9} {'padding':>10} "
        f"{'loss':>12} {'overlap':>9} {'docs':>8} {'repeats':>8} {'passes':>6}"
    )
    masked = planner.spec.loss_mask_column is not None  # a column only with a loss mask
    grouped = planner.files is not None  # markers: a column only with a grouped spec
    click.echo(
        head + (f" {'masked':>10}" if masked else "") + (f" {'markers':>9}" if grouped else "")
    )
    for p in led.pools:
        click.echo(
            f"  {p.name:<12} {p.blocks:>9,} {p.body_tokens:>12,} {p.separator_tokens:>9,} "
            f"{p.padding_positions:>10,} {p.loss_positions:>12,} {p.overlap_tokens:>9,} "
            f"{p.unique_documents:>8,} {p.documents_seen_more_than_once:>8,} "
            f"{p.passes:>6}"
            + (f" {p.masked_tokens:>10,}" if masked else "")
            + (f" {p.marker_tokens:>9,}" if grouped else "")
        )
    for ph in phases:
        spent = ", ".join(f"{k} {v:,}" for k, v in ph["blocks_before"].items())
        click.echo(f"  {ph['summary']}; blocks of epoch {ph['epoch']} before it: {spent}")
    if lineage:
        pools = ", ".join(f"{p['name']} {p['tokens']:,}" for p in lineage["pools"])
        click.echo(
            f"fed to {run}'s lineage up to its step {lineage['step']} (the runs it started "
            f"from included): {lineage['tokens']:,} tokens: {pools or 'nothing yet'}"
        )


def _phases(planner: Any, record: Any) -> list[dict[str, Any]]:
    """The run's stream changes (:func:`~tokenloom.train.phases.run_phases`), each with the
    blocks per pool its epoch had delivered before it (the quota a reweight keeps)."""
    from tokenloom.loader.observe.ledger import ledger
    from tokenloom.train.phases import run_phases

    out = []
    for ph in run_phases(record):
        head = ledger(planner, steps=ph["step"], epoch=ph["epoch"])
        out.append({**ph, "blocks_before": {p.name: p.blocks for p in head.pools}})
    return out


def _lineage(run: str) -> dict[str, Any]:
    """What the run's record says its lineage was fed (:mod:`tokenloom.train.lineage`)."""
    from tokenloom.train.lineage import lineage_pools, spent_tokens
    from tokenloom.train.record import read_record

    record = read_record(run)
    pools = lineage_pools(record)
    return {"run": record.out, "step": record.step, "tokens": spent_tokens(pools), "pools": pools}
