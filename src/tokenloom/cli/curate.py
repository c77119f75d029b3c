"""``tokenloom dedup`` and ``tokenloom score``: curation results as added columns."""

from __future__ import annotations

import click

from tokenloom.cli.options import (
    emit_json,
    json_option,
    storage_options_option,
    table_option,
    workers_option,
)

__all__ = ["commands"]


def _print(result, what: str) -> None:  # noqa: ANN001 - CurationResult
    versions = ", ".join(map(str, result.versions)) or "none (up to date)"
    click.echo(
        f"{what}: {result.flagged:,} of {result.rows:,} rows flagged in "
        f"{result.groups:,} groups; columns {', '.join(result.columns)}; "
        f"versions {versions} ({result.seconds:.1f} s)"
    )
    if result.by_source:
        click.echo("per source (rows, flagged):")
        for source, c in result.by_source.items():
            click.echo(f"  {source:<24} {c['rows']:>10,} {c['flagged']:>10,}")
    for ex in result.examples:
        click.echo(f"  group {ex['group']}:")
        for row in ex["rows"]:
            click.echo(f"    {row['id']:>8} {row['source']:<22} {row['snippet']}")


@click.command(
    "dedup",
    epilog="""\b
Examples:
  tokenloom dedup --table corpus.lance                   # exact: is_dup, dup_of
  tokenloom dedup --table corpus.lance --near            # near: near_dup_cluster, is_near_dup
  tokenloom dedup --table corpus.lance --near --threshold 0.7 --recompute
  tokenloom dedup --table corpus.lance --near --keep source-priority:wiki_en,web

\b
Exact: BLAKE2b of the NFC, whitespace-collapsed text; the first occurrence by id
is kept. Near: MinHash (3-word shingles of spelling-folded text, 128 permutations)
+ LSH, every candidate pair verified against the threshold; --keep picks the member
kept (near_dup_cluster = its id). Filter with SQL:
  --filter "NOT is_dup AND NOT is_near_dup" """,
)
@table_option
@storage_options_option
@click.option("--near", is_flag=True, help="Near-duplicates (MinHash + LSH) instead of exact.")
@click.option(
    "--threshold",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.5,
    show_default=True,
    help="Estimated Jaccard similarity that joins two documents.",
)
@click.option(
    "--keep",
    default="first",
    show_default=True,
    metavar="first|longest|source-priority:A,B",
    help="Near: the member of each cluster kept (first = smallest id; longest = most "
    "characters; source-priority = sources in the order listed; ties: smallest id).",
)
@click.option("--recompute", is_flag=True, help="Drop and rebuild the near-dup clusters.")
@workers_option
@json_option
def dedup(
    table: str,
    storage_options: dict,
    near: bool,
    threshold: float,
    keep: str,
    recompute: bool,
    workers: int | None,
    as_json: bool,
) -> None:
    """Flag exact or near-duplicate documents as added columns."""
    from tokenloom.curate.jobs import dedup_exact, dedup_near

    if keep != "first" and not near:
        raise click.UsageError("--keep chooses among near duplicates; pass it with --near")
    if near:
        result = dedup_near(
            table,
            threshold=threshold,
            keep=keep,
            workers=workers,
            recompute=recompute,
            storage_options=storage_options,
        )
    else:
        result = dedup_exact(table, workers=workers, storage_options=storage_options)
    if as_json:
        emit_json(result.to_json())
    else:
        _print(result, "near duplicates" if near else "exact duplicates")


@click.command(
    "score",
    epilog="""\b
Examples:
  tokenloom score --table corpus.lance
  tokenloom score --table corpus.lance --workers 2 --json

\b
quality = fraction of the applicable Gopher/C4 rules a document passes (1.0 = all);
quality_reasons lists the failed rules. Code documents (detected) get code rules.""",
)
@table_option
@storage_options_option
@workers_option
@json_option
def score(table: str, storage_options: dict, workers: int | None, as_json: bool) -> None:
    """Add heuristic quality scores and the reasons behind them."""
    from tokenloom.curate.jobs import score_quality

    result = score_quality(table, workers=workers, storage_options=storage_options)
    if as_json:
        emit_json(result.to_json())
        return
    click.echo(
        f"quality: {result.rows - result.flagged:,} of {result.rows:,} rows pass every "
        f"rule; versions {', '.join(map(str, result.versions)) or 'none'} "
        f"({result.seconds:.1f} s)"
    )
    click.echo("rows failing each rule:")
    for rule, n in result.by_rule.items():
        click.echo(f"  {rule:<32} {n:>10,}")
    click.echo("per source (rows, passing every rule, mean quality):")
    for source, c in result.by_source.items():
        click.echo(f"  {source:<24} {c['rows']:>10,} {c['pass']:>10,} {c['mean_quality']:>8.3f}")


commands = [dedup, score]
