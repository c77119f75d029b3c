"""``tokenloom demo``: the main job, end to end on the bundled corpus.

Today: build the bundled corpus → ingest → exact and near dedup → quality scores → GPT-2 tokens
→ length statistics, then the table's version history with the bytes each stage added. Later
stages of the pipeline (train, search) extend this same command.
"""

from __future__ import annotations

import os
import shutil
import time

import click

__all__ = ["command"]

_MARKER = ".tokenloom-demo"


def _step(n: int, total: int, text: str) -> None:
    click.echo(f"[{n}/{total}] {text}")


@click.command(
    "demo",
    epilog="""\b
Examples:
  tokenloom demo                       # in ./tokenloom-demo
  tokenloom demo --workdir /tmp/demo --max-docs 200 --workers 2""",
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
@click.option(
    "--workers", type=click.IntRange(min=0), default=2, show_default=True, help="Backfill workers."
)
def command(workdir: str, max_docs: int | None, workers: int) -> None:
    """Run the main job end to end on the bundled corpus."""
    import pyarrow.compute as pc

    from tokenloom.cli.info import format_versions
    from tokenloom.corpus import build_corpus
    from tokenloom.curate import heldout_filter
    from tokenloom.curate.jobs import dedup_exact, dedup_near, score_quality
    from tokenloom.ingest import ingest
    from tokenloom.stats import length_stats
    from tokenloom.table import Table
    from tokenloom.tokenize.column import tokenize_table

    started = time.perf_counter()
    total = 7
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
    _step(1, total, f"building the bundled corpus in {corpus_dir}")
    manifest = build_corpus(corpus_dir, max_docs_per_source=max_docs)
    for src in manifest.sources:
        click.echo(f"      {src.name:<24} {src.docs:>7,} docs {src.bytes / 1e6:>8.2f} MB")

    uri = os.path.join(workdir, "corpus.lance")
    _step(2, total, f"ingesting into {uri}")
    paths = [os.path.join(corpus_dir, f"{src.name}.jsonl") for src in manifest.sources]
    result = ingest(paths, uri)
    click.echo(
        f"      {result.rows_written:,} rows, {sum(result.rejected.values())} rejected, "
        f"{result.bytes_read / 1e6 / max(result.seconds, 1e-9):,.1f} MB/s"
    )

    _step(3, total, "exact duplicates (is_dup, dup_of)")
    exact = dedup_exact(uri, workers=workers)
    click.echo(f"      {exact.flagged:,} duplicate rows in {exact.groups:,} groups")

    _step(4, total, "near duplicates (MinHash + LSH: near_dup_cluster, is_near_dup)")
    near = dedup_near(uri, workers=workers)
    click.echo(f"      {near.flagged:,} near-duplicate rows in {near.groups:,} clusters, e.g.:")
    for ex in near.examples[:3]:
        rows = ex["rows"]
        click.echo(
            "        "
            + "  ~  ".join(f"{r['source']}#{r['id']} {r['snippet'][:28]!r}" for r in rows[:2])
        )

    _step(5, total, "quality scores (quality, quality_reasons)")
    score_quality(uri, workers=workers)
    table = Table.open(uri)
    click.echo(
        f"      {table.count_rows('quality >= 1.0'):,} of {table.count_rows():,} rows pass "
        "every rule"
    )

    _step(6, total, "GPT-2 tokens (input_ids, n_tokens)")
    tok = tokenize_table(uri, "gpt2", workers=workers)
    bad = len(tok.roundtrip_failures)
    click.echo(
        f"      {tok.tokens:,} tokens, {tok.tokens_per_second:,.0f} tokens/s; round-trip "
        f"{tok.roundtrip_checked - bad}/{tok.roundtrip_checked} sampled rows exact"
    )

    curated = f"NOT is_dup AND NOT is_near_dup AND quality >= 0.75 AND NOT ({heldout_filter(1)})"
    _step(7, total, f"statistics of the training selection: {curated}")
    data = Table.open(uri).dataset.to_table(columns=["n_tokens", "source"], filter=curated)
    stats = length_stats(
        pc.fill_null(data.column("n_tokens"), 0).to_numpy(),
        seq_len=1024,
        sources=data.column("source").to_numpy(zero_copy_only=False),
    )
    click.echo(
        f"      {stats.documents:,} documents, {stats.tokens:,} tokens, median "
        f"{stats.percentiles.p50:,.0f} tokens/doc"
    )
    click.echo(f"      {stats.summary()}")

    table = Table.open(uri)
    click.echo("\ntable versions (bytes added by each stage; nothing rewritten):")
    for line in format_versions(table.versions()):
        click.echo(line)
    click.echo(f"\ndone in {time.perf_counter() - started:.1f} s from raw text")
