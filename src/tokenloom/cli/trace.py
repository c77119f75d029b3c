"""``tokenloom trace``: the rows of a training step, or the steps of a row."""

from __future__ import annotations

import json

import click
import numpy as np

from tokenloom.cli.options import json_option, run_record, storage_options_option

__all__ = ["command", "describe"]


def describe(run, seen: list, *, chars: int = 60) -> list[dict]:  # noqa: ANN001
    """Each stretch with its row's source and the text of exactly the tokens the model saw
    (decoded with the run's tokenizer; the row's text when that tokenizer cannot be loaded)."""
    from tokenloom.table import Table
    from tokenloom.table.tokens import as_token_lists

    if not seen:
        return []
    spec = run.planner.spec
    column = spec.token_column
    files = run.planner.files
    name = spec.group.name_column if spec.group is not None else None
    # each step's rows as the version it read holds them (a run whose data changed read several)
    data: dict[str, list] = {"id": [], "source": [], "text": [], column: []}
    if name is not None and name not in data:
        data[name] = []
    rows: dict[tuple[int, int], int] = {}
    for version in sorted({run.version_at(s.step) for s in seen}):
        table = Table.open(spec.table, version=version, storage_options=run.planner.storage_options)
        ids = sorted({s.row_id for s in seen if run.version_at(s.step) == version})
        found = table.dataset.to_table(
            columns=list(data), filter=f"id IN ({', '.join(map(str, ids))})"
        )
        part = found.to_pydict()
        part[column] = as_token_lists(found.column(column), found.schema.field(column)).to_pylist()
        base = len(data["id"])
        rows.update(((version, i), base + k) for k, i in enumerate(part["id"]))
        for key in data:
            data[key].extend(part[key])
    try:
        from tokenloom.tokenize import load_tokenizer

        tok = load_tokenizer(run.record.tokenizer["name"])
    except Exception:  # noqa: BLE001 (a tokenizer that is not loadable here: show the text)
        tok = None
    out = []
    for s in seen:
        k = rows[(run.version_at(s.step), s.row_id)]
        if s.kind == "marker" and files is not None:  # a prefix before the row: its ids
            member = int(np.flatnonzero(files.rows == s.row_id)[0])
            ids = files.prefix_of(member)[s.token_start : s.token_end].tolist()
            text = tok.decode(ids) if tok is not None else str(ids)
        elif tok is not None:
            text = tok.decode(data[column][k][s.token_start : s.token_end])
        else:
            text = data["text"][k]
        extra = {}
        if files is not None:
            extra = {"document": s.group, "kind": s.kind, "file": str(data[name][k])}
        out.append(
            {
                "step": s.step,
                "epoch": s.epoch,
                "rank": s.rank,
                "block": s.block,
                "position": s.position,
                "row_id": s.row_id,
                "pool": s.pool,
                "source": data["source"][k],
                "tokens": [s.token_start, s.token_end],
                "context": [s.token_start, s.context_end] if s.context_end is not None else None,
                "provenance": list(s.as_tuple()),
                "snippet": " ".join(text.split())[:chars],
                **extra,
            }
        )
    return out


@click.command(
    "trace",
    epilog="""\b
Examples:
  tokenloom trace --run runs/tiny --step 120            # the rows of step 120's batch
  tokenloom trace --run runs/tiny --step 120 --rank 1   # what rank 1 was fed
  tokenloom trace --run runs/tiny --row 4711 --json     # every step that saw row 4711""",
)
@click.option(
    "--run",
    "--checkpoint",
    "checkpoint",
    required=True,
    metavar="RUN",
    help="The run's --out directory (its latest checkpoint) or RUN/step-N (--checkpoint is the "
    "same option).",
)
@storage_options_option
@click.option("--step", type=click.IntRange(min=1), default=None, help="Optimizer step (1-based).")
@click.option("--row", "row_id", type=click.IntRange(min=0), default=None, help="A row id.")
@click.option("--rank", type=click.IntRange(min=0), default=None)
@click.option("--chars", type=click.IntRange(min=0), default=60, show_default=True)
@json_option
def command(
    checkpoint: str,
    storage_options: dict,
    step: int | None,
    row_id: int | None,
    rank: int | None,
    chars: int,
    as_json: bool,
) -> None:
    """Which rows the model saw at a step, or at which steps it saw a row.

    Recomputed from the checkpoint's pinned plan (table version, filter, seed, block length,
    global batch and the topology of each resume); no log of samples is needed.
    """
    from tokenloom.search.trace import open_run

    if (step is None) == (row_id is None):
        raise click.UsageError("give exactly one of --step and --row")
    record = run_record(checkpoint)  # a missing run is a usage error naming --run
    if record.loader.to_dict().get("kind") == "image_text":
        _trace_vlm(record, step, row_id, rank, storage_options, as_json)
        return
    run = open_run(checkpoint, storage_options=storage_options)
    seen = run.step(step, rank=rank) if step is not None else run.row(row_id)
    if rank is not None and row_id is not None:
        seen = [s for s in seen if s.rank == rank]
    rows = describe(run, seen, chars=chars)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "table": run.planner.spec.table,
                    "table_version": run.table_version,
                    "loader": run.planner.spec.to_dict(),
                    "steps_done": run.steps_done,
                    "rows": rows,
                },
                indent=1,
            )
        )
        return
    what = f"step {step}" if step is not None else f"row {row_id}"
    spec = run.planner.spec
    click.echo(
        f"{what}: {len(rows)} stretch(es); run of {run.steps_done} steps on table version "
        f"{run.table_version}, filter {spec.filter!r}; {spec.describe()}"
    )
    click.echo(f"{'step':>6} {'rank':>4} {'block':>5} {'pos':>5} {'row':>8}  {'pool':<8} "
               f"{'source':<16} {'tokens':<15} text")  # fmt: skip
    for r in rows:
        rng = f"[{r['tokens'][0]}, {r['tokens'][1]})"
        if r["context"]:
            rng += f" ctx<{r['context'][1]}"
        if "file" in r:  # grouped: the file the tokens come from, its marker named as such
            what = "marker of" if r["kind"] == "marker" else "file"
            click.echo(f"{'':>6} {'':>4} {'':>5} {'':>5} {'':>8}  doc {r['document']}, "
                       f"{what} {r['file']!r}")  # fmt: skip
        click.echo(
            f"{r['step']:>6} {r['rank']:>4} {r['block']:>5} {r['position']:>5} {r['row_id']:>8}  "
            f"{r['pool']:<8} {r['source']:<16} {rng:<15} {r['snippet']!r}"
        )


def _trace_vlm(record, step, row_id, rank, storage_options, as_json: bool) -> None:  # noqa: ANN001
    """The samples of an image+text run's step (or the steps of a row)."""
    from tokenloom.vision.trace import trace_vlm_run

    rows = trace_vlm_run(
        record, step=step, row_id=row_id, rank=rank, storage_options=storage_options
    )
    spec = record.loader
    if as_json:
        click.echo(json.dumps({"table": spec.table, "table_version": spec.version,
                               "loader": spec.to_dict(), "steps_done": record.step,
                               "rows": rows}, indent=1))  # fmt: skip
        return
    what = f"step {step}" if step is not None else f"row {row_id}"
    click.echo(f"{what}: {len(rows)} sample(s); image+text run of {record.step} steps on table "
               f"version {spec.version}; {spec.describe()}")  # fmt: skip
    click.echo(f"{'step':>6} {'epoch':>5} {'rank':>4} {'block':>5} {'pos':>4} {'row':>8}")
    for r in rows:
        click.echo(f"{r['step']:>6} {r['epoch']:>5} {r['rank']:>4} {r['block']:>5} "
                   f"{r['position']:>4} {r['row_id']:>8}")  # fmt: skip
