"""``tokenloom demo``: the main job, end to end on the bundled corpus.

Today: build the bundled corpus, ingest it, print the table summary. Each later stage of the
pipeline (curate, tokenize, train, search) extends this same command.
"""

from __future__ import annotations

import os
import shutil
import time

import click

__all__ = ["command"]

_MARKER = ".tokenloom-demo"


@click.command(
    "demo",
    epilog="""\b
Examples:
  tokenloom demo                       # in ./tokenloom-demo
  tokenloom demo --workdir /tmp/demo --max-docs 200""",
)
@click.option(
    "--workdir",
    default="tokenloom-demo",
    show_default=True,
    metavar="DIR",
    help="Where the corpus and the table are written (recreated on each run).",
)
@click.option(
    "--max-docs",
    type=click.IntRange(min=1),
    default=None,
    help="Cap documents per source, for a quicker run.",
)
def command(workdir: str, max_docs: int | None) -> None:
    """Run the main job end to end on the bundled corpus: build, ingest, summarise."""
    from tokenloom.cli.info import format_info
    from tokenloom.corpus import build_corpus
    from tokenloom.ingest import ingest
    from tokenloom.table import Table, table_info

    started = time.perf_counter()
    workdir = os.path.abspath(workdir)
    if os.path.exists(workdir):
        if not os.path.exists(os.path.join(workdir, _MARKER)):
            raise click.UsageError(
                f"{workdir} exists and was not made by `tokenloom demo`; pass another --workdir"
            )
        shutil.rmtree(workdir)
    os.makedirs(workdir)
    open(os.path.join(workdir, _MARKER), "w").close()

    corpus_dir = os.path.join(workdir, "corpus")
    click.echo(f"[1/3] building the bundled corpus in {corpus_dir}")
    manifest = build_corpus(corpus_dir, max_docs_per_source=max_docs)
    for src in manifest.sources:
        click.echo(f"      {src.name:<24} {src.docs:>7,} docs {src.bytes / 1e6:>8.2f} MB")

    table_uri = os.path.join(workdir, "corpus.lance")
    click.echo(f"[2/3] ingesting into {table_uri}")
    paths = [os.path.join(corpus_dir, f"{src.name}.jsonl") for src in manifest.sources]
    result = ingest(paths, table_uri)
    click.echo(
        f"      {result.rows_written:,} rows, version {result.version}, "
        f"{sum(result.rejected.values())} rejected, "
        f"{result.bytes_read / 1e6 / max(result.seconds, 1e-9):,.1f} MB/s"
    )

    click.echo("[3/3] table summary")
    click.echo(format_info(table_info(Table.open(table_uri))))
    click.echo(f"\ndone in {time.perf_counter() - started:.1f} s from raw text")
