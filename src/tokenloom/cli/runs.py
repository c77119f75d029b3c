"""``tokenloom runs [DIR]``: the training runs under a directory and their lineage;
``tokenloom runs rm RUN``: release the table versions a run pinned (and delete it, on request)."""

from __future__ import annotations

import os

import click

from tokenloom.cli.options import emit_json, json_option, run_record, storage_options_option

__all__ = ["command"]


class _RunsGroup(click.Group):
    """``tokenloom runs [DIR]`` is ``tokenloom runs list [DIR]``: a first argument that is no
    subcommand (or none at all) lists."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        help_names = set(ctx.help_option_names)
        if not args or (args[0] not in self.commands and args[0] not in help_names):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@click.group(
    "runs",
    cls=_RunsGroup,
    epilog="""\b
Examples:
  tokenloom runs                            # the runs under . (a few levels down)
  tokenloom runs runs/ --json
  tokenloom runs rm runs/old                # release the table versions it pinned
  tokenloom runs rm runs/old --delete       # ... and delete its directory""",
)
def command() -> None:
    """Training runs: list them with their lineage, or remove one (releasing its pins)."""


def _tok(n: int) -> str:
    return f"{n / 1e6:,.2f}M" if n >= 100_000 else f"{n:,}"


def _pools(pools: list[dict]) -> str:
    return ", ".join(f"{p['name']} {_tok(p['tokens'])}" for p in pools) or "nothing yet"


def _loss(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _lines(run: dict, root: str, depth: int) -> list[str]:
    pad = "   " * depth
    head = "└─ " if depth else ""
    name = os.path.relpath(run["run"], root)
    origin = ""
    if run["parent"]:
        where = os.path.relpath(run["parent"], root) if depth == 0 else "its parent"
        origin = f"  (from {where} at step {run['parent_step']})"
    pinned = "pinned" if run["pinned"] else "NOT pinned"
    c = run["compute"]
    rate = f"{c['tokens_per_second']:,.0f} tok/s" if c["tokens_per_second"] else "n/a tok/s"
    lines = [
        f"{pad}{head}{name}  {run['model']}, step {run['step']}/{run['steps']}{origin}",
        f"{pad}     data     {run['table']} v{run['table_version']} ({pinned}), "
        f"{run['token_column'] or 'image+text'}, filter {run['filter'] or '(none)'}",
        f"{pad}     spec     {run['spec']}",
    ]
    if len(run.get("data_versions") or ()) > 1:  # the data changed during the run
        moves = ", ".join(
            f"v{v['version']} from step {v['from_step']}"
            + (f" ({v['change']})" if v["change"] else "")
            for v in run["data_versions"]
        )
        lines.append(f"{pad}     versions {moves}")
    lines += [
        f"{pad}     loss     train {_loss(run['train_loss'])}, val {_loss(run['val_loss'])}",
        f"{pad}     spent    {_pools(run['pools'])}",
    ]
    for phase in run.get("phases") or ():
        lines.append(f"{pad}     change   {phase['summary']}")
    budget = run["total_budget_tokens"]
    cap = f" of a {_tok(budget)} budget" if budget else ""
    if run["parent"] or budget:
        lines.append(f"{pad}     lineage  {_pools(run['lineage_pools'])}{cap}")
    lines.append(
        f"{pad}     compute  {c['wall_seconds']:,.1f} s wall, {c['process_hours']:.4f} "
        f"process-hours on {c['device_count'] or '?'} x {c['device_name'] or '?'}, {rate}"
    )
    return lines


@command.command(
    "list",
    epilog="""\b
Examples:
  tokenloom runs list runs/
  tokenloom runs list --json""",
)
@click.argument("directory", default=".", metavar="[DIR]", type=click.Path(file_okay=False))
@json_option
def list_runs(directory: str, as_json: bool) -> None:
    """The runs under DIR (default: the current directory, a few levels down): lineage
    (parent → child), model and step, table and version (pinned or not), loader spec, tokens
    spent per pool (own and whole lineage), last train/val loss, compute."""
    from tokenloom.train.catalog import find_runs

    if not os.path.isdir(directory):
        raise click.BadParameter(f"{directory!r} is not a directory", param_hint="'DIR'")
    report = find_runs(directory)
    data = report.to_json()
    if as_json:
        emit_json(data)
        return
    runs = {r["run"]: r for r in data["runs"]}
    click.echo(f"{len(runs)} run(s) under {report.root}")

    def walk(path: str, depth: int) -> None:
        for line in _lines(runs[path], report.root, depth):
            click.echo(line)
        for child in sorted(runs[path]["children"]):
            walk(child, depth + 1)

    for entry in report.roots():
        walk(entry.path, 0)
    for path, why in report.unreadable:
        click.echo(f"not a readable run: {path}: {why}")


@command.command(
    "rm",
    epilog="""\b
Examples:
  tokenloom runs rm runs/old
  tokenloom runs rm runs/old --delete --json
  tokenloom runs rm runs/s3run --storage-options aws_endpoint=http://127.0.0.1:8333""",
)
@click.argument("run", metavar="RUN")
@storage_options_option
@click.option(
    "--delete",
    "delete_dir",
    is_flag=True,
    help="Also delete the run directory (its checkpoint and record); without it, only the "
    "table versions it pinned are released.",
)
@json_option
def remove(run: str, storage_options: dict, delete_dir: bool, as_json: bool) -> None:
    """Release the Lance tags RUN holds on the table versions it trained on (gc and Lance's
    cleanup may then remove those versions); with --delete, delete RUN's directory too."""
    from tokenloom.train.catalog import remove_run

    run_record(run, option="RUN")  # no run there: a usage error naming RUN
    done = remove_run(run, delete=delete_dir, storage_options=storage_options or None)
    if as_json:
        emit_json(done.to_json())
        return
    for pin in done.released:
        click.echo(f"released {pin['tag']} (version {pin['version']} of {pin['table']})")
    for pin in done.kept:
        click.echo(f"kept {pin['tag']}: held by run {pin['run']}")
    for gone in done.missing_tables:
        click.echo(f"table {gone['table']} is gone: nothing to release there")
    if not done.released:
        click.echo(f"{done.run} held no tag")
    if done.deleted:
        click.echo(f"deleted {done.run}")
