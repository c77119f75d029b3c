"""``tokenloom verify``: the loader checks a training team runs before a long job."""

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
    "verify",
    epilog="""\b
Checks (on the first K steps of epoch 0, K steps at an offset drawn from the seed, and every
block holding the shortest and the longest selected rows):
  text_reconstruction  blocks decode back to the rows' text, from the batch's provenance alone
  token_ids            stored ids == a fresh tokenization with the recorded tokenizer
  document_isolation   the attention mask built from the batch never crosses a document
  loss_positions       labels != -100 exactly where the target is the same document's next token
  resume               save state after K steps, reload, the next K steps are identical
Exit status 1 when any check fails.

\b
Examples:
  tokenloom verify --table corpus.lance
  tokenloom verify --run runs/tiny                         # the loader a training run recorded
  tokenloom verify --table corpus.lance --filter "NOT is_dup AND quality >= 0.75" --seq-len 2048
  tokenloom verify --table corpus.lance --packing best_fit --long-docs window --window 1024 \\
      --overlap 128 --json""",
)
@loader_table_option
@storage_options_option
@loader_options
@click.option(
    "--steps",
    "k",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    metavar="K",
    help="Steps per sample, and steps read before the resume check saves its state.",
)
@json_option
def command(table: str | None, storage_options: dict, k: int, as_json: bool, **loader: Any) -> None:
    """Check the loader's batches against the table before a long training job."""
    from tokenloom.verify import verify

    run = loader.get("run")
    spec = loader_spec(table, loader)
    report = verify(spec, steps=k, storage_options=storage_options)
    # verify reads the stream the run started with; a run's later data changes are not in it
    changed = [
        f"{c.kind} from global step {c.global_step:,} (version {c.version_after})"
        for c in run_changes(run)
    ]
    if as_json:
        emit_json({**report.to_json(), "changes_not_verified": changed})
    else:
        click.echo(
            f"verify {report.table} (version {report.version}), column {spec.token_column}: "
            f"{spec.describe()}"
        )
        click.echo(
            f"  read {len(report.steps_read)} of {report.total_steps:,} steps of epoch 0; "
            f"fixed rows {', '.join(map(str, report.fixed_rows))}; "
            f"{report.rows_checked:,} rows tokenized again"
        )
        if report.left_out:
            click.echo(f"  {report.left_out}")
        if changed:
            click.echo(
                "  not verified: the run's data changes ("
                + "; ".join(changed)
                + "); verify reads the stream the run started with"
            )
        for check in report.checks:
            status = "PASS" if check.passed else "FAIL"
            click.echo(f"{status}  {check.name:<20} {check.detail}")
        passed = sum(c.passed for c in report.checks)
        click.echo(f"{passed} of {len(report.checks)} checks passed in {report.seconds:.1f} s")
    if not report.passed:
        click.echo(f"verify failed: {', '.join(report.failed)}", err=True)
        raise click.exceptions.Exit(1)
