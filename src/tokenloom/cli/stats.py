"""``tokenloom stats``: documents, tokens, lengths, per source, pad/truncate vs packing."""

from __future__ import annotations

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
    "stats",
    epilog="""\b
Examples:
  tokenloom stats --table corpus.lance
  tokenloom stats --run runs/tiny --json                   # the loader a training run recorded
  tokenloom stats --table corpus.lance --filter "NOT is_dup" --seq-len 2048 --plot lengths.png
  tokenloom stats --table corpus.lance --column input_ids_bpe16k --json""",
)
@loader_table_option
@storage_options_option
@loader_options
@click.option("--plot", default=None, metavar="FILE", help="Write a PNG length histogram.")
@json_option
def command(  # noqa: ANN003 - the loader options
    table: str | None, storage_options: dict, plot: str | None, as_json: bool, **loader
) -> None:
    """Length statistics of a token column, and the exact epoch of the loader options given,
    from the stored counts only."""
    from tokenloom.loader.pipeline.planner import Planner
    from tokenloom.stats import length_stats
    from tokenloom.stats.read import read_lengths
    from tokenloom.table import Table
    from tokenloom.table.filters import validate_filter

    run = loader.get("run")
    spec = loader_spec(table, loader)
    filter, seq_len, count = spec.filter, spec.seq_len, spec.count_column
    table = spec.table
    ds = Table.open(table, version=spec.version, storage_options=storage_options).dataset
    if count not in ds.schema.names:
        raise click.UsageError(
            f"no {count!r} column: tokenize first "
            f"(`tokenloom tokenize --table {table} --tokenizer gpt2`)"
        )
    filter = validate_filter(ds, filter)
    planner = Planner(  # refuses rows whose count or filter column is not computed
        spec, storage_options=storage_options, changes=run_changes(run)
    )
    if planner.inputs.null_rows:
        click.echo(
            f"warning: {planner.inputs.null_rows:,} selected rows have no {count!r} "
            f"(counted as empty, --allow-missing); `tokenloom refresh --table {table}` "
            "computes them",
            err=True,
        )
    n_tokens, sources = read_lengths(ds, count, filter)  # no Python string per document
    if len(n_tokens) == 0:
        raise click.UsageError(f"the filter {filter!r} selects no rows")
    stats = length_stats(n_tokens, seq_len=seq_len, sources=sources)
    epoch = planner.epoch_info(0)
    mask = None
    if spec.loss_mask_column:
        from tokenloom.loader.pipeline.lossmask import mask_summary

        mask = {"column": spec.loss_mask_column, **mask_summary(ds, spec.loss_mask_column, filter)}
    from tokenloom.loader.plan.ends import window_end_counts

    ends = window_end_counts(planner)
    if plot:
        from tokenloom.stats import plot_length_histogram

        plot_length_histogram(n_tokens, plot, seq_len=seq_len, sources=sources)
    if as_json:
        emit_json(
            {
                **stats.to_json(),
                "loader": spec.to_dict(),
                "epoch": epoch,
                **({"loss_mask": mask} if mask else {}),
                **({"window_ends": ends} if ends is not None else {}),
                **({"plot": plot} if plot else {}),
            }
        )
    else:
        p = stats.percentiles
        click.echo(
            f"documents {stats.documents:,}   tokens {stats.tokens:,}   "
            f"mean {stats.mean:,.0f} tokens/doc"
        )
        click.echo(
            f"percentiles  p5 {p.p5:,.0f}  p25 {p.p25:,.0f}  p50 {p.p50:,.0f}  "
            f"p75 {p.p75:,.0f}  p95 {p.p95:,.0f}  p99 {p.p99:,.0f}  max {p.max:,}"
        )
        for src in stats.by_source:
            click.echo(
                f"  {src.source:<24} {src.docs:>9,} docs {src.tokens:>13,} tokens  "
                f"pad/truncate keeps {src.kept_tokens / max(src.tokens, 1):6.1%}"
            )
        click.echo(stats.summary())
        positions = max(epoch["steps"] * spec.global_batch * seq_len, 1)
        click.echo(
            f"epoch 0 with {spec.describe()}: {epoch['steps']:,} steps, {epoch['blocks']:,} "
            f"blocks, padding {epoch['padding_positions']:,} positions "
            f"({epoch['padding_positions'] / positions:.2%}), dropped {epoch['dropped_tokens']:,} "
            "tokens"
        )
        if ends is not None:
            click.echo(
                f"windows of {ends['long_docs']:,} long documents end at: section "
                f"{ends['section']:,}, paragraph {ends['paragraph']:,}, line {ends['line']:,}, "
                f"none {ends['none']:,} (of {ends['windows']:,} windows before a document's end)"
            )
        if planner.inputs.left_out():
            click.echo(planner.inputs.left_out())
        if mask:
            click.echo(
                f"loss mask {mask['column']!r}: {mask['rows_masked']:,} of {mask['rows']:,} rows "
                f"have spans ({mask['spans']:,}), {mask['masked_tokens']:,} tokens in them "
                f"({mask['masked_tokens'] / max(stats.tokens, 1):.2%} of the tokens)"
            )
        if plot:
            click.echo(f"histogram: {plot}")
