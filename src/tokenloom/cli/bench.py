"""``tokenloom bench``: benchmarks printed as ratios measured side by side in one run."""

from __future__ import annotations

import glob
import os
import tempfile

import click

from tokenloom.cli.options import emit_json, json_option

__all__ = ["command"]


@click.group(
    "bench",
    epilog="""\b
Examples:
  tokenloom bench ingest
  tokenloom bench backfill --copies 4 --workers 2
  tokenloom bench tokenize --workers 2
  tokenloom bench loader
  tokenloom bench search""",
)
def command() -> None:
    """Benchmarks that print ratios measured side by side in one run."""


@command.command(
    "ingest",
    epilog="""\b
Examples:
  tokenloom bench ingest                       # on the bundled corpus, built on the fly
  tokenloom bench ingest --corpus corpus/ --repeats 5
  python -m tokenloom.bench ingest --json""",
)
@click.option(
    "--corpus",
    "corpus_dir",
    default=None,
    metavar="DIR",
    help="A directory of JSONL files [default: build the bundled corpus in a temp dir].",
)
@click.option(
    "--repeats",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="Alternating runs of each reader; medians are compared.",
)
@json_option
def ingest_bench(corpus_dir: str | None, repeats: int, as_json: bool) -> None:
    """Ingest MB/s next to pyarrow's raw JSON reader on the same files, as a ratio."""
    from tokenloom.bench.ingest import run_ingest_bench

    with tempfile.TemporaryDirectory(prefix="tokenloom-corpus-") as tmp:
        if corpus_dir is None:
            from tokenloom.corpus import build_corpus

            corpus_dir = tmp
            build_corpus(corpus_dir)
        paths = sorted(glob.glob(os.path.join(corpus_dir, "*.jsonl")))
        if not paths:
            raise click.BadParameter(f"no *.jsonl file in {corpus_dir}", param_hint="--corpus")
        bench = run_ingest_bench(paths, repeats=repeats)
    if as_json:
        emit_json(bench.to_json())
        return
    click.echo(
        f"{bench.files} files, {bench.megabytes:,.1f} MB, {bench.rows:,} rows, "
        f"median of {repeats} alternating runs"
    )
    click.echo(f"  pyarrow.json.read_json (parse only)   {bench.pyarrow_mb_s:8.1f} MB/s")
    click.echo(f"  tokenloom ingest (validate+write+commit) {bench.tokenloom_mb_s:8.1f} MB/s")
    click.echo(f"  ratio tokenloom/pyarrow               {bench.ratio:8.2f}x")


@command.command(
    "backfill",
    epilog="""\b
Examples:
  tokenloom bench backfill                    # bundled corpus x10, 2 workers
  tokenloom bench backfill --copies 10 --workers 2 --json""",
)
@click.option(
    "--copies",
    default=4,
    show_default=True,
    type=click.IntRange(min=1),
    help="Ingest the bundled corpus this many times (more rows).",
)
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1))
@json_option
def backfill_bench(copies: int, workers: int, repeats: int, as_json: bool) -> None:
    """Backfill engine overhead: add_column with N workers vs an in-process loop, as a ratio."""
    from tokenloom.backfill.builtin import n_words
    from tokenloom.bench.backfill import run_backfill_bench
    from tokenloom.corpus import build_corpus
    from tokenloom.ingest import ingest

    with tempfile.TemporaryDirectory(prefix="tokenloom-bench-") as tmp:
        corpus = os.path.join(tmp, "corpus")
        build_corpus(corpus)
        paths = sorted(glob.glob(os.path.join(corpus, "*.jsonl")))
        uri = os.path.join(tmp, "t.lance")
        for _ in range(copies):
            ingest(paths, uri, force=True, progress=False)
        bench = run_backfill_bench(uri, n_words, workers=workers, repeats=repeats)
    if as_json:
        emit_json(bench.to_json())
        return
    click.echo(f"{bench.rows:,} rows, UDF n_words (whitespace word count), median of {repeats}")
    click.echo(f"  in-process loop (read + UDF, no write)   {bench.loop_rows_s:12,.0f} rows/s")
    click.echo(
        f"  add_column, {workers} workers (+ checkpoint, commit) {bench.engine_rows_s:8,.0f} rows/s"
    )
    click.echo(f"  engine time / loop time                  {bench.ratio:12.2f}x")


def _bundled_table(tmp: str) -> str:
    from tokenloom.corpus import build_corpus
    from tokenloom.ingest import ingest

    corpus = os.path.join(tmp, "corpus")
    build_corpus(corpus)
    uri = os.path.join(tmp, "t.lance")
    ingest(sorted(glob.glob(os.path.join(corpus, "*.jsonl"))), uri, progress=False)
    return uri


@command.command(
    "tokenize",
    epilog="""\b
Examples:
  tokenloom bench tokenize                    # gpt2, 2 workers, bundled corpus
  tokenloom bench tokenize --workers 2 --repeats 5 --json""",
)
@click.option("--tokenizer", "spec", default="gpt2", show_default=True)
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1))
@json_option
def tokenize_bench(spec: str, workers: int, repeats: int, as_json: bool) -> None:
    """Tokenize backfill tokens/s vs the raw batch encoder (same texts, same workers); dedup
    docs/s for exact and near."""
    from tokenloom.bench.curate import run_dedup_bench, run_tokenize_bench

    with tempfile.TemporaryDirectory(prefix="tokenloom-bench-") as tmp:
        uri = _bundled_table(tmp)
        bench = run_tokenize_bench(uri, spec=spec, workers=workers, repeats=repeats)
        dedup = run_dedup_bench(uri, workers=workers)
    if as_json:
        emit_json({"tokenize": bench.to_json(), "dedup": dedup})
        return
    click.echo(
        f"{bench.tokens:,} {spec} tokens of the bundled corpus, {workers} workers, "
        f"median of {repeats} alternating runs"
    )
    click.echo(f"  raw batch encoder (read + encode)            {bench.raw_tokens_s:12,.0f} tok/s")
    click.echo(
        f"  tokenize backfill (+ checkpoint, commit)     {bench.backfill_tokens_s:12,.0f} tok/s"
    )
    click.echo(
        f"  ratio backfill/raw                           {bench.ratio:12.2f}x  (goal >= 0.85)"
    )
    click.echo(
        f"dedup, {dedup['docs']:,} docs: exact {dedup['exact_docs_s']:,} docs/s, "
        f"near {dedup['near_docs_s']:,} docs/s"
    )


@command.command(
    "loader",
    epilog="""\b
Examples:
  tokenloom bench loader                              # 400k docs, 20 s per loader (~10 min)
  tokenloom bench loader --docs 50000 --seconds 5     # a quick look
  tokenloom bench loader --only tokenloom,parquet --json
  tokenloom bench loader --only tokenloom,transport   # + the numpy-transport prototype
The corpus and its copies are built once under --workdir and reused.""",
)
@click.option(
    "--docs",
    default=400_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Documents of the synthetic corpus (lognormal lengths, median 450 / mean 800 tokens).",
)
@click.option(
    "--seconds",
    default=20.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Measuring budget per loader, after its first batch.",
)
@click.option(
    "--steps",
    default=None,
    type=click.IntRange(min=1),
    help="Measure this many batches per loader instead of --seconds.",
)
@click.option(
    "--workdir",
    default="~/.cache/tokenloom/bench-loader",
    show_default=True,
    metavar="DIR",
    help="Where the corpus, its Parquet/MDS copies and the long-document table are cached.",
)
@click.option(
    "--only",
    default="tokenloom,lancedb,mds,parquet,prepacked,long",
    show_default=True,
    metavar="LIST",
    help="Comma-separated loaders: tokenloom, lancedb, mds, parquet, prepacked, long, recipes, "
    "transport.",
)
@json_option
def loader_bench(
    docs: int, seconds: float, steps: int | None, workdir: str, only: str, as_json: bool
) -> None:
    """Loader tokens/s next to LanceDB, pre-packed MDS and Parquet, as ratios, with goals."""
    from tokenloom.bench.loader import (
        KNOWN_LOADERS,
        LoaderBenchConfig,
        format_report,
        run_loader_bench,
    )

    names = tuple(n.strip() for n in only.split(",") if n.strip())
    unknown = sorted(set(names) - set(KNOWN_LOADERS))
    if unknown or not names:
        raise click.BadParameter(
            f"unknown loader(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {','.join(KNOWN_LOADERS)}",
            param_hint="--only",
        )
    config = LoaderBenchConfig(docs=docs, seconds=seconds, steps=steps, workdir=workdir, only=names)
    bench = run_loader_bench(config, log=lambda msg: click.echo(msg, err=True))
    if as_json:
        emit_json(bench.to_json())
        return
    click.echo(format_report(bench))


@command.command(
    "search",
    epilog="""\b
Examples:
  tokenloom bench search                      # bundled corpus, ~4,000 rows embedded
  tokenloom bench search --embed-rows 2000 --repeats 3 --json

\b
Full-text index on all 28k documents; MiniLM on an evenly spread subset (id % stride = 0)
because embedding the whole corpus on 2 cores takes tens of minutes (extrapolated and
printed). Query latency p50/p95 over 16 queries, end to end, model loaded.""",
)
@click.option(
    "--embed-rows",
    default=4000,
    show_default=True,
    type=click.IntRange(min=100),
    help="About this many rows get an embedding (id % stride = 0).",
)
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(min=1))
@json_option
def search_bench(embed_rows: int, workers: int, repeats: int, as_json: bool) -> None:
    """Index build time and query latency (FTS, vector, hybrid; p50/p95) on the bundled corpus."""
    import time

    from tokenloom.bench.search import QUERIES, run_search_bench

    with tempfile.TemporaryDirectory(prefix="tokenloom-bench-") as tmp:
        started = time.perf_counter()
        uri = _bundled_table(tmp)
        ingest_seconds = time.perf_counter() - started
        bench = run_search_bench(uri, embed_rows=embed_rows, workers=workers, repeats=repeats)
        bench.ingest_seconds = ingest_seconds
    if as_json:
        emit_json(bench.to_json())
        return
    click.echo(f"bundled corpus: {bench.rows:,} rows (build + ingest {ingest_seconds:.1f} s)")
    click.echo(f"  full-text index (BM25, all rows)        {bench.fts_index_seconds:8.2f} s")
    click.echo(
        f"  embed {bench.embedded_rows:,} rows (id % {bench.stride} = 0), {bench.embed_workers} "
        f"workers  {bench.embed_seconds:8.1f} s  ({bench.embed_rows_s:.1f} rows/s; all "
        f"{bench.rows:,} rows would take ~{bench.full_embed_minutes:.0f} min)"
    )
    click.echo(
        f"  IVF_FLAT index ({bench.ivf_partitions} partitions)          "
        f"{bench.ivf_index_seconds:8.2f} s"
    )
    q = sorted(bench.query_embed_ms)[len(bench.query_embed_ms) // 2]
    click.echo(
        f"query latency, {len(QUERIES)} queries x {repeats}, K=10 (query embedding p50 {q:.1f} ms):"
    )
    click.echo(f"  {'case':<46} {'p50 ms':>8} {'p95 ms':>8} {'hits':>6}")
    for name, (p50, p95) in bench.percentiles().items():
        click.echo(f"  {name:<46} {p50:8.1f} {p95:8.1f} {bench.hits[name]:6.1f}")


@command.command(
    "rows",
    epilog="""\b
Examples:
  tokenloom bench rows                          # images: decode to patches, samples/s
  tokenloom bench rows --workload image-text --copies 20 --threads 2""",
)
@click.option(
    "--workload",
    type=click.Choice(["image", "image-text"]),
    default="image",
    show_default=True,
    help="image: samples/s of decode to patches; image-text: tokens/s (patches + text).",
)
@click.option(
    "--copies",
    default=10,
    show_default=True,
    type=click.IntRange(min=1),
    help="Times the bundled image set (54 samples) is repeated.",
)
@click.option("--threads", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--batch", default=32, show_default=True, type=click.IntRange(min=1))
@json_option
def rows_bench(workload: str, copies: int, threads: int, batch: int, as_json: bool) -> None:
    """RowDataset with decode vs tar shards (WebDataset layout), Parquet and MDS, as ratios."""
    from tokenloom.bench.rows import format_report, run_rows_bench

    with tempfile.TemporaryDirectory(prefix="tokenloom-rows-") as tmp:
        reports = run_rows_bench(
            tmp, workload=workload, copies=copies, threads=threads, batch=batch
        )
    if as_json:
        emit_json({"workload": workload, "copies": copies, "reports": reports})
        return
    click.echo(f"{workload}, {copies} copies of the bundled image set, {threads} decode threads")
    click.echo(format_report(reports, workload))
