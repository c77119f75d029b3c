"""``tokenloom bench``: benchmarks printed as ratios measured side by side in one run."""

from __future__ import annotations

import glob
import os
import tempfile

import click

from tokenloom.bench.loader_model import MODELS as _LOOP_MODELS
from tokenloom.cli.options import emit_json, existing_dir, json_option

__all__ = ["command"]

# The stage names of ``bench scale`` (kept here so --help does not import the bench module).
_SCALE_STAGES = ("ingest", "dedup", "dedup-near", "tokenize", "stats", "plan", "loader")


@click.group(
    "bench",
    epilog="""\b
Examples:
  tokenloom bench ingest
  tokenloom bench backfill --copies 4 --workers 2
  tokenloom bench tokenize --workers 2
  tokenloom bench loader
  tokenloom bench near-dedup
  tokenloom bench plan
  tokenloom bench scale --docs 200000,2000000 --mean-tokens 40
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
    "components",
    epilog="""\b
Examples:
  tokenloom bench components                  # 1,000,000 pairs over 2,000,000 ids
  tokenloom bench components --pairs 200000 --nodes 400000 --json""",
)
@click.option("--nodes", default=2_000_000, show_default=True, type=click.IntRange(min=2))
@click.option("--pairs", default=1_000_000, show_default=True, type=click.IntRange(min=1))
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(min=1))
@json_option
def components_bench(nodes: int, pairs: int, repeats: int, as_json: bool) -> None:
    """Near-dedup union-find vs scipy's connected_components (random and LSH-like pairs)."""
    from tokenloom.bench.curate import run_components_bench

    res = run_components_bench(nodes=nodes, pairs=pairs, repeats=repeats)
    if as_json:
        emit_json(res)
        return
    click.echo(
        f"{pairs:,} pairs over {nodes:,} ids, median of {repeats} alternating runs, "
        "identical labels"
    )
    for name, g in res["graphs"].items():
        click.echo(
            f"  {name:7s} union-find {g['tokenloom_seconds']:7.3f} s  scipy "
            f"{g['scipy_seconds']:7.3f} s  ratio {g['ratio_tokenloom_scipy']:5.2f}x  "
            f"({g['components']:,} components, largest {g['largest']:,})"
        )


@command.command(
    "near-dedup",
    epilog="""\b
Examples:
  tokenloom bench near-dedup                         # 10M signatures (5.1 GB file), 2 workers
  tokenloom bench near-dedup --rows 300000 --json
  tokenloom bench near-dedup --stage 200000,2000000  # whole dedup stage: peak RSS by size
The signature file is written under --workdir (default: a temporary folder) and reused.""",
)
@click.option("--rows", default=10_000_000, show_default=True, type=click.IntRange(min=2))
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    help="Keep (and reuse) the signature file here.",
)
@click.option(
    "--stage",
    "stage",
    metavar="N,N,...",
    help="Instead: run the whole dedup --near stage on synthetic tables of these sizes and "
    "compare their peak RSS (the largest against the smallest; goal <= 1.5x).",
)
@json_option
def near_dedup_bench(
    rows: int, workers: int, workdir: str | None, stage: str | None, as_json: bool
) -> None:
    """Near-dedup clustering of synthetic MinHash signatures with planted groups: wall, CPU,
    peak RSS against the goals (< 10 min, <= 4 GB)."""
    from tokenloom.bench.near_dedup import run_cluster_bench, run_stage_bench

    if stage is not None:
        try:
            sizes = [int(x) for x in stage.split(",") if x.strip()]
        except ValueError:
            sizes = []
        if not sizes or min(sizes) < 2:
            raise click.BadParameter(
                f"{stage!r} is not a comma-separated list of sizes >= 2, e.g. 200000,2000000",
                param_hint="--stage",
            )
        runs = [run_stage_bench(docs=n, workers=workers, workdir=workdir) for n in sizes]
        ratio = runs[-1]["peak_rss_bytes"] / runs[0]["peak_rss_bytes"]
        res = {"runs": runs, "rss_ratio_last_first": round(ratio, 3)}
        if as_json:
            emit_json(res)
            return
        for r in runs:
            click.echo(
                f"dedup --near, {r['docs']:>10,} docs, {workers} workers: wall "
                f"{r['wall_seconds']:7.1f} s  CPU {r['cpu_seconds']:7.1f} s  peak RSS "
                f"{r['peak_rss_bytes'] / 2**20:7.0f} MiB  (load {r['load_average'][0]})"
            )
        verdict = "PASS" if ratio <= 1.5 else "MISS"
        click.echo(f"peak RSS {sizes[-1]:,} / {sizes[0]:,} docs: {ratio:.2f}x  (<= 1.5x {verdict})")
        return
    res = run_cluster_bench(rows=rows, workers=workers, workdir=workdir)
    if as_json:
        emit_json(res)
        return
    st, goals = res["stats"], res["goals"]
    click.echo(
        f"{rows:,} signatures x 128, {workers} workers, planted groups "
        f"({res['planted']['planted_members']:,} members), load {res['load_average'][0]}"
    )
    click.echo(
        f"  wall {res['wall_seconds']:.1f} s (< 600 s {goals['wall_under_600s']})  "
        f"CPU {res['cpu_seconds']:.1f} s  phases {st['seconds']}"
    )
    click.echo(
        f"  peak RSS {res['peak_rss_bytes'] / 2**30:.2f} GiB over {res['peak_processes']} "
        f"processes (<= 4 GB {goals['rss_at_most_4GB']})"
    )
    click.echo(
        f"  {res['near_duplicates']:,} near duplicates in {res['clusters']:,} clusters; planted "
        f"members joined {res['planted']['recall']:.4%}, clusters mixing groups "
        f"{res['planted']['clusters_mixing_groups']}; {st['verified']:,} pairs verified, "
        f"{st['windowed_buckets']:,} buckets windowed"
    )


@command.command(
    "loader",
    epilog="""\b
Examples:
  tokenloom bench loader                              # 400k docs, 20 s per loader (~10 min)
  tokenloom bench loader --docs 50000 --seconds 5     # a quick look
  tokenloom bench loader --only tokenloom,parquet --json
  tokenloom bench loader --docs 50000 --seconds 4 --cache warm,cold --out /tmp/lb
  tokenloom bench loader --only tokenloom --gpu-sim 124M,354M   # data stall feeding an H100
  tokenloom bench loader --store s3 --docs 20000 --seconds 5 --latency-ms 0,20
  tokenloom bench loader --store s3 --docs 2500000 --scale-docs 250000 --latency-ms 20 \
      --only tokenloom --seconds 10
The corpus and its copies are built once under --workdir and reused; the results are written
as loader-bench.json, .md and .png under --out (default: --workdir). --store s3 serves
them from a local S3 server (SeaweedFS) and measures tokenloom, Parquet (single rows and
row groups) and MDS from it.""",
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
    default=(
        "tokenloom,bound-workers,lancedb,mds,mds-shuffle,webdataset,parquet,parquet-order,"
        "parquet-preshuffled,parquet-rows,prepacked,long"
    ),
    show_default=True,
    metavar="LIST",
    help=(
        "Comma-separated loaders: tokenloom (with the read bound in-process), bound-workers "
        "(the read bound with two DataLoader workers), lancedb, mds, mds-shuffle, webdataset, "
        "parquet, parquet-order, parquet-preshuffled, parquet-rows, prepacked, long, recipes, "
        "ray, ray-shuffle, ray-parquet (Ray Data), litdata "
        "(--store s3: also lance-rows, bare per-row takes: the store's bound)."
    ),
)
@click.option(
    "--cache",
    default="warm",
    show_default=True,
    metavar="LIST",
    help="Page-cache states to measure each loader in: warm, cold (posix_fadvise) or both.",
)
@click.option(
    "--out",
    default=None,
    metavar="DIR",
    help="Folder for loader-bench.json/.md/.png (default: --workdir).",
)
@click.option(
    "--gpu-sim",
    default=None,
    metavar="MODELS",
    help="Also feed simulated GPT-2 training steps (124M, 354M) on one H100 at 40% MFU from "
    "tokenloom (workers=2) and report the data stall %.",
)
@click.option(
    "--shuffle-docs",
    default=None,
    type=click.IntRange(min=1),
    metavar="N",
    help="Also run every loader for two epochs on an N-document corpus and report the shuffle "
    "it gives (how far documents move between epochs, source shards per batch) beside its "
    "tokens/s.",
)
@click.option(
    "--model",
    type=click.Choice(sorted(_LOOP_MODELS)),
    default=None,
    help="Also train this model on every loader's batches for --model-steps steps each and "
    "report samples/s, data-stall % and total time per loader.",
)
@click.option(
    "--model-steps",
    default=20,
    show_default=True,
    type=click.IntRange(min=1),
    help="Training steps per loader with --model (after one warm-up step).",
)
@click.option(
    "--batch-sizes",
    default="8",
    show_default=True,
    metavar="LIST",
    help="The protocol's sweep: every loader at each batch size, e.g. 4,8,16 (the goals and the "
    "main table are at 8 when listed, else at the first).",
)
@click.option(
    "--epochs",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Measuring windows (--seconds or --steps each) per loader and batch size; the table "
    "gives their mean and min-max.",
)
@click.option(
    "--rounds",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Measure every loader this many times in turn (round 1: each loader once, then round "
    "2, ...); each goal is then the median of its rounds' ratios, so a slow spell of a shared "
    "machine moves one round, not the figure.",
)
@click.option(
    "--seq-len",
    default=1024,
    show_default=True,
    type=click.IntRange(min=8),
    help="Block length L of every loader (a shorter one keeps --model steps short on CPU).",
)
@click.option(
    "--store",
    type=click.Choice(["local", "s3"]),
    default="local",
    show_default=True,
    help="s3: local vs a local S3 server at each --latency-ms (tokenloom, lance-rows, "
    "parquet-rows, parquet, mds).",
)
@click.option(
    "--latency-ms",
    default="0,20",
    show_default=True,
    metavar="LIST",
    help="With --store s3: request latencies added by a proxy (0: none).",
)
@click.option(
    "--scale-docs",
    default=None,
    type=click.IntRange(min=1),
    metavar="N",
    help="With --store s3: also read a table of N documents (< --docs) at every latency and "
    "check that peak RSS stays flat (<= 1.2x) as the table grows to --docs.",
)
@click.option(
    "--token-layout",
    type=click.Choice(["list", "bytes"]),
    default="list",
    show_default=True,
    help="With --store s3: how the synthetic tables store the ids (tokenloom tokenize --layout).",
)
@json_option
def loader_bench(
    docs: int,
    seconds: float,
    steps: int | None,
    workdir: str,
    only: str,
    cache: str,
    out: str | None,
    gpu_sim: str | None,
    shuffle_docs: int | None,
    model: str | None,
    model_steps: int,
    batch_sizes: str,
    epochs: int,
    rounds: int,
    seq_len: int,
    store: str,
    latency_ms: str,
    scale_docs: int | None,
    token_layout: str,
    as_json: bool,
) -> None:
    """Loader tokens/s next to LanceDB, pre-packed MDS/WebDataset and Parquet, as ratios."""
    if store == "s3":
        if rounds != 1:
            raise click.BadParameter("applies to --store local only", param_hint="--rounds")
        _loader_s3_bench(
            docs, seconds, steps, workdir, only, latency_ms, scale_docs, token_layout, as_json
        )
        return
    if scale_docs is not None:
        raise click.BadParameter("applies to --store s3 only", param_hint="--scale-docs")
    if token_layout != "list":
        raise click.BadParameter("applies to --store s3 only", param_hint="--token-layout")
    from tokenloom.bench.loader import (
        KNOWN_LOADERS,
        LoaderBenchConfig,
        format_report,
        run_loader_bench,
    )
    from tokenloom.bench.loader_cache import CACHE_MODES
    from tokenloom.bench.loader_gpusim import format_gpu_sims, run_gpu_sims
    from tokenloom.bench.loader_output import write_outputs
    from tokenloom.loader.observe.profile import parse_gpu_sims

    names = tuple(n.strip() for n in only.split(",") if n.strip())
    unknown = sorted(set(names) - set(KNOWN_LOADERS))
    if unknown or not names:
        raise click.BadParameter(
            f"unknown loader(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {','.join(KNOWN_LOADERS)}",
            param_hint="--only",
        )
    modes = tuple(m.strip() for m in cache.split(",") if m.strip())
    if not modes or set(modes) - set(CACHE_MODES):
        raise click.BadParameter(
            f"{cache!r}: choose from {','.join(CACHE_MODES)}", param_hint="--cache"
        )
    from tokenloom.bench.protocol import parse_sizes

    try:
        sizes = parse_sizes(batch_sizes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--batch-sizes") from None
    config = LoaderBenchConfig(
        docs=docs,
        seconds=seconds,
        steps=steps,
        workdir=workdir,
        only=names,
        cache=modes,
        seq_len=seq_len,
        batch_size=8 if 8 in sizes else sizes[0],
        batch_sizes=sizes,
        epochs=epochs,
        rounds=rounds,
    )
    try:
        sims = parse_gpu_sims(gpu_sim, config.seq_len) if gpu_sim is not None else []
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu-sim") from None
    log = lambda msg: click.echo(msg, err=True)  # noqa: E731
    bench = run_loader_bench(config, log=log)
    simulated = run_gpu_sims(config, sims, log=log) if sims else []
    trained = []
    if model is not None:
        from tokenloom.bench.loader_model import run_model_in_loop

        trained = run_model_in_loop(config, bench, model, model_steps, log=log)
    shuffles = []
    if shuffle_docs is not None:
        from tokenloom.bench.loader_shuffle import run_shuffle_quality

        shuffles = run_shuffle_quality(config, bench, shuffle_docs, log=log)
    written = write_outputs(bench, out or workdir)
    for kind, path in written.items():
        click.echo(f"{kind}: {path}", err=True)
    if as_json:
        emit_json(
            {
                **bench.to_json(),
                "gpu_sim": [r.to_json() for r in simulated],
                "shuffle": [q.to_json() for q in shuffles],
                "model": [r.to_json() for r in trained],
            }
        )
        return
    click.echo(format_report(bench))
    if simulated:
        click.echo("\n" + format_gpu_sims(simulated, sims))
    if trained:
        from tokenloom.bench.loader_model import format_model_runs

        click.echo("\n" + format_model_runs(trained))
    if shuffles:
        from tokenloom.bench.loader_shuffle import format_shuffle

        click.echo("\n" + format_shuffle(shuffles, bench))
    with open(written["protocol markdown"], encoding="utf-8") as f:
        click.echo("\nprotocol (per loader and batch size):\n" + f.read())


def _loader_s3_bench(
    docs: int, seconds: float, steps: int | None, workdir: str, only: str, latency: str,
    scale_docs: int | None, layout: str, as_json: bool,
) -> None:  # fmt: skip
    from tokenloom.bench.loader_s3 import S3_LOADERS, S3BenchConfig, format_s3_report, run_s3_bench

    try:
        latencies = tuple(float(x) for x in latency.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(
            f"{latency!r} is not a list of numbers", param_hint="--latency-ms"
        ) from None
    if not latencies or min(latencies) < 0:
        raise click.BadParameter(f"{latency!r}: give latencies >= 0", param_hint="--latency-ms")
    names = tuple(n for n in (s.strip() for s in only.split(",")) if n in S3_LOADERS)
    if not names:
        raise click.BadParameter(f"--store s3 measures {','.join(S3_LOADERS)}", param_hint="--only")
    from tokenloom.bench.loader import LoaderBenchConfig

    run = LoaderBenchConfig(
        docs=docs, seconds=seconds, steps=steps, workdir=workdir, only=("tokenloom",)
    )
    if scale_docs is not None and scale_docs >= docs:
        raise click.BadParameter(
            f"{scale_docs} is not below --docs {docs}; e.g. --scale-docs {max(docs // 10, 1)}",
            param_hint="--scale-docs",
        )
    config = S3BenchConfig(
        run=run, latencies_ms=latencies, only=names, scale_docs=scale_docs, layout=layout
    )
    bench = run_s3_bench(config, log=lambda msg: click.echo(msg, err=True))
    if as_json:
        emit_json(bench.to_json())
        return
    click.echo(format_s3_report(bench))


@command.command(
    "plan",
    epilog="""\b
Examples:
  tokenloom bench plan                                 # 17.5M and 100M documents
  tokenloom bench plan --docs 2000000 --node-processes 2 --recipe-docs 200000
  tokenloom bench plan --docs 17500000 --json
  tokenloom bench plan --docs 0 --recipe-docs 17500000 --recipes best_fit,rows
Build time and bytes per document of the epoch plan, one process and N processes sharing
one node's plan store, with PASS/MISS against < 10 s per epoch and <= 12 B/doc per node.""",
)
@click.option(
    "--docs",
    default="17500000,100000000",
    show_default=True,
    metavar="LIST",
    help="Comma-separated corpus sizes (documents; lognormal lengths, median 450 / mean 800).",
)
@click.option(
    "--node-processes",
    default=4,
    show_default=True,
    type=click.IntRange(min=1),
    help="Processes sharing the node's plan store (ranks / DataLoader workers).",
)
@click.option("--epochs", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--seq-len", default=2048, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--recipe-docs",
    default=1_000_000,
    show_default=True,
    type=click.IntRange(min=0),
    help="Documents of the recipe measurement, each recipe in a fresh process (0: skip).",
)
@click.option(
    "--recipes",
    default="concat,window,window_table,best_fit,mixture,rows",
    show_default=True,
    metavar="LIST",
    help="Recipes measured at --recipe-docs: concat, window (an epoch, cut points kept as "
    "the window table), window_table (cutting that table once), best_fit, mixture (3 pools), "
    "rows (the row loader's selection and plan).",
)
@click.option(
    "--reference-max-docs",
    default=20_000_000,
    show_default=True,
    type=click.IntRange(min=0),
    help="Measure the former int64 layout up to this many documents.",
)
@click.option(
    "--keep",
    default=0.9,
    show_default=True,
    type=click.FloatRange(min=0, max=1, min_open=True),
    help="Share of the synthetic table's rows the selection keeps (1: consecutive ids).",
)
@click.option(
    "--workdir",
    default=None,
    metavar="DIR",
    type=existing_dir,
    help="Local directory (it must exist) for the plan stores [default: a temporary directory].",
)
@json_option
def plan_bench(
    docs: str,
    node_processes: int,
    epochs: int,
    seq_len: int,
    recipe_docs: int,
    recipes: str,
    reference_max_docs: int,
    keep: float,
    workdir: str | None,
    as_json: bool,
) -> None:
    """Epoch plan build time and memory per document at corpus scale."""
    from tokenloom.bench.plan import PlanBenchConfig, format_plan_report, run_plan_bench

    try:
        sizes = tuple(int(d.replace("_", "")) for d in docs.split(",") if d.strip())
        sizes = () if sizes == (0,) else sizes  # --docs 0: the recipes only
    except ValueError as exc:
        raise click.BadParameter(f"{docs!r}: {exc}", param_hint="--docs") from exc
    names = tuple(r.strip() for r in recipes.split(",") if r.strip())
    try:
        PlanBenchConfig(docs=(1,), recipes=names)
    except ValueError as exc:
        raise click.BadParameter(f"{recipes!r}: {exc}", param_hint="--recipes") from exc
    try:
        config = PlanBenchConfig(
            docs=sizes,
            procs=node_processes,
            epochs=epochs,
            seq_len=seq_len,
            recipe_docs=recipe_docs,
            recipes=names,
            reference_max_docs=reference_max_docs,
            keep=keep,
            workdir=workdir,
        )
    except ValueError as exc:
        raise click.BadParameter(f"{docs!r}: {exc}", param_hint="--docs") from exc
    bench = run_plan_bench(config, log=lambda msg: click.echo(msg, err=True))
    if as_json:
        emit_json(bench.to_json())
        return
    click.echo(format_plan_report(bench))


@command.command(
    "scale",
    epilog="""\b
Examples:
  tokenloom bench scale                                  # 2M docs of ~1,030 tokens, every stage
  tokenloom bench scale --docs 200000,2000000 --mean-tokens 40 \\
      --stages ingest,dedup,dedup-near,tokenize,stats     # peak RSS flat as the count grows
  tokenloom bench scale --stages plan,loader --plan-docs 17500000 --store s3
A synthetic JSONL corpus (words of the bundled corpus by frequency, lognormal lengths, planted
exact and near copies) goes through the real commands, each in its own process: ingest, dedup,
dedup --near, tokenize, stats; then bench plan (every recipe) and bench loader. Per stage: wall,
CPU, documents per CPU second, peak RSS (process tree, sampled), B/doc, bytes written and read;
with several --docs, each stage's peak RSS at the largest size over the smallest (<= 1.5x).""",
)
@click.option(
    "--docs",
    default="2000000",
    show_default=True,
    metavar="LIST",
    help="Comma-separated corpus sizes (documents); the pipeline runs at each.",
)
@click.option(
    "--mean-tokens",
    default=1030.0,
    show_default=True,
    type=click.FloatRange(min=2),
    help="Mean document length in tokens (lognormal; seed 000: ~1,030). Short documents "
    "(30-60) make the document count grow without gigabytes of text.",
)
@click.option(
    "--stages",
    default=",".join(_SCALE_STAGES),
    show_default=True,
    metavar="LIST",
    help="Stages to run: " + ", ".join(_SCALE_STAGES) + ".",
)
@click.option(
    "--workers",
    default=2,
    show_default=True,
    type=click.IntRange(min=0),
    help="Workers of the dedup and tokenize backfills (0: in their own process).",
)
@click.option(
    "--tokenizer",
    "spec",
    default="gpt2",
    show_default=True,
    help="Tokenizer of the tokenize stage.",
)
@click.option(
    "--plan-docs",
    default=17_500_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Documents of the plan stage (bench plan --recipe-docs).",
)
@click.option(
    "--loader-docs",
    default=2_000_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Documents of the loader stage (bench loader --docs).",
)
@click.option(
    "--seconds",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Measuring budget per loader in the loader stage.",
)
@click.option(
    "--store",
    type=click.Choice(["local", "s3"]),
    default="local",
    show_default=True,
    help="s3: the loader stage reads from a local S3 server at 20 ms latency.",
)
@click.option(
    "--workdir",
    default=None,
    metavar="DIR",
    type=existing_dir,
    help="Local directory (it must exist) for the corpus and tables [default: a temporary "
    "directory]; the run's own folder in it is removed at the end.",
)
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
@json_option
def scale_bench(
    docs: str,
    mean_tokens: float,
    stages: str,
    workers: int,
    spec: str,
    plan_docs: int,
    loader_docs: int,
    seconds: float,
    store: str,
    workdir: str | None,
    seed: int,
    as_json: bool,
) -> None:
    """The pipeline stage by stage on a synthetic corpus: time, CPU, peak RSS, bytes, B/doc."""
    from tokenloom.bench.scale import ScaleConfig, format_scale_report, run_scale_bench

    try:
        sizes = tuple(int(d.replace("_", "")) for d in docs.split(",") if d.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 2:
        raise click.BadParameter(
            f"{docs!r} is not a comma-separated list of sizes >= 2, e.g. 200000,2000000",
            param_hint="--docs",
        )
    names = tuple(s.strip() for s in stages.split(",") if s.strip())
    try:
        config = ScaleConfig(
            docs=sizes,
            mean_tokens=mean_tokens,
            stages=names,
            workers=workers,
            tokenizer=spec,
            plan_docs=plan_docs,
            loader_docs=loader_docs,
            loader_seconds=seconds,
            store=store,
            workdir=workdir,
            seed=seed,
        )
    except ValueError as exc:
        raise click.BadParameter(f"{stages!r}: {exc}", param_hint="--stages") from None
    bench = run_scale_bench(config, log=lambda msg: click.echo(msg, err=True))
    if as_json:
        emit_json(bench.to_json())
        return
    click.echo(format_scale_report(bench))


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
  tokenloom bench rows                          # images, ResNet-18 in the loop, every loader
  tokenloom bench rows --workload image-text --copies 4 --batch-sizes 4,8,16 --epochs 3
  tokenloom bench rows --only tokenloom,parquet --model none --out /tmp/rows
Loaders: tokenloom, tokenloom blocks (image-text only), tar shards, parquet, mds, ray,
ray-shuffle, litdata. Each at each batch size in its own process, --epochs passes over the
samples; the results are written as rows-bench-<workload>-protocol.json/.md and PNG charts
under --out.""",
)
@click.option(
    "--workload",
    type=click.Choice(["image", "image-text"]),
    default="image",
    show_default=True,
    help="image: decode + ResNet-18; image-text: decode + text bytes + a tiny CLIP-style "
    "dual encoder.",
)
@click.option(
    "--copies",
    default=4,
    show_default=True,
    type=click.IntRange(min=1),
    help="Times the bundled image set (54 samples) is repeated.",
)
@click.option("--threads", default=2, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--batch-sizes",
    default="4,8,16",
    show_default=True,
    metavar="LIST",
    help="Every loader at each batch size (each in a fresh process).",
)
@click.option(
    "--epochs",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="Passes over the samples per loader and size (two or more: the shuffle figures).",
)
@click.option(
    "--only",
    default=None,
    metavar="LIST",
    help="Comma-separated loaders [default: every one; `tokenloom blocks`, the image+text "
    "loader, runs with the image-text workload only].",
)
@click.option(
    "--model",
    type=click.Choice(["auto", "none"]),
    default="auto",
    show_default=True,
    help="Train the workload's model on every batch (samples/s and data stall with it): auto "
    "is ResNet-18 for image, a tiny CLIP-style dual encoder for image-text; none: the loaders "
    "alone.",
)
@click.option(
    "--out",
    default=None,
    metavar="DIR",
    help="Folder for the JSON, Markdown and charts [default: a temporary folder, removed].",
)
@json_option
def rows_bench(
    workload: str,
    copies: int,
    threads: int,
    batch_sizes: str,
    epochs: int,
    only: str | None,
    model: str,
    out: str | None,
    as_json: bool,
) -> None:
    """RowDataset vs tar shards, Parquet, MDS, Ray Data and litdata on images, a model in the
    loop, under the benchmark protocol (batch sizes x epochs, CPU/RSS, shuffle)."""
    from tokenloom.bench.protocol import parse_sizes
    from tokenloom.bench.protocol_output import markdown_table, write_protocol
    from tokenloom.bench.rows import CASES, run_rows_bench

    try:
        sizes = parse_sizes(batch_sizes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--batch-sizes") from None
    names = CASES if only is None else tuple(n.strip() for n in only.split(",") if n.strip())
    unknown = sorted(set(names) - set(CASES))
    if unknown or not names:
        raise click.BadParameter(
            f"unknown loader(s) {', '.join(unknown) or '(none given)'}; choose from "
            f"{','.join(CASES)}",
            param_hint="--only",
        )
    if max(sizes) > 54 * copies:
        raise click.BadParameter(
            f"batch size {max(sizes)} is over the {54 * copies} samples; raise --copies to "
            f"{-(-max(sizes) // 54)} or lower the size",
            param_hint="--batch-sizes",
        )
    log = lambda msg: click.echo(msg, err=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="tokenloom-rows-") as tmp:
        rows, series, meta = run_rows_bench(
            tmp, workload=workload, copies=copies, threads=threads, batch_sizes=sizes,
            epochs=epochs, model=model == "auto", only=names, log=log,
        )  # fmt: skip
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        header = (
            f"Workload {workload}: {meta['rows']:,} samples ({copies} copies of the bundled "
            f"set), batch sizes {batch_sizes}, {epochs} epoch(s), {threads} threads, "
            f"model: {meta['model'] or 'none'}, {os.cpu_count()} CPUs, load average at the "
            f"end {load}."
        )
        written = write_protocol(
            rows, series, out or tmp, stem=f"rows-bench-{workload}", header=header,
            title=f"{workload}: samples/s per loader and B", meta={"workload": workload, **meta},
        )  # fmt: skip
        if out is None:
            written = {}  # the temporary folder goes: nothing to point at
    for kind, path in written.items():
        click.echo(f"{kind}: {path}", err=True)
    if as_json:
        emit_json({"workload": workload, "header": header, **meta,
                   "rows": [r.to_json() for r in rows]})  # fmt: skip
        return
    click.echo(markdown_table(rows, header=header))
